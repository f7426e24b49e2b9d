/* Internal: CPU kernels for the four batch-norm passes on float32 storage.
 * Each is a single pass over its tensors with float64 accumulation, and its
 * summation order depends only on the shape, so results are reproducible
 * bit for bit. */
#ifndef SBN_CPU_BN_KERNELS_H
#define SBN_CPU_BN_KERNELS_H

#include <stdint.h>

#include "syncbn.h"

/* A (N, C, S) view of an input: S is the product of the spatial dims. */
typedef struct sbn_geom {
  int64_t n, c, s;
  sbn_layout layout;
} sbn_geom;

/* Pass 1 (read x). Per channel: a shift k (a value of the channel, so that
 * the sums stay well-conditioned when |mean| >> std), s1 = sum(x - k) and
 * s2 = sum((x - k)^2). Empty input: all zero. */
void sbn_cpu_stats_f32(double *shift, double *s1, double *s2, const float *x, sbn_geom g);

/* Pass 2 (read x, write y): y = (x - mean) * scale + bias per channel. y may be x. */
void sbn_cpu_normalize_f32(float *y, const float *x, sbn_geom g, const double *mean,
                           const double *scale, const double *bias);

/* Backward pass 1 (read x, dy): sum_dy = sum(dy), sum_dy_xmu = sum(dy * (x - mean)). */
void sbn_cpu_backward_reduce_f32(double *sum_dy, double *sum_dy_xmu, const float *dy,
                                 const float *x, sbn_geom g, const double *mean);

/* Backward pass 2 (read x, dy, write dx):
 * dx = a * dy - b - c * (x - mean) per channel. dx may be dy. */
void sbn_cpu_backward_elemt_f32(float *dx, const float *dy, const float *x, sbn_geom g,
                                const double *mean, const double *a, const double *b,
                                const double *c);

#endif
