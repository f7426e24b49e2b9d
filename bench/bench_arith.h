/* The float64 arithmetic floor of the reductions, for syncbn-bench's
 * floor and "attain" columns: how many values per second the least work the
 * library's numerics ask of a reduction (the CPU kernels accumulate in
 * float64) gets through on this machine, with the data already in L1. Per
 * value, statistics: widen, subtract the shift, add, square, add; backward
 * reduce: widen two, subtract the mean, multiply, add both. Where this rate
 * is below what the read bandwidth delivers, a reduction is bound by its
 * arithmetic, not by memory. (On the AMD EPYC Zen 3 the kernels were
 * developed on, the loop is faster than the reads, bfloat16 included.)
 *
 * The loop: AVX2, 4-double vectors, 16 values a step into 4 independent
 * pairs of sums (no dependency chain binds it), the cheapest widening
 * (bfloat16: one unpack per 4 values); each thread its own 4096 values
 * (and as many gradients for the backward reduce), many times over. The
 * rate is the best of 10 runs on the same threads as the passes, half of
 * them with the additions on the multiply-add unit: a floor for any loop
 * doing this work. Only measured where the kernels run at the AVX2 level
 * (the AVX-512 levels' 8-double vectors would need their own loop). */
#ifndef SBN_BENCH_ARITH_H
#define SBN_BENCH_ARITH_H

#include "../src/cpu/half.h"
#include "bench_machine.h"

enum { AR_VALUES = 4096, AR_REPS = 100, AR_UNITS = 8 }; /* units per thread */

#if defined(__x86_64__)
/* Values 8 at a time, widened to two vectors of 4 doubles. */
__attribute__((target("avx2"))) static inline void ar_wide8(const void *p, int64_t i, int bf16, __m256d *lo,
                                                            __m256d *hi) {
  if (bf16) {
    const __m128i h = _mm_load_si128((const __m128i *)((const uint16_t *)p + i));
    *lo = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h)));
    *hi = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpackhi_epi16(_mm_setzero_si128(), h)));
  } else {
    const float *f = (const float *)p + i;
    *lo = _mm256_cvtps_pd(_mm_load_ps(f)), *hi = _mm256_cvtps_pd(_mm_load_ps(f + 4));
  }
}

static volatile double ar_sink;

/* One step of 16 values; fma: the subtractions and the sums' additions
 * on the multiply-add unit (x * 1 + y, the same rounding), which frees the
 * add pipes for the widening on some cores (AMD Zen). */
__attribute__((target("avx2,fma"))) static inline void ar_step(const char *x, const char *g, int64_t i, int bf16,
                                                               int fma, __m256d *s, __m256d *q) {
  const __m256d m = _mm256_set1_pd(0.25), one = _mm256_set1_pd(1.0);
  __m256d w[4], e[4] = {m, m, m, m};
  ar_wide8(x, i, bf16, &w[0], &w[1]), ar_wide8(x, i + 8, bf16, &w[2], &w[3]);
  if (g) ar_wide8(g, i, bf16, &e[0], &e[1]), ar_wide8(g, i + 8, bf16, &e[2], &e[3]);
  for (int j = 0; j < 4; j++) {
    const __m256d d = fma ? _mm256_fmsub_pd(w[j], one, m) : _mm256_sub_pd(w[j], m), t = g ? e[j] : d;
    s[j] = fma ? _mm256_fmadd_pd(t, one, s[j]) : _mm256_add_pd(s[j], t);
    q[j] = _mm256_add_pd(q[j], _mm256_mul_pd(t, d));
  }
}

/* k->x (and k->dy for the backward reduce): AR_VALUES values for each of
 * k->n threads; unit u reads those at u % k->n (units handed out to
 * whichever thread is free, several per thread so none waits on another);
 * k->c: 1 for bfloat16; k->s: 1 for the backward reduce; k->chunk: 1 for
 * the multiply-add unit's additions. */
__attribute__((target("avx2,fma"))) static void ar_units(const sbn_kargs *k, int64_t u0, int64_t u1) {
  const int bf16 = (int)k->c, bred = (int)k->s, fma = (int)k->chunk;
  const size_t vb = bf16 ? 2 : 4;
  __m256d s[4], q[4];
  for (int j = 0; j < 4; j++) s[j] = q[j] = _mm256_setzero_pd();
  for (int64_t u = u0; u < u1; u++) {
    const size_t off = (size_t)(u % k->n) * AR_VALUES * vb;
    const char *x = (const char *)k->x + off, *g = bred ? (const char *)k->dy + off : NULL;
    for (int r = 0; r < AR_REPS; r++)
      if (fma)
        for (int64_t i = 0; i < AR_VALUES; i += 16) ar_step(x, g, i, bf16, 1, s, q);
      else
        for (int64_t i = 0; i < AR_VALUES; i += 16) ar_step(x, g, i, bf16, 0, s, q);
  }
  double o[4];
  for (int j = 1; j < 4; j++) s[0] = _mm256_add_pd(s[0], s[j]), q[0] = _mm256_add_pd(q[0], q[j]);
  _mm256_storeu_pd(o, _mm256_add_pd(s[0], q[0])); /* every sum used: none optimized away */
  ar_sink = o[0];
}
#endif

/* Values per second on `threads` threads (0 where not measured): the
 * statistics' (bred 0) or the backward reduce's (bred 1) arithmetic. */
static inline double arith_rate(int threads, int bf16, int bred) {
#if defined(__x86_64__)
  if (sbn_cpu_get_isa() != SBN_CPU_ISA_AVX2) return 0;
  const size_t bytes = (size_t)threads * AR_VALUES * (bf16 ? 2 : 4);
  char *buf = aligned_alloc(64, 2 * bytes);
  if (!buf) return 0;
  for (size_t i = 0; i < 2 * bytes / 4; i++) { /* 1.0 to 1.75, in either type */
    const float v = 1.0f + (float)(i % 97) / 128.0f;
    if (bf16) ((uint16_t *)buf)[2 * i] = ((uint16_t *)buf)[2 * i + 1] = sbn_f32_to_bf16(v);
    else ((float *)buf)[i] = v;
  }
  sbn_kargs k;
  memset(&k, 0, sizeof k);
  k.x = buf, k.dy = buf + bytes, k.n = threads, k.c = bf16, k.s = bred;
  double best = 0;
  for (int run = 0; run < 10; run++) { /* 5 of each kind of addition */
    k.chunk = run % 2;
    const double t0 = now();
    sbn_cpu_parallel_for(threads, (int64_t)threads * AR_UNITS, 1, ar_units, &k, NULL, 0);
    const double rate = (double)threads * AR_UNITS * AR_VALUES * AR_REPS / (now() - t0);
    if (rate > best) best = rate;
  }
  free(buf);
  return best;
#else
  (void)threads, (void)bf16, (void)bred;
  return 0;
#endif
}

#endif
