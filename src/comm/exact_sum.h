/* Internal: exact, order-independent summation of doubles (binned fixed
 * point, after ReproBLAS), so that any reduction tree (MPI_Iallreduce's,
 * whatever algorithm the engine picks, or the threads backend's loop) gives
 * bitwise the same sum. See exact_sum.c for the format and the error bound.
 *
 * A term is an sbn_xbin of 24 bytes; merging two is exactly commutative and
 * associative, so a sum is a pure function of the multiset of terms. */
#ifndef SBN_EXACT_SUM_H
#define SBN_EXACT_SUM_H

#include <stddef.h>
#include <stdint.h>

/* Largest number of terms one sum may merge (the headroom of the top bin:
 * 55-bit field, 38-bit digits). Groups larger than this are refused. */
#define SBN_XSUM_MAX_TERMS 65536

typedef struct sbn_xbin {
  int64_t w[3];
} sbn_xbin;

/* The empty sum (the sum of no terms, and of +0/-0). */
static inline sbn_xbin sbn_xsum_zero(void) { return (sbn_xbin){{0, 0, 0}}; }

void sbn_xsum_encode_f64(sbn_xbin *out, const double *x, size_t n);
void sbn_xsum_encode_f32(sbn_xbin *out, const float *x, size_t n);
/* inout[i] = inout[i] (+) in[i]. */
void sbn_xsum_merge(sbn_xbin *inout, const sbn_xbin *in, size_t n);
/* acc (+)= x, one double (the threads backend's inner loop). */
void sbn_xsum_add(sbn_xbin *acc, double x);
/* Correctly rounded (to nearest, ties to even) value of each sum. */
void sbn_xsum_decode_f64(double *out, const sbn_xbin *in, size_t n);
void sbn_xsum_decode_f32(float *out, const sbn_xbin *in, size_t n);
/* One sum rounded to p = 53 (double) or 24 (float) significant bits, as a
 * double that holds it exactly. */
double sbn_xsum_round(const sbn_xbin *e, int p);
/* v (0 < v < 2^127) rounded to p = 53 or 24 bits, times 2^scale, when
 * 2^scale is a normal double (scale >= -1022) and v 2^scale < 2^1024 (else
 * inf); a float result below 2^-126 is not rounded as a subnormal float
 * (the caller checks). The library's 128-bit conversion is slow, so the
 * top 63 bits of v, with the bits below folded into the lowest one (a
 * sticky bit: 63 > p + 1, so ties and halves are seen as they are), go
 * through the hardware's correctly rounded 64-bit conversion; both
 * scalings are by powers of two, exact unless the result overflows. */
static inline double sbn_xsum_round_u128(unsigned __int128 v, int p, int scale) {
  const uint64_t hi = (uint64_t)(v >> 64), lo = (uint64_t)v;
  const int len = hi ? 128 - __builtin_clzll(hi) : 64 - __builtin_clzll(lo);
  const int sh = len > 63 ? len - 63 : 0;
  uint64_t t = (uint64_t)(v >> sh);
  t |= (uint64_t)(sh && lo << (64 - sh) != 0); /* sh <= 64: the bits below are in lo */
  const double r = p == 53 ? (double)(int64_t)t : (double)(float)(int64_t)t;
  const uint64_t bits = (uint64_t)(scale + sh + 1023) << 52;
  double f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return r * f;
}
/* The finite sum s0 2^76 + s1 2^38 + s2 (units of bin T-2; any signs, no
 * carries needed) with top bin T, 0 <= T <= 55; |s0| < 2^54. */
sbn_xbin sbn_xsum_make(int T, int64_t s0, int64_t s1, int64_t s2);
/* The top bin of a sum of finite terms (its largest term's), or -1 when it
 * holds no finite nonzero term or is a control element. */
int sbn_xsum_top(const sbn_xbin *e);

/* Two terms, the common case of two ranks: when both are normal (or zero)
 * and their exponents differ by at most 22, the binned sum drops nothing
 * (the smaller term's lowest bit lies at most 74 bits below the larger's
 * leading bit, the window reaches at least 76 below it), so it holds a + b
 * exactly and decodes to a + b rounded once to nearest: the hardware's own
 * addition (float: the exact double sum rounded once to float). These
 * return 1 with that result, the same bits as sbn_xsum_add twice and a
 * decode, or 0 when the caller must take the general path. */
static inline int sbn_xsum_pair_ok(double a, double b) {
  uint64_t ua, ub;
  __builtin_memcpy(&ua, &a, 8);
  __builtin_memcpy(&ub, &b, 8);
  const int ea = (int)((ua >> 52) & 0x7ff), eb = (int)((ub >> 52) & 0x7ff);
  if (ea == 0 || eb == 0 || ea == 0x7ff || eb == 0x7ff) return 0; /* zero, subnormal, inf, NaN */
  return ea - eb <= 22 && eb - ea <= 22;
}
static inline int sbn_xsum_pair_f64(double a, double b, double *out) {
  if (!sbn_xsum_pair_ok(a, b)) return 0;
  const double s = a + b; /* an exact zero is +0 under round to nearest */
  if (s - s != 0) return 0; /* overflow: the general path says which infinity */
  *out = s;
  return 1;
}
static inline int sbn_xsum_pair_f32(float a, float b, float *out) {
  if (!sbn_xsum_pair_ok(a, b)) return 0;
  const float s = (float)((double)a + (double)b); /* the double sum is exact: 24 + 22 + 1 bits */
  if (s - s != 0) return 0;
  *out = s;
  return 1;
}

/* out[i] = a[i] + b[i] as the binned sum of the two terms rounded once
 * (the same bits as sbn_xsum_add twice and a decode), for n pairs; out may
 * be a or b. Blocks of pairs that all pass the shortcut's test take the
 * hardware addition, vectorized (exact_pair.c). */
void sbn_xsum_pair_sum_f64(double *out, const double *a, const double *b, size_t n);
void sbn_xsum_pair_sum_f32(float *out, const float *a, const float *b, size_t n);

/* A control element rides in the same reduction as the data (the MPI
 * backend's signature check): it merges as min and max of a 64-bit hash and
 * max of a status instead of a sum. Both operands of a merge at one position
 * are of the same kind. */
sbn_xbin sbn_xsum_ctrl(uint64_t hash, int status);
/* Returns 1 when every merged hash was equal; *status gets the max status. */
int sbn_xsum_ctrl_read(const sbn_xbin *e, int *status);

#endif
