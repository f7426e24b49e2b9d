// The per-channel steps of the CUDA layer (bn_finish_cuda.h) as kernels of
// their own: for the calls whose elementwise kernel does not do them itself
// (bn_elemt.cu), that is an empty tensor, a backward without dx, and the
// SBN_CUDA_SEPARATE_FINISH build. Compiled with -fmad=false, though the
// shared steps (finish_math.cuh) round every operation explicitly anyway.
#include <cuda_runtime.h>

#include "bn_finish_cuda.h"
#include "finish_math.cuh"
#include "launch.cuh"

using namespace sbn_cuda;

namespace {

// A thread per channel.
__global__ void forward_finish(sbn_cuda_finish f, int batch_stats, int update) {
  pdl_wait();
  pdl_trigger();
  const double n = batch_stats ? f.payload[2 * f.c] : 0.0;
  if (fwd_count_bad(f, batch_stats, n)) return;
  fwd_finish_channels(f, batch_stats, update, n, blockIdx.x, gridDim.x, true);
}

__global__ void backward_finish(sbn_cuda_finish f, int synced, int want_dx, int batch_stats) {
  pdl_wait();
  pdl_trigger();
  if (*f.fwd_bad) return;
  bwd_finish_channels(f, synced, batch_stats, blockIdx.x, gridDim.x, want_dx != 0);
}

} // namespace

extern "C" int sbn_cuda_forward_finish(sbn_cuda_stream stream, const sbn_cuda_finish *f,
                                       int batch_stats, int update) {
  const unsigned blocks = f->c > 0 ? (unsigned)((f->c + kFinishThreads - 1) / kFinishThreads) : 1;
  return launch_kernel(forward_finish, blocks, kFinishThreads, (cudaStream_t)stream, *f, batch_stats, update);
}

extern "C" int sbn_cuda_backward_finish(sbn_cuda_stream stream, const sbn_cuda_finish *f,
                                        int synced, int want_dx, int batch_stats) {
  const unsigned blocks = f->c > 0 ? (unsigned)((f->c + kFinishThreads - 1) / kFinishThreads) : 1;
  return launch_kernel(backward_finish, blocks, kFinishThreads, (cudaStream_t)stream, *f, synced, want_dx,
                       batch_stats);
}
