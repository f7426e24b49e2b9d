/* CPU kernels, portable C. Channels-first walks each (n, c) row of S
 * contiguous values; channels-last walks rows of C channels and keeps one
 * accumulator per channel. Accumulation is float64 in a fixed order (LANES
 * interleaved partial sums combined at the end of each row). */
#include "bn_kernels.h"

#include <string.h>

enum { LANES = 8 };

/* Sum of (x-k) and (x-k)^2 over a contiguous row, LANES partial sums. */
static void row_stats(const float *x, int64_t len, double k, double *s1, double *s2) {
  double a1[LANES] = {0}, a2[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= len; i += LANES)
    for (int j = 0; j < LANES; j++) {
      double d = (double)x[i + j] - k;
      a1[j] += d;
      a2[j] += d * d;
    }
  for (int j = 0; i < len; i++, j++) {
    double d = (double)x[i] - k;
    a1[j] += d;
    a2[j] += d * d;
  }
  double t1 = 0, t2 = 0;
  for (int j = 0; j < LANES; j++) t1 += a1[j], t2 += a2[j];
  *s1 += t1;
  *s2 += t2;
}

void sbn_cpu_stats_f32(double *shift, double *s1, double *s2, const float *x, sbn_geom g) {
  const int64_t C = g.c, S = g.s, N = g.n;
  memset(s1, 0, sizeof(double) * (size_t)C);
  memset(s2, 0, sizeof(double) * (size_t)C);
  if (N == 0 || S == 0) {
    memset(shift, 0, sizeof(double) * (size_t)C);
    return;
  }
  if (g.layout == SBN_LAYOUT_CHANNELS_FIRST) {
    for (int64_t c = 0; c < C; c++) shift[c] = x[c * S];
    for (int64_t n = 0; n < N; n++)
      for (int64_t c = 0; c < C; c++) row_stats(x + (n * C + c) * S, S, shift[c], &s1[c], &s2[c]);
  } else {
    for (int64_t c = 0; c < C; c++) shift[c] = x[c];
    const int64_t rows = N * S;
    for (int64_t r = 0; r < rows; r++) {
      const float *row = x + r * C;
      for (int64_t c = 0; c < C; c++) {
        double d = (double)row[c] - shift[c];
        s1[c] += d;
        s2[c] += d * d;
      }
    }
  }
}

void sbn_cpu_normalize_f32(float *y, const float *x, sbn_geom g, const double *mean,
                           const double *scale, const double *bias) {
  const int64_t C = g.c, S = g.s, N = g.n;
  if (g.layout == SBN_LAYOUT_CHANNELS_FIRST) {
    for (int64_t n = 0; n < N; n++)
      for (int64_t c = 0; c < C; c++) {
        const float *xr = x + (n * C + c) * S;
        float *yr = y + (n * C + c) * S;
        const double m = mean[c], a = scale[c], b = bias[c];
        for (int64_t i = 0; i < S; i++) yr[i] = (float)(((double)xr[i] - m) * a + b);
      }
  } else {
    const int64_t rows = N * S;
    for (int64_t r = 0; r < rows; r++) {
      const float *xr = x + r * C;
      float *yr = y + r * C;
      for (int64_t c = 0; c < C; c++) yr[c] = (float)(((double)xr[c] - mean[c]) * scale[c] + bias[c]);
    }
  }
}

static void row_backward_reduce(const float *dy, const float *x, int64_t len, double m,
                                double *sdy, double *sdyx) {
  double a1[LANES] = {0}, a2[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= len; i += LANES)
    for (int j = 0; j < LANES; j++) {
      double d = (double)dy[i + j];
      a1[j] += d;
      a2[j] += d * ((double)x[i + j] - m);
    }
  for (int j = 0; i < len; i++, j++) {
    double d = (double)dy[i];
    a1[j] += d;
    a2[j] += d * ((double)x[i] - m);
  }
  double t1 = 0, t2 = 0;
  for (int j = 0; j < LANES; j++) t1 += a1[j], t2 += a2[j];
  *sdy += t1;
  *sdyx += t2;
}

void sbn_cpu_backward_reduce_f32(double *sum_dy, double *sum_dy_xmu, const float *dy,
                                 const float *x, sbn_geom g, const double *mean) {
  const int64_t C = g.c, S = g.s, N = g.n;
  memset(sum_dy, 0, sizeof(double) * (size_t)C);
  memset(sum_dy_xmu, 0, sizeof(double) * (size_t)C);
  if (g.layout == SBN_LAYOUT_CHANNELS_FIRST) {
    for (int64_t n = 0; n < N; n++)
      for (int64_t c = 0; c < C; c++) {
        const int64_t off = (n * C + c) * S;
        row_backward_reduce(dy + off, x + off, S, mean[c], &sum_dy[c], &sum_dy_xmu[c]);
      }
  } else {
    const int64_t rows = N * S;
    for (int64_t r = 0; r < rows; r++) {
      const float *xr = x + r * C, *dyr = dy + r * C;
      for (int64_t c = 0; c < C; c++) {
        double d = (double)dyr[c];
        sum_dy[c] += d;
        sum_dy_xmu[c] += d * ((double)xr[c] - mean[c]);
      }
    }
  }
}

void sbn_cpu_backward_elemt_f32(float *dx, const float *dy, const float *x, sbn_geom g,
                                const double *mean, const double *a, const double *b,
                                const double *c) {
  const int64_t C = g.c, S = g.s, N = g.n;
  if (g.layout == SBN_LAYOUT_CHANNELS_FIRST) {
    for (int64_t n = 0; n < N; n++)
      for (int64_t ch = 0; ch < C; ch++) {
        const int64_t off = (n * C + ch) * S;
        const double m = mean[ch], ka = a[ch], kb = b[ch], kc = c[ch];
        for (int64_t i = 0; i < S; i++)
          dx[off + i] = (float)(ka * (double)dy[off + i] - kb - kc * ((double)x[off + i] - m));
      }
  } else {
    const int64_t rows = N * S;
    for (int64_t r = 0; r < rows; r++) {
      const int64_t off = r * C;
      for (int64_t ch = 0; ch < C; ch++)
        dx[off + ch] = (float)(a[ch] * (double)dy[off + ch] - b[ch] - c[ch] * ((double)x[off + ch] - mean[ch]));
    }
  }
}
