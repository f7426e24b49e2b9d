/* Exact, order-independent summation: binned fixed point (the idea of
 * ReproBLAS's binned sums, our own small format).
 *
 * GRID. A double is an integer multiple of 2^-1074; number the bits of that
 * integer 0..2097 and cut them into bins of W = 38 bits: bin b holds bits
 * [38b, 38b+38), b = 0..55. A term records its top bin T (the bin of its
 * leading bit) and three signed integer bins T, T-1, T-2: 114 bits, enough
 * for any double's 53 bits wherever its leading bit sits in bin T (38 + 76 >=
 * 53 + 37), so one term alone is exact.
 *
 * MERGE. Two sums merge by aligning to the larger top: the smaller one's
 * bins shift down and bins below T_max - 2 are dropped; integer bins add.
 * Dropping is what makes the merge exactly associative and commutative: a
 * merged sum is always (max of its terms' tops, the exact integer sum over
 * its terms of their digits in bins T_max-2..T_max), because the max only
 * grows and a dropped bin would be dropped by the final top anyway. No
 * carries move between bins during merges (a carry could move value across
 * the drop line and make the result depend on the order). So every
 * reduction order and tree gives the same 24 bytes, hence the same decoded
 * bits on every rank.
 *
 * LAYOUT (24 bytes): w[0] = top-bin sum (signed, 55 bits) << 9 | flags << 6
 * | tag, where tag = T + 1 (0: no finite nonzero term yet; 63: a control
 * element) and flags record +inf, -inf and NaN terms; w[1], w[2] = bins T-1
 * and T-2 (signed 64-bit).
 *
 * HEADROOM. Each term adds one digit of magnitude < 2^38 to each bin, so n
 * terms give |bin| < n * 2^38: the 55-bit top field holds n <= 2^16 =
 * SBN_XSUM_MAX_TERMS terms (the 64-bit bins far more). Groups are limited
 * to that many ranks.
 *
 * ERROR BOUND. Let the largest term's top be T (so max|x| >= 2^(38T) in
 * units of 2^-1074). The sum keeps each term truncated toward zero at bit
 * 38(T-2), an error < 2^(38(T-2)) per term, then rounds once to nearest
 * (ties to even) when decoded. So for n terms
 *     |result - exact sum| <= ulp(result)/2 + n * 2^-76 * max|x_i|
 * (<= ulp/2 + 2^-60 max|x| at the 65536-term limit): correctly rounded
 * unless terms more than 2^76 below the largest one are dropped, and never
 * worse than a float64 sum's own rounding (which is (n-1) * 2^-53 * sum|x|).
 * float32 results are rounded once from the exact sum (no double rounding).
 *
 * SPECIAL VALUES. +0 and -0 contribute nothing; an exactly zero sum is +0
 * (as the old rank-ordered sum starting from 0.0). Any NaN term, or both
 * +inf and -inf, gives NaN (the quiet default NaN; payloads are not kept);
 * otherwise an infinite term gives that infinity. A finite sum beyond the
 * format's range rounds to +-inf as IEEE arithmetic would. */
#include "exact_sum.h"

#include <math.h>
#include <string.h>

enum { W = 38, TAG_CTRL = 63, F_PINF = 1, F_NINF = 2, F_NAN = 4 };
#define DIGIT_MASK ((UINT64_C(1) << W) - 1)
#define FLAG_BITS (INT64_C(7) << 6)

/* Bits [0, W) of m * 2^shift. */
static inline int64_t digit(uint64_t m, int shift) {
  if (shift >= 0) return shift < 64 ? (int64_t)((m << shift) & DIGIT_MASK) : 0;
  return -shift < 64 ? (int64_t)((m >> -shift) & DIGIT_MASK) : 0;
}

static inline int64_t pack0(int64_t top_sum, int64_t flags, int tag) {
  return (int64_t)(((uint64_t)top_sum << 9) | (uint64_t)flags | (uint64_t)tag);
}

static inline sbn_xbin encode1(double x) {
  uint64_t u;
  memcpy(&u, &x, sizeof u);
  const int neg = (int)(u >> 63), e = (int)((u >> 52) & 0x7ff);
  uint64_t m = u & ((UINT64_C(1) << 52) - 1);
  sbn_xbin r = {{0, 0, 0}};
  if (e == 0x7ff) {
    r.w[0] = (int64_t)(m ? F_NAN : neg ? F_NINF : F_PINF) << 6;
    return r;
  }
  int s; /* bit position of m's last bit, in units of 2^-1074 */
  if (e == 0) {
    if (!m) return r;
    s = 0;
  } else {
    m |= UINT64_C(1) << 52;
    s = e - 1;
  }
  const int T = (s + 63 - __builtin_clzll(m)) / W;
  int64_t d0 = digit(m, s - T * W), d1 = digit(m, s - (T - 1) * W), d2 = digit(m, s - (T - 2) * W);
  if (neg) d0 = -d0, d1 = -d1, d2 = -d2;
  r.w[0] = pack0(d0, 0, T + 1);
  r.w[1] = d1;
  r.w[2] = d2;
  return r;
}

static inline void merge1(sbn_xbin *o, const sbn_xbin *a) {
  const int64_t o0 = o->w[0], a0 = a->w[0];
  const int to = (int)(o0 & 63), ta = (int)(a0 & 63);
  if (to == TAG_CTRL) {
    int64_t so = o0 >> 9, sa = a0 >> 9;
    o->w[0] = pack0(so > sa ? so : sa, 0, TAG_CTRL);
    if ((uint64_t)a->w[1] < (uint64_t)o->w[1]) o->w[1] = a->w[1];
    if ((uint64_t)a->w[2] > (uint64_t)o->w[2]) o->w[2] = a->w[2];
    return;
  }
  const int64_t flags = (o0 | a0) & FLAG_BITS;
  if (ta == 0) { /* a holds no finite nonzero term */
    o->w[0] = o0 | flags;
    return;
  }
  if (to == 0) {
    o->w[0] = a0 | flags;
    o->w[1] = a->w[1];
    o->w[2] = a->w[2];
    return;
  }
  int64_t s0 = o0 >> 9, s1 = o->w[1], s2 = o->w[2];
  int64_t t0 = a0 >> 9, t1 = a->w[1], t2 = a->w[2];
  int top = to;
  if (ta > to) { /* align to the larger top: swap roles */
    int64_t x;
    x = s0, s0 = t0, t0 = x;
    x = s1, s1 = t1, t1 = x;
    x = s2, s2 = t2, t2 = x;
    top = ta;
  }
  switch (top - (ta > to ? to : ta)) {
    case 0: s0 += t0, s1 += t1, s2 += t2; break;
    case 1: s1 += t0, s2 += t1; break;
    case 2: s2 += t0; break;
    default: break; /* entirely below the window */
  }
  o->w[0] = pack0(s0, flags, top);
  o->w[1] = s1;
  o->w[2] = s2;
}

/* round(v / 2^k) to nearest, ties to even; `sticky`: nonzero bits below v. */
static inline uint64_t round_shift(unsigned __int128 v, int k, int sticky) {
  if (k <= 0) return (uint64_t)v;
  if (k > 128) return 0; /* v < 2^128 <= half */
  unsigned __int128 q = k == 128 ? 0 : v >> k;
  unsigned __int128 rem = k == 128 ? v : v & ((((unsigned __int128)1) << k) - 1);
  unsigned __int128 half = ((unsigned __int128)1) << (k - 1);
  if (rem > half || (rem == half && (sticky || (q & 1)))) q++;
  return (uint64_t)q;
}

static inline int bitlen128(unsigned __int128 v) {
  uint64_t hi = (uint64_t)(v >> 64);
  return hi ? 128 - __builtin_clzll(hi) : 64 - __builtin_clzll((uint64_t)v);
}

/* The sum rounded to p significant bits (53: double, 24: float, with the
 * matching subnormal floor), as a double that holds it exactly. */
static inline double decode1(const sbn_xbin *e, int p) {
  const int64_t w0 = e->w[0];
  const int tag = (int)(w0 & 63), fl = (int)((w0 >> 6) & 7);
  if ((fl & F_NAN) || ((fl & F_PINF) && (fl & F_NINF))) return NAN;
  if (fl & F_PINF) return INFINITY;
  if (fl & F_NINF) return -INFINITY;
  if (tag == 0 || tag == TAG_CTRL) return 0.0;
  const int T = tag - 1;
  /* Carry-normalize: value = s0 * 2^76 + lo with 0 <= lo < 2^76 (units of
   * 2^(38(T-2)) * 2^-1074). */
  int64_t s0 = w0 >> 9, s1 = e->w[1], s2 = e->w[2];
  int64_t c = s2 >> W; /* floor division (arithmetic shift) */
  s2 -= c * (INT64_C(1) << W);
  s1 += c;
  c = s1 >> W;
  s1 -= c * (INT64_C(1) << W);
  s0 += c;
  unsigned __int128 lo = ((unsigned __int128)(uint64_t)s1 << W) | (uint64_t)s2;
  const int neg = s0 < 0;
  uint64_t hi = (uint64_t)s0;
  if (neg) { /* |s0 * 2^76 + lo| = (-s0 - 1) * 2^76 + (2^76 - lo) */
    hi = (uint64_t)(-(s0 + 1));
    lo = (((unsigned __int128)1) << 76) - lo;
    if (lo >> 76) lo = 0, hi++;
  }
  if (!hi && !lo) return 0.0;
  const int base = W * (T - 2); /* bit position of lo's bit 0, units of 2^-1074 */
  if (T >= 4 && hi < (UINT64_C(1) << 51)) {
    /* Fast path: the magnitude fits 128 bits and its scale 2^(base-1074) is
     * a normal double, so one correctly rounded integer conversion and an
     * exact scaling give the result (an overflow rounds to inf, as it
     * should). float: the same from a correctly rounded float conversion,
     * when the result is a normal float (else the general path below). */
    const unsigned __int128 v = ((unsigned __int128)hi << 76) | lo;
    const double mag = sbn_xsum_round_u128(v, p, base - 1074);
    if (p == 53 || mag >= 0x1p-126) return neg ? -mag : mag;
  }
  const int rmin = (p == 53 ? 0 : 1074 - 149) - base; /* smallest subnormal's bit */
  unsigned __int128 v;
  int off = 0, sticky = 0;
  if (hi < (UINT64_C(1) << 51)) {
    v = ((unsigned __int128)hi << 76) | lo;
  } else { /* >= 2^127: drop 64 low bits into the sticky bit (rounding is far above) */
    v = ((unsigned __int128)hi << 12) | (lo >> 64);
    sticky = (uint64_t)lo != 0;
    off = 64;
  }
  int r = bitlen128(v) + off - p; /* lowest kept bit */
  if (r < rmin) r = rmin;
  const uint64_t q = r <= off ? (uint64_t)v /* exact: fewer than p bits (off is 0 here) */
                              : round_shift(v, r - off, sticky);
  const double mag = ldexp((double)q, base + (r > off ? r : off) - 1074);
  return neg ? -mag : mag;
}

void sbn_xsum_encode_f64(sbn_xbin *out, const double *x, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = encode1(x[i]);
}

void sbn_xsum_encode_f32(sbn_xbin *out, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = encode1((double)x[i]);
}

void sbn_xsum_merge(sbn_xbin *inout, const sbn_xbin *in, size_t n) {
  for (size_t i = 0; i < n; i++) merge1(&inout[i], &in[i]);
}

void sbn_xsum_add(sbn_xbin *acc, double x) {
  const sbn_xbin t = encode1(x);
  merge1(acc, &t);
}

void sbn_xsum_decode_f64(double *out, const sbn_xbin *in, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = decode1(&in[i], 53);
}

void sbn_xsum_decode_f32(float *out, const sbn_xbin *in, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = (float)decode1(&in[i], 24);
}

double sbn_xsum_round(const sbn_xbin *e, int p) { return decode1(e, p); }

sbn_xbin sbn_xsum_make(int T, int64_t s0, int64_t s1, int64_t s2) {
  return (sbn_xbin){{pack0(s0, 0, T + 1), s1, s2}};
}

int sbn_xsum_top(const sbn_xbin *e) {
  const int tag = (int)(e->w[0] & 63);
  return tag == 0 || tag == TAG_CTRL ? -1 : tag - 1;
}

sbn_xbin sbn_xsum_ctrl(uint64_t hash, int status) {
  sbn_xbin e;
  e.w[0] = pack0(status > 0 ? status : 0, 0, TAG_CTRL);
  e.w[1] = e.w[2] = (int64_t)hash;
  return e;
}

int sbn_xsum_ctrl_read(const sbn_xbin *e, int *status) {
  *status = (int)(e->w[0] >> 9);
  return e->w[1] == e->w[2];
}
