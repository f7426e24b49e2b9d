#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int bad(const char *name, const char *s, const char *what) {
  fprintf(stderr, "syncbn-train: --%s '%s': %s\n", name, s, what);
  return -1;
}

int arg_i64(int64_t *out, const char *name, const char *s, int64_t lo, int64_t hi) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (end == s || *end) return bad(name, s, "not an integer");
  if (errno == ERANGE || v < lo || v > hi) {
    char msg[96];
    snprintf(msg, sizeof msg, "out of range [%lld, %lld]", (long long)lo, (long long)hi);
    return bad(name, s, msg);
  }
  *out = v;
  return 0;
}

int arg_int(int *out, const char *name, const char *s, int lo, int hi) {
  int64_t v;
  if (arg_i64(&v, name, s, lo, hi)) return -1;
  *out = (int)v;
  return 0;
}

int arg_u64(uint64_t *out, const char *name, const char *s) {
  char *end;
  errno = 0;
  if (*s == '-') return bad(name, s, "must not be negative");
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s || *end) return bad(name, s, "not an integer");
  if (errno == ERANGE) return bad(name, s, "out of range");
  *out = v;
  return 0;
}

int arg_double(double *out, const char *name, const char *s, double lo, double hi, int lo_open) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end) return bad(name, s, "not a number");
  if (!isfinite(v) || errno == ERANGE || v < lo || v > hi || (lo_open && v == lo)) {
    char msg[96];
    snprintf(msg, sizeof msg, "out of range %c%g, %g]", lo_open ? '(' : '[', lo, hi);
    return bad(name, s, msg);
  }
  *out = v;
  return 0;
}
