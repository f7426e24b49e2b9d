/* Internal: the per-channel steps of the CUDA layer (bn_finish_cuda.h) as
 * device functions, shared by the finish kernels (bn_finish.cu) and the
 * elementwise kernels that do the same work in their own blocks
 * (bn_elemt.cu). They mirror the CPU table's float64 formulas operation for
 * operation (device_cpu.c), each operation rounded explicitly, so that the
 * results are the same bits whatever -fmad the including file is compiled
 * with, and the same in every block that computes them. */
#ifndef SBN_CUDA_FINISH_MATH_CUH
#define SBN_CUDA_FINISH_MATH_CUH

#include <cuda_runtime.h>

#include "bn_finish_cuda.h"

namespace sbn_cuda {

constexpr int kFinishThreads = 256;            /* a thread per channel */
constexpr double kCumulative = -1.0;           /* SBN_MOMENTUM_CUMULATIVE */
constexpr int64_t kNbtMax = int64_t(1) << 53;  /* SBN_NUM_BATCHES_TRACKED_MAX */

/* Channel c's statistics for the forward: from the payload's sums (count n)
 * or, without batch statistics, from the running statistics. */
__device__ __forceinline__ void fwd_channel(const sbn_cuda_finish &f, int batch_stats, double n, int64_t c,
                                            double &mean, double &var, double &invstd) {
  var = 0.0;
  if (!batch_stats) {
    mean = (double)f.rm[c];
    invstd = __ddiv_rn(1.0, __dsqrt_rn(__dadd_rn((double)f.rv[c], f.eps)));
  } else if (n == 0) { /* every rank empty: nothing observed */
    mean = 0.0, invstd = 0.0;
  } else {
    mean = __ddiv_rn(f.payload[c], n);
    var = __dsub_rn(__ddiv_rn(f.payload[f.c + c], n), __dmul_rn(mean, mean));
    var = var < 0 ? 0.0 : var; /* rounding below 0; a NaN (inf - inf) stays, as PyTorch's */
    invstd = __ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(var, f.eps)));
  }
}

/* The forward's normalize coefficients of channel c: y = (x - mean) * a + b. */
__device__ __forceinline__ void fwd_coef(const sbn_cuda_finish &f, int batch_stats, double n, int64_t c,
                                         double &mean, double &a, double &b) {
  double var, invstd;
  fwd_channel(f, batch_stats, n, c, mean, var, invstd);
  a = __dmul_rn(f.affine ? (double)f.w[c] : 1.0, invstd);
  b = f.affine ? (double)f.b[c] : 0.0;
}

/* The count the forward found, deferred to the device: 1 is an error, which
 * changes nothing but fwd_bad and the host's flag (block 0 sets them). */
__device__ __forceinline__ bool fwd_count_bad(const sbn_cuda_finish &f, int batch_stats, double n) {
  if (!(batch_stats && n == 1)) return false;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *f.fwd_bad = 1;
    *(volatile int *)f.flag = 1;
    __threadfence_system();
  }
  return true;
}

/* The forward finish of channels blk * 256 + t, + nblk * 256, ... by blocks
 * blk < nblk of the grid (every thread of each calls it): saved mean and
 * invstd (and the normalize coefficients ka, kb when write_k), the running
 * statistics update. num_batches_tracked is read by every one of these
 * blocks and written by the last to finish (counted in f.done, which it
 * resets for the next call), so none reads the new value. The caller has
 * ruled out a count of 1. */
__device__ __forceinline__ void fwd_finish_channels(const sbn_cuda_finish &f, int batch_stats, int update,
                                                    double n, unsigned blk, unsigned nblk, bool write_k) {
  const int64_t C = f.c;
  const int do_update = update && batch_stats && n > 0;
  const int64_t old = do_update ? *(volatile int64_t *)f.nbt : 0;
  const int64_t nbt = old < kNbtMax ? old + 1 : old; /* saturates */
  const double fac = f.momentum == kCumulative ? __ddiv_rn(1.0, (double)nbt) : f.momentum;
  const double unbias = __ddiv_rn(n, __dsub_rn(n, 1.0));
  const double keep = __dsub_rn(1.0, fac);
  for (int64_t c = (int64_t)blk * blockDim.x + threadIdx.x; c < C; c += (int64_t)nblk * blockDim.x) {
    double mean, var, invstd;
    fwd_channel(f, batch_stats, n, c, mean, var, invstd);
    if (do_update) {
      f.rm[c] = (float)__dadd_rn(__dmul_rn(keep, (double)f.rm[c]), __dmul_rn(fac, mean));
      f.rv[c] = (float)__dadd_rn(__dmul_rn(keep, (double)f.rv[c]), __dmul_rn(__dmul_rn(fac, var), unbias));
    }
    f.mean[c] = mean;
    f.invstd[c] = invstd;
    if (write_k) {
      f.ka[c] = __dmul_rn(f.affine ? (double)f.w[c] : 1.0, invstd);
      f.kb[c] = f.affine ? (double)f.b[c] : 0.0;
    }
  }
  __syncthreads(); /* every thread of this block has read nbt */
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(f.done, 1u) == nblk - 1) {
      __threadfence(); /* the last block: every block has read nbt (acquire before writing it) */
      *f.done = 0;
      *f.fwd_bad = 0;
      *f.saved_count = batch_stats ? n : 0.0;
      if (do_update) *(volatile int64_t *)f.nbt = nbt;
    }
  }
}

/* The backward's elementwise coefficients of channel c from the (global)
 * sums and the saved statistics (count: the forward's):
 * dx = (a * dy - b) - cc * (x - mean). */
__device__ __forceinline__ void bwd_coef(const sbn_cuda_finish &f, int synced, int batch_stats, double count,
                                         int64_t c, double &a, double &b, double &cc) {
  const int64_t C = f.c;
  const double gsum_dy = synced ? f.payload[c] : f.local[c];
  const double gsum_dy_xmu = synced ? f.payload[C + c] : f.local[C + c];
  const double invstd = f.invstd[c];
  a = __dmul_rn(f.affine ? (double)f.w[c] : 1.0, invstd);
  if (batch_stats && count > 0) {
    b = __ddiv_rn(__dmul_rn(a, gsum_dy), count);
    cc = __ddiv_rn(__dmul_rn(__dmul_rn(__dmul_rn(a, invstd), invstd), gsum_dy_xmu), count);
  } else {
    b = 0.0, cc = 0.0;
  }
}

/* The backward finish of channels blk * 256 + t, ... (as fwd_finish_channels):
 * grad_weight and grad_bias += this rank's sums, and the coefficients
 * ka, kb, kc when write_k. The caller has ruled out fwd_bad. */
__device__ __forceinline__ void bwd_finish_channels(const sbn_cuda_finish &f, int synced, int batch_stats,
                                                    unsigned blk, unsigned nblk, bool write_k) {
  const int64_t C = f.c;
  const double count = *f.saved_count;
  for (int64_t c = (int64_t)blk * blockDim.x + threadIdx.x; c < C; c += (int64_t)nblk * blockDim.x) {
    if (write_k) bwd_coef(f, synced, batch_stats, count, c, f.ka[c], f.kb[c], f.kc[c]);
    if (f.affine) {
      f.gw[c] = __fadd_rn(f.gw[c], (float)__dmul_rn(f.local[C + c], f.invstd[c]));
      f.gb[c] = __fadd_rn(f.gb[c], (float)f.local[c]);
    }
  }
}

/* How many of a grid's first blocks share the finish's channels: one per
 * 256 channels, or every block of a smaller grid (each then takes several). */
__device__ __forceinline__ unsigned finish_blocks(int64_t C, unsigned grid) {
  const int64_t want = (C + kFinishThreads - 1) / kFinishThreads;
  return want < (int64_t)grid ? (unsigned)(want > 0 ? want : 1) : grid;
}

} /* namespace sbn_cuda */

#endif
