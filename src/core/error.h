/* Internal: recording errors in the per-thread last-error message. */
#ifndef SBN_ERROR_H
#define SBN_ERROR_H

#include "syncbn.h"

#if defined(__GNUC__)
#define SBN_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define SBN_PRINTF(a, b)
#endif

/* Record a failure: formats the message into the thread's last error (and
 * prints it when SYNCBN_DEBUG=1); returns status so callers can
 * `return sbn_fail(...)`. */
sbn_status sbn_fail(sbn_status status, const char *fmt, ...) SBN_PRINTF(2, 3);
/* Keep status and message as they are (a failure already recorded). */
static inline sbn_status sbn_pass(sbn_status status) { return status; }
/* Clear the last error at the start of a public call. */
void sbn_clear_error(void);
/* Put back a message saved earlier (cleanup that calls other public
 * functions must not lose the caller's last error). */
void sbn_restore_error(const char *saved);
/* A collective just carried this thread's own failure to its peers (they
 * returned PEER_FAILED and the group stays usable). The count lets a caller
 * above the layer (the data-parallel wrapper) tell a failure the peers know
 * of from one they would wait out until their timeout. */
void sbn_failure_told(void);
uint64_t sbn_failures_told(void);
/* Whether SYNCBN_DEBUG asks for diagnostics on stderr (the library prints
 * nothing otherwise). */
int sbn_debug_enabled(void);

#endif
