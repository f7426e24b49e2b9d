/* The exact sum in integer lanes for an agreed window (see exact_lanes.h
 * for the format and why its bits are the binned sum's): the scalar
 * reference, value by value with branches, which handles every case. The
 * entry points without _ref (exact_lanes_blocks.c) give its outputs bit for
 * bit, faster, and fall back to it for blocks with an unusual value. */
#include "exact_lanes.h"

#include <string.h>

enum { W = 38, D = 57 };
#define LO_MASK ((UINT64_C(1) << D) - 1)

/* The lanes of x in the window of top bin T; returns 0 if x does not fit
 * (lanes 0). Normal numbers take the straight path (their leading bit is
 * known from the exponent); zeros, subnormals, inf/NaN the general one. */
static int enc_general(int64_t *o, double x, int T) {
  uint64_t u;
  memcpy(&u, &x, sizeof u);
  const int e = (int)((u >> 52) & 0x7ff);
  uint64_t m = u & ((UINT64_C(1) << 52) - 1);
  o[0] = o[1] = 0;
  if (e == 0x7ff) return 0;
  m |= (uint64_t)(e != 0) << 52;
  if (!m) return 1;
  const int s = e - (e != 0);            /* position of m's bit 0 (units of 2^-1074) */
  const int lead = s + 63 - __builtin_clzll(m);
  const int low = s + __builtin_ctzll(m); /* lowest set bit */
  const int base = W * T - 2 * W;       /* the window's bit 0 */
  if (lead >= W * T + W || low < base) return 0;
  const unsigned __int128 v = s >= base ? (unsigned __int128)m << (s - base) : (unsigned __int128)(m >> (base - s));
  int64_t hi = (int64_t)(uint64_t)(v >> D), lo = (int64_t)((uint64_t)v & LO_MASK);
  const int64_t neg = -(int64_t)(u >> 63); /* 0 or -1: conditional negation */
  o[0] = (hi ^ neg) - neg;
  o[1] = (lo ^ neg) - neg;
  return 1;
}

static inline int enc1(int64_t *o, double x, int T) {
  uint64_t u;
  memcpy(&u, &x, sizeof u);
  const unsigned e = (unsigned)((u >> 52) & 0x7ff);
  if (e - 1 >= 0x7fe) return enc_general(o, x, T); /* zero, subnormal, inf, NaN */
  const uint64_t m = (u & ((UINT64_C(1) << 52) - 1)) | (UINT64_C(1) << 52);
  const int sh = (int)e - 1 - (W * T - 2 * W); /* m's bit 0 in the window */
  if (sh < 0 || sh > 2 * D - 53) return enc_general(o, x, T); /* low bits or top outside: rare */
  int64_t hi, lo;
  if (sh >= D) hi = (int64_t)(m << (sh - D)), lo = 0;
  else hi = (int64_t)(m >> (D - sh)), lo = (int64_t)((m << sh) & LO_MASK);
  const int64_t neg = -(int64_t)(u >> 63);
  o[0] = (hi ^ neg) - neg;
  o[1] = (lo ^ neg) - neg;
  return 1;
}

size_t sbn_xlanes_encode_ref_f64(int64_t *out, const double *x, const uint8_t *top, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += !enc1(out + 2 * i, x[i], top[i]);
  return bad;
}

size_t sbn_xlanes_encode_ref_f32(int64_t *out, const float *x, const uint8_t *top, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += !enc1(out + 2 * i, (double)x[i], top[i]);
  return bad;
}

size_t sbn_xlanes_misfits_ref_f64(const double *x, const uint8_t *top, size_t n) {
  size_t bad = 0;
  int64_t o[2];
  for (size_t i = 0; i < n; i++) bad += !enc1(o, x[i], top[i]);
  return bad;
}

size_t sbn_xlanes_misfits_ref_f32(const float *x, const uint8_t *top, size_t n) {
  size_t bad = 0;
  int64_t o[2];
  for (size_t i = 0; i < n; i++) bad += !enc1(o, (double)x[i], top[i]);
  return bad;
}

/* hi 2^57 + lo = s0 2^76 + s1 2^38 + s2 with hi = s0 2^19 + (hi mod 2^19)
 * and lo = (lo >> 38) 2^38 + (lo mod 2^38) (floor division). */
sbn_xbin sbn_xlanes_to_xbin(int64_t hi, int64_t lo, int T) {
  const int64_t s0 = hi >> 19;
  const int64_t s1 = (int64_t)(((uint64_t)hi & ((UINT64_C(1) << 19) - 1)) << 19) + (lo >> W);
  const int64_t s2 = (int64_t)((uint64_t)lo & ((UINT64_C(1) << W) - 1));
  return sbn_xsum_make(T, s0, s1, s2);
}

/* The lane sum rounded to p bits. hi 2^57 + lo is first made H 2^57 + L
 * with 0 <= L < 2^57 and H >= 0 (and a sign); its top 63 bits, with a
 * sticky bit for the rest, go through the hardware's correctly rounded
 * conversion (as sbn_xsum_round_u128, in 64-bit operations), then an exact
 * scaling. Windows in the subnormal range (T < 4) and subnormal float
 * results take the binned sum's general rounding. */
static inline double dec1(int64_t hi, int64_t lo, int T, int p) {
  if (T < 4) {
    const sbn_xbin b = sbn_xlanes_to_xbin(hi, lo, T);
    return sbn_xsum_round(&b, p);
  }
  uint64_t H = (uint64_t)(hi + (lo >> D)), L = (uint64_t)lo & LO_MASK;
  const int neg = (int64_t)H < 0;
  if (neg) { /* |H 2^57 + L| = (-H - 1) 2^57 + (2^57 - L), or -H 2^57 when L = 0 */
    H = L ? ~H : -H;
    L = L ? (UINT64_C(1) << D) - L : 0;
  }
  uint64_t t;
  int sh;
  const int k = H ? 64 - __builtin_clzll(H) : 0; /* bits of H; the magnitude has k + 57 */
  if (k <= 6) {
    if (!H && !L) return 0.0;
    t = H << D | L, sh = 0;
  } else {
    sh = k - 6;
    t = H << (63 - k) | L >> sh;
    t |= (uint64_t)((L & ((UINT64_C(1) << sh) - 1)) != 0);
  }
  double r = p == 53 ? (double)(int64_t)t : (double)(float)(int64_t)t;
  const uint64_t bits = (uint64_t)(W * T - 2 * W - 1074 + sh + 1023) << 52;
  double f;
  memcpy(&f, &bits, sizeof f);
  r *= f;
  if (p == 24 && r < 0x1p-126) { /* a subnormal float: the general path */
    const sbn_xbin b = sbn_xlanes_to_xbin(hi, lo, T);
    return sbn_xsum_round(&b, p);
  }
  return neg ? -r : r;
}

void sbn_xlanes_decode_ref_f64(double *out, const int64_t *lanes, const uint8_t *top, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = dec1(lanes[2 * i], lanes[2 * i + 1], top[i], 53);
}

void sbn_xlanes_decode_ref_f32(float *out, const int64_t *lanes, const uint8_t *top, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = (float)dec1(lanes[2 * i], lanes[2 * i + 1], top[i], 24);
}

void sbn_xlanes_tops(uint8_t *top, const sbn_xbin *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const int t = sbn_xsum_top(&s[i]);
    top[i] = (uint8_t)(t < 0 ? 0 : t);
  }
}
