/*
 * syncbn_nccl.h — the NCCL process-group backend of syncbn (GPUs).
 *
 * Kept apart from syncbn.h so that programs without NCCL never see nccl.h;
 * the backend lives in its own library, libsyncbn_nccl (link it before
 * libsyncbn), so a program that does not use it never loads libnccl.
 * One rank per GPU (NCCL refuses two ranks of one communicator on the same
 * device).
 *
 *   // over any existing group, e.g. MPI (one rank per GPU):
 *   sbn_group *world, *gpus;
 *   sbn_group_from_mpi(&world, MPI_COMM_WORLD);
 *   sbn_group_create_nccl_over(&gpus, world, local_rank);   // collective
 *   sbn_bn_options o = sbn_bn_options_default(64);
 *   o.device = (sbn_device){SBN_DEVICE_CUDA, local_rank};
 *   sbn_bn_create(&bn, &o, gpus);
 *   sbn_bn_set_stream(bn, stream);     // forward/backward enqueue on it
 *   ...
 *   sbn_bn_destroy(bn);
 *   sbn_group_destroy(gpus);           // before `world`
 *   sbn_group_destroy(world);
 *
 * LAYERS. A layer on this group sums its statistics with ncclAllReduce on
 * the layer's stream: nothing waits for the host, so a training step can be
 * captured in a CUDA graph. The sums are exact and rounded once, so results
 * are bitwise identical on every rank, from run to run, and equal to the
 * threads and MPI backends' (two NCCL reductions per collective: a MAX of
 * one byte per value, then an integer SUM of 32 bytes per value; see
 * src/comm/nccl.c).
 *
 * ERRORS ON THE DEVICE PATH are found on the device: ranks whose layers
 * disagree (a different layer, dtype or collective), or a rank whose layer
 * failed locally, make every other rank's device-side check record the
 * disagreement instead of writing results (the statistics stay this rank's
 * own), and the group's next host-side call (any sbn_group_* collective
 * on this group) returns SBN_STATUS_MISMATCH on the ranks that recorded it
 * and SBN_STATUS_PEER_FAILED, naming them, on the others. To know at a
 * point of your choice (e.g. once per epoch), synchronize the layers'
 * streams and call sbn_group_barrier (it waits, bounded by the group's
 * timeout): every rank then reports the same error. Ranks must pass the
 * same number of values to each collective (the same model on every rank):
 * NCCL's calls carry the sizes, and calls of different sizes are undefined
 * behaviour in NCCL that no device-side check can prevent.
 *
 * HOST MEMORY. sbn_group_allreduce / sbn_group_broadcast accept host or
 * device buffers of this group's GPU: host buffers are staged through
 * device memory; these calls synchronize (they return when the data is in
 * `buf`) and first agree on the call on every rank (a mismatch is reported
 * before any payload moves, with the same messages as MPI's).
 *
 * TIMEOUTS. NCCL calls cannot be cancelled. The synchronizing calls poll the
 * stream and ncclCommGetAsyncError against the group's timeout
 * (SYNCBN_TIMEOUT, sbn_group_set_timeout); when it passes they call
 * ncclCommAbort — also on a caller's communicator, which is then unusable —
 * mark the group broken and return SBN_STATUS_TIMEOUT (NCCL cannot say which
 * rank is missing). The abort also ends device work that waits in NCCL
 * kernels (e.g. a layer step whose peer never arrived). A rank that was
 * stopped and resumes later finds its peers gone: its own next synchronizing
 * call times out the same way. On a blocking communicator an NCCL host call
 * itself may block (a launch that first connects to a stuck peer, a split, a
 * finalize): each group has a watchdog thread that aborts the communicator
 * when such a call is still running at the deadline, with the same status.
 */
#ifndef SYNCBN_NCCL_H
#define SYNCBN_NCCL_H

#include <nccl.h>

#include "syncbn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ABI-stable entry point behind sbn_group_create_nccl: *comm points to an
 * ncclComm_t and comm_size is sizeof(ncclComm_t). */
SBN_API sbn_status sbn_group_create_nccl_comm(sbn_group **out, const void *comm, size_t comm_size,
                                              int device);

/* A group over the caller's communicator `comm`, whose ranks are this
 * group's ranks, on CUDA device `device` (the communicator's own device).
 * Local: no communication. The communicator is NOT owned: it must outlive
 * the group (sbn_group_destroy it first, then ncclCommDestroy), and the
 * caller must not run collectives on it concurrently with the group's
 * (interleaving on the same stream is fine). A timeout aborts it (above).
 * Blocking and non-blocking communicators both work, at the same cost per
 * collective (measured on an H200).
 * Sub-groups (sbn_group_split, sbn_group_new) use ncclCommSplit and own
 * their new communicators. Without NCCL support: SBN_STATUS_NOT_BUILT. */
static inline sbn_status sbn_group_create_nccl(sbn_group **out, ncclComm_t comm, int device) {
  return sbn_group_create_nccl_comm(out, &comm, sizeof comm, device);
}

/* Collective over `bootstrap` (any group: MPI, threads, custom; every rank
 * calls): rank 0 makes an ncclUniqueId, sbn_group_broadcast sends it, and
 * every rank joins a new blocking communicator (ncclCommInitRank, bounded by
 * bootstrap's timeout; a watchdog bounds its later calls) on CUDA device
 * `device`; ranks and size are bootstrap's. The communicator is owned by
 * the new group and destroyed with it; `bootstrap` may be destroyed any
 * time after this returns.
 * bootstrap NULL: a group of one rank (through the real NCCL calls; for
 * tests and benchmarks). If any rank fails, every rank returns an error and
 * no group. Without NCCL support: SBN_STATUS_NOT_BUILT. */
SBN_API sbn_status sbn_group_create_nccl_over(sbn_group **out, sbn_group *bootstrap, int device);

#ifdef __cplusplus
}
#endif
#endif /* SYNCBN_NCCL_H */
