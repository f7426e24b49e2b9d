/*
 * syncbn_custom.h — a process group whose collectives are the caller's.
 *
 * Bring your own communicator: rank, size and three callbacks (all-reduce,
 * broadcast, barrier; split optional) make a group that layers use like any
 * other backend. This is how the Python package rides on torch.distributed
 * (gloo, MPI, NCCL), and how a C program plugs in Horovod, UCC or its own
 * engine:
 *
 *   static int my_allreduce(void *ctx, void *buf, size_t count, sbn_dtype dtype,
 *                           sbn_device device, void *stream) {
 *     return engine_sum(ctx, buf, count, dtype) == OK ? 0 : 1;  // in place
 *   }
 *   ...
 *   sbn_custom_ops ops = {SBN_CUSTOM_OPS_VERSION, "my-engine",
 *                         my_allreduce, my_broadcast, my_barrier, NULL, NULL};
 *   sbn_group *world;
 *   sbn_group_create_custom(&world, rank, size, &ops, engine);
 *   sbn_bn_create(&bn, &opt, world);   // the layer code does not change
 *
 * CONTRACT FOR THE CALLBACKS
 *  - Every rank calls the same callbacks in the same order (the library sees
 *    to that, see MISMATCH below); a callback returns when the collective is
 *    complete on this rank (for host buffers: the data is in `buf`).
 *  - allreduce: in-place element-wise SUM over all ranks of `count` values
 *    of `dtype` at `buf`, in any order. The library sends SBN_DTYPE_FLOAT64
 *    (signatures, the layer's statistics) and SBN_DTYPE_FLOAT32
 *    (sbn_group_allreduce of float32); SBN_DTYPE_INT64 is part of the
 *    contract for later use.
 *    EXACT SUMS: the engine's additions are only ever trusted where they are
 *    exact. For an all-reduce of P*count <= 2^20 values in all (the layer's
 *    2C+1 and 2C: always, up to P*C = 2^19), each rank places its values in
 *    its own slot of a zeroed P*count buffer, so the engine's sum is an
 *    all-gather (x + 0 is exact), and every rank merges the P contributions
 *    with the library's exact summation: results are bitwise those of the
 *    threads and MPI backends, whatever order the engine adds in. Larger
 *    all-reduces (sbn_group_allreduce of gradient buckets) are the engine's
 *    own sum, as deterministic as the engine is.
 *  - broadcast: copy `bytes` bytes at `buf` from group rank `root` to all.
 *  - barrier: optional (NULL: the signature reduction that starts every
 *    collective already waits for every rank).
 *  - device/stream: every buffer is host memory (device.type ==
 *    SBN_DEVICE_CPU, stream == NULL), also for CUDA layers, whose O(C)
 *    statistics are staged through the host. The parameters are there so
 *    that a later version can pass device buffers without changing the
 *    callbacks' signature; until SBN_CUSTOM_OPS_VERSION says so, ignore them.
 *  - split (optional): MPI-style split of the engine's communicator. Return
 *    0 with *new_ctx, *new_rank, *new_size for color >= 0; for
 *    color == SBN_UNDEFINED return 0 and set *new_ctx = NULL. Without it,
 *    sbn_group_split/sbn_group_new on a custom group answer
 *    SBN_STATUS_UNSUPPORTED on every rank (no communication): build a
 *    custom group from a sub-communicator of your engine instead (the
 *    Python package does that per torch.distributed group).
 *  - destroy (optional): called with the group's ctx when its handle is
 *    destroyed (the root's ctx and the ctx of each split group).
 *  - Threads: callbacks run on the thread that called syncbn.
 *
 * ERRORS. A callback returning non-zero makes the syncbn call fail with
 * SBN_STATUS_BACKEND_ERROR and a message naming the group, the callback,
 * the returned code, what the layer was doing, and the text the callback
 * left with sbn_custom_set_error(). The engine's state is then unknown, so
 * the group is marked broken: later calls on this rank fail at once with
 * SBN_STATUS_GROUP_BROKEN.
 *
 * MISMATCH DETECTION: A SECOND SMALL REDUCTION. Before each collective's
 * payload the library all-reduces a fixed-size header of 8 float64 values
 * (so ranks that disagree on the payload size never call the engine with
 * different sizes): [1, local-error flag, h1, h1^2, h2, h2^2, h3, h3^2]
 * where h1..h3 are three independent 16-bit fingerprints (+1) of the
 * collective's signature (kind, layer ordinal, C, dtype, root). The sums
 * are integers below 2^53, hence exact in any order; all ranks agree iff
 * sum(h) == P*h and sum(h^2) == P*h^2 on this rank (zero variance). On any
 * disagreement or local error every rank then exchanges its full signature
 * (one more all-reduce of P*sizeof signature float64 values) and every rank
 * returns the same verdict: SBN_STATUS_MISMATCH listing who called what, or
 * its own error / SBN_STATUS_PEER_FAILED. Cost: one extra all-reduce of 64
 * bytes per collective on the good path. Groups are limited to 65536 ranks
 * (the exact summation's limit; the header's sums stay below 2^53).
 *
 * TIMEOUTS are the engine's business: a rank that never arrives blocks the
 * callbacks until the engine gives up (torch.distributed: the `timeout` of
 * init_process_group/new_group; MPI: never). sbn_group_set_timeout is
 * accepted and has no effect on a custom group.
 */
#ifndef SYNCBN_CUSTOM_H
#define SYNCBN_CUSTOM_H

#include "syncbn.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SBN_CUSTOM_OPS_VERSION 1

typedef struct sbn_custom_ops {
  int version;      /* SBN_CUSTOM_OPS_VERSION */
  const char *name; /* engine name for messages, e.g. "torch.distributed:gloo" (copied) */
  int (*allreduce)(void *ctx, void *buf, size_t count, sbn_dtype dtype, sbn_device device,
                   void *stream);
  int (*broadcast)(void *ctx, void *buf, size_t bytes, int root, sbn_device device,
                   void *stream);
  int (*barrier)(void *ctx);                               /* optional */
  int (*split)(void *ctx, int color, int key, void **new_ctx, int *new_rank,
               int *new_size);                             /* optional */
  void (*destroy)(void *ctx);                              /* optional */
} sbn_custom_ops;

/* A group of `size` ranks in which this process is `rank`, communicating
 * through `ops` (copied; allreduce and broadcast required) on `ctx`. Local:
 * no communication. Release with sbn_group_destroy. */
SBN_API sbn_status sbn_group_create_custom(sbn_group **out, int rank, int size,
                                           const sbn_custom_ops *ops, void *ctx);

/* For callbacks: the text to add to the error message when the callback
 * returns non-zero (copied, per thread; cleared before every callback). */
SBN_API void sbn_custom_set_error(const char *message);

#ifdef __cplusplus
}
#endif
#endif /* SYNCBN_CUSTOM_H */
