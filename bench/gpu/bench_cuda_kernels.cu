/* Microbenchmark of the CUDA kernels of the four passes
 * (src/cuda/bn_kernels_cuda.h) on the ResNet-50 batch-norm shapes at N = 32,
 * float32 and bfloat16, channels-first and channels-last.
 *
 * Each kernel call is timed alone with CUDA events (reduction passes: tile
 * kernel + merge kernel), median of --reps calls after warm-up; the calls
 * rotate over enough tensor sets (>= 4x a 50 MB L2) that every call reads
 * its inputs from DRAM. Bytes: statistics reads x (1 tensor), normalize
 * reads x and writes y (2), backward reduce reads x and dy (2), backward
 * elementwise reads x, dy and writes dx (3): forward 3 tensor passes,
 * backward 5. The reference is a device-to-device cudaMemcpy of 256 MiB
 * measured in the same run (bytes read + written). Output: one row per
 * configuration, microseconds per kernel, GB/s of forward and backward,
 * and their fraction of the copy bandwidth.
 *
 *   bench_cuda_kernels [--reps N] [--only C,HxW]
 * Prints "SKIP: no CUDA device" and exits 0 without a GPU. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "../../src/cuda/bn_kernels_cuda.h"

#define CK(call)                                                                             \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      fprintf(stderr, "%s: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)
#define KK(call)                                                                       \
  do {                                                                                 \
    int e_ = (call);                                                                   \
    if (e_ != 0) {                                                                     \
      fprintf(stderr, "%s returned %d (%s:%d)\n", #call, e_, __FILE__, __LINE__);    \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

static double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/* Median milliseconds of `reps` calls of f(i), each timed alone. */
template <class F> static double time_ms(cudaStream_t st, int reps, F f) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; i++) f(i); /* warm-up */
  std::vector<float> ms;
  for (int i = 0; i < reps; i++) {
    CK(cudaEventRecord(a, st));
    f(i);
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float t;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return median(ms);
}

int main(int argc, char **argv) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIP: no CUDA device\n");
    return 0;
  }
  int reps = 30;
  const char *only = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else {
      fprintf(stderr, "usage: %s [--reps N] [--only C,HxW]\n", argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  sbn_cuda_stream s = (sbn_cuda_stream)st;

  /* copy bandwidth */
  const size_t cbytes = (size_t)256 << 20;
  char *ca, *cb;
  CK(cudaMalloc(&ca, cbytes));
  CK(cudaMalloc(&cb, cbytes));
  CK(cudaMemset(ca, 1, cbytes));
  const double copy_ms = time_ms(st, reps, [&](int i) {
    CK(cudaMemcpyAsync(i & 1 ? ca : cb, i & 1 ? cb : ca, cbytes, cudaMemcpyDeviceToDevice, st));
  });
  const double copy_gbs = 2.0 * cbytes / copy_ms / 1e6;
  CK(cudaFree(ca));
  CK(cudaFree(cb));
  printf("device: %s, %d SMs, L2 %d MiB; copy (D2D, 256 MiB, read + write): %.0f GB/s\n", prop.name,
         prop.multiProcessorCount, prop.l2CacheSize >> 20, copy_gbs);
  printf("%-6s %-7s %-2s %8s %9s %9s %9s %9s %8s %8s %6s %6s\n", "C", "HxW", "L", "MB", "stats_us", "norm_us",
         "bred_us", "belt_us", "fwd_GB/s", "bwd_GB/s", "fwd%", "bwd%");

  struct Shape {
    int c, hw;
  };
  static const Shape shapes[] = {{64, 112}, {64, 56}, {256, 56}, {128, 56}, {128, 28}, {512, 28},
                                 {256, 28}, {256, 14}, {1024, 14}, {512, 14}, {512, 7}, {2048, 7}};
  const int64_t N = 32;
  const size_t rot_bytes = (size_t)4 * (prop.l2CacheSize > 0 ? prop.l2CacheSize : 50 << 20);
  for (const Shape &sh : shapes)
    for (sbn_dtype dt : {SBN_DTYPE_FLOAT32, SBN_DTYPE_BFLOAT16})
      for (int layout = 0; layout < 2; layout++) {
        char tag[32];
        snprintf(tag, sizeof tag, "%d,%dx%d", sh.c, sh.hw, sh.hw);
        if (only && strcmp(only, tag)) continue;
        const int64_t C = sh.c, S = (int64_t)sh.hw * sh.hw;
        const size_t es = dt == SBN_DTYPE_FLOAT32 ? 4 : 2, tb = (size_t)(N * C * S) * es;
        const int sets = (int)std::min<size_t>(64, std::max<size_t>(2, (rot_bytes + 3 * tb - 1) / (3 * tb)));
        std::vector<char *> x(sets), dy(sets), out(sets);
        for (int i = 0; i < sets; i++) {
          CK(cudaMalloc(&x[i], tb));
          CK(cudaMalloc(&dy[i], tb));
          CK(cudaMalloc(&out[i], tb));
          /* 0x3c00 / 0x3f80 halves: 1.0 in float16 / bfloat16; any finite bits do for float32 */
          CK(cudaMemset(x[i], 0x3c, tb));
          CK(cudaMemset(dy[i], 0x3b, tb));
        }
        double *pc; /* per-channel arrays */
        CK(cudaMalloc(&pc, sizeof(double) * (size_t)(8 * C + 1)));
        CK(cudaMemset(pc, 0, sizeof(double) * (size_t)(8 * C + 1)));
        double *sum = pc, *sumsq = pc + C, *cnt = pc + 2 * C, *mean = pc + 2 * C + 1, *a = mean + C,
               *b = a + C, *c = b + C;
        sbn_geom g = {N, C, S, (sbn_layout)layout, dt};
        sbn_cuda_ws ws = {};
        KK(sbn_cuda_ws_reserve(&ws, g));
        const double t_st = time_ms(st, reps, [&](int i) { KK(sbn_cuda_stats(&ws, s, sum, sumsq, cnt, x[i % sets], g)); });
        const double t_no = time_ms(st, reps, [&](int i) { KK(sbn_cuda_normalize(s, out[i % sets], x[i % sets], g, mean, a, b)); });
        const double t_br = time_ms(st, reps, [&](int i) {
          KK(sbn_cuda_backward_reduce(&ws, s, sum, sumsq, dy[i % sets], x[i % sets], g, mean, NULL));
        });
        const double t_be = time_ms(st, reps, [&](int i) {
          KK(sbn_cuda_backward_elemt(s, out[i % sets], dy[i % sets], x[i % sets], g, mean, a, b, c));
        });
        const double fwd = 3.0 * tb / (t_st + t_no) / 1e6, bwd = 5.0 * tb / (t_br + t_be) / 1e6;
        char hw[16];
        snprintf(hw, sizeof hw, "%dx%d", sh.hw, sh.hw);
        printf("%-6d %-7s %-2s %8.1f %9.1f %9.1f %9.1f %9.1f %8.0f %8.0f %5.0f%% %5.0f%%   %s\n", sh.c, hw,
               layout ? "CL" : "CF", tb / 1e6, t_st * 1e3,
               t_no * 1e3, t_br * 1e3, t_be * 1e3, fwd, bwd, 100 * fwd / copy_gbs, 100 * bwd / copy_gbs,
               dt == SBN_DTYPE_FLOAT32 ? "f32" : "bf16");
        fflush(stdout);
        sbn_cuda_ws_free(&ws);
        CK(cudaFree(pc));
        for (int i = 0; i < sets; i++) {
          CK(cudaFree(x[i]));
          CK(cudaFree(dy[i]));
          CK(cudaFree(out[i]));
        }
      }
  CK(cudaStreamDestroy(st));
  return 0;
}
