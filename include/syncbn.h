/*
 * syncbn.h — synchronized batch normalization for data-parallel training.
 *
 * The core header (layers, groups, thread ranks); syncbn_mpi.h, syncbn_nccl.h,
 * syncbn_custom.h, syncbn_nn.h, syncbn_dp.h and syncbn_data.h add the other
 * backends, modules, the data-parallel wrapper and datasets on top of it.
 * Everything is reached through opaque handles; every call
 * returns an sbn_status; sbn_last_error() holds a per-thread message with the
 * detail of the most recent failure. The library never prints (unless the
 * environment sets SYNCBN_DEBUG=1) and never exits or aborts on a user error.
 *
 * Naming: sbn_<object>_<action>; enum values carry their enum's name
 * (SBN_STATUS_*, SBN_DTYPE_*, ...). Outputs come first in argument lists.
 *
 * Threading: any function may be called from any thread; one handle (group,
 * layer, module, wrapper) is used by one thread at a time. Ranks of the
 * in-process backend are threads, each with its own handles. The README
 * ("Threads and lifetimes") lists what must outlive what.
 *
 * Environment:
 *   SYNCBN_TIMEOUT  seconds a collective waits for missing ranks (default 300,
 *                   also when empty); a value that is not a positive number,
 *                   all of it ("abc", "0", "2x"), makes the group constructors
 *                   that use it (threads, MPI, NCCL) fail with
 *                   SBN_STATUS_INVALID_ARGUMENT naming the value (MPI: on
 *                   every rank; a rank whose own value is fine gets
 *                   SBN_STATUS_PEER_FAILED naming the rank that refused)
 *   SYNCBN_DEBUG    1 (any value but empty and "0"): print every error to
 *                   stderr as it is recorded
 *   SYNCBN_NUM_THREADS  CPU kernel threads per rank (see sbn_set_num_threads):
 *                   a positive integer, all of it; anything else ("abc",
 *                   "0", "5x") is ignored (the default applies; a note on
 *                   stderr when SYNCBN_DEBUG=1)
 *   SYNCBN_CPU_ISA  generic|avx2|avx512|avx512bf16: force a kernel level
 *   SYNCBN_MPI_PAIR 0: two MPI ranks use the general exact all-reduce instead
 *                   of their pairwise exchange (README, "Two backends")
 */
#ifndef SYNCBN_H
#define SYNCBN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* SBN_API marks what the shared library exports. It is compiled with hidden
 * visibility, so a function is visible to programs only when a public header
 * declares it with SBN_API; everything else stays internal (a program's own
 * function of the same name can neither replace nor clash with it). */
#if defined(__GNUC__) || defined(__clang__)
#define SBN_API __attribute__((visibility("default")))
#else
#define SBN_API
#endif

#define SYNCBN_VERSION_MAJOR 1
#define SYNCBN_VERSION_MINOR 0
#define SYNCBN_VERSION_PATCH 0
/* MAJOR*10000 + MINOR*100 + PATCH, comparable with sbn_version(). */
#define SYNCBN_VERSION \
  (SYNCBN_VERSION_MAJOR * 10000 + SYNCBN_VERSION_MINOR * 100 + SYNCBN_VERSION_PATCH)

/* ------------------------------------------------------------------------ */
/* Status codes                                                             */
/* ------------------------------------------------------------------------ */

/* X(name, message): one table generates the enum, the names and messages. */
#define SBN_STATUS_MAP(X)                                                         \
  X(OK, "no error")                                                               \
  X(INVALID_ARGUMENT, "invalid argument (NULL pointer, bad option or shape)")     \
  X(UNSUPPORTED, "unsupported dtype, layout or device")                           \
  X(NOT_BUILT, "this feature or backend was not built into the library")          \
  X(NOT_MEMBER, "the calling rank is not a member of the requested group")        \
  X(MISMATCH, "ranks of a group disagree on the collective (layer, C or dtype)")  \
  X(PEER_FAILED, "another rank of the group reported an error")                   \
  X(TIMEOUT, "a collective timed out waiting for missing ranks")                  \
  X(GROUP_BROKEN, "the group failed earlier (timeout or fault) and is unusable")  \
  X(BAD_STATE, "call out of order (e.g. backward without a training forward)")    \
  X(OUT_OF_MEMORY, "out of memory")                                               \
  X(BACKEND_ERROR, "the communication or device backend reported an error")       \
  X(IO_ERROR, "input/output error")                                               \
  X(INTERNAL, "internal error (a bug in syncbn)")

typedef enum sbn_status {
#define SBN_STATUS_ENUM_(name, msg) SBN_STATUS_##name,
  SBN_STATUS_MAP(SBN_STATUS_ENUM_)
#undef SBN_STATUS_ENUM_
  SBN_STATUS_COUNT_
} sbn_status;

/* Static message for a status ("unknown status" for out-of-range values). */
SBN_API const char *sbn_status_string(sbn_status status);
/* Static name of a status, e.g. "SBN_STATUS_TIMEOUT". */
SBN_API const char *sbn_status_name(sbn_status status);
/* Detail of the most recent failure on the calling thread ("" if none).
 * Calls clear it when they start, except the destroy/free functions, which
 * leave it as it is when they succeed, so cleanup can follow a failure
 * without losing its message (a destroy that is refused, e.g. a group
 * destroyed twice, or a module that is another's child, returns its own
 * status and says why here). Valid until the next syncbn call on this
 * thread. */
SBN_API const char *sbn_last_error(void);
/* Runtime version, same encoding as SYNCBN_VERSION. */
SBN_API int sbn_version(void);

/* ------------------------------------------------------------------------ */
/* Tensors: a descriptor of caller-owned memory                             */
/* ------------------------------------------------------------------------ */

typedef enum sbn_dtype {
  SBN_DTYPE_FLOAT32 = 0,
  SBN_DTYPE_BFLOAT16 = 1, /* storage type: accepted where documented */
  SBN_DTYPE_FLOAT16 = 2,  /* storage type: accepted where documented */
  SBN_DTYPE_FLOAT64 = 3,  /* collectives; layers with param_dtype FLOAT64 (CPU) */
  SBN_DTYPE_INT64 = 4     /* group broadcast only (e.g. num_batches_tracked) */
} sbn_dtype;

/* Memory order of a dense tensor whose logical shape is (N, C, d1, ..., dk).
 * CHANNELS_FIRST: row-major (N, C, d1..dk), PyTorch's contiguous format.
 * CHANNELS_LAST:  row-major (N, d1..dk, C), PyTorch's channels_last(_3d). */
typedef enum sbn_layout {
  SBN_LAYOUT_CHANNELS_FIRST = 0,
  SBN_LAYOUT_CHANNELS_LAST = 1
} sbn_layout;

typedef enum sbn_device_type {
  SBN_DEVICE_CPU = 0,
  SBN_DEVICE_CUDA = 1 /* answered SBN_STATUS_NOT_BUILT without CUDA support */
} sbn_device_type;

typedef struct sbn_device {
  sbn_device_type type;
  int index; /* CUDA ordinal; 0 for the CPU */
} sbn_device;

#define SBN_MAX_DIMS 5

/* A dense tensor in caller-owned memory. shape is always the logical
 * PyTorch order (N, C, d1..); layout says how it lies in memory. The
 * descriptor does not own data; the library never frees it. */
typedef struct sbn_tensor {
  void *data;
  int ndim; /* 2..SBN_MAX_DIMS for layer inputs */
  int64_t shape[SBN_MAX_DIMS];
  sbn_dtype dtype;
  sbn_layout layout;
  sbn_device device;
} sbn_tensor;

/* Convenience: a CPU tensor descriptor. Does not validate (the consumer does).
 * shape must hold ndim values; ndim is clamped to [0, SBN_MAX_DIMS]. */
SBN_API sbn_tensor sbn_tensor_cpu(void *data, int ndim, const int64_t *shape, sbn_dtype dtype,
                                  sbn_layout layout);
/* Number of elements (product of the shape), 0 for ndim <= 0 or NULL.
 * -1 when a dimension is negative or the shape's size overflows: the
 * product of its non-zero dimensions exceeds INT64_MAX (an empty shape
 * such as [0, 2^40, 2^40] is still indexed by its other dimensions). Every
 * call that takes a tensor rejects such shapes with
 * SBN_STATUS_INVALID_ARGUMENT. */
SBN_API int64_t sbn_tensor_numel(const sbn_tensor *t);

/* ------------------------------------------------------------------------ */
/* Process groups                                                           */
/* ------------------------------------------------------------------------ */

/* A group of ranks that synchronize. Each rank holds its own handle.
 * Backends: "threads" (this header), "mpi" (syncbn_mpi.h, libsyncbn_mpi),
 * "nccl" (syncbn_nccl.h, libsyncbn_nccl), "custom" (syncbn_custom.h). The
 * layer never depends on which one a group uses. */
typedef struct sbn_group sbn_group;

/* --- in-process backend: a team of `size` thread ranks --- */
typedef struct sbn_team sbn_team;

/* Create a team of `size` >= 1 ranks. Nothing runs yet: each of `size`
 * threads calls sbn_team_join with a distinct rank. */
SBN_API sbn_status sbn_team_create(sbn_team **team, int size);
/* Join as `rank` (0 <= rank < size, each rank exactly once) and receive the
 * team's world group. The handle belongs to the calling thread; release it
 * with sbn_group_destroy. Returns at once (no rendezvous). */
SBN_API sbn_status sbn_team_join(sbn_group **world, sbn_team *team, int rank);
/* Free the team. Groups already joined stay valid until destroyed. */
SBN_API sbn_status sbn_team_destroy(sbn_team *team);

/* Run fn on `size` threads, one per rank, each given its world group (which
 * is destroyed after fn returns). Returns SBN_STATUS_OK when every fn returned
 * 0, else the status of the lowest failing rank (SBN_STATUS_INTERNAL if fn
 * returned a non-status value); sbn_last_error() then names that rank, its
 * return value and the last error message recorded on its thread. */
typedef int (*sbn_rank_fn)(sbn_group *world, void *arg);
SBN_API sbn_status sbn_team_run(int size, sbn_rank_fn fn, void *arg);

/* --- queries --- */
SBN_API int sbn_group_rank(const sbn_group *group); /* -1 for NULL */
SBN_API int sbn_group_size(const sbn_group *group); /* 0 for NULL */
/* Backend name ("threads", "mpi", "nccl", "custom") and a descriptive group name used in
 * error messages ("world", "world/split(color=1)", "world/ranks{0,1}"). */
SBN_API const char *sbn_group_backend(const sbn_group *group);
SBN_API const char *sbn_group_name(const sbn_group *group);

/* 1 when every member of `inner` is a member of `outer` and both descend
 * from the same root group (a team's world or one MPI constructor call) on
 * this process; 0 otherwise. Local. Used to check that a model's
 * SyncBatchNorm groups lie within a data-parallel wrapper's group. */
SBN_API int sbn_group_contains(const sbn_group *outer, const sbn_group *inner);

/* Seconds a collective on this group waits for missing ranks before failing
 * with SBN_STATUS_TIMEOUT (naming the missing ranks) and marking the group
 * broken. Default: SYNCBN_TIMEOUT (top of this header) or 300. Any value
 * >= SBN_TIMEOUT_FOREVER (including +inf, SYNCBN_TIMEOUT=inf or 1e30) means
 * wait forever; waiting ranks sleep, they do not spin. Local; set it on
 * every rank. */
#define SBN_TIMEOUT_FOREVER 1e9 /* seconds (about 31 years) */
SBN_API sbn_status sbn_group_set_timeout(sbn_group *group, double seconds);

/* --- sub-groups (collective over the parent: every rank of the parent must
 *     call, in the same order relative to other collectives) --- */

#define SBN_UNDEFINED (-1) /* color for "not in any new group" */

/* MPI-style split: ranks with the same color >= 0 form a group ordered by
 * (key, parent rank). color SBN_UNDEFINED: *out = NULL and
 * SBN_STATUS_NOT_MEMBER. Success is agreed: when one rank fails (e.g. out
 * of memory for its handle), every rank fails at once, the others with
 * SBN_STATUS_PEER_FAILED naming it, and nobody keeps a group. */
SBN_API sbn_status sbn_group_split(sbn_group **out, sbn_group *parent, int color, int key);
/* PyTorch-style new_group: `ranks` (parent ranks, distinct, n >= 1) form a
 * group ordered as listed. Every parent rank passes the same list; ranks not
 * listed get *out = NULL and SBN_STATUS_NOT_MEMBER. Lists that differ between
 * ranks give SBN_STATUS_MISMATCH on every rank. */
SBN_API sbn_status sbn_group_new(sbn_group **out, sbn_group *parent, int n, const int *ranks);
/* Release this rank's handle (local, not collective). NULL is a no-op.
 * Layers (sbn_bn_create, SyncBatchNorm modules) and data-parallel wrappers
 * made on the handle should be destroyed first; if some still exist, the
 * backend is released now and the handle's memory when the last of them is
 * destroyed, and their collectives fail with SBN_STATUS_BAD_STATE saying
 * that the group was destroyed. */
SBN_API sbn_status sbn_group_destroy(sbn_group *group);

/* --- collectives (every rank of the group, same order, same arguments) --- */

typedef enum sbn_reduce_op { SBN_REDUCE_OP_SUM = 0 } sbn_reduce_op;

/* In-place all-reduce of `count` values of dtype FLOAT32 or FLOAT64 in host
 * memory. Results are bitwise identical on every rank, from run to run and
 * between backends: the sum is computed exactly and rounded once (to
 * nearest, ties to even), independent of the order in which the engine
 * combines the ranks. Error <= ulp/2 + P * 2^-76 * max|term| (terms more than
 * 2^76 below the largest may be dropped). An exactly zero sum is +0; NaN, or
 * +inf with -inf, gives NaN; otherwise an infinite term gives that infinity.
 * At most 65536 ranks per group. */
SBN_API sbn_status sbn_group_allreduce(sbn_group *group, void *buf, size_t count, sbn_dtype dtype,
                                       sbn_reduce_op op);
/* Copy `bytes` bytes from `root`'s buf into every other rank's buf. */
SBN_API sbn_status sbn_group_broadcast(sbn_group *group, void *buf, size_t bytes, int root);
SBN_API sbn_status sbn_group_barrier(sbn_group *group);

/* ------------------------------------------------------------------------ */
/* The layer: SyncBatchNorm                                                 */
/* ------------------------------------------------------------------------ */

typedef struct sbn_bn sbn_bn;

/* momentum value meaning PyTorch's momentum=None: cumulative moving average
 * with factor 1/num_batches_tracked. */
#define SBN_MOMENTUM_CUMULATIVE (-1.0)

typedef struct sbn_bn_options {
  int64_t num_features;    /* C > 0 */
  double eps;              /* >= 0 and finite; default 1e-5 */
  double momentum;         /* in [0, 1] or SBN_MOMENTUM_CUMULATIVE; default 0.1 */
  int affine;              /* learnable weight (init 1) and bias (init 0); default 1 */
  int track_running_stats; /* running_mean (0), running_var (1), nbt (0); default 1 */
  sbn_device device;       /* where parameters live and inputs must be; default CPU */
  /* dtype of weight, bias, their gradients and the running statistics:
   * FLOAT32 (default; inputs float32, bfloat16 or float16) or FLOAT64
   * (inputs float64 only, as PyTorch's model.double(); CPU layers only:
   * a CUDA layer answers SBN_STATUS_UNSUPPORTED). Added last, so callers
   * that start from sbn_bn_options_default need no change. */
  sbn_dtype param_dtype;
} sbn_bn_options;

/* PyTorch's defaults for C channels. */
SBN_API sbn_bn_options sbn_bn_options_default(int64_t num_features);

/* Create a layer. group: the ranks whose statistics are synchronized; NULL
 * or a group of size 1 gives plain BatchNorm with identical results. The
 * group must outlive the layer. The layer gets an ordinal among layers
 * created on this group handle: create layers in the same order on every
 * rank (as replicas of one model do); collectives carry the ordinal so that
 * ranks calling different layers get SBN_STATUS_MISMATCH instead of mixed
 * statistics. New layers are in training mode. */
SBN_API sbn_status sbn_bn_create(sbn_bn **out, const sbn_bn_options *options, sbn_group *group);
SBN_API sbn_status sbn_bn_destroy(sbn_bn *bn); /* NULL is a no-op */

SBN_API sbn_status sbn_bn_set_training(sbn_bn *bn, int training);
SBN_API int sbn_bn_is_training(const sbn_bn *bn); /* -1 for NULL */
/* The group given at creation if it synchronizes (size > 1), else NULL. */
SBN_API sbn_group *sbn_bn_get_group(const sbn_bn *bn);
SBN_API sbn_status sbn_bn_get_options(const sbn_bn *bn, sbn_bn_options *out);

/* Forward. x: (N, C, *) with 2..5 dims, C == num_features, N >= 0 (N = 0 is
 * an empty rank: it still takes part in the collective), float32 (or
 * bfloat16/float16 storage, see "CPU kernels" below) for a layer whose
 * param_dtype is FLOAT32, float64 for a FLOAT64 layer (any other pairing
 * is SBN_STATUS_INVALID_ARGUMENT naming both dtypes), either layout. y: same shape, dtype and layout as x; y may alias x exactly
 * (in place) but must not partially overlap it.
 *
 * Training (or track_running_stats = 0): normalizes with the batch mean and
 * biased variance over all ranks of the group (one all-reduce of 2C+1
 * float64 values); with track_running_stats, updates running_mean and
 * running_var (unbiased, n/(n-1) with n the global count per channel) and
 * num_batches_tracked, and remembers the statistics for backward. A global
 * count of exactly 1 value per channel is SBN_STATUS_INVALID_ARGUMENT on
 * every rank ("expected more than 1 value per channel when training").
 * A global count of 0 (every rank empty, e.g. the tail of a sharded
 * dataset) succeeds, as PyTorch's SyncBatchNorm test expects: y is empty,
 * running_mean, running_var and num_batches_tracked are untouched (nothing
 * was observed; PyTorch's module would still count the batch), and the
 * backward of that forward gives empty dx and adds nothing to grad_weight
 * and grad_bias. In eval mode with
 * track_running_stats = 0 the statistics are this rank's own (no
 * collective), as in PyTorch. Eval with running statistics: no collective.
 *
 * On any failure nothing changes: running statistics, num_batches_tracked
 * and the saved statistics are as before the call; y is unspecified. */
SBN_API sbn_status sbn_bn_forward(sbn_bn *bn, sbn_tensor *y, const sbn_tensor *x);

/* Backward of the most recent forward of this layer (or of the one a record
 * restored: sbn_bn_restore_forward below). x: the same input as
 * that forward (same shape and values; the layer does not keep a copy);
 * dy: same shape/dtype/layout as x. dx: overwritten; may be NULL when the
 * input needs no gradient (the collective still happens); may alias dy or x
 * exactly (elementwise), never partially.
 * Training forward: dx uses the global sums of dy and dy*(x - mean), one
 * all-reduce of 2C float64 values. grad_weight and grad_bias are LOCAL
 * (this rank's contribution) and ACCUMULATED (+=) as in PyTorch; a
 * data-parallel wrapper averages them over ranks. On failure nothing is
 * accumulated. */
SBN_API sbn_status sbn_bn_backward(sbn_bn *bn, sbn_tensor *dx, const sbn_tensor *dy,
                                   const sbn_tensor *x);

/* This rank's forward (backward = 0) or backward (backward = 1) of the
 * layer fails before it reaches the library: a binding's own check of its
 * caller's input refused it (the Python package's dtype and device rules,
 * say). Where that call would have synchronized (a training forward on a
 * group; the backward of a synchronized forward), this rank still takes
 * part in its collective, carrying the failure, so the other ranks' calls
 * fail with SBN_STATUS_PEER_FAILED naming this rank and `message` instead
 * of waiting for it. Nothing changes on any rank; the group stays usable.
 * Returns `status`, with `message` as sbn_last_error (NULL: the status's
 * own text); SBN_STATUS_INVALID_ARGUMENT, and no collective, for a NULL
 * layer or a status that is not a failure. */
SBN_API sbn_status sbn_bn_fail_call(sbn_bn *bn, int backward, sbn_status status, const char *message);

/* Records of forwards, for a layer applied more than once before its
 * backward: the same module on two inputs (two views of a batch, as in
 * contrastive learning; a shared block), or a forward recomputed for
 * gradient checkpointing. backward differentiates the layer's most recent
 * forward; a record keeps what backward needs of a forward (the mean and
 * 1/std it normalized with, its count, whether it was synchronized, x's
 * shape), so an earlier one can be made current again:
 *
 *   sbn_bn_forward(bn, &y1, &x1);  sbn_bn_save_forward(bn, r1);
 *   sbn_bn_forward(bn, &y2, &x2);
 *   sbn_bn_backward(bn, &dx2, &dy2, &x2);
 *   sbn_bn_restore_forward(bn, r1);  sbn_bn_backward(bn, &dx1, &dy1, &x1);
 *
 * A record is O(C) memory on the layer's device, made for one layer (any
 * other layer refuses it) and reusable; a CUDA layer's copies are enqueued
 * on its stream (no wait). Save and restore are local, with no collective;
 * the backward's collective carries which of the layer's synchronized
 * forwards it differentiates, so ranks that restored different ones get
 * SBN_STATUS_MISMATCH on every rank ("... for forward #3" against "#4")
 * instead of mixed statistics. Restore changes nothing else: parameters, running
 * statistics, num_batches_tracked and gradients stay the layer's current
 * ones (backward uses the current weight). A record may outlive its layer
 * (destroy it any time; for CUDA, destroying waits for the GPU). */
typedef struct sbn_bn_record sbn_bn_record;
SBN_API sbn_status sbn_bn_record_create(sbn_bn_record **out, const sbn_bn *bn);
SBN_API sbn_status sbn_bn_record_destroy(sbn_bn_record *record); /* NULL is a no-op */
/* SBN_STATUS_BAD_STATE if the layer has no successful forward. */
SBN_API sbn_status sbn_bn_save_forward(sbn_bn *bn, sbn_bn_record *record);
/* SBN_STATUS_BAD_STATE if nothing was saved in the record. */
SBN_API sbn_status sbn_bn_restore_forward(sbn_bn *bn, const sbn_bn_record *record);

/* Set grad_weight and grad_bias to zero. */
SBN_API sbn_status sbn_bn_zero_grad(sbn_bn *bn);

/* Per-channel state of a layer, as PyTorch names it. */
typedef enum sbn_bn_tensor_id {
  SBN_BN_TENSOR_WEIGHT = 0,       /* parameter (affine only) */
  SBN_BN_TENSOR_BIAS = 1,         /* parameter (affine only) */
  SBN_BN_TENSOR_GRAD_WEIGHT = 2,  /* gradient (affine only) */
  SBN_BN_TENSOR_GRAD_BIAS = 3,    /* gradient (affine only) */
  SBN_BN_TENSOR_RUNNING_MEAN = 4, /* buffer (track_running_stats only) */
  SBN_BN_TENSOR_RUNNING_VAR = 5   /* buffer (track_running_stats only) */
} sbn_bn_tensor_id;

/* A view of one per-channel tensor: the layer's param_dtype (float32 or
 * float64), shape (C), on the layer's device. The memory belongs to the layer (valid until sbn_bn_destroy) and
 * may be read and written between calls (e.g. to load weights).
 * SBN_STATUS_INVALID_ARGUMENT if the layer has no such tensor (affine = 0 or
 * track_running_stats = 0). */
SBN_API sbn_status sbn_bn_tensor(sbn_tensor *view, sbn_bn *bn, sbn_bn_tensor_id id);

/* num_batches_tracked (int64), in [0, SBN_NUM_BATCHES_TRACKED_MAX]. Set
 * fails without track_running_stats or for a value outside that range
 * (checkpoint loaders reject such values too). A training forward
 * increments it and saturates at the maximum: 2^53, beyond which the
 * cumulative-average factor 1/num_batches_tracked is no longer exact in
 * double (and which no training reaches: 285 years at a batch per
 * microsecond), so the counter never overflows. */
#define SBN_NUM_BATCHES_TRACKED_MAX (INT64_C(1) << 53)
SBN_API sbn_status sbn_bn_get_num_batches_tracked(const sbn_bn *bn, int64_t *out);
SBN_API sbn_status sbn_bn_set_num_batches_tracked(sbn_bn *bn, int64_t value);


/* ------------------------------------------------------------------------ */
/* GPUs (CUDA)                                                              */
/* ------------------------------------------------------------------------ */

/* A layer created with options.device = {SBN_DEVICE_CUDA, i} keeps its
 * parameters, gradients, running statistics and scratch on GPU i. Its
 * inputs and outputs are device pointers of that GPU (tensor.device
 * {SBN_DEVICE_CUDA, i}); sbn_bn_tensor views are device pointers too (copy
 * with cudaMemcpy). A host pointer, memory of another GPU, or a tensor whose
 * device differs from the layer's is SBN_STATUS_INVALID_ARGUMENT or
 * SBN_STATUS_UNSUPPORTED, as for any bad input. Without CUDA support
 * (built without nvcc, or libsyncbn_cuda not linked) creating such a layer
 * answers SBN_STATUS_NOT_BUILT.
 *
 * Work is enqueued on the layer's stream (sbn_bn_set_stream) and forward
 * and backward return without waiting for the GPU, with one exception: a
 * group without a device all-reduce (threads, MPI, custom) is served
 * through host memory, which waits for the stream once per collective
 * (a copy of 2C+1 values, the group's exact host all-reduce, a copy back).
 * A layer without a group, or with a group that reduces device buffers,
 * never synchronizes with the host, so its steps can be captured in a CUDA
 * graph. Run a step of the largest shape eagerly first: the first call
 * with a larger shape allocates the layer's scratch (cudaMalloc), which
 * must not happen during a capture. Graphs captured before such a growth stay valid (the
 * replaced scratch is kept until sbn_bn_destroy).
 *
 * Counts: the host knows the global count per channel except after a
 * device all-reduce. There the device applies the rules itself: a count
 * of 0 (every rank empty) succeeds and changes nothing, as on the CPU; a
 * count of 1 leaves running statistics, num_batches_tracked, the saved
 * statistics and the gradients of the following backward untouched (y and
 * dx are unspecified) and the error ("expected more than 1 value per
 * channel") is returned by the layer's next forward or backward that finds
 * it; the getters of num_batches_tracked wait for the stream and report it
 * too.
 *
 * num_batches_tracked lives on the GPU: get and set copy it and wait. */

/* The CUDA stream (a cudaStream_t) of a CUDA layer's work from now on; NULL
 * is the legacy default stream (the initial value). The stream must stay
 * alive until the layer is destroyed or given another stream (destroy waits
 * for it). A stream of another GPU, or a CPU layer:
 * SBN_STATUS_INVALID_ARGUMENT. */
SBN_API sbn_status sbn_bn_set_stream(sbn_bn *bn, void *cuda_stream);
/* Number of CUDA devices: SBN_STATUS_NOT_BUILT without CUDA support; OK with
 * *count = 0 when CUDA is built but there is no GPU (or no driver). */
SBN_API sbn_status sbn_cuda_device_count(int *count);

/* ------------------------------------------------------------------------ */
/* CPU kernels: storage types and threads within a rank                     */
/* ------------------------------------------------------------------------ */

/* Storage: layer inputs and outputs (x, y, dy, dx) may be FLOAT32, BFLOAT16
 * or FLOAT16 (all four of one call the same dtype); parameters, gradients
 * and running statistics stay float32. The reductions accumulate in float64;
 * the elementwise passes compute in float64 for float32 storage and in
 * float32 for 16-bit storage, with the mean split in two float32 halves so
 * that x - mean stays exact (an error far below the 16-bit rounding of y and
 * dx, which are rounded once, to nearest even). A layer created with
 * param_dtype FLOAT64 keeps its state in float64 and takes FLOAT64 inputs
 * and outputs, computed in float64 throughout (PyTorch's model.double()).
 *
 * Threads: each rank runs the CPU kernels on T threads (the library's own
 * pool, created on the first call that needs it). Results are
 * bitwise identical for every T (fixed work units, partial sums merged in a
 * fixed order), so T only changes speed. T is, in order of precedence:
 *   sbn_set_num_threads(T) with T >= 1 (process-wide);
 *   the environment variable SYNCBN_NUM_THREADS (read once; ignored unless
 *   it is a positive integer);
 *   max(1, usable cores / ranks sharing them), where the ranks sharing them
 *   are the size of the layer's group for the threads backend (the ranks are
 *   threads of this process) times the MPI processes on this node
 *   (OMPI_COMM_WORLD_LOCAL_SIZE or MPI_LOCALNRANKS), so that ranks and their
 *   threads together do not oversubscribe the cores.
 * Tensors under 65536 values run on one thread.
 *
 * SYNCBN_CPU_ISA=generic|avx2|avx512|avx512bf16 forces those kernels
 * (default: avx512bf16 when the CPU also has AVX512_BF16, else avx512 when it
 * has AVX-512 F, BW, VL and DQ, else avx2 when it has AVX2 and FMA);
 * all give the same bits. A level the CPU lacks (or an unknown name): the best,
 * with a note on stderr when SYNCBN_DEBUG=1. */

/* T >= 1: threads per rank from now on; 0: back to the default; < 0:
 * SBN_STATUS_INVALID_ARGUMENT. */
SBN_API sbn_status sbn_set_num_threads(int threads);
/* The T a rank uses when `ranks_in_process` ranks share this process. */
SBN_API int sbn_num_threads(int ranks_in_process);

#ifdef __cplusplus
}
#endif
#endif /* SYNCBN_H */
