/* Internal: the exact sum of exact_sum.c in two phases, for engines that can
 * only add integers and take maxima (NCCL has no user-defined reduction).
 *
 * Compiled as C (the CPU test), as C++ and as CUDA device code (the NCCL
 * backend's kernels): every function is __host__ __device__ under nvcc and
 * the host and device builds run the same statements. No __int128 to
 * floating-point conversion, no library rounding: the only floating-point
 * operations are exact (an integer below 2^53 to double, products by powers
 * of two whose results are representable), so host and device give the same
 * bits.
 *
 * THE SCHEME. For one value position over P ranks with terms x_1..x_P:
 *   phase 1  every rank computes tag(x_r) (the top bin + 1, 0 for zero, inf,
 *            NaN); the engine's MAX gives tag_max on every rank;
 *   phase 2  every rank encodes its term against the common top
 *            T = tag_max - 1: bins[k] = signed digit of x_r in bin T - k,
 *            k = 0, 1, 2, plus a count word for inf/NaN terms; the engine's
 *            integer SUM (exact, any order, any tree) adds them;
 *   decode   the summed bins and count word give the value, rounded once
 *            exactly as exact_sum.c's decode rounds.
 *
 * WHY THIS IS BITWISE THE BINNED MERGE OF exact_sum.c. In exact_sum.c a term
 * x with top bin t is encoded exactly in its bins t, t-1, t-2 (53 bits fit in
 * 38 + 76 bits below its leading bit). A merge aligns two partial sums to the
 * larger top and drops bins below it minus 2; as exact_sum.c argues, the
 * merged result over any set of terms is therefore (T_max, the exact integer
 * sum over the terms of their digits in bins T_max, T_max-1, T_max-2), the
 * digits below T_max-2 being dropped whatever the order. The fixed-top
 * encoding computes, for each term, exactly these digits:
 *   - bins above the term's own top (T_max >= b > t) hold none of its bits:
 *     its leading bit is below bit 38(t+1) <= 38b, so digit() gives 0 — the
 *     same 0 the merge adds when it shifts the term's bins down;
 *   - bins t..t-2 that lie inside the window get the same digit() as the
 *     term's own encoding (the same function of the same bits);
 *   - bins below T_max-2 are not encoded at all — the merge drops them.
 * Truncation toward zero on the magnitude, then the sign: identical in both
 * (digit() of |m|, negated for negative terms). The bins are summed as plain
 * int64 in both (|bin| < P * 2^38 <= 2^54, no overflow for P <= 65536), so
 * (T_max, sum of bins) is the same triple exact_sum.c's w[0] >> 9, w[1],
 * w[2] hold after any merge order, and the decode below is exact_sum.c's
 * decode (its exact general path; its fast path is a shortcut to the same
 * correctly rounded value). Special values: exact_sum.c ORs flags for +inf,
 * -inf and NaN terms; here each kind is counted (21 bits each, P < 2^21),
 * and a count > 0 is that flag. tests/test_xsum_fixed.c checks all of this
 * against sbn_xsum_* bit for bit. */
#ifndef SBN_EXACT_SUM_FIXED_H
#define SBN_EXACT_SUM_FIXED_H

#include <stdint.h>
#if !defined(__CUDA_ARCH__)
#include <string.h>
#endif

#if defined(__CUDACC__)
#define SBN_FX_FN static __host__ __device__ inline
#else
#define SBN_FX_FN static inline
#endif

typedef unsigned __int128 sbn_fx_u128;

#define SBN_FX_W 38
#define SBN_FX_PINF_ONE ((int64_t)1)
#define SBN_FX_NINF_ONE ((int64_t)1 << 21)
#define SBN_FX_NAN_ONE ((int64_t)1 << 42)
#define SBN_FX_COUNT_MASK (((int64_t)1 << 21) - 1)

SBN_FX_FN uint64_t sbn_fx_bits(double x) {
#if defined(__CUDA_ARCH__)
  return (uint64_t)__double_as_longlong(x);
#else
  uint64_t u;
  memcpy(&u, &x, sizeof u);
  return u;
#endif
}

SBN_FX_FN double sbn_fx_from_bits(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double((long long)u);
#else
  double x;
  memcpy(&x, &u, sizeof x);
  return x;
#endif
}

/* Leading zeros of v != 0. */
SBN_FX_FN int sbn_fx_clz64(uint64_t v) {
#if defined(__CUDA_ARCH__)
  return __clzll((long long)v);
#else
  return __builtin_clzll(v);
#endif
}

/* Bits [0, W) of m * 2^shift (exact_sum.c's digit()). */
SBN_FX_FN int64_t sbn_fx_digit(uint64_t m, int shift) {
  const uint64_t mask = ((uint64_t)1 << SBN_FX_W) - 1;
  if (shift >= 0) return shift < 64 ? (int64_t)((m << shift) & mask) : 0;
  return -shift < 64 ? (int64_t)((m >> -shift) & mask) : 0;
}

/* Split a finite nonzero double into integer significand m and the bit
 * position s of m's bit 0 in units of 2^-1074. Returns 0 for zero, inf,
 * NaN (then *kind is 0, 1 = +inf, 2 = -inf, 3 = NaN). */
SBN_FX_FN int sbn_fx_split(double x, uint64_t *m, int *s, int *neg, int *kind) {
  const uint64_t u = sbn_fx_bits(x);
  const int e = (int)((u >> 52) & 0x7ff);
  *neg = (int)(u >> 63);
  *m = u & (((uint64_t)1 << 52) - 1);
  *kind = 0;
  if (e == 0x7ff) {
    *kind = *m ? 3 : *neg ? 2 : 1;
    return 0;
  }
  if (e == 0) {
    if (!*m) return 0;
    *s = 0;
  } else {
    *m |= (uint64_t)1 << 52;
    *s = e - 1;
  }
  return 1;
}

/* Phase 1: top bin + 1 of x; 0 for +-0, inf and NaN (they add no bins). */
SBN_FX_FN int sbn_fx_tag(double x) {
  uint64_t m;
  int s = 0, neg, kind;
  if (!sbn_fx_split(x, &m, &s, &neg, &kind)) return 0;
  return (s + 63 - sbn_fx_clz64(m)) / SBN_FX_W + 1;
}

/* Phase 2: the count word of x (added over ranks). */
SBN_FX_FN int64_t sbn_fx_special(double x) {
  const uint64_t u = sbn_fx_bits(x);
  if (((u >> 52) & 0x7ff) != 0x7ff) return 0;
  if (u & (((uint64_t)1 << 52) - 1)) return SBN_FX_NAN_ONE;
  return (u >> 63) ? SBN_FX_NINF_ONE : SBN_FX_PINF_ONE;
}

/* Phase 2: x's digits in bins T, T-1, T-2 with T = tag_max - 1, where
 * tag_max >= sbn_fx_tag(x) is the maximum over all ranks (0: all zero). */
SBN_FX_FN void sbn_fx_encode(int64_t bins[3], double x, int tag_max) {
  bins[0] = bins[1] = bins[2] = 0;
  uint64_t m;
  int s = 0, neg, kind;
  if (tag_max <= 0 || !sbn_fx_split(x, &m, &s, &neg, &kind)) return;
  const int T = tag_max - 1;
  for (int k = 0; k < 3; k++) {
    const int64_t d = sbn_fx_digit(m, s - (T - k) * SBN_FX_W);
    bins[k] = neg ? -d : d;
  }
}

/* q * 2^E for an integer q < 2^64 whose value is representable (or beyond
 * the range: then +-inf as IEEE rounding gives): two exact products by
 * normal powers of two. q itself is exact as a double when it has at most 53
 * significant bits, which the decode guarantees. */
SBN_FX_FN double sbn_fx_scale(uint64_t q, int E) {
  double v = (double)q;
  while (E > 600) {
    v *= sbn_fx_from_bits((uint64_t)(600 + 1023) << 52);
    E -= 600;
  }
  while (E < -600) {
    v *= sbn_fx_from_bits((uint64_t)(-600 + 1023) << 52);
    E += 600;
  }
  return v * sbn_fx_from_bits((uint64_t)(E + 1023) << 52);
}

SBN_FX_FN int sbn_fx_bitlen128(sbn_fx_u128 v) {
  const uint64_t hi = (uint64_t)(v >> 64), lo = (uint64_t)v;
  return hi ? 128 - sbn_fx_clz64(hi) : lo ? 64 - sbn_fx_clz64(lo) : 0;
}

/* round(v / 2^k), to nearest, ties to even; `sticky`: nonzero bits below v. */
SBN_FX_FN uint64_t sbn_fx_round_shift(sbn_fx_u128 v, int k, int sticky) {
  if (k <= 0) return (uint64_t)v;
  if (k > 128) return 0;
  sbn_fx_u128 q = k == 128 ? 0 : v >> k;
  sbn_fx_u128 rem = k == 128 ? v : v & ((((sbn_fx_u128)1) << k) - 1);
  sbn_fx_u128 half = ((sbn_fx_u128)1) << (k - 1);
  if (rem > half || (rem == half && (sticky || (q & 1)))) q++;
  return (uint64_t)q;
}

/* The sum (tag_max, summed bins s0..s2, summed count word) rounded once to
 * p significant bits (53: double; 24: float, with float's subnormal floor),
 * as a double that holds it exactly. The same steps as exact_sum.c's
 * decode1 (general path). */
SBN_FX_FN double sbn_fx_decode(int tag_max, int64_t s0, int64_t s1, int64_t s2, int64_t special,
                               int p) {
  const int64_t npinf = special & SBN_FX_COUNT_MASK;
  const int64_t nninf = (special >> 21) & SBN_FX_COUNT_MASK;
  const int64_t nnan = (special >> 42) & SBN_FX_COUNT_MASK;
  if (nnan || (npinf && nninf)) return sbn_fx_from_bits(UINT64_C(0x7ff8000000000000));
  if (npinf) return sbn_fx_from_bits(UINT64_C(0x7ff0000000000000));
  if (nninf) return sbn_fx_from_bits(UINT64_C(0xfff0000000000000));
  if (tag_max <= 0) return 0.0;
  const int T = tag_max - 1;
  const int64_t one = (int64_t)1 << SBN_FX_W;
  int64_t c = s2 >> SBN_FX_W; /* floor division (arithmetic shift) */
  s2 -= c * one;
  s1 += c;
  c = s1 >> SBN_FX_W;
  s1 -= c * one;
  s0 += c;
  sbn_fx_u128 lo = ((sbn_fx_u128)(uint64_t)s1 << SBN_FX_W) | (uint64_t)s2;
  const int neg = s0 < 0;
  uint64_t hi = (uint64_t)s0;
  if (neg) { /* |s0 * 2^76 + lo| = (-s0 - 1) * 2^76 + (2^76 - lo) */
    hi = (uint64_t)(-(s0 + 1));
    lo = (((sbn_fx_u128)1) << 76) - lo;
    if (lo >> 76) lo = 0, hi++;
  }
  if (!hi && !lo) return 0.0;
  const int base = SBN_FX_W * (T - 2);
  const int rmin = (p == 53 ? 0 : 1074 - 149) - base;
  sbn_fx_u128 v;
  int off = 0, sticky = 0;
  if (hi < ((uint64_t)1 << 51)) {
    v = ((sbn_fx_u128)hi << 76) | lo;
  } else { /* >= 2^127: 64 low bits go into the sticky bit */
    v = ((sbn_fx_u128)hi << 12) | (lo >> 64);
    sticky = (uint64_t)lo != 0;
    off = 64;
  }
  int r = sbn_fx_bitlen128(v) + off - p; /* lowest kept bit */
  if (r < rmin) r = rmin;
  const uint64_t q = r <= off ? (uint64_t)v : sbn_fx_round_shift(v, r - off, sticky);
  const double mag = sbn_fx_scale(q, base + (r > off ? r : off) - 1074);
  return neg ? -mag : mag;
}

#endif
