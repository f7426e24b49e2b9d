/* Internal: CUDA kernels for the four batch-norm passes — the GPU
 * counterpart of src/cpu/bn_kernels.h, called by the CUDA device table.
 *
 * Contract (the same as the CPU kernels unless stated):
 *  - every pointer is device memory of the current device; every launch is
 *    enqueued on `stream` (a cudaStream_t; NULL = the legacy default stream);
 *    nothing synchronizes with the host and nothing allocates (scratch comes
 *    from sbn_cuda_ws, reserved before the call), so a sequence of calls can
 *    be captured in a CUDA graph;
 *  - storage float32, bfloat16 or float16 (sbn_geom.dtype), both layouts;
 *    per-channel inputs and outputs are float64;
 *  - partial sums are merged in a fixed order (no floating-point atomics):
 *    the same input gives the same bits on every run;
 *  - accuracy: within float32 rounding of a float64 reference, also for
 *    channels whose mean is 1e4 times their standard deviation (partials are
 *    shifted or Welford, merged in float64);
 *  - an empty input (n == 0 or s == 0) writes zeros to the per-channel sums
 *    and touches no tensor element.
 * Each function returns 0, or the cudaError_t of a failed launch. */
#ifndef SBN_CUDA_BN_KERNELS_CUDA_H
#define SBN_CUDA_BN_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "../core/geom.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *sbn_cuda_stream; /* = cudaStream_t */

/* Device scratch for the partial sums of the reduction passes, owned by one
 * layer: grows on the first call with a larger shape (at least doubling),
 * then is reused. A CUDA graph captured before a growth still writes the
 * block it recorded, so replaced blocks are kept until sbn_cuda_ws_free
 * (doubling bounds them by the size of the last one). */
enum { SBN_CUDA_WS_RETIRED = 64 }; /* doublings of a size_t */
typedef struct sbn_cuda_ws {
  void *part;
  size_t cap; /* bytes */
  void *retired[SBN_CUDA_WS_RETIRED];
  int nretired;
} sbn_cuda_ws;

/* Test hook: the rows layout's reductions aim at this many blocks instead
 * of CL_REDUCE_BLOCKS (kern_common.cuh), so that small test shapes get
 * chunks of several row tiles; 0 restores the default. Not thread-safe;
 * reserve the workspace after setting it. */
void sbn_cuda_set_reduce_blocks(int64_t blocks);

/* Make ws large enough for g on the current device (cudaMalloc, never
 * cudaFree: no wait for the device; never during stream capture once
 * reserved). 0, or the cudaError_t (ws unchanged). */
int sbn_cuda_ws_reserve(sbn_cuda_ws *ws, sbn_geom g);
void sbn_cuda_ws_free(sbn_cuda_ws *ws);

/* Forward pass 1 (read x). Per channel c, with n = N*S local values:
 *   sum[c]   = n * mean_c
 *   sumsq[c] = M2_c + n * mean_c^2       (M2 = sum of squared deviations)
 * and *count = n (one double). This is the layer's all-reduce payload:
 * sum = payload[0..C), sumsq = payload[C..2C), count = payload + 2C. */
int sbn_cuda_stats(sbn_cuda_ws *ws, sbn_cuda_stream stream, double *sum, double *sumsq,
                   double *count, const void *x, sbn_geom g);

/* Forward pass 2 (read x, write y): y = (x - mean) * scale + bias. y may be x. */
int sbn_cuda_normalize(sbn_cuda_stream stream, void *y, const void *x, sbn_geom g,
                       const double *mean, const double *scale, const double *bias);

/* Backward pass 1 (read x, dy): sum_dy = sum(dy), sum_dy_xmu = sum(dy * (x - mean)).
 * dup, when not NULL, receives the same values too (dup[c] = sum_dy[c],
 * dup[C + c] = sum_dy_xmu[c]): the layer's payload for the collective. */
int sbn_cuda_backward_reduce(sbn_cuda_ws *ws, sbn_cuda_stream stream, double *sum_dy,
                             double *sum_dy_xmu, const void *dy, const void *x, sbn_geom g,
                             const double *mean, double *dup);

/* Backward pass 2 (read x, dy, write dx): dx = (a*dy - b) - c*(x - mean).
 * dx may be dy or x. */
int sbn_cuda_backward_elemt(sbn_cuda_stream stream, void *dx, const void *dy, const void *x,
                            sbn_geom g, const double *mean, const double *a, const double *b,
                            const double *c);

#ifdef __cplusplus
}
#endif
#endif
