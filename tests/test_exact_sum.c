/* The exact summation behind every all-reduce (src/comm/exact_sum.c),
 * checked against an independent exact reference: a plain fixed-point big
 * integer over the whole double range (units of 2^-1075, bit by bit).
 *
 *  1. Correct rounding (float64 and float32 results) when no term lies more
 *     than 2^24 below the largest: |exact - result| <= half the spacing of
 *     the result towards the exact sum, ties to even.
 *  2. The documented bound for any mix of magnitudes (huge and tiny terms,
 *     adversarial cancellation): |exact - result| <= ulp/2 + n 2^-76 max|x|.
 *  3. Order independence: random permutations and random merge trees give
 *     the same 24 bytes and the same decoded bits.
 *  4. Special values: signed zeros, +-inf, NaN, overflow to inf,
 *     subnormals, single terms (exact round trip of random bit patterns),
 *     and the headroom limit (65536 terms of the largest digits).
 *  5. The two-term shortcut (sbn_xsum_pair_*, the threads backend's path for
 *     two ranks) gives the general path's bits wherever it applies.
 *  6. The bulk two-term sums (sbn_xsum_pair_sum_*, the MPI backend's path
 *     for two ranks) give the general path's bits for every pair, in place
 *     too: blocks of ordinary pairs (the vectorized shortcut) and blocks
 *     with one special pair among them (pair by pair).
 * Prints the worst errors; exits non-zero on any failure. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/comm/exact_lanes.h"
#include "../src/comm/exact_sum.h"
#include "testutil.h"

enum { NL = 76 }; /* 32-bit limbs: 2432 bits >= 2099 + log2(terms) + sign */
typedef struct kacc { int64_t l[NL]; } kacc;
static int failures;
#define FAIL(...) (fprintf(stderr, "FAIL: " __VA_ARGS__), failures++)

static void k_norm(kacc *k) {
  for (int i = 0; i < NL - 1; i++) {
    int64_t c = k->l[i] >> 32; /* floor */
    k->l[i] -= c * (INT64_C(1) << 32);
    k->l[i + 1] += c;
  }
}
/* k += s * x (x finite, s = +-1), in units of 2^-1075. */
static void k_add(kacc *k, double x, int s) {
  if (x == 0) return;
  int e;
  double f = frexp(fabs(x), &e);
  uint64_t m = (uint64_t)ldexp(f, 53);
  int pos = e - 53 + 1075;
  if (pos < 0) m >>= -pos, pos = 0; /* only trailing zeros go */
  if (x < 0) s = -s;
  for (int b = 0; b < 64; b++)
    if (m >> b & 1) k->l[(pos + b) / 32] += s * (INT64_C(1) << ((pos + b) % 32)); /* (no shift of a negative) */
  if (k->l[0] > (INT64_C(1) << 60) || k->l[0] < -(INT64_C(1) << 60)) k_norm(k);
}
/* Sign of k (normalized on return). */
static int k_sign(kacc *k) {
  k_norm(k);
  if (k->l[NL - 1] < 0) return -1;
  for (int i = NL - 1; i >= 0; i--)
    if (k->l[i]) return 1;
  return 0;
}
/* |k| compared with 2^p (units of 2^-1075): -1, 0, 1. */
static int k_cmp_pow2(kacc *k, int p) {
  kacc a = *k;
  if (k_sign(&a) < 0)
    for (int i = 0; i < NL; i++) a.l[i] = -a.l[i];
  kacc b;
  memset(&b, 0, sizeof b);
  b.l[p / 32] = INT64_C(1) << (p % 32);
  for (int i = 0; i < NL; i++) a.l[i] -= b.l[i];
  return k_sign(&a);
}
static int exp2_of(double pow2) { /* pow2 = 2^e, e >= -1074 */
  int e;
  frexp(pow2, &e);
  return e - 1;
}

/* Is r (a float64 or float32 result of the terms) the correctly rounded sum? */
static int correctly_rounded(const double *x, size_t n, double r, int is_float) {
  kacc k;
  memset(&k, 0, sizeof k);
  for (size_t i = 0; i < n; i++) k_add(&k, x[i], 1);
  k_add(&k, r, -1); /* D = S - r */
  int sd = k_sign(&k);
  if (sd == 0) return 1;
  double toward = sd > 0 ? INFINITY : -INFINITY;
  double gap = is_float ? fabs((double)nextafterf((float)r, (float)toward) - r) : fabs(nextafter(r, toward) - r);
  int c = k_cmp_pow2(&k, exp2_of(gap) - 1 + 1075); /* |D| vs gap/2 */
  if (c < 0) return 1;
  if (c > 0) return 0;
  double m = is_float ? ldexp(frexp(r, &(int){0}), 24) : ldexp(frexp(r, &(int){0}), 53);
  return fmod(m, 2.0) == 0; /* tie: even mantissa */
}

/* |S - r| <= ulp(r)/2 + n 2^-76 max|x| (checked as: |D| <= ulp(r) + n 2^(38(T-2)))
 * where T is the top bin of the largest term. Returns the error in units of
 * max|x| * 2^-53 for the report, or -1 on violation. */
static double within_bound(const double *x, size_t n, double r) {
  kacc k;
  memset(&k, 0, sizeof k);
  double mx = 0;
  for (size_t i = 0; i < n; i++) k_add(&k, x[i], 1), mx = fmax(mx, fabs(x[i]));
  k_add(&k, r, -1);
  if (mx == 0) return k_sign(&k) == 0 ? 0 : -1;
  int e;
  frexp(mx, &e);
  const int lead = e - 1 + 1074, T = lead / 38; /* lead bit, units of 2^-1074 */
  kacc b = k;
  if (k_sign(&b) < 0)
    for (int i = 0; i < NL; i++) b.l[i] = -b.l[i];
  double ulp = fabs(nextafter(r, INFINITY) - r);
  k_add(&b, ulp, -1);
  for (size_t i = 0; i < n; i++) /* n * 2^(38(T-2)) in 2^-1074 units = 2^(38(T-2)+1) in ours */
    if (38 * (T - 2) >= 0) b.l[(38 * (T - 2) + 1) / 32] -= INT64_C(1) << ((38 * (T - 2) + 1) % 32);
  if (k_sign(&b) > 0) return -1;
  /* the error itself, roughly, for the report */
  double err = fabs((double)(long double)0);
  long double v = 0;
  for (int i = NL - 1; i >= 0; i--) v = v * 4294967296.0L + (long double)k.l[i];
  err = fabs((double)(v * powl(2.0L, -1075)));
  return err / (mx * 0x1p-53);
}

static double xsum(const double *x, size_t n) {
  sbn_xbin acc = sbn_xsum_zero();
  for (size_t i = 0; i < n; i++) sbn_xsum_add(&acc, x[i]);
  double r;
  sbn_xsum_decode_f64(&r, &acc, 1);
  return r;
}
static float xsumf(const double *x, size_t n) {
  sbn_xbin acc = sbn_xsum_zero();
  for (size_t i = 0; i < n; i++) sbn_xsum_add(&acc, x[i]);
  float r;
  sbn_xsum_decode_f32(&r, &acc, 1);
  return r;
}

/* A random merge tree over encoded terms (what MPI's algorithms do). */
static sbn_xbin tree_sum(sbn_xbin *t, size_t n, rng *r) {
  while (n > 1) {
    size_t i = (size_t)rng_int(r, 0, (int)n - 1), j = (size_t)rng_int(r, 0, (int)n - 2);
    if (j >= i) j++;
    if (rng_uniform(r) < 0.5) sbn_xsum_merge(&t[i], &t[j], 1);
    else sbn_xsum_merge(&t[j], &t[i], 1), t[i] = t[j];
    t[j] = t[n - 1];
    n--;
  }
  return t[0];
}

static void check_special(const char *name, const double *x, size_t n, double want) {
  double r = xsum(x, n);
  int ok = isnan(want) ? isnan(r) : memcmp(&r, &want, 8) == 0;
  printf("%-4s special %-34s -> %-12g (expected %g%s)\n", ok ? "ok" : "FAIL", name, r, want,
         want == 0 && !signbit(want) ? ", +0" : "");
  if (!ok) failures++;
}

int main(void) {
  rng r = rng_seed(4242);
  enum { MAXN = 4096 };
  double *x = malloc(sizeof(double) * 65536);
  sbn_xbin *t = malloc(sizeof(sbn_xbin) * 65536);

  /* 1. correct rounding, magnitudes within 2^24 of each other */
  int cases = 0, bad64 = 0, bad32 = 0;
  for (int c = 0; c < 3000; c++) {
    size_t n = (size_t)rng_int(&r, 1, 64);
    int e0 = c % 5 == 0 ? rng_int(&r, -120, 100) : rng_int(&r, -1000, 1000); /* float32 cases in range */
    for (size_t i = 0; i < n; i++) {
      x[i] = ldexp(rng_uniform(&r) + 0.5, e0 + rng_int(&r, -23, 0)) * (rng_uniform(&r) < 0.5 ? -1 : 1);
      if (c % 3 == 0 && i % 2 == 1) x[i] = -x[i - 1] * (1 + ldexp(1, -40)); /* near-cancelling pairs */
      if (c % 5 == 0) x[i] = (float)x[i];
    }
    if (c % 7 == 0 && n > 1) x[n - 1] = -x[0]; /* exact cancellation of one term */
    cases++;
    bad64 += !correctly_rounded(x, n, xsum(x, n), 0);
    float f = xsumf(x, n);
    if (isfinite(f)) bad32 += !correctly_rounded(x, n, (double)f, 1);
  }
  printf("%-4s correct rounding: %d sums of 1-64 terms within 2^24 of the largest: %d float64 and %d float32 "
         "results not correctly rounded (must be 0)\n", bad64 || bad32 ? "FAIL" : "ok", cases, bad64, bad32);
  failures += bad64 + bad32;

  /* 2. the bound, any magnitudes */
  double worst = 0;
  int bound_bad = 0;
  for (int c = 0; c < 2000; c++) {
    size_t n = (size_t)rng_int(&r, 2, 200);
    for (size_t i = 0; i < n; i++) {
      x[i] = ldexp(rng_uniform(&r) - 0.5, rng_int(&r, -1070, 1020) / (c % 4 == 0 ? 1 : 16));
      if (c % 3 == 0 && i >= 2 && rng_uniform(&r) < 0.5) x[i] = -x[i - 2]; /* adversarial cancellation */
    }
    double e = within_bound(x, n, xsum(x, n));
    if (e < 0) bound_bad++;
    else worst = fmax(worst, e);
  }
  /* classic cancellation cases */
  double canc[][4] = {{1e16, 1, -1e16, 0}, {0x1p100, 0x1p-1000, -0x1p100, 0}, {1, 0x1p-60, -1, 0}, {DBL_MAX, -DBL_MAX, 0x1p-1074, 0}};
  for (int c = 0; c < 4; c++) {
    double e = within_bound(canc[c], 3, xsum(canc[c], 3));
    printf("     cancellation {%g, %g, %g} -> %g (error %.3g x 2^-53 max|x|)\n", canc[c][0], canc[c][1], canc[c][2],
           xsum(canc[c], 3), e);
    if (e < 0) bound_bad++;
  }
  printf("%-4s error bound |S - r| <= ulp/2 + n 2^-76 max|x|: 2004 sums over the whole range, %d violations; "
         "worst error %.3g x 2^-53 max|x|\n", bound_bad ? "FAIL" : "ok", bound_bad, worst);
  failures += bound_bad;

  /* 3. order independence */
  int order_bad = 0;
  for (int c = 0; c < 300; c++) {
    size_t n = (size_t)rng_int(&r, 2, 300);
    for (size_t i = 0; i < n; i++) x[i] = ldexp(rng_normal(&r), rng_int(&r, -200, 200) / (c % 2 ? 1 : 20));
    sbn_xsum_encode_f64(t, x, n);
    sbn_xbin ref = tree_sum(t, n, &r);
    double dref;
    sbn_xsum_decode_f64(&dref, &ref, 1);
    for (int k = 0; k < 8; k++) {
      for (size_t i = n - 1; i > 0; i--) { /* shuffle */
        size_t j = (size_t)rng_int(&r, 0, (int)i);
        double s = x[i];
        x[i] = x[j], x[j] = s;
      }
      sbn_xsum_encode_f64(t, x, n);
      sbn_xbin got = k % 2 ? tree_sum(t, n, &r) : (sbn_xbin){{0}};
      if (k % 2 == 0) {
        got = sbn_xsum_zero();
        for (size_t i = 0; i < n; i++) sbn_xsum_add(&got, x[i]);
      }
      double d;
      sbn_xsum_decode_f64(&d, &got, 1);
      if (memcmp(&got, &ref, sizeof got) || memcmp(&d, &dref, 8)) order_bad++;
    }
  }
  printf("%-4s order independence: 300 sums x 8 permutations/merge trees: %d differ in any bit (must be 0)\n",
         order_bad ? "FAIL" : "ok", order_bad);
  failures += order_bad;

  /* 4. special values */
  check_special("-0 + -0", (double[]){-0.0, -0.0}, 2, 0.0);
  check_special("no terms", x, 0, 0.0);
  check_special("1 + -1", (double[]){1, -1}, 2, 0.0);
  check_special("+inf + 1", (double[]){INFINITY, 1}, 2, INFINITY);
  check_special("-inf + 1e308", (double[]){-INFINITY, 1e308}, 2, -INFINITY);
  check_special("+inf + -inf", (double[]){INFINITY, -INFINITY}, 2, NAN);
  check_special("NaN + 1", (double[]){NAN, 1}, 2, NAN);
  check_special("DBL_MAX + DBL_MAX (overflow)", (double[]){DBL_MAX, DBL_MAX}, 2, INFINITY);
  check_special("-DBL_MAX - DBL_MAX", (double[]){-DBL_MAX, -DBL_MAX}, 2, -INFINITY);
  check_special("DBL_MAX + DBL_MAX - DBL_MAX", (double[]){DBL_MAX, DBL_MAX, -DBL_MAX}, 3, DBL_MAX);
  check_special("2^-1074 + 2^-1074", (double[]){0x1p-1074, 0x1p-1074}, 2, 0x1p-1073);
  check_special("min normal - 2^-1074", (double[]){DBL_MIN, -0x1p-1074}, 2, DBL_MIN - 0x1p-1074);
  check_special("1 + 2^-53 (tie, to even)", (double[]){1, 0x1p-53}, 2, 1.0);
  check_special("1 + 2^-53 + 2^-80 (above tie)", (double[]){1, 0x1p-53, 0x1p-80}, 3, 1 + 0x1p-52);
  { /* float32: rounded once from the exact sum, not via float64 */
    double y[] = {1, 0x1p-24, 0x1p-60};
    float f = xsumf(y, 3);
    int ok = f == 1 + 0x1p-23f;
    printf("%-4s special float32 1 + 2^-24 + 2^-60 -> %a (expected %a: one rounding)\n", ok ? "ok" : "FAIL", f, 1 + 0x1p-23f);
    failures += !ok;
  }
  int trip_bad = 0;
  for (int i = 0; i < 200000; i++) { /* single terms: exact round trip */
    uint64_t u = rng_u64(&r) ^ (uint64_t)i;
    double v, back;
    memcpy(&v, &u, 8);
    if (!isfinite(v) || v == 0) continue;
    sbn_xbin e;
    sbn_xsum_encode_f64(&e, &v, 1);
    sbn_xsum_decode_f64(&back, &e, 1);
    trip_bad += memcmp(&v, &back, 8) != 0;
  }
  printf("%-4s single terms: 200000 random bit patterns (incl. subnormals) round-trip exactly: %d wrong\n",
         trip_bad ? "FAIL" : "ok", trip_bad);
  failures += trip_bad;
  { /* headroom: 65536 terms whose digits are all at their maximum */
    const size_t n = SBN_XSUM_MAX_TERMS;
    double big = ldexp(1.0 - 0x1p-53, 38 * 20 - 1074 + 38); /* top digit 2^38 - 1 */
    for (size_t i = 0; i < n; i++) x[i] = big; /* top bins sum to 2^16 (2^38 - 1) < 2^54 */
    double e = within_bound(x, n, xsum(x, n));
    printf("%-4s headroom: %zu terms of maximal digits: error %.3g x 2^-53 max|x| (bound ok: %s)\n",
           e < 0 ? "FAIL" : "ok", n, e, e < 0 ? "no" : "yes");
    failures += e < 0;
  }
  { /* control elements: min/max hash, max status */
    sbn_xbin a = sbn_xsum_ctrl(77, 0), b = sbn_xsum_ctrl(77, 3), c = sbn_xsum_ctrl(78, 0);
    int st;
    sbn_xsum_merge(&a, &b, 1);
    int same = sbn_xsum_ctrl_read(&a, &st);
    int ok = same && st == 3;
    sbn_xsum_merge(&a, &c, 1);
    ok = ok && !sbn_xsum_ctrl_read(&a, &st) && st == 3;
    printf("%-4s control element: equal hashes agree, a different one disagrees, status is the max\n", ok ? "ok" : "FAIL");
    failures += !ok;
  }
  { /* 5. two terms: the shortcut against the general path, bit for bit */
    int taken64 = 0, taken32 = 0, bad = 0, n = 0;
    for (int i = 0; i < 400000; i++, n++) {
      double a, b;
      if (i % 4 == 0) { /* random bit patterns: zeros, subnormals, inf, NaN, huge */
        uint64_t ua = rng_u64(&r), ub = rng_u64(&r);
        if (i % 8 == 0) ub = (ub & ~(UINT64_C(0x7ff) << 52)) | (ua & (UINT64_C(0x7ff) << 52)); /* same exponent */
        memcpy(&a, &ua, 8), memcpy(&b, &ub, 8);
      } else { /* exponents 0-30 apart (around the shortcut's limit of 22), ties, cancellation */
        a = ldexp(1 + rng_uniform(&r), rng_int(&r, -1020, 1020));
        b = ldexp(1 + rng_uniform(&r), ilogb(a) - rng_int(&r, 0, 30)) * (rng_uniform(&r) < 0.5 ? -1 : 1);
        if (i % 5 == 1) b = ldexp(1, ilogb(a) - 53 + rng_int(&r, 0, 2)) * (1 + ldexp(rng_int(&r, 0, 3), -52)); /* near ties */
        if (i % 7 == 2) b = -a * (1 + ldexp(rng_int(&r, -3, 3), -52)); /* cancellation */
        if (i % 11 == 3) a = DBL_MAX * (1 - rng_uniform(&r) * 0x1p-20), b = fabs(b) + ldexp(1, 1000); /* overflow */
      }
      double two[2] = {a, b}, got, want = xsum(two, 2);
      if (sbn_xsum_pair_f64(a, b, &got)) {
        taken64++;
        if (memcmp(&got, &want, 8)) {
          if (bad++ < 5) fprintf(stderr, "FAIL pair f64 %a + %a: shortcut %a, general %a\n", a, b, got, want);
        }
      }
      int k = i % 4 == 0 || !isfinite(a) ? 0 : rng_int(&r, -125, 125) - ilogb(a); /* same shift: float range */
      float fa = (float)ldexp(a, k), fb = (float)ldexp(b, k), fgot;
      double twof[2] = {fa, fb};
      float fwant = xsumf(twof, 2);
      if (sbn_xsum_pair_f32(fa, fb, &fgot)) {
        taken32++;
        if (memcmp(&fgot, &fwant, 4)) {
          if (bad++ < 5) fprintf(stderr, "FAIL pair f32 %a + %a: shortcut %a, general %a\n", fa, fb, fgot, fwant);
        }
      }
    }
    int ok = bad == 0 && taken64 > n / 4 && taken32 > n / 4;
    printf("%-4s two-term shortcut: %d pairs, taken %d (float64) and %d (float32) times, %d results differ from the "
           "general path (must be 0; taken more than a quarter of the time)\n", ok ? "ok" : "FAIL", n, taken64, taken32,
           bad);
    failures += !ok;
  }
  { /* 6. bulk two-term sums against the general path, pair by pair */
    enum { N = 200003 };
    double *a = malloc(8 * N), *b = malloc(8 * N), *o = malloc(8 * N);
    float *fa = malloc(4 * N), *fb = malloc(4 * N), *fo = malloc(4 * N);
    size_t nbad64 = 0, nbad32 = 0, fast = 0;
    for (size_t i = 0; i < N; i++) {
      /* blocks of 64: 0 ordinary pairs and signed zeros only; 1 near ties whose deciding bit
       * lies beyond the binned window (exponents 51-53 apart: the shortcut
       * must not take them), nothing special; 2 special values too */
      /* 3: a layer's statistics: every term of the block within 18 binades
       * (the block-wide test of the vector variants passes), zeros too;
       * 4: the same with one near tie 51-53 binades apart, which that test
       * must refuse (the pair goes the general way) */
      const int block = (int)(i / 64 % 5);
      const int narrow = block >= 3;
      double p = ldexp(1 + rng_uniform(&r), narrow ? rng_int(&r, -5, 5) : rng_int(&r, -1000, 1000)) *
                 (rng_uniform(&r) < 0.5 ? -1 : 1);
      double y = ldexp(rng_normal(&r), ilogb(p) - rng_int(&r, 0, block == 2 ? 40 : narrow ? 8 : 20));
      if (narrow && rng_uniform(&r) < 0.1) y = rng_uniform(&r) < 0.5 ? 0.0 : -0.0;
      if ((block == 1 && i % 2) || (block == 4 && i % 64 == 17))
        y = ldexp(1, ilogb(p) - 53 + rng_int(&r, 0, 2)) * (1 + ldexp(rng_int(&r, 1, 3), -52));
      if (block == 2 && rng_uniform(&r) < 0.05) { /* random bit patterns: zeros, subnormals, inf, NaN, huge */
        uint64_t u = rng_u64(&r);
        memcpy(&y, &u, 8);
      }
      if (block == 2 && rng_uniform(&r) < 0.05) p = DBL_MAX, y = fabs(y) + ldexp(1, 1000); /* overflow */
      if (block == 0 && rng_uniform(&r) < 0.1) { /* a zero term, or two (-0 + -0 must give +0) */
        y = rng_uniform(&r) < 0.5 ? 0.0 : -0.0;
        if (rng_uniform(&r) < 0.3) p = rng_uniform(&r) < 0.7 ? -0.0 : 0.0;
      }
      a[i] = p, b[i] = y;
      const int k = rng_int(&r, -120, 120) - (isfinite(p) && p != 0 ? ilogb(p) : 0);
      fa[i] = (float)ldexp(p, k), fb[i] = (float)ldexp(y, k);
      if (block == 1 && i % 2) /* float near ties: a tail beyond the window of a float's terms too */
        fb[i] = (float)(ldexp(1, ilogb(fa[i]) - 24 - rng_int(&r, 20, 28)) * (1 + ldexp(rng_int(&r, 1, 3), -23)));
      if (block == 2 && i % 97 == 0) fb[i] = 0x1p-140f; /* a float subnormal */
    }
    /* every instruction-set variant of the block loops (they follow the lanes' choice) */
    double *a2 = malloc(8 * N);
    float *fb2 = malloc(4 * N);
    for (int v = 0; v < sbn_xlanes_isa_count(); v++) {
      if (!sbn_xlanes_isa_supported(v) || sbn_xlanes_set_isa(sbn_xlanes_isa_name(v)) != 0) {
        printf("skip bulk two-term sums, variant %s: not supported by this CPU\n", sbn_xlanes_isa_name(v));
        continue;
      }
      nbad64 = nbad32 = fast = 0;
      sbn_xsum_pair_sum_f64(o, a, b, N);
      sbn_xsum_pair_sum_f32(fo, fa, fb, N);
      for (size_t i = 0; i < N; i++) {
        double two[2] = {a[i], b[i]}, want = xsum(two, 2), tmp;
        double twof[2] = {fa[i], fb[i]};
        float fwant = xsumf(twof, 2);
        nbad64 += memcmp(&o[i], &want, 8) != 0;
        nbad32 += memcmp(&fo[i], &fwant, 4) != 0;
        fast += sbn_xsum_pair_f64(a[i], b[i], &tmp);
      }
      memcpy(a2, a, 8 * N), memcpy(fb2, fb, 4 * N);
      sbn_xsum_pair_sum_f64(a2, a2, b, N); /* in place */
      sbn_xsum_pair_sum_f32(fb2, fa, fb2, N);
      const int inplace_ok = memcmp(a2, o, 8 * N) == 0 && memcmp(fb2, fo, 4 * N) == 0;
      const int ok = nbad64 == 0 && nbad32 == 0 && inplace_ok && fast > N / 2;
      printf("%-4s bulk two-term sums, variant %s: %d pairs (%zu take the shortcut), %zu float64 and %zu float32 "
             "results differ from the general path (must be 0); in place: %s\n", ok ? "ok" : "FAIL",
             sbn_xlanes_isa_name(v), N, fast, nbad64, nbad32, inplace_ok ? "same" : "DIFFERENT");
      failures += !ok;
    }
    free(a), free(b), free(o), free(fa), free(fb), free(fo), free(a2), free(fb2);
  }
  free(x), free(t);
  printf("\n%s: %d failure(s)\n", failures ? "FAILED" : "exact_sum: all passed", failures);
  return failures ? 1 : 0;
}
