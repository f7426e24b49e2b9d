/* Strict parsing of syncbn-train's numeric options: the whole string must be
 * a decimal number in range: an optional sign (+4 as Python's int() takes
 * it), digits, for real values a '.' and an exponent (1e-3). "--lr 0.1x",
 * "--epochs 2.5", " 4", "0x10", "0x1p-3", "inf" and "nan" are errors. */
#ifndef SBN_TRAIN_ARGS_H
#define SBN_TRAIN_ARGS_H

#include <stdint.h>

/* Each returns 0 and sets *out, or prints "syncbn-train: --NAME: ..." to
 * stderr and returns -1. */
int arg_int(int *out, const char *name, const char *s, int lo, int hi);
int arg_i64(int64_t *out, const char *name, const char *s, int64_t lo, int64_t hi);
int arg_u64(uint64_t *out, const char *name, const char *s);
/* A finite double in [lo, hi]; lo_open excludes lo itself. */
int arg_double(double *out, const char *name, const char *s, double lo, double hi, int lo_open);

#endif
