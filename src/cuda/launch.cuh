/* Internal: how the CUDA kernels are launched, with programmatic dependent
 * launch (PDL) on GPUs that have it (compute capability 9.0 and later).
 *
 * A pass is a chain of short kernels (tiles, merge, finish and
 * elementwise), and each boundary costs the GPU a drain and a launch of a
 * few microseconds: on 7x7 and 14x14 maps more than the data itself. With
 * PDL a kernel is launched while its predecessor finishes: its blocks start,
 * wait at pdl_wait() until the predecessor has completed and its memory is
 * visible, and everything before that wait (the launch, block scheduling)
 * overlaps. pdl_trigger() lets the successor launch once every block of
 * this kernel has passed it; the long kernels call it after their main
 * loop, so that the successor's waiting blocks do not take the slots of
 * this kernel's later waves. Every kernel waits before its first global
 * read or write (a predecessor may be the caller's kernel producing x), so
 * what a kernel computes does not depend on PDL, only when it starts.
 * Measured on an H200 against the same build without it: forward 5%,
 * backward 3% faster over the benchmark's shapes, up to 8% on 7x7 and
 * 14x14 maps (BENCHMARKS.md). -DSBN_CUDA_NO_PDL turns it off, to measure. */
#ifndef SBN_CUDA_LAUNCH_CUH
#define SBN_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>

#include <atomic>

namespace sbn_cuda {

#if defined(SBN_CUDA_NO_PDL)
constexpr bool kPdl = false;
#else
constexpr bool kPdl = true;
#endif

__device__ __forceinline__ void pdl_wait() {
#if !defined(SBN_CUDA_NO_PDL) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* (Triggering right after the wait in every kernel measured the same.) */
__device__ __forceinline__ void pdl_trigger() {
#if !defined(SBN_CUDA_NO_PDL) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Whether the current device has PDL (compute capability >= 9), asked once
 * per device. */
static inline bool pdl_device(void) {
  constexpr int kMaxDev = 64;
  static std::atomic<int> known[kMaxDev]; /* 0 not asked yet, 1 no, 2 yes */
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess || d < 0 || d >= kMaxDev) {
    cudaGetLastError();
    return false;
  }
  int k = known[d].load(std::memory_order_relaxed);
  if (k == 0) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess) {
      cudaGetLastError();
      major = 0;
    }
    k = major >= 9 ? 2 : 1;
    known[d].store(k, std::memory_order_relaxed);
  }
  return k == 2;
}

/* kernel k on grid x block threads on stream st; the launch's status (a
 * failed launch's error is not left behind as the last error) */
template <class... P, class... A>
static inline int launch_kernel(void (*k)(P...), unsigned grid, unsigned block, cudaStream_t st, A... a) {
  cudaLaunchAttribute at[1] = {};
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  const unsigned nat = kPdl && pdl_device() ? 1 : 0;
  /* by position: gridDim, blockDim, dynamicSmemBytes, stream, attrs, numAttrs */
  cudaLaunchConfig_t cfg = {dim3(grid), dim3(block), 0, st, at, nat};
  const cudaError_t e = cudaLaunchKernelEx(&cfg, k, (P)a...);
  cudaGetLastError();
  return (int)e;
}

} /* namespace sbn_cuda */

#endif
