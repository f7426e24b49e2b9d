// The per-channel steps of the CUDA layer (bn_finish_cuda.h). Compiled with
// -fmad=false: every operation rounds as the CPU table's does.
#include <cuda_runtime.h>

#include "bn_finish_cuda.h"
#include "launch.cuh"

using sbn_cuda::launch_kernel;
using sbn_cuda::pdl_trigger;
using sbn_cuda::pdl_wait;

namespace {

constexpr int kThreads = 256;
constexpr double kCumulative = -1.0;                 // SBN_MOMENTUM_CUMULATIVE
constexpr int64_t kNbtMax = int64_t(1) << 53;        // SBN_NUM_BATCHES_TRACKED_MAX

// A thread per channel. num_batches_tracked is read by every block and
// written by the last block to finish (counted in f.done, which that block
// resets for the next call), so no block reads the new value.
__global__ void forward_finish(sbn_cuda_finish f, int batch_stats, int update) {
  pdl_wait();
  pdl_trigger();
  const int64_t C = f.c;
  const double n = batch_stats ? f.payload[2 * C] : 0.0;
  if (batch_stats && n == 1) { // the deferred count error: change nothing else
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      *f.fwd_bad = 1;
      *(volatile int *)f.flag = 1;
      __threadfence_system();
    }
    return;
  }
  const int do_update = update && batch_stats && n > 0;
  const int64_t old = do_update ? *(volatile int64_t *)f.nbt : 0;
  const int64_t nbt = old < kNbtMax ? old + 1 : old; // saturates
  const double fac = f.momentum == kCumulative ? 1.0 / (double)nbt : f.momentum;
  const double unbias = n / (n - 1);
  const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c < C) {
    double mean, var = 0, invstd;
    if (!batch_stats) {
      mean = f.rm[c];
      invstd = 1.0 / sqrt((double)f.rv[c] + f.eps);
    } else if (n == 0) { // every rank empty: nothing observed
      mean = 0, invstd = 0;
    } else {
      mean = f.payload[c] / n;
      var = f.payload[C + c] / n - mean * mean;
      var = var > 0 ? var : 0.0;
      invstd = 1.0 / sqrt(var + f.eps);
    }
    if (do_update) {
      f.rm[c] = (float)((1 - fac) * f.rm[c] + fac * mean);
      f.rv[c] = (float)((1 - fac) * f.rv[c] + fac * var * unbias);
    }
    f.mean[c] = mean;
    f.invstd[c] = invstd;
    f.ka[c] = (f.affine ? (double)f.w[c] : 1.0) * invstd;
    f.kb[c] = f.affine ? (double)f.b[c] : 0.0;
  }
  __syncthreads(); // every thread of this block has read nbt
  if (threadIdx.x != 0) return;
  __threadfence();
  if (atomicAdd(f.done, 1u) != gridDim.x - 1) return;
  __threadfence(); // the last block: every block has read nbt (acquire before writing it)
  *f.done = 0;
  *f.fwd_bad = 0;
  *f.saved_count = batch_stats ? n : 0.0;
  if (do_update) *(volatile int64_t *)f.nbt = nbt;
}

__global__ void backward_finish(sbn_cuda_finish f, int synced, int want_dx, int batch_stats) {
  pdl_wait();
  pdl_trigger();
  const int64_t C = f.c;
  const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C || *f.fwd_bad) return;
  const double sum_dy = f.local[c], sum_dy_xmu = f.local[C + c];
  const double gsum_dy = synced ? f.payload[c] : sum_dy;
  const double gsum_dy_xmu = synced ? f.payload[C + c] : sum_dy_xmu;
  const double invstd = f.invstd[c], count = *f.saved_count;
  if (want_dx) {
    const double a = (f.affine ? (double)f.w[c] : 1.0) * invstd;
    f.ka[c] = a;
    if (batch_stats && count > 0) {
      f.kb[c] = a * gsum_dy / count;
      f.kc[c] = a * invstd * invstd * gsum_dy_xmu / count;
    } else {
      f.kb[c] = 0, f.kc[c] = 0;
    }
  }
  if (f.affine) {
    f.gw[c] += (float)(sum_dy_xmu * invstd);
    f.gb[c] += (float)sum_dy;
  }
}

} // namespace

extern "C" int sbn_cuda_forward_finish(sbn_cuda_stream stream, const sbn_cuda_finish *f,
                                       int batch_stats, int update) {
  const unsigned blocks = f->c > 0 ? (unsigned)((f->c + kThreads - 1) / kThreads) : 1;
  return launch_kernel(forward_finish, blocks, kThreads, (cudaStream_t)stream, *f, batch_stats, update);
}

extern "C" int sbn_cuda_backward_finish(sbn_cuda_stream stream, const sbn_cuda_finish *f,
                                        int synced, int want_dx, int batch_stats) {
  const unsigned blocks = (unsigned)((f->c + kThreads - 1) / kThreads);
  return launch_kernel(backward_finish, blocks, kThreads, (cudaStream_t)stream, *f, synced, want_dx, batch_stats);
}
