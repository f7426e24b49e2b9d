/* Internal: the process-group interface. A backend is a table of function
 * pointers behind the opaque sbn_group handle; the layer only calls the
 * sbn_comm_* wrappers below and never knows which backend it talks to. */
#ifndef SBN_COMM_H
#define SBN_COMM_H

#include "syncbn.h"
#include "../core/error.h"

/* What a rank is doing in a collective. Every collective carries one; the
 * backend checks that all ranks carry the same signature (kind, layer, count,
 * dtype) before touching data, and propagates a rank's local error (status !=
 * OK) to all ranks, so misuse becomes an error on every rank, not a hang or
 * mixed statistics. */
typedef enum sbn_sig_kind {
  SBN_SIG_KIND_ALLREDUCE = 1,
  SBN_SIG_KIND_BROADCAST,
  SBN_SIG_KIND_BARRIER,
  SBN_SIG_KIND_SPLIT,
  SBN_SIG_KIND_NEW_GROUP,
  SBN_SIG_KIND_BN_FORWARD,
  SBN_SIG_KIND_BN_BACKWARD
} sbn_sig_kind;

typedef struct sbn_sig {
  int32_t kind;    /* sbn_sig_kind */
  int32_t layer;   /* layer ordinal on the group, -1 if none */
  int64_t count;   /* payload elements (C for layers) */
  int32_t dtype;   /* payload dtype */
  int32_t status;  /* this rank's local error, SBN_STATUS_OK if none */
  uint64_t extra;  /* kind-specific (root of a broadcast, hash of a rank list) */
  char what[256];  /* for messages: "forward of layer #2 (C=64)" or the local error */
} sbn_sig;

/* Fill a signature; `what` is printf-formatted. */
void sbn_sig_init(sbn_sig *sig, sbn_sig_kind kind, int layer, int64_t count, sbn_dtype dtype,
                  const char *fmt, ...) SBN_PRINTF(6, 7);
/* The same with `what` already written: no formatting (a layer formats its
 * description once and reuses it on every call). */
void sbn_sig_init_text(sbn_sig *sig, sbn_sig_kind kind, int layer, int64_t count, sbn_dtype dtype,
                       const char *what);
/* Mark a signature as carrying this rank's local failure (message: the
 * calling thread's last error). */
void sbn_sig_set_error(sbn_sig *sig, sbn_status status);
/* 1 when two signatures describe the same collective. */
int sbn_sig_same(const sbn_sig *a, const sbn_sig *b);

typedef struct sbn_comm_ops {
  const char *name;
  /* In-place sum of count FLOAT32/FLOAT64 values, rank-ordered. */
  sbn_status (*allreduce)(sbn_group *g, void *buf, size_t count, sbn_dtype dtype,
                          const sbn_sig *sig);
  sbn_status (*broadcast)(sbn_group *g, void *buf, size_t bytes, int root, const sbn_sig *sig);
  sbn_status (*barrier)(sbn_group *g, const sbn_sig *sig);
  /* Collective over g; *out = NULL and SBN_STATUS_NOT_MEMBER for color < 0.
   * Sets *agreed once every rank is known to make this same call (the
   * signatures matched): a failure after that point is this rank's alone,
   * and the caller tells the others (group.c, split_agreed). */
  sbn_status (*split)(sbn_group **out, sbn_group *g, int color, int key, const sbn_sig *sig,
                      int *agreed);
  void (*destroy)(sbn_group *g);
  /* Optional (NULL for host-only backends): the same sum as allreduce, of
   * `count` FLOAT64 values in device memory, enqueued on `stream` (a
   * cudaStream_t) without waiting for the host, so that a layer's step can
   * be captured in a CUDA graph. Layers on a device whose group lacks it
   * stage the values through host memory instead. */
  sbn_status (*allreduce_device)(sbn_group *g, void *buf, size_t count, sbn_dtype dtype,
                                 const sbn_sig *sig, void *stream);
  /* Optional (NULL: peers find out by their timeout): this rank leaves the
   * group's collectives for good after an error of its own (`why`); every
   * rank waiting in a collective of g, now or later, fails at once naming
   * this rank and why, and the group is broken on every rank. */
  void (*abort)(sbn_group *g, const char *why);
} sbn_comm_ops;

/* The handle: generic part + backend state. */
struct sbn_group {
  const sbn_comm_ops *ops;
  void *impl;       /* backend state */
  int rank, size;
  double timeout_s; /* collective wait limit */
  int next_layer;   /* ordinal handed to the next layer created on this handle */
  /* Layers and data-parallel wrappers holding this handle, plus the
   * destroyed bit (atomic, group.c): the memory outlives them all. */
  uint32_t holds;
  char name[128];
  /* Lineage, process-local: groups split from one root share root_id, and
   * world_ranks[i] is member i's rank in that root. Filled generically by
   * group.c, so backends need not know about it. */
  uint64_t root_id;
  int *world_ranks;
};

/* This rank leaves g's collectives after an error its peers do not know
 * of (ops->abort; a backend without it: they find out by their timeout). */
void sbn_group_abort(sbn_group *g, const char *why);

/* A layer or wrapper starts / stops holding g. sbn_group_destroy of a held
 * handle releases the backend at once but keeps the handle's memory, with
 * a backend table whose calls all fail, until the last holder lets go: a
 * layer used after its group was destroyed gets an error, not a dangling
 * pointer. */
void sbn_group_retain(sbn_group *g);
void sbn_group_release(sbn_group *g);

/* Allocate a handle with the generic fields set (timeout from SYNCBN_TIMEOUT). */
sbn_group *sbn_group_alloc(const sbn_comm_ops *ops, void *impl, int rank, int size,
                           const char *name);
/* SYNCBN_TIMEOUT in seconds (300 when unset). NaN, with
 * SBN_STATUS_INVALID_ARGUMENT recorded naming the value, when it is not a
 * positive number: a root group's constructor then fails with that status. */
double sbn_default_timeout(void);

/* The calls the layer makes (argument checks done by the caller). */
static inline sbn_status sbn_comm_allreduce(sbn_group *g, void *buf, size_t count,
                                            sbn_dtype dtype, const sbn_sig *sig) {
  return g->ops->allreduce(g, buf, count, dtype, sig);
}

/* Thread ranks (threads backend) alive in this process, over all teams: a
 * rank counts from sbn_team_join until its world handle is destroyed. */
int sbn_threads_ranks_in_process(void);

/* Message helper for backends: the error to report when the signatures of
 * the ranks differ or carry errors. Returns the status every rank returns and
 * records the message. sigs[r] is rank r's signature. */
sbn_status sbn_sig_verdict(const sbn_group *g, const sbn_sig *sigs, int me);

#endif
