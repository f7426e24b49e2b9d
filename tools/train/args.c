#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int bad(const char *name, const char *s, const char *what) {
  fprintf(stderr, "syncbn-train: --%s '%s': %s\n", name, s, what);
  return -1;
}

/* Numbers are written in decimal, as in PyTorch's argparse scripts: an
 * optional sign, then digits (a real value may add a '.' and an exponent).
 * strtoll/strtod alone would also take leading spaces (" 4": a quoting
 * slip in a job script) and strtod hexadecimal, "inf" and "nan". */
static int decimal_integer(const char *s) {
  s += *s == '+' || *s == '-';
  if (!*s) return 0;
  for (; *s; s++)
    if (*s < '0' || *s > '9') return 0;
  return 1;
}

static int decimal_real(const char *s) {
  s += *s == '+' || *s == '-';
  if (!((*s >= '0' && *s <= '9') || (*s == '.' && s[1] >= '0' && s[1] <= '9'))) return 0;
  for (; *s; s++)
    if (!((*s >= '0' && *s <= '9') || *s == '.' || *s == 'e' || *s == 'E' || *s == '+' || *s == '-')) return 0;
  return 1;
}

int arg_i64(int64_t *out, const char *name, const char *s, int64_t lo, int64_t hi) {
  char *end;
  errno = 0;
  if (!decimal_integer(s)) return bad(name, s, "not a decimal integer");
  long long v = strtoll(s, &end, 10);
  if (end == s || *end) return bad(name, s, "not a decimal integer");
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
  if (!decimal_integer(s)) return bad(name, s, "not a decimal integer");
  if (*s == '-') return bad(name, s, "must not be negative");
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s || *end) return bad(name, s, "not a decimal integer");
  if (errno == ERANGE) return bad(name, s, "out of range");
  *out = v;
  return 0;
}

int arg_double(double *out, const char *name, const char *s, double lo, double hi, int lo_open) {
  char *end;
  errno = 0;
  if (!decimal_real(s)) return bad(name, s, "not a decimal number");
  double v = strtod(s, &end);
  if (end == s || *end) return bad(name, s, "not a decimal number");
  if (!isfinite(v) || errno == ERANGE || v < lo || v > hi || (lo_open && v == lo)) {
    char msg[96];
    snprintf(msg, sizeof msg, "out of range %c%g, %g]", lo_open ? '(' : '[', lo, hi);
    return bad(name, s, msg);
  }
  *out = v;
  return 0;
}
