/*
 * syncbn_dp.h — data-parallel training of a module tree, in the spirit of
 * Bagua's `model.with_bagua(optimizers, algorithm)`.
 *
 *   sbn_dp *dp;
 *   sbn_dp_wrap(&dp, model, &sgd, 1, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, world, NULL);
 *   for each batch: sbn_dp_zero_grad(dp); sbn_dp_forward(dp, &y, &x);
 *                   loss/dy on this rank; sbn_dp_backward(dp, NULL, &dy); sbn_dp_step(dp);
 *
 * Wrapping (collective over the group): checks that every SyncBatchNorm of
 * the tree synchronizes within the wrapper's ranks, broadcasts parameters
 * and buffers from rank 0 so every rank starts equal, plans gradient
 * buckets, and marks the tree wrapped (convert_sync_batchnorm is refused
 * from then on: convert before wrapping, as PyTorch and Bagua require).
 *
 * Backward runs the model's backward and all-reduces the gradients in
 * buckets of options.bucket_bytes, each started as soon as all its gradients
 * are complete (for a Sequential root: after each top-level child), on a
 * communication thread when the backend allows (threads), so communication
 * overlaps the rest of backward. Parameters named in params_to_ignore are
 * neither broadcast nor reduced.
 */
#ifndef SYNCBN_DP_H
#define SYNCBN_DP_H

#include "syncbn_nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sbn_dp sbn_dp;

typedef enum sbn_dp_algorithm {
  SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE = 0 /* Bagua's GradientAllReduce */
} sbn_dp_algorithm;

typedef enum sbn_dp_reduce {
  /* gradients averaged over ranks (Bagua's default): exact when every rank's
   * loss is a mean over equal batches */
  SBN_DP_REDUCE_AVERAGE = 0,
  /* gradients summed: exact with uneven batches when each rank divides its
   * loss by the GLOBAL batch size (sbn_nn_cross_entropy_forward's divisor) */
  SBN_DP_REDUCE_SUM = 1
} sbn_dp_reduce;

typedef struct sbn_dp_options {
  size_t bucket_bytes;                 /* default 4 MiB; 0: one bucket per parameter */
  sbn_dp_reduce reduce;                /* default AVERAGE */
  int overlap;                         /* default 1: all-reduce on a communication thread */
  const char *const *params_to_ignore; /* full names, "{module_name}.{param_name}"; a name
                                        * the model lacks is INVALID_ARGUMENT */
  int num_params_to_ignore;
} sbn_dp_options;

SBN_API sbn_dp_options sbn_dp_options_default(void);

/* Wrap `model` (a root: a module's child is SBN_STATUS_INVALID_ARGUMENT)
 * for data-parallel training over `group` with the given optimizers (kept,
 * not owned; they step in sbn_dp_step). Collective: every rank of the group
 * calls it with the same architecture, the same parameters requiring
 * gradients and the same options.reduce and bucket_bytes (else
 * SBN_STATUS_MISMATCH on the rank that differs from rank 0, PEER_FAILED on
 * the others, nothing changed). */
SBN_API sbn_status sbn_dp_wrap(sbn_dp **out, sbn_module *model, sbn_nn_sgd *const *optimizers,
                               int num_optimizers, sbn_dp_algorithm algorithm, sbn_group *group,
                               const sbn_dp_options *options);

/* The model's forward (y is a view, as sbn_module_forward). */
SBN_API sbn_status sbn_dp_forward(sbn_dp *dp, sbn_tensor *y, const sbn_tensor *x);
/* The model's backward and the gradient all-reduce (collective). dx may be
 * NULL; else *dx becomes a view, as sbn_module_backward's. On return every
 * rank holds the same reduced gradients. Gradients accumulate as in
 * PyTorch: several backwards before a step (micro-batches) give the sum of
 * each one's reduced gradients (only what a backward computes is
 * all-reduced, never what the parameters held before it).
 * Its preconditions (a successful forward to differentiate, a dy of the
 * forward output's shape)
 * are agreed on first: a rank that misses one gets SBN_STATUS_BAD_STATE or
 * INVALID_ARGUMENT, the others SBN_STATUS_PEER_FAILED naming it, and the
 * groups stay usable. On failure the gradients are as before the call (see
 * sbn_module_backward), not reduced. */
SBN_API sbn_status sbn_dp_backward(sbn_dp *dp, sbn_tensor *dx, const sbn_tensor *dy);
/* Step every optimizer; counts a training step. Refused with
 * SBN_STATUS_BAD_STATE (nothing stepped) while the last sbn_dp_backward
 * failed: the gradients would be this rank's alone, not reduced, and the
 * replicas would drift apart. A backward that succeeds allows it again. */
SBN_API sbn_status sbn_dp_step(sbn_dp *dp);
SBN_API sbn_status sbn_dp_zero_grad(sbn_dp *dp);

SBN_API int64_t sbn_dp_train_step_counter(const sbn_dp *dp); /* Bagua's bagua_train_step_counter */
SBN_API sbn_status sbn_dp_set_train_step_counter(sbn_dp *dp, int64_t steps); /* e.g. on resume */
SBN_API int sbn_dp_num_buckets(const sbn_dp *dp);
SBN_API sbn_group *sbn_dp_group(const sbn_dp *dp);

/* Unwrap: the tree is no longer marked wrapped; the model and optimizers
 * stay with the caller. Local. NULL is a no-op. The model must outlive the
 * wrapper: sbn_module_destroy of a wrapped model is refused
 * (SBN_STATUS_BAD_STATE) until this is called. */
SBN_API sbn_status sbn_dp_destroy(sbn_dp *dp);

#ifdef __cplusplus
}
#endif
#endif
