/* Status names and messages (one X-macro table in syncbn.h), the per-thread
 * last-error message, SYNCBN_DEBUG, and the runtime version. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static const char *const status_names[] = {
#define SBN_STATUS_NAME_(name, msg) "SBN_STATUS_" #name,
    SBN_STATUS_MAP(SBN_STATUS_NAME_)
#undef SBN_STATUS_NAME_
};

static const char *const status_messages[] = {
#define SBN_STATUS_MSG_(name, msg) msg,
    SBN_STATUS_MAP(SBN_STATUS_MSG_)
#undef SBN_STATUS_MSG_
};

const char *sbn_status_string(sbn_status status) {
  if ((unsigned)status >= SBN_STATUS_COUNT_) return "unknown status";
  return status_messages[status];
}

const char *sbn_status_name(sbn_status status) {
  if ((unsigned)status >= SBN_STATUS_COUNT_) return "SBN_STATUS_UNKNOWN";
  return status_names[status];
}

int sbn_version(void) { return SYNCBN_VERSION; }

static _Thread_local char last_error[1024];

const char *sbn_last_error(void) { return last_error; }

void sbn_clear_error(void) { last_error[0] = '\0'; }

static _Thread_local uint64_t failures_told;
void sbn_failure_told(void) { failures_told++; }
uint64_t sbn_failures_told(void) { return failures_told; }

void sbn_restore_error(const char *saved) {
  if (saved != last_error) snprintf(last_error, sizeof last_error, "%s", saved);
}

int sbn_debug_enabled(void) {
  /* Computed once, by whichever thread fails first; atomic, so threads
   * failing at the same time (every rank of a group does) do not race. */
  static int cached = -1;
  int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
  if (v < 0) {
    const char *env = getenv("SYNCBN_DEBUG");
    v = env && env[0] && strcmp(env, "0") != 0;
    __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
  }
  return v;
}

sbn_status sbn_fail(sbn_status status, const char *fmt, ...) {
  /* Format into a temporary: fmt's arguments may point into last_error. */
  char msg[sizeof last_error];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  memcpy(last_error, msg, sizeof msg);
  if (sbn_debug_enabled()) fprintf(stderr, "syncbn: %s: %s\n", sbn_status_name(status), last_error);
  return status;
}
