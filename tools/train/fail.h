/* The trainer's own error messages (per thread, like the library's): the
 * tool uses only the public API, so it keeps its messages itself. */
#ifndef SBN_TRAIN_FAIL_H
#define SBN_TRAIN_FAIL_H

#include "syncbn.h"

/* Record a message and return st. */
sbn_status train_fail(sbn_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The last train_fail message of this thread, else the library's. */
const char *train_error(void);
void train_clear_error(void);

#endif
