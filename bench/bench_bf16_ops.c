/* syncbn-bench-bf16-ops: what the float64 work of the bfloat16 statistics
 * costs per value on one core, in L1 (2048 values, no memory traffic).
 *
 * The channels-first statistics of 16-bit storage do, per value: widen to
 * float64 (bfloat16 -> float32 by a shift, float32 -> float64 by vcvtps2pd),
 * subtract the channel's shift, add, and add the square (one fused
 * multiply-add). This times that loop (as the kernels write it, 16 values a
 * step in four chains) against variants that move work between the adding
 * and the multiply-add pipes, a conversion-only loop, and an integer
 * widening that needs no conversion instruction (exact for finite values:
 * the bits moved into a float64 scaled by 2^-896, the scale folded into the
 * subtraction's multiply-add). Every variant's sums are checked against the
 * plain loop's (the same values in the same lanes must give the same bits),
 * so a faster variant would be a usable one. AVX2 + FMA only.
 *
 *   build/bench/syncbn-bench-bf16-ops [rounds]      (default 200) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

enum { N = 2048, REPS = 200 };
typedef void (*stats_fn)(const uint16_t *p, double sh, __m256d out[8]);

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Four values of x - sh: from 8 bfloat16 (lanes 0-3: the even ones, 4-7 the odd ones, as the kernels' loads). */
#define CVT(h) _mm256_cvtps_pd(_mm_castsi128_ps(h))
#define EVEN(a) CVT(_mm_slli_epi32(a, 16))
#define ODD(a) CVT(_mm_and_si128(a, _mm_set1_epi32((int)0xffff0000u)))
#define SUB_ADDPIPE(x, k) _mm256_sub_pd(x, k)
#define SUB_FMAPIPE(x, k) _mm256_fmsub_pd(x, _mm256_set1_pd(1.0), k)
#define ADD_ADDPIPE(s, d) _mm256_add_pd(s, d)
#define ADD_FMAPIPE(s, d) _mm256_fmadd_pd(d, _mm256_set1_pd(1.0), s)

#define STATS_LOOP(NAME, SUB, ADD)                                                                       \
  static __attribute__((noinline)) void NAME(const uint16_t *p, double sh, __m256d out[8]) {             \
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0, q0 = s0, q1 = s0, q2 = s0, q3 = s0;     \
    const __m256d vk = _mm256_set1_pd(sh);                                                                \
    for (int i = 0; i < N; i += 16) {                                                                      \
      const __m128i a = _mm_loadu_si128((const __m128i *)(p + i)), b = _mm_loadu_si128((const __m128i *)(p + i + 8)); \
      const __m256d d0 = SUB(EVEN(a), vk), d1 = SUB(ODD(a), vk), d2 = SUB(EVEN(b), vk), d3 = SUB(ODD(b), vk); \
      s0 = ADD(s0, d0), s1 = ADD(s1, d1), s2 = ADD(s2, d2), s3 = ADD(s3, d3);                             \
      q0 = _mm256_fmadd_pd(d0, d0, q0), q1 = _mm256_fmadd_pd(d1, d1, q1);                                  \
      q2 = _mm256_fmadd_pd(d2, d2, q2), q3 = _mm256_fmadd_pd(d3, d3, q3);                                  \
    }                                                                                                      \
    out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3, out[4] = q0, out[5] = q1, out[6] = q2, out[7] = q3; \
  }
STATS_LOOP(plain, SUB_ADDPIPE, ADD_ADDPIPE)
STATS_LOOP(sub_on_fma, SUB_FMAPIPE, ADD_ADDPIPE)
STATS_LOOP(add_on_fma, SUB_ADDPIPE, ADD_FMAPIPE)
STATS_LOOP(both_on_fma, SUB_FMAPIPE, ADD_FMAPIPE)

/* The conversions alone (or-ed together: no floating-point arithmetic). */
static __attribute__((noinline)) void convert_only(const uint16_t *p, double sh, __m256d out[8]) {
  (void)sh;
  __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
  for (int i = 0; i < N; i += 16) {
    const __m128i a = _mm_loadu_si128((const __m128i *)(p + i)), b = _mm_loadu_si128((const __m128i *)(p + i + 8));
    s0 = _mm256_or_pd(s0, EVEN(a)), s1 = _mm256_or_pd(s1, ODD(a));
    s2 = _mm256_or_pd(s2, EVEN(b)), s3 = _mm256_or_pd(s3, ODD(b));
  }
  const __m256d z = _mm256_setzero_pd();
  out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3, out[4] = out[5] = out[6] = out[7] = z;
}

/* Integer widening of four values: sign-extend, shift the exponent and
 * mantissa into a float64's fields, clear the three sign copies that land in
 * the exponent: the value times 2^-896, exactly (zeros and subnormals too). */
static inline __m256d widen_scaled(__m128i four) {
  const __m256i t = _mm256_slli_epi64(_mm256_cvtepi16_epi64(four), 45);
  return _mm256_castsi256_pd(_mm256_and_si256(t, _mm256_set1_epi64x((long long)0x8fffffffffffffffull)));
}
/* The lanes of `plain`: even values of each 8 in one vector, odd ones in the other. */
static inline __m128i evens(__m128i a) {
  return _mm_shuffle_epi8(a, _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
}
static __attribute__((noinline)) void integer_widening(const uint16_t *p, double sh, __m256d out[8]) {
  __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0, q0 = s0, q1 = s0, q2 = s0, q3 = s0;
  const __m256d nk = _mm256_set1_pd(-sh), scale = _mm256_set1_pd(ldexp(1.0, 896));
  for (int i = 0; i < N; i += 16) {
    const __m128i a = evens(_mm_loadu_si128((const __m128i *)(p + i)));
    const __m128i b = evens(_mm_loadu_si128((const __m128i *)(p + i + 8)));
    const __m256d d0 = _mm256_fmadd_pd(widen_scaled(a), scale, nk);
    const __m256d d1 = _mm256_fmadd_pd(widen_scaled(_mm_unpackhi_epi64(a, a)), scale, nk);
    const __m256d d2 = _mm256_fmadd_pd(widen_scaled(b), scale, nk);
    const __m256d d3 = _mm256_fmadd_pd(widen_scaled(_mm_unpackhi_epi64(b, b)), scale, nk);
    s0 = _mm256_add_pd(s0, d0), s1 = _mm256_add_pd(s1, d1), s2 = _mm256_add_pd(s2, d2), s3 = _mm256_add_pd(s3, d3);
    q0 = _mm256_fmadd_pd(d0, d0, q0), q1 = _mm256_fmadd_pd(d1, d1, q1);
    q2 = _mm256_fmadd_pd(d2, d2, q2), q3 = _mm256_fmadd_pd(d3, d3, q3);
  }
  out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3, out[4] = q0, out[5] = q1, out[6] = q2, out[7] = q3;
}

int main(int argc, char **argv) {
  const int rounds = argc > 1 ? atoi(argv[1]) : 200;
  if (rounds < 1) {
    fprintf(stderr, "usage: %s [rounds >= 1]\n", argv[0]);
    return 2;
  }
  static uint16_t x[N] __attribute__((aligned(64)));
  for (int i = 0; i < N; i++) { /* both signs, 40 binades, zeros and subnormals */
    float f = (i % 3 ? 1.0f : -1.0f) * (1.0f + (float)i * 0.37f) * ldexpf(1.0f, i % 41 - 20);
    uint32_t u;
    memcpy(&u, &f, 4);
    x[i] = (uint16_t)(u >> 16);
  }
  x[5] = 0, x[6] = 0x8000, x[7] = 0x0001, x[9] = 0x8003;
  const struct {
    const char *name;
    stats_fn fn;
    int same_sums; /* its sums must equal plain's bit for bit */
  } v[] = {{"as the kernels (adding pipes)", plain, 1},        {"subtraction on the FMA pipes", sub_on_fma, 1},
           {"addition on the FMA pipes", add_on_fma, 1},       {"both on the FMA pipes", both_on_fma, 1},
           {"integer widening, no vcvtps2pd", integer_widening, 1}, {"conversions only (no arithmetic)", convert_only, 0}};
  enum { NV = sizeof v / sizeof v[0] };
  double best[NV];
  __m256d ref[8], got[8];
  plain(x, 1.5, ref);
  int bad = 0;
  for (int k = 0; k < NV; k++) {
    best[k] = INFINITY;
    v[k].fn(x, 1.5, got);
    if (v[k].same_sums && memcmp(got, ref, sizeof ref)) {
      printf("FAIL: %s: sums differ from the plain loop's\n", v[k].name);
      bad = 1;
    }
  }
  for (int r = 0; r < rounds; r++) /* interleaved, best of the rounds */
    for (int k = 0; k < NV; k++) {
      const double t0 = now();
      for (int it = 0; it < REPS; it++) v[k].fn(x, 1.5, got);
      const double t = now() - t0;
      if (t < best[k]) best[k] = t;
    }
  printf("bfloat16 statistics' float64 work, one thread, %d values in L1, best of %d rounds:\n", N, rounds);
  for (int k = 0; k < NV; k++)
    printf("  %-34s %6.2f G values/s  (%.2fx the kernels' loop)%s\n", v[k].name, (double)N * REPS / best[k] / 1e9,
           best[0] / best[k], v[k].same_sums ? ", same sums" : "");
  return bad;
}
#else
int main(void) {
  printf("syncbn-bench-bf16-ops: needs an x86-64 build with AVX2 and FMA\n");
  return 0;
}
#endif
