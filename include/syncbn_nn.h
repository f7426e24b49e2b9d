/*
 * syncbn_nn.h — a small neural-network module layer on top of syncbn.h:
 * a module tree with PyTorch state-dict names, CPU float32 layers (NCHW),
 * convert_sync_batchnorm and its reverse, cross-entropy, SGD, and
 * checkpoints in the safetensors format.
 *
 * Conventions (as in syncbn.h): every call returns an sbn_status and records
 * a message readable with sbn_last_error(); outputs come first; nothing
 * prints, exits or aborts.
 *
 * Activations: a module owns its outputs and its input gradient. forward()
 * fills *y with a VIEW of module-owned memory, valid until the next forward
 * of that module (or its destruction); backward() does the same for *dx.
 * The caller's input x must stay alive and unchanged until the backward of
 * that forward (like sbn_bn_backward, the modules keep a pointer, not a
 * copy). A view a module returned may be passed back to it (y2 = f(y), a
 * block applied twice; its dx as dy or as the next x): the module then
 * writes a second buffer of its own, so the values are those of a copy and
 * the input stays intact for backward. Gradients of parameters ACCUMULATE (+=) as in PyTorch; call
 * sbn_module_zero_grad before each step. Input tensors: float32, CPU,
 * channels-first (PyTorch's contiguous layout).
 *
 * Ownership: a container (Sequential, BasicBlock) owns its children;
 * destroying the root destroys the tree. A module can be a child of at most
 * one parent.
 */
#ifndef SYNCBN_NN_H
#define SYNCBN_NN_H

#include "syncbn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Module tree                                                              */
/* ------------------------------------------------------------------------ */

typedef struct sbn_module sbn_module;

typedef enum sbn_module_kind {
  SBN_MODULE_KIND_SEQUENTIAL = 0,
  SBN_MODULE_KIND_LINEAR,
  SBN_MODULE_KIND_CONV2D,
  SBN_MODULE_KIND_RELU,
  SBN_MODULE_KIND_MAXPOOL2D,
  SBN_MODULE_KIND_ADAPTIVE_AVGPOOL2D, /* global average pooling: (N,C,H,W) -> (N,C,1,1) */
  SBN_MODULE_KIND_FLATTEN,
  SBN_MODULE_KIND_BATCHNORM1D,
  SBN_MODULE_KIND_BATCHNORM2D,
  SBN_MODULE_KIND_BATCHNORM3D,
  SBN_MODULE_KIND_SYNC_BATCHNORM,
  SBN_MODULE_KIND_BASIC_BLOCK,
  SBN_MODULE_KIND_COUNT_
} sbn_module_kind;

/* PyTorch's class name of a kind ("Conv2d", "BatchNorm2d", "SyncBatchNorm"). */
SBN_API const char *sbn_module_kind_name(sbn_module_kind kind);
SBN_API sbn_module_kind sbn_module_kind_of(const sbn_module *m); /* SBN_MODULE_KIND_COUNT_ for NULL */

/* Destroy a module and its children. NULL is a no-op. Refused with
 * SBN_STATUS_BAD_STATE, the module left as it is: a module that is the child
 * of another (destroy the root), and a root marked wrapped (see
 * sbn_module_set_wrapped; destroy the data-parallel wrapper first). */
SBN_API sbn_status sbn_module_destroy(sbn_module *m);

/* Children: count, and the i-th child with its local name ("0", "conv1"). */
SBN_API int sbn_module_num_children(const sbn_module *m);
SBN_API sbn_status sbn_module_child(sbn_module **child, const char **name, sbn_module *m, int i);
/* Find a submodule by dotted path ("layer1.0.bn1"; "" is m itself). */
SBN_API sbn_status sbn_module_find(sbn_module **out, sbn_module *m, const char *path);

/* Recursive train/eval (PyTorch's module.train(mode)). New modules train. */
SBN_API sbn_status sbn_module_train(sbn_module *m, int training);
SBN_API int sbn_module_is_training(const sbn_module *m); /* -1 for NULL */

/* Forward: *y becomes a view of the module's output (see the conventions
 * above). Backward of the most recent forward: dy must have y's shape; *dx
 * becomes a view of the gradient w.r.t. that forward's x. A failed backward
 * changes no gradient, also when it fails part-way (a SyncBatchNorm's
 * collective after the modules behind it accumulated): the gradients are
 * saved before and put back. The cost: one read of the gradients per
 * backward; gradients that are not all zero (accumulated over several
 * backwards) are also copied, into memory the module keeps (at most one
 * float per parameter). */
SBN_API sbn_status sbn_module_forward(sbn_module *m, sbn_tensor *y, const sbn_tensor *x);
SBN_API sbn_status sbn_module_backward(sbn_module *m, sbn_tensor *dx, const sbn_tensor *dy);
/* Set every parameter gradient in the tree to zero. */
SBN_API sbn_status sbn_module_zero_grad(sbn_module *m);

/* requires_grad of one parameter by full name, or of every parameter of the
 * tree when name is NULL. A parameter that does not require grad keeps its
 * gradient untouched in backward. Optimizers keep the set of parameters
 * that required grad when they were created (sbn_nn_sgd_create): one made
 * after the change skips the parameter, an earlier one still steps it
 * (with momentum or weight decay it still moves). */
SBN_API sbn_status sbn_module_set_requires_grad(sbn_module *m, const char *name, int requires_grad);

/* The "wrapped" flag of a root (set by the data-parallel wrapper): while it
 * is set on a module or any of its ancestors, convert/revert of the tree
 * are refused with SBN_STATUS_BAD_STATE (PyTorch's and Bagua's rule:
 * convert before wrapping). */
SBN_API sbn_status sbn_module_set_wrapped(sbn_module *m, int wrapped);
SBN_API int sbn_module_is_wrapped(const sbn_module *m); /* this module or an ancestor; -1 for NULL */

/* ------------------------------------------------------------------------ */
/* State: parameters and buffers with PyTorch state-dict names              */
/* ------------------------------------------------------------------------ */

/* Full state-dict names have at most SBN_NN_NAME_MAX - 1 characters.
 * Attaching a child (sbn_nn_sequential_append) whose name, path or
 * subtree would make a longer one is refused (SBN_STATUS_INVALID_ARGUMENT
 * naming the parent's path and the limit), so a model that was built can
 * always be listed and saved. */
#define SBN_NN_NAME_MAX 256

typedef enum sbn_nn_entry_kind {
  SBN_NN_ENTRY_KIND_PARAMETER = 1,
  SBN_NN_ENTRY_KIND_BUFFER = 2
} sbn_nn_entry_kind;

/* One named tensor of the tree. data points at the live storage (float32 for
 * parameters and running statistics, int64 for num_batches_tracked, shape
 * [] i.e. ndim 0, numel 1): it may be read and written between calls, e.g.
 * by a broadcast of bytes(dtype) * numel from rank 0. grad: the parameter's
 * gradient (float32, numel values), NULL for buffers. The float32 data and
 * grad pointers stay valid until the model is destroyed (convert/revert
 * keep that memory); num_batches_tracked's data and `owner` only until the
 * tree changes (convert/revert/destroy). */
typedef struct sbn_nn_entry {
  char name[SBN_NN_NAME_MAX]; /* full name: "layer1.0.bn1.running_mean" */
  sbn_nn_entry_kind kind;
  sbn_dtype dtype;            /* SBN_DTYPE_FLOAT32 or SBN_DTYPE_INT64 */
  int ndim;                   /* 0 for scalars */
  int64_t shape[SBN_MAX_DIMS];
  int64_t numel;
  void *data;
  float *grad;
  int requires_grad;          /* parameters only */
  sbn_module *owner;          /* the module holding it */
} sbn_nn_entry;

/* Select what sbn_module_entries lists. */
#define SBN_NN_PARAMETERS 1u
#define SBN_NN_BUFFERS 2u
#define SBN_NN_STATE (SBN_NN_PARAMETERS | SBN_NN_BUFFERS)

/* List the tree's entries in PyTorch's order (state_dict order: a module's
 * parameters, then its buffers, then its children depth-first; with only
 * SBN_NN_PARAMETERS it is named_parameters() order). *out is malloc'ed:
 * release with free(). The wrapper of a data-parallel step iterates this
 * list to bucket gradients and to broadcast parameters and buffers. */
SBN_API sbn_status sbn_module_entries(sbn_nn_entry **out, int *count, sbn_module *m, unsigned what);
/* Total number of parameter values (numel summed). */
SBN_API int64_t sbn_module_num_parameters(sbn_module *m);

/* ------------------------------------------------------------------------ */
/* Layers (constructors; new modules are in training mode)                  */
/* ------------------------------------------------------------------------ */

/* A container running its children in order. */
SBN_API sbn_status sbn_nn_sequential_create(sbn_module **out);
/* Append child (ownership moves to seq; on failure it stays with the
 * caller). name NULL: its index ("0", "1", ...), as nn.Sequential.
 * Refused when a state-dict name would exceed SBN_NN_NAME_MAX - 1. */
SBN_API sbn_status sbn_nn_sequential_append(sbn_module *seq, const char *name, sbn_module *child);

/* y = x W^T + b; x (N, in) or (*, in); weight (out, in), bias (out).
 * Initialized like PyTorch (uniform(+-1/sqrt(in))) from `seed`. */
SBN_API sbn_status sbn_nn_linear_create(sbn_module **out, int64_t in_features, int64_t out_features,
                                        int bias, uint64_t seed);

/* Conv2d with a square kernel, stride and zero padding; weight (out, in, k, k).
 * x (N, C_in, H, W). im2col + OpenBLAS sgemm. */
SBN_API sbn_status sbn_nn_conv2d_create(sbn_module **out, int64_t in_channels, int64_t out_channels,
                                        int kernel_size, int stride, int padding, int bias, uint64_t seed);

SBN_API sbn_status sbn_nn_relu_create(sbn_module **out);
/* MaxPool2d(kernel_size, stride (0: = kernel_size), padding). */
SBN_API sbn_status sbn_nn_maxpool2d_create(sbn_module **out, int kernel_size, int stride, int padding);
/* AdaptiveAvgPool2d((1, 1)): global average pooling. */
SBN_API sbn_status sbn_nn_global_avgpool_create(sbn_module **out);
/* Flatten(start_dim = 1): (N, ...) -> (N, prod(...)); output aliases input. */
SBN_API sbn_status sbn_nn_flatten_create(sbn_module **out);

/* BatchNorm{1,2,3}d: plain batch normalization (the core sbn_bn layer with
 * group NULL). dims 1, 2 or 3. Input checks as PyTorch: 1d takes 2D or 3D
 * input, 2d takes 4D, 3d takes 5D. options: e.g. sbn_bn_options_default(C);
 * modules are float32 on the CPU (param_dtype FLOAT64 or a CUDA device:
 * SBN_STATUS_UNSUPPORTED; sbn_bn_create makes such layers). */
SBN_API sbn_status sbn_nn_batchnorm_create(sbn_module **out, int dims, const sbn_bn_options *options);
/* SyncBatchNorm over group (NULL or size 1: plain BN). Input (N, C, *) with
 * at least 2 dims. Options as for sbn_nn_batchnorm_create; a refused one
 * leaves the group as it was (no layer ordinal taken). Reverting one made
 * here gives BatchNorm2d; one made by convert reverts to the kind it came
 * from. */
SBN_API sbn_status sbn_nn_sync_batchnorm_create(sbn_module **out, const sbn_bn_options *options,
                                                sbn_group *group);
/* The core layer behind a BatchNorm/SyncBatchNorm module. */
SBN_API sbn_status sbn_module_bn(sbn_bn **out, sbn_module *m);

/* torchvision's BasicBlock: conv1 (3x3, stride), bn1, relu, conv2 (3x3),
 * bn2, + identity or downsample (downsample.0: conv 1x1 stride,
 * downsample.1: BatchNorm2d, present when stride != 1 or in != out), relu. */
SBN_API sbn_status sbn_nn_basic_block_create(sbn_module **out, int64_t inplanes, int64_t planes, int stride,
                                             uint64_t seed);

/* ------------------------------------------------------------------------ */
/* convert_sync_batchnorm / revert_sync_batchnorm                           */
/* ------------------------------------------------------------------------ */

/* Replace every BatchNorm1d/2d/3d of the tree by a SyncBatchNorm over
 * `group` with the same options, weight, bias, running statistics,
 * num_batches_tracked, training flag and requires_grad (existing
 * SyncBatchNorm modules are left as they are). *out = module, except when
 * module itself is a BatchNorm: then *out is a NEW module and `module` is
 * left unchanged and still owned by the caller (as in PyTorch).
 * All or nothing: on failure the tree and *out are unchanged. Refused (BAD_STATE)
 * when the tree is wrapped (see sbn_module_set_wrapped), or when module is
 * itself a BatchNorm that has a parent (convert the parent instead).
 * Create layers and convert in the same order on every rank (the group
 * gives each SyncBatchNorm an ordinal to detect mismatched calls).
 * Storage: as in PyTorch, the new modules keep the parameter, gradient and
 * running-statistics memory of the ones they replace, so pointers taken
 * before the convert (an SGD created earlier, sbn_nn_entry data/grad of
 * those tensors) stay valid and refer to the converted model. When module
 * itself is a BatchNorm, the returned module takes over its memory and
 * `module` is left with equal copies. */
SBN_API sbn_status sbn_nn_convert_sync_batchnorm(sbn_module **out, sbn_module *module, sbn_group *group);
/* The reverse: every SyncBatchNorm becomes the BatchNorm kind it was
 * converted from (BatchNorm2d if created directly), group-free, keeping
 * all state. Same root and failure rules as convert. */
SBN_API sbn_status sbn_nn_revert_sync_batchnorm(sbn_module **out, sbn_module *module);

/* ------------------------------------------------------------------------ */
/* Loss and optimizer                                                       */
/* ------------------------------------------------------------------------ */

/* Cross-entropy of logits (N, K) against class indices targets[N] in
 * [0, K): loss = sum_i -log softmax(logits_i)[t_i] / divisor, with
 * divisor = N when `divisor` <= 0 (PyTorch's reduction='mean'), or a given
 * value, e.g. the GLOBAL batch size in data-parallel training, so that
 * summing the ranks' losses and gradients gives the global mean exactly
 * even with uneven batches. N = 0 gives loss 0. Accumulated in double. */
SBN_API sbn_status sbn_nn_cross_entropy_forward(double *loss, const sbn_tensor *logits,
                                                const int64_t *targets, double divisor);
/* dlogits (caller memory, logits' shape) = (softmax - onehot) / divisor. */
SBN_API sbn_status sbn_nn_cross_entropy_backward(sbn_tensor *dlogits, const sbn_tensor *logits,
                                                 const int64_t *targets, double divisor);
/* Number of correct argmax predictions (for accuracy). */
SBN_API sbn_status sbn_nn_count_correct(int64_t *correct, const sbn_tensor *logits,
                                        const int64_t *targets);

typedef struct sbn_nn_sgd sbn_nn_sgd;
typedef struct sbn_nn_sgd_options {
  double lr, momentum, dampening, weight_decay;
  int nesterov;
} sbn_nn_sgd_options;

/* SGD over the parameters of `m` that require grad (at creation), with
 * PyTorch's exact rule: g = grad + wd*p; buf = g at the first step, then
 * momentum*buf + (1-dampening)*g; g = nesterov ? g + momentum*buf : buf;
 * p -= lr*g. lr, momentum and weight_decay must be finite and >= 0,
 * dampening finite (SBN_STATUS_INVALID_ARGUMENT naming the field and its
 * value otherwise; set_lr likewise keeps the old lr). Nesterov needs
 * momentum > 0 and dampening 0. The optimizer
 * keeps pointers to the parameters' memory, which convert/revert preserve
 * (an optimizer created before convert_sync_batchnorm keeps training the
 * converted model, as in PyTorch); destroying the model invalidates it. */
SBN_API sbn_status sbn_nn_sgd_create(sbn_nn_sgd **out, sbn_module *m, const sbn_nn_sgd_options *options);
SBN_API sbn_status sbn_nn_sgd_step(sbn_nn_sgd *opt);
SBN_API sbn_status sbn_nn_sgd_set_lr(sbn_nn_sgd *opt, double lr);
/* Optimizer state as entries for checkpoints (resume): one F32 buffer
 * "<param>.momentum_buffer" per parameter (when momentum != 0) and an I64
 * scalar "step". *out malloc'ed; free(). */
SBN_API sbn_status sbn_nn_sgd_entries(sbn_nn_entry **out, int *count, sbn_nn_sgd *opt);
SBN_API sbn_status sbn_nn_sgd_destroy(sbn_nn_sgd *opt); /* NULL is a no-op */

/* ------------------------------------------------------------------------ */
/* Checkpoints: safetensors                                                 */
/* ------------------------------------------------------------------------ */

/* File layout: 8-byte little-endian header length, a JSON header
 * {"name": {"dtype": "F32"|"I64", "shape": [...], "data_offsets": [b, e]},
 *  (save writes the entries' own dtypes; load also reads the others),
 *  "__metadata__": {"format": "pt", "syncbn_crc32": "<hex>"}} padded with
 * spaces to a multiple of 8, then the data. The CRC32 (zlib) of the data
 * section detects flipped data bytes; files without it (e.g. written by
 * PyTorch) are accepted unchecked.
 *
 * Save is atomic: a temporary file in the same directory, fsync, rename,
 * fsync of the directory; a crash leaves the previous file intact. A new
 * file gets mode 0666 less the umask, a replaced file keeps its mode, and
 * its owner and group as far as the caller may set them; a path that is a
 * symbolic link replaces the link's target (in the target's directory) and
 * keeps the link. Only a regular file is replaced: a directory, FIFO or
 * device there is SBN_STATUS_IO_ERROR, nothing written. A save over the file size limit
 * (RLIMIT_FSIZE) fails with SBN_STATUS_IO_ERROR naming the limit: the
 * calling thread blocks SIGXFSZ during the write and consumes the one the
 * write raised, so the process is not killed. */
SBN_API sbn_status sbn_nn_save(const char *path, sbn_module *m);
/* Save arbitrary entries (e.g. model + optimizer state); names must be
 * distinct and the header they make at most 100 MiB (the format's limit),
 * else SBN_STATUS_INVALID_ARGUMENT and nothing is written. */
SBN_API sbn_status sbn_nn_save_entries(const char *path, const sbn_nn_entry *entries, int count);

/* What a non-strict load did not match. Release with
 * sbn_nn_load_report_free. */
typedef struct sbn_nn_load_report {
  int num_missing;    /* model keys absent from the file */
  char **missing;
  int num_unexpected; /* file keys absent from the model */
  char **unexpected;
} sbn_nn_load_report;
SBN_API void sbn_nn_load_report_free(sbn_nn_load_report *report);

#define SBN_NN_LOAD_STRICT 1u
/* Refuse an entry whose dtype is not the model's instead of converting it
 * (for files only this program writes, where another dtype means damage). */
#define SBN_NN_LOAD_EXACT_DTYPES 2u

/* Load a checkpoint into the tree. Everything is validated before anything
 * changes (header length, JSON, every entry's dtype, shape and offsets in
 * range, non-overlapping and covering the data exactly, exact file size,
 * checksum, and the keys, shapes and values against the model); on any
 * failure the model is untouched. An entry of another dtype is converted
 * to the model's as PyTorch's load_state_dict (param.copy_(input)) does,
 * with its bits: F64/F32/F16/BF16, integer (I8..I64, U8..U64) and BOOL
 * entries into float32/float64/float16/bfloat16 (round to nearest even;
 * to a 16-bit type through float32, as torch), into int64 (floating point
 * truncated toward zero). Refused (SBN_STATUS_INVALID_ARGUMENT naming the
 * key): float8 entries, a value an int64 cannot hold (NaN, infinite, out
 * of range), a num_batches_tracked outside [0, 2^53]. Strict: missing or unexpected keys are
 * errors. Non-strict: matching keys load, the others are listed in
 * *report (may be NULL). Either way, a missing num_batches_tracked loads
 * as 0 (the pre-version-2 state dict) and is not reported. Corrupt files:
 * SBN_STATUS_IO_ERROR; a valid file that does not fit the model:
 * SBN_STATUS_INVALID_ARGUMENT. */
SBN_API sbn_status sbn_nn_load(sbn_module *m, const char *path, unsigned flags, sbn_nn_load_report *report);
/* The same from a file image in memory. */
SBN_API sbn_status sbn_nn_load_memory(sbn_module *m, const void *buf, size_t len, unsigned flags,
                                      sbn_nn_load_report *report);
/* Load into arbitrary entries (same validation and rules; no special
 * num_batches_tracked handling beyond names ending in it). */
SBN_API sbn_status sbn_nn_load_entries(sbn_nn_entry *entries, int count, const void *buf, size_t len,
                                       unsigned flags, sbn_nn_load_report *report);

#ifdef __cplusplus
}
#endif
#endif /* SYNCBN_NN_H */
