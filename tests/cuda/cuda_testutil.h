/* Support for the GPU tests of the layer (the .cu tests of tests/cuda): the SKIP rule,
 * device buffers, and the hooks that put bn_case's ranks on the GPU. The C
 * support of tests/ (testutil, bn_case) is included with C linkage. */
#ifndef SBN_CUDA_TESTUTIL_H
#define SBN_CUDA_TESTUTIL_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "bn_case.h"
#include "testutil.h"
}

#define CUDA_OK(call)                                                                       \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

/* Without a GPU (no driver, no device) the test prints why and passes. */
static inline int gpu_or_skip(const char *test) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    printf("SKIP: %s needs a GPU (cudaGetDeviceCount: %s, %d devices)\n", test,
           e != cudaSuccess ? cudaGetErrorString(e) : "ok", n);
    (void)cudaGetLastError();
    return 0;
  }
  cudaDeviceProp p;
  CUDA_OK(cudaGetDeviceProperties(&p, 0));
  printf("%s on %s (sm_%d%d), %d device(s)\n", test, p.name, p.major, p.minor, n);
  return 1;
}

static inline sbn_device cuda_dev(int index) {
  sbn_device d;
  d.type = SBN_DEVICE_CUDA;
  d.index = index;
  return d;
}

/* Each rank thread's stream (non-blocking: nothing orders it after other
 * streams, so a missing wait in the library shows as a wrong result). */
static thread_local cudaStream_t tl_stream;

static void *hook_alloc(size_t bytes) {
  void *p = NULL;
  CUDA_OK(cudaMalloc(&p, bytes ? bytes : 4));
  return p;
}
static void hook_release(void *p) { CUDA_OK(cudaFree(p)); }
static void hook_upload(void *dst, const void *src, size_t bytes) {
  CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, tl_stream));
  CUDA_OK(cudaStreamSynchronize(tl_stream));
}
static void hook_download(void *dst, const void *src, size_t bytes) {
  CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, tl_stream));
  CUDA_OK(cudaStreamSynchronize(tl_stream));
}
static int hook_rank_begin(sbn_bn *bn, int rank) {
  (void)rank;
  CUDA_OK(cudaStreamCreateWithFlags(&tl_stream, cudaStreamNonBlocking));
  CHECK_OK(sbn_bn_set_stream(bn, tl_stream));
  return 0;
}
static void hook_rank_end(int rank) {
  (void)rank;
  CUDA_OK(cudaStreamSynchronize(tl_stream));
  CUDA_OK(cudaStreamDestroy(tl_stream));
  tl_stream = NULL;
}
static const case_device gpu_hooks = {{SBN_DEVICE_CUDA, 0}, hook_alloc,  hook_release,  hook_upload,
                                      hook_download,        hook_rank_begin, hook_rank_end};

#endif
