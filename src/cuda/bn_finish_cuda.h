/* Internal: the per-channel steps of the CUDA layer between its passes, as
 * small kernels (bn_finish.cu) or inside the elementwise kernels that follow
 * them (bn_elemt.cu), so that the host never waits for the statistics.
 * They mirror the CPU table's float64 formulas operation for operation
 * (device_cpu.c; finish_math.cuh rounds each one explicitly). Each returns
 * 0 or the cudaError_t of the launch. */
#ifndef SBN_CUDA_BN_FINISH_CUDA_H
#define SBN_CUDA_BN_FINISH_CUDA_H

#include <stdint.h>

#include "bn_kernels_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device (and host-mapped) memory of one layer that the kernels update. */
typedef struct sbn_cuda_finish {
  int64_t c;
  double eps, momentum; /* momentum SBN_MOMENTUM_CUMULATIVE: 1/num_batches_tracked */
  int affine;
  float *w, *b, *gw, *gb, *rm, *rv;     /* NULL when absent */
  const double *payload;                /* 2C+1 (forward) or 2C (backward), the (global) sums */
  double *local;                        /* 2C: this rank's backward sums */
  double *mean, *invstd, *ka, *kb, *kc; /* saved statistics and coefficients */
  double *saved_count;                  /* the count of the saved statistics */
  int64_t *nbt;                         /* num_batches_tracked */
  int *fwd_bad;                         /* 1: the last forward found a count of 1 */
  unsigned *done;                       /* forward_finish's count of finished blocks (0 between calls) */
  int *flag;                            /* host-mapped: set to 1 with fwd_bad (reported by the host) */
} sbn_cuda_finish;

/* Forward: mean/invstd from the payload (batch_stats) or the running
 * statistics, the running update (update), ka = w*invstd, kb = b. A count
 * of 1 changes nothing but fwd_bad and flag; a count of 0 saves zeros and
 * updates nothing. */
int sbn_cuda_forward_finish(sbn_cuda_stream stream, const sbn_cuda_finish *f, int batch_stats,
                            int update);
/* Backward: coefficients of dx from the payload (synced) or the local sums
 * (when want_dx), and grad_weight/grad_bias += the local sums. Nothing when
 * fwd_bad. */
int sbn_cuda_backward_finish(sbn_cuda_stream stream, const sbn_cuda_finish *f, int synced,
                             int want_dx, int batch_stats);

/* The finish and the elementwise pass after it in one kernel: the
 * elementwise kernel's blocks compute their channels' coefficients from the
 * payload themselves and its first blocks do the rest of the finish
 * (bn_elemt.cu). The same results as sbn_cuda_forward_finish then
 * sbn_cuda_normalize (f->mean, f->ka, f->kb), and as
 * sbn_cuda_backward_finish(want_dx 1) then sbn_cuda_backward_elemt, but
 * ka, kb, kc are not written, and a count of 1 (forward) or fwd_bad
 * (backward) leaves y or dx unwritten. An empty tensor runs the finish
 * kernel alone. */
int sbn_cuda_finish_normalize(sbn_cuda_stream stream, void *y, const void *x, sbn_geom g,
                              const sbn_cuda_finish *f, int batch_stats, int update);
int sbn_cuda_finish_backward_elemt(sbn_cuda_stream stream, void *dx, const void *dy, const void *x,
                                   sbn_geom g, const sbn_cuda_finish *f, int synced, int batch_stats);

#ifdef __cplusplus
}
#endif
#endif
