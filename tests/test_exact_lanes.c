/* The integer-lane form of the exact sum (src/comm/exact_lanes.c), against
 * the binned sum it stands in for (src/comm/exact_sum.c, itself checked
 * against a big-integer reference in test_exact_sum):
 *
 *  1. Same bits: whenever every term fits the agreed window, the lane sum
 *     decodes (float64 and float32) to exactly the binned sum's bits, for
 *     windows at, above and below the largest term's top bin, in any order.
 *  2. Fit is exact: a term said to fit round-trips bit for bit through its
 *     lanes; a term said not to fit really has a bit outside the window
 *     (checked independently with frexp), or is inf/NaN.
 *  3. Adversarial mixes: every exponent from subnormal to DBL_MAX,
 *     cancellation to zero and to a tiny remainder, integer-valued terms
 *     (trailing zeros), signed zeros, up to SBN_XLANES_MAX_TERMS terms of
 *     the largest digits (the headroom).
 * Prints the counts; exits non-zero on any failure. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/comm/exact_lanes.h"
#include "testutil.h"

static int failures;
#define FAIL(...) (fprintf(stderr, "FAIL: " __VA_ARGS__), failures++)

/* A term of the given binary exponent (x in [2^e, 2^(e+1)), clamped to
 * the double range), random sign and mantissa; some with trailing zeros. */
static double term(rng *r, int e) {
  if (e > 1023) e = 1023;
  double m = 1.0 + rng_uniform(r);
  if (rng_int(r, 0, 3) == 0) m = 1.0 + (double)rng_int(r, 0, 255) / 256.0; /* few low bits */
  double x = ldexp(m, e);
  return rng_int(r, 0, 1) ? -x : x;
}

/* Independent fit check: all bits of x within [38(T-2), 38(T+1)) in units
 * of 2^-1074. */
static int fits_ref(double x, int T) {
  if (!isfinite(x)) return 0;
  if (x == 0) return 1;
  int e;
  double f = frexp(fabs(x), &e); /* x = f 2^e, f in [0.5, 1) */
  const int lead = e - 1 + 1074;
  uint64_t m = (uint64_t)ldexp(f, 53); /* 53-bit integer: x = m 2^(e-53) */
  int low = e - 53 + 1074;
  while (!(m & 1)) m >>= 1, low++;
  return lead < 38 * (T + 1) && low >= 38 * (T - 2);
}

static void check_set(const double *x, size_t n, int T, size_t *same, size_t *fallback) {
  sbn_xbin acc = sbn_xsum_zero();
  for (size_t i = 0; i < n; i++) sbn_xsum_add(&acc, x[i]);
  double want64;
  float want32;
  sbn_xsum_decode_f64(&want64, &acc, 1);
  sbn_xsum_decode_f32(&want32, &acc, 1);
  int64_t sum[2] = {0, 0}, rsum[2] = {0, 0};
  size_t bad = 0;
  uint8_t top = (uint8_t)T;
  for (size_t i = 0; i < n; i++) {
    int64_t l[2];
    const size_t mis = sbn_xlanes_encode_f64(l, &x[i], &top, 1);
    bad += mis;
    if (mis != (size_t)!fits_ref(x[i], T)) FAIL("fit of %a in window %d: %zu misfits, reference says %d\n", x[i], T, mis, fits_ref(x[i], T));
    if (!mis) {
      double back;
      sbn_xlanes_decode_f64(&back, l, &top, 1);
      if (memcmp(&back, &x[i], 8) != 0 && !(x[i] == 0 && back == 0))
        FAIL("round trip of %a in window %d gives %a\n", x[i], T, back);
    }
    sum[0] += l[0], sum[1] += l[1];
  }
  for (size_t i = n; i-- > 0;) { /* reverse order: integer sums, the same lanes */
    int64_t l[2];
    sbn_xlanes_encode_f64(l, &x[i], &top, 1);
    rsum[0] += l[0], rsum[1] += l[1];
  }
  if (memcmp(sum, rsum, sizeof sum) != 0) FAIL("lane sums depend on the order\n");
  if (sbn_xlanes_misfits_f64(x, (uint8_t[]){top}, 0) != 0) FAIL("misfits of nothing\n");
  if (bad) {
    (*fallback)++;
    return;
  }
  double got64;
  float got32;
  sbn_xlanes_decode_f64(&got64, sum, &top, 1);
  sbn_xlanes_decode_f32(&got32, sum, &top, 1);
  if (memcmp(&got64, &want64, 8) != 0 || memcmp(&got32, &want32, 4) != 0) {
    FAIL("window %d, %zu terms: lanes give %a / %a, binned sum %a / %a\n", T, n, got64, (double)got32, want64,
         (double)want32);
    return;
  }
  (*same)++;
}

int main(void) {
  rng r = rng_seed(20261123);
  size_t same = 0, fallback = 0, sets = 0;
  double x[SBN_XLANES_MAX_TERMS];
  for (int it = 0; it < 200000; it++) {
    const size_t n = (size_t)rng_int(&r, 1, SBN_XLANES_MAX_TERMS);
    const int e0 = rng_int(&r, -1074, 1023), spread = rng_int(&r, 0, 3) ? rng_int(&r, 0, 30) : rng_int(&r, 0, 120);
    for (size_t i = 0; i < n; i++) x[i] = term(&r, e0 - rng_int(&r, 0, spread));
    switch (rng_int(&r, 0, 7)) {
      case 0: /* cancellation: the negated terms again, exactly zero */
        for (size_t i = 0; i < n / 2; i++) x[n / 2 + i] = -x[i];
        break;
      case 1: /* cancellation leaving a tiny remainder */
        if (n >= 3) {
          for (size_t i = 0; i < (n - 1) / 2; i++) x[(n - 1) / 2 + i] = -x[i];
          x[n - 1] = ldexp(x[n - 1], -rng_int(&r, 0, 40));
        }
        break;
      case 2: /* signed zeros among the terms */
        x[rng_int(&r, 0, (int)n - 1)] = rng_int(&r, 0, 1) ? 0.0 : -0.0;
        break;
      case 3: /* a non-finite term: never fits */
        if (rng_int(&r, 0, 3) == 0) x[rng_int(&r, 0, (int)n - 1)] = rng_int(&r, 0, 1) ? INFINITY : NAN;
        break;
      default:
        break;
    }
    sbn_xbin acc = sbn_xsum_zero();
    for (size_t i = 0; i < n; i++)
      if (isfinite(x[i])) sbn_xsum_add(&acc, x[i]);
    const int Ttrue = sbn_xsum_top(&acc) < 0 ? 0 : sbn_xsum_top(&acc);
    int T = Ttrue + rng_int(&r, -1, 2);
    if (T < 0) T = 0;
    if (T > 55) T = 55;
    check_set(x, n, T, &same, &fallback);
    sets++;
    if (failures > 20) break;
  }
  /* Headroom: the most terms, each the largest digits of the window. */
  for (int T = 0; T <= 55; T += 5) {
    for (int sign = -1; sign <= 1; sign += 2) {
      const double big = ldexp(1.0 - 0x1p-53, 38 * (T + 1) - 1074); /* all 53 bits just below the window top */
      for (int i = 0; i < SBN_XLANES_MAX_TERMS; i++) x[i] = isfinite(big) ? sign * big : sign * DBL_MAX;
      check_set(x, SBN_XLANES_MAX_TERMS, T, &same, &fallback);
      sets++;
    }
  }
  /* The batch entry points agree with one-at-a-time use. */
  {
    enum { N = 1000 };
    static double v[N], d[N];
    static float vf[N], df[N];
    static uint8_t tops[N];
    static int64_t lanes[2 * N];
    for (int i = 0; i < N; i++) {
      v[i] = term(&r, rng_int(&r, -1074, 1000));
      vf[i] = (float)term(&r, rng_int(&r, -149, 126));
      tops[i] = (uint8_t)((ilogb(v[i]) + 1074) / 38);
    }
    size_t mis = sbn_xlanes_encode_f64(lanes, v, tops, N);
    if (mis != sbn_xlanes_misfits_f64(v, tops, N) || mis) FAIL("batch encode: %zu misfits\n", mis);
    sbn_xlanes_decode_f64(d, lanes, tops, N);
    if (memcmp(d, v, sizeof v) != 0) FAIL("batch round trip (float64)\n");
    for (int i = 0; i < N; i++) tops[i] = (uint8_t)((ilogb(vf[i]) + 1074) / 38);
    mis = sbn_xlanes_encode_f32(lanes, vf, tops, N);
    if (mis != sbn_xlanes_misfits_f32(vf, tops, N) || mis) FAIL("batch encode (float32): %zu misfits\n", mis);
    sbn_xlanes_decode_f32(df, lanes, tops, N);
    if (memcmp(df, vf, sizeof vf) != 0) FAIL("batch round trip (float32)\n");
  }
  printf("exact lanes: %zu sets of up to %d terms: %zu fit their window and decode to the binned sum's bits, "
         "%zu have a term outside it (fallback); %d failures\n",
         sets, SBN_XLANES_MAX_TERMS, same, fallback, failures);
  return failures ? 1 : 0;
}
