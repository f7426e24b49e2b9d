#include "fail.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char msg[1024];

sbn_status train_fail(sbn_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return st;
}

const char *train_error(void) { return msg[0] ? msg : sbn_last_error(); }
void train_clear_error(void) { msg[0] = 0; }
