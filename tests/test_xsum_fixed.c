/* The two-phase exact sum (max of tags, then integer sums of fixed-top bins:
 * src/comm/exact_sum_fixed.h, the NCCL backend's arithmetic) against the
 * binned merge of exact_sum.c, bit for bit: the same bins and the same
 * decoded double and float, over random and adversarial sets of terms
 * (mixed magnitudes over the whole exponent range, cancellation, ties,
 * infinities, NaN, signed zeros, subnormals, overflow, up to 65536 terms),
 * merged in shuffled orders. Runs on the CPU (this file also compiles as
 * C++, as the CUDA kernels include the header). Prints the evidence and
 * exits non-zero on any difference. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "../src/comm/exact_sum.h"
#ifdef __cplusplus
}
#endif
#include "../src/comm/exact_sum_fixed.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double unif(void) { return (double)(rnd() >> 11) * 0x1p-53; }
static double from_bits(uint64_t u) {
  double x;
  memcpy(&x, &u, sizeof x);
  return x;
}
static uint64_t bits(double x) {
  uint64_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}
static uint32_t fbits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

/* A term of one of several kinds. */
static double term(int kind) {
  const double sign = (rnd() & 1) ? -1.0 : 1.0;
  switch (kind) {
    case 0: return sign * unif(); /* plain */
    case 1: return sign * ldexp(1.0 + unif(), (int)(rnd() % 2046) - 1022); /* any normal */
    case 2: return from_bits(rnd() & 0x000fffffffffffffull) * sign; /* subnormal (or 0) */
    case 3: return sign * ldexp(1.0 + unif(), 1000 + (int)(rnd() % 24)); /* huge: sums overflow */
    case 4: return sign * ldexp((double)(rnd() % 8), (int)(rnd() % 200) - 100); /* small ints: ties */
    case 5: return sign * 0.0;
    case 6: return sign * ldexp(1.0 + unif(), (int)(rnd() % 160) - 80); /* 2^+-80 */
    default: return sign * ldexp(1.0 + unif(), (int)(rnd() % 40)); /* float-sized */
  }
}

static long checked, failures;

/* Sum xs[0..n) both ways and compare. */
static void compare(const double *xs, int n, const char *label) {
  /* binned merge, in a shuffled order, as a tree of pairs */
  sbn_xbin *acc = (sbn_xbin *)calloc((size_t)n + 1, sizeof *acc);
  int *perm = (int *)calloc((size_t)n + 1, sizeof *perm);
  for (int i = 0; i < n; i++) perm[i] = i;
  for (int i = n - 1; i > 0; i--) {
    int j = (int)(rnd() % (uint64_t)(i + 1)), t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
  for (int i = 0; i < n; i++) sbn_xsum_encode_f64(&acc[i], &xs[perm[i]], 1);
  for (int w = 1; w < n; w *= 2)
    for (int i = 0; i + w < n; i += 2 * w) sbn_xsum_merge(&acc[i], &acc[i + w], 1);
  sbn_xbin ref = sbn_xsum_zero();
  if (n) ref = acc[0];
  double ref64;
  float ref32;
  sbn_xsum_decode_f64(&ref64, &ref, 1);
  sbn_xsum_decode_f32(&ref32, &ref, 1);

  /* two phases: max of tags, then integer sums */
  int tag = 0;
  for (int i = 0; i < n; i++) {
    int t = sbn_fx_tag(xs[i]);
    if (t > tag) tag = t;
  }
  int64_t s[3] = {0, 0, 0}, sp = 0;
  for (int i = n - 1; i >= 0; i--) { /* another order: integers don't care */
    int64_t b[3];
    sbn_fx_encode(b, xs[i], tag);
    s[0] += b[0], s[1] += b[1], s[2] += b[2];
    sp += sbn_fx_special(xs[i]);
  }
  const double got64 = sbn_fx_decode(tag, s[0], s[1], s[2], sp, 53);
  const float got32 = (float)sbn_fx_decode(tag, s[0], s[1], s[2], sp, 24);

  checked++;
  int bad = 0;
  const int ref_tag = (int)(ref.w[0] & 63);
  if (ref_tag != tag) bad = 1;
  if (tag && ((ref.w[0] >> 9) != s[0] || ref.w[1] != s[1] || ref.w[2] != s[2])) bad = 1;
  if (bits(ref64) != bits(got64) || fbits(ref32) != fbits(got32)) bad = 1; /* NaN: same bits too */
  if (bad) {
    failures++;
    if (failures <= 10)
      printf("MISMATCH %s n=%d: tag %d/%d bins %lld %lld %lld / %lld %lld %lld, f64 %a / %a, "
             "f32 %a / %a\n",
             label, n, ref_tag, tag, (long long)(ref.w[0] >> 9), (long long)ref.w[1],
             (long long)ref.w[2], (long long)s[0], (long long)s[1], (long long)s[2], ref64, got64,
             (double)ref32, (double)got32);
  }
  free(acc);
  free(perm);
}

int main(void) {
  enum { MAXN = 65536 };
  double *xs = (double *)malloc(sizeof *xs * MAXN);
  if (!xs) return 1;

  /* hand-picked cases */
  const double inf = INFINITY, nan_ = NAN;
  struct { int n; double v[4]; const char *label; } hand[] = {
      {0, {0}, "empty"},
      {1, {-0.0}, "-0"},
      {2, {0.0, -0.0}, "+0 -0"},
      {1, {0x1p-1074}, "min subnormal"},
      {2, {0x1p-1074, -0x1p-1074}, "cancel subnormal"},
      {2, {0x1.fffffffffffffp1023, 0x1.fffffffffffffp1023}, "overflow"},
      {2, {-0x1.fffffffffffffp1023, -0x1p1023}, "negative overflow"},
      {3, {1.0, 0x1p-53, 0x1p-106}, "tie broken by sticky"},
      {2, {1.0, 0x1p-53}, "tie to even"},
      {2, {1.0 + 0x1p-52, 0x1p-53}, "tie to even up"},
      {3, {0x1p100, 1.0, -0x1p100}, "cancellation"},
      {2, {inf, 1.0}, "+inf"},
      {2, {-inf, 1.0}, "-inf"},
      {2, {inf, -inf}, "inf-inf"},
      {3, {nan_, 1.0, inf}, "nan"},
      {2, {0x1p-126, -0x1p-150}, "float subnormal boundary"},
      {2, {0x1p-149, 0x1p-151}, "float min subnormal tie"},
      {2, {0x1.fffffep127, 0x1p103}, "float overflow"},
      {2, {0x1p-1022, -0x1p-1074}, "normal to subnormal"},
      {4, {1e308, -1e308, 1e-300, 3.0}, "huge cancel"},
  };
  for (size_t i = 0; i < sizeof hand / sizeof hand[0]; i++) compare(hand[i].v, hand[i].n, hand[i].label);

  /* random sets: each kind alone and mixed, many sizes */
  char label[64];
  for (int rep = 0; rep < 200000; rep++) {
    const int n = 1 + (int)(rnd() % (rep % 10 == 0 ? 1000 : 17));
    const int mode = (int)(rnd() % 10);
    for (int i = 0; i < n; i++) xs[i] = term(mode < 8 ? mode : (int)(rnd() % 8));
    if (mode == 9 && n > 1) { /* cancellation: negate most terms of a copy */
      for (int i = 0; i + 1 < n; i += 2) xs[i + 1] = -xs[i] * (rnd() % 4 ? 1.0 : 1.0 + 0x1p-52);
    }
    if (rep % 97 == 0) xs[rnd() % (uint64_t)n] = (rnd() & 1) ? inf : -inf;
    if (rep % 211 == 0) xs[rnd() % (uint64_t)n] = nan_;
    snprintf(label, sizeof label, "random rep %d mode %d", rep, mode);
    compare(xs, n, label);
  }
  /* the largest groups: 65536 terms (the headroom limit), same sign, same
   * top bin (the top-bin field's worst case) and mixed */
  for (int rep = 0; rep < 6; rep++) {
    for (int i = 0; i < MAXN; i++)
      xs[i] = rep < 2 ? (rep ? -1.0 : 1.0) * (0x1p38 - 1.0 - (double)(rnd() % 1000))
                      : term((int)(rnd() % 8));
    snprintf(label, sizeof label, "65536 terms rep %d", rep);
    compare(xs, MAXN, label);
  }
  /* float32 inputs widened (the layer's float32 all-reduce) */
  for (int rep = 0; rep < 5000; rep++) {
    const int n = 1 + (int)(rnd() % 9);
    for (int i = 0; i < n; i++) xs[i] = (double)(float)term(7 - (int)(rnd() % 2) * 3);
    compare(xs, n, "float32 terms");
  }
  free(xs);
  printf("two-phase fixed-top sum vs binned merge: %ld sets compared (bins, double and float "
         "results bitwise), %ld mismatches\n",
         checked, failures);
  return failures ? 1 : 0;
}
