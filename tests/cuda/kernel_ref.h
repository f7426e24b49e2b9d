/* Float64 reference of the four batch-norm passes, for the kernel tests:
 * plain loops over a tensor given as the doubles of its stored values, in
 * either layout. C and C++ (the CUDA test includes it; so can a CPU test). */
#ifndef SBN_TEST_KERNEL_REF_H
#define SBN_TEST_KERNEL_REF_H

#include <math.h>
#include <stdint.h>

/* Index of element (n, c, s) of an (N, C, S) tensor; cl: channels-last. */
static inline int64_t kref_index(int64_t N, int64_t C, int64_t S, int cl, int64_t n, int64_t c, int64_t s) {
  (void)N;
  return cl ? (n * S + s) * C + c : (n * C + c) * S + s;
}

/* Per channel: mean, m2 = sum of squared deviations (two passes), and
 * absdev = mean |x - k| with k the channel's first value (the magnitude of
 * the shifted values a kernel sums). Empty: zeros. */
static inline void kref_stats(const double *x, int64_t N, int64_t C, int64_t S, int cl, double *mean, double *m2,
                              double *absdev) {
  const double n = (double)(N * S);
  for (int64_t c = 0; c < C; c++) {
    double sum = 0, q = 0, a = 0;
    for (int64_t i = 0; i < N; i++)
      for (int64_t s = 0; s < S; s++) sum += x[kref_index(N, C, S, cl, i, c, s)];
    const double m = n > 0 ? sum / n : 0;
    const double k = n > 0 ? x[kref_index(N, C, S, cl, 0, c, 0)] : 0;
    for (int64_t i = 0; i < N; i++)
      for (int64_t s = 0; s < S; s++) {
        const double v = x[kref_index(N, C, S, cl, i, c, s)];
        q += (v - m) * (v - m);
        a += fabs(v - k);
      }
    mean[c] = m, m2[c] = q, absdev[c] = n > 0 ? a / n : 0;
  }
}

/* Per channel: sum(dy), sum(dy (x - mean)), and the sums of the terms'
 * magnitudes sum|dy|, sum|dy (x - mean)|. */
static inline void kref_bred(const double *x, const double *dy, int64_t N, int64_t C, int64_t S, int cl,
                             const double *mean, double *sdy, double *sdyxmu, double *ady, double *adyxmu) {
  for (int64_t c = 0; c < C; c++) {
    double a = 0, b = 0, aa = 0, ab = 0;
    for (int64_t i = 0; i < N; i++)
      for (int64_t s = 0; s < S; s++) {
        const int64_t j = kref_index(N, C, S, cl, i, c, s);
        a += dy[j], b += dy[j] * (x[j] - mean[c]);
        aa += fabs(dy[j]), ab += fabs(dy[j] * (x[j] - mean[c]));
      }
    sdy[c] = a, sdyxmu[c] = b, ady[c] = aa, adyxmu[c] = ab;
  }
}

/* The elementwise passes, one value. */
static inline double kref_norm(double x, double mean, double scale, double bias) {
  return (x - mean) * scale + bias;
}
static inline double kref_belt(double x, double dy, double mean, double a, double b, double c) {
  return (a * dy - b) - c * (x - mean);
}

#endif
