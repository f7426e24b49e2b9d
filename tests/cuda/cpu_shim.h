/* Test support: runs tests/cuda/test_cuda_kernels.cu on a machine without a
 * GPU (or without nvcc), to check the test itself — its float64 reference,
 * tolerances, evidence and aliasing checks — before GPU time is spent on it.
 *
 * Compiled as C++ with -DSBN_KERNEL_TEST_ON_CPU, the test includes this
 * header instead of cuda_runtime.h: the few CUDA runtime calls it makes
 * become host memory operations, and the contract of bn_kernels_cuda.h is
 * implemented with the CPU kernels (src/cpu/bn_kernels.h, which accumulate
 * in float64 too, and keep the same storage conversions), converting their
 * shifted sums into the contract's (n mean, M2 + n mean^2, n). What this
 * proves is the harness and the CPU kernels against the same reference; the
 * CUDA kernels themselves only run on a GPU. */
#ifndef SBN_TEST_CUDA_CPU_SHIM_H
#define SBN_TEST_CUDA_CPU_SHIM_H

#include <stdlib.h>
#include <string.h>

#include <vector>

extern "C" { /* C headers without C++ guards */
#include "../../src/cpu/bn_kernels.h"
}
#include "../../src/cuda/bn_kernels_cuda.h"

typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2 };
typedef struct CUstream_st *cudaStream_t;
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
enum { cudaStreamNonBlocking = 1 };
struct cudaDeviceProp {
  char name[256];
  int major, minor, multiProcessorCount;
};

static inline const char *cudaGetErrorString(cudaError_t e) { return e == 0 ? "no error" : "error (CPU shim)"; }
static inline cudaError_t cudaGetLastError(void) { return 0; }
static inline cudaError_t cudaGetDeviceCount(int *n) {
  *n = 1;
  return 0;
}
static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {
  memset(p, 0, sizeof *p);
  strcpy(p->name, "CPU shim: the CPU kernels behind the CUDA kernels' contract");
  return 0;
}
template <class T> static inline cudaError_t cudaMalloc(T **p, size_t n) {
  *p = (T *)malloc(n ? n : 1);
  return *p ? 0 : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaFree(void *p) {
  free(p);
  return 0;
}
static inline cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) {
  memmove(d, s, n);
  return 0;
}
static inline cudaError_t cudaMemset(void *d, int v, size_t n) {
  memset(d, v, n);
  return 0;
}
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
  static char dummy;
  *s = (cudaStream_t)(void *)&dummy;
  return 0;
}
static inline cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
static inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return 0; }
static inline cudaError_t cudaStreamDestroy(cudaStream_t) { return 0; }

/* ---- the contract over the CPU kernels ---- */

static inline bool shim_geom_ok(sbn_geom g) {
  return (g.dtype == SBN_DTYPE_FLOAT32 || g.dtype == SBN_DTYPE_BFLOAT16 || g.dtype == SBN_DTYPE_FLOAT16) &&
         (g.layout == SBN_LAYOUT_CHANNELS_FIRST || g.layout == SBN_LAYOUT_CHANNELS_LAST) && g.n >= 0 &&
         g.c >= 0 && g.s >= 0;
}
static inline bool shim_empty(sbn_geom g) { return g.n == 0 || g.c == 0 || g.s == 0; }

/* ws->part: a sbn_cpu_ws reserved for the shape */
/* The CPU kernels have no chunks of row tiles: the hook changes nothing. */
void sbn_cuda_set_reduce_blocks(int64_t) {}

int sbn_cuda_ws_reserve(sbn_cuda_ws *ws, sbn_geom g) {
  if (!ws || !shim_geom_ok(g)) return cudaErrorInvalidValue;
  if (shim_empty(g)) return 0;
  sbn_cpu_ws *c = (sbn_cpu_ws *)ws->part;
  if (!c) {
    c = (sbn_cpu_ws *)calloc(1, sizeof *c);
    if (!c) return cudaErrorMemoryAllocation;
    c->threads = 1;
  }
  if (sbn_cpu_ws_reserve(c, g) != 0) {
    if (!ws->part) free(c);
    return cudaErrorMemoryAllocation;
  }
  ws->part = c;
  ws->cap = sizeof *c;
  return 0;
}
void sbn_cuda_ws_free(sbn_cuda_ws *ws) {
  sbn_cpu_ws *c = (sbn_cpu_ws *)ws->part;
  if (c) sbn_cpu_ws_free(c), free(c);
  ws->part = NULL, ws->cap = 0;
}

int sbn_cuda_stats(sbn_cuda_ws *ws, sbn_cuda_stream, double *sum, double *sumsq, double *count, const void *x,
                   sbn_geom g) {
  if (!shim_geom_ok(g) || !count) return cudaErrorInvalidValue;
  const int64_t C = g.c;
  if (shim_empty(g)) {
    for (int64_t c = 0; c < C; c++) sum[c] = 0, sumsq[c] = 0;
    *count = 0;
    return 0;
  }
  if (!ws || !ws->part || !x) return cudaErrorInvalidValue;
  std::vector<double> k(C), s1(C), s2(C);
  sbn_cpu_stats((sbn_cpu_ws *)ws->part, k.data(), s1.data(), s2.data(), x, g);
  const double n = (double)(g.n * g.s);
  for (int64_t c = 0; c < C; c++) {
    const double mean = k[c] + s1[c] / n;
    double m2 = s2[c] - s1[c] * s1[c] / n;
    if (m2 < 0) m2 = 0;
    sum[c] = n * mean, sumsq[c] = m2 + n * mean * mean;
  }
  *count = n;
  return 0;
}

int sbn_cuda_backward_reduce(sbn_cuda_ws *ws, sbn_cuda_stream, double *sum_dy, double *sum_dy_xmu, const void *dy,
                             const void *x, sbn_geom g, const double *mean, double *dup) {
  if (!shim_geom_ok(g)) return cudaErrorInvalidValue;
  if (shim_empty(g)) {
    for (int64_t c = 0; c < g.c; c++) sum_dy[c] = 0, sum_dy_xmu[c] = 0;
  } else {
    if (!ws || !ws->part || !x || !dy || !mean) return cudaErrorInvalidValue;
    sbn_cpu_backward_reduce((sbn_cpu_ws *)ws->part, sum_dy, sum_dy_xmu, dy, x, g, mean);
  }
  if (dup)
    for (int64_t c = 0; c < g.c; c++) dup[c] = sum_dy[c], dup[g.c + c] = sum_dy_xmu[c];
  return 0;
}

/* The elementwise passes take no workspace in the contract; the CPU ones
 * want one (16-bit coefficients): a temporary one per call. */
int sbn_cuda_normalize(sbn_cuda_stream, void *y, const void *x, sbn_geom g, const double *mean,
                       const double *scale, const double *bias) {
  if (!shim_geom_ok(g)) return cudaErrorInvalidValue;
  if (shim_empty(g)) return 0;
  sbn_cpu_ws w = {NULL, 0, 1};
  if (sbn_cpu_ws_reserve(&w, g) != 0) return cudaErrorMemoryAllocation;
  sbn_cpu_normalize(&w, y, x, g, mean, scale, bias);
  sbn_cpu_ws_free(&w);
  return 0;
}

int sbn_cuda_backward_elemt(sbn_cuda_stream, void *dx, const void *dy, const void *x, sbn_geom g,
                            const double *mean, const double *a, const double *b, const double *c) {
  if (!shim_geom_ok(g)) return cudaErrorInvalidValue;
  if (shim_empty(g)) return 0;
  sbn_cpu_ws w = {NULL, 0, 1};
  if (sbn_cpu_ws_reserve(&w, g) != 0) return cudaErrorMemoryAllocation;
  sbn_cpu_backward_elemt(&w, dx, dy, x, g, mean, a, b, c);
  sbn_cpu_ws_free(&w);
  return 0;
}

#endif
