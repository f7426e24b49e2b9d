/* Internal: a device is a table of the layer's entry points. The layer
 * (bn.c) checks arguments, runs the group's collectives and keeps the
 * bookkeeping of train/eval and of the saved forward; everything that
 * touches per-channel state or tensor data goes through the table of the
 * layer's device, chosen once when the layer is created:
 *   CPU   src/cpu/device_cpu.c   (always built)
 *   CUDA  src/cuda/device_cuda.c (libsyncbn_cuda, found at run time:
 *         device.c, ARCHITECTURE.md "Devices")
 *
 * One layer step through the table:
 *   forward:  stats -> [group all-reduce of the payload] -> forward_finish -> normalize
 *   backward: backward_reduce -> [all-reduce] -> backward_finish -> backward_elemt
 * normalize always follows a successful forward_finish of the same call,
 * and backward_elemt a backward_finish with want_dx: a device may leave the
 * finish's work to those (CUDA does, in the elementwise kernel).
 * The payload is 2C+1 doubles: per channel sum = n*mean and sumsq =
 * M2 + n*mean^2, then the count n (forward); sum(dy) and sum(dy*(x-mean))
 * (backward, 2C). It lives in the device's memory (`payload`); a group
 * without a device all-reduce sees it through `payload_host`, which
 * to_host/from_host copy (the CPU's is the same buffer: no copy). */
#ifndef SBN_CORE_DEVICE_H
#define SBN_CORE_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "geom.h"
#include "syncbn.h"

enum { SBN_DEV_TENSORS = 6 }; /* indexed by sbn_bn_tensor_id */

/* A layer's state on its device: the part the core reads, filled by the
 * device's create. */
typedef struct sbn_dev_layer {
  sbn_bn_options opt;
  void *tensor[SBN_DEV_TENSORS];  /* weight .. running_var, device memory, opt.param_dtype
                                     (float or double); NULL when absent */
  double *payload;                /* 2C+1, device memory: the collective's buffer */
  double *payload_host;           /* 2C+1, host memory (== payload on the CPU) */
  void *stream;                   /* the layer's stream (CUDA: cudaStream_t, NULL = legacy) */
  void *impl;                     /* the device's own: scratch, saved statistics, counters */
} sbn_dev_layer;

/* What forward_finish computes from the payload. */
typedef struct sbn_dev_forward {
  int batch_stats; /* 1: the batch statistics in the payload; 0: the running statistics */
  int synced;      /* the payload holds the group's sums (else this rank's) */
  int update;      /* training with tracking: update running stats and num_batches_tracked */
  double count;    /* the count per channel, when the host knows it; -1 when only the
                      device does (a device all-reduce): the device then applies the
                      count rules itself and defers the error (see `deferred`) */
} sbn_dev_forward;

typedef struct sbn_dev_ops {
  const char *name;
  int payload_on_device; /* 1: `payload` is device memory (a host group needs staging) */

  /* Allocate the state for L->opt (weight 1, bias 0, running_var 1, the
   * rest 0) on L->opt.device, in L->opt.param_dtype (a device that lacks
   * that dtype answers SBN_STATUS_UNSUPPORTED). On failure frees what it
   * took, records the message and returns the status. */
  sbn_status (*create)(sbn_dev_layer *L, const char *call);
  void (*destroy)(sbn_dev_layer *L);
  /* Is `data` memory this device's kernels can use (`name`: "x", ...)? */
  sbn_status (*check_data)(const sbn_dev_layer *L, const void *data, const char *call,
                           const char *name);
  /* Scratch for shape g, threads for `ranks` ranks sharing this process. */
  sbn_status (*prepare)(sbn_dev_layer *L, sbn_geom g, int ranks, const char *call);
  /* NULL when the device has no streams. */
  sbn_status (*set_stream)(sbn_dev_layer *L, void *stream);
  /* An error the device found after an earlier call returned (a deferred
   * count error): returned once, then cleared. NULL: never any. */
  sbn_status (*deferred)(sbn_dev_layer *L, const char *call);

  /* Forward. stats: this rank's payload (2C+1). forward_finish: the
   * statistics used by normalize and saved for backward, the running
   * statistics update; normalize: y. */
  sbn_status (*stats)(sbn_dev_layer *L, const void *x, sbn_geom g);
  sbn_status (*forward_finish)(sbn_dev_layer *L, const sbn_dev_forward *f);
  sbn_status (*normalize)(sbn_dev_layer *L, void *y, const void *x, sbn_geom g);

  /* Backward. backward_reduce: this rank's payload (2C) and a copy kept
   * for grad_weight/grad_bias. backward_finish: the elementwise
   * coefficients from the (global) payload when want_dx, and the local
   * gradient accumulation. */
  sbn_status (*backward_reduce)(sbn_dev_layer *L, const void *dy, const void *x, sbn_geom g);
  sbn_status (*backward_finish)(sbn_dev_layer *L, int synced, int want_dx, int batch_stats);
  sbn_status (*backward_elemt)(sbn_dev_layer *L, void *dx, const void *dy, const void *x,
                               sbn_geom g);

  /* The payload through host memory: to_host makes payload_host hold the
   * first `count` values and waits for them; with `zero` it sets both
   * payloads to zeros instead (a rank with a local error contributes
   * nothing). from_host copies them back (enqueued). */
  sbn_status (*to_host)(sbn_dev_layer *L, size_t count, int zero);
  sbn_status (*from_host)(sbn_dev_layer *L, size_t count);

  /* Records of the saved forward (sbn_bn_save_forward): what backward
   * reads of the last forward's statistics, in memory of this device that
   * record_alloc takes (for L's shape) and record_free gives back (it may
   * wait for the device). record_save copies the layer's into a record,
   * record_load back (enqueued on the layer's stream: no wait). */
  sbn_status (*record_alloc)(const sbn_dev_layer *L, void **mem, const char *call);
  void (*record_free)(int device_index, void *mem);
  sbn_status (*record_save)(sbn_dev_layer *L, void *mem);
  sbn_status (*record_load)(sbn_dev_layer *L, const void *mem);

  sbn_status (*zero_grad)(sbn_dev_layer *L);
  sbn_status (*get_nbt)(const sbn_dev_layer *L, int64_t *out);
  sbn_status (*set_nbt)(sbn_dev_layer *L, int64_t value);
  /* Devices of this kind (CUDA: 0 when there is no GPU or driver). */
  sbn_status (*device_count)(int *count);
} sbn_dev_ops;

/* The table for a device type; NULL (message recorded, status in *st) when
 * that device is not built or not linked. */
const sbn_dev_ops *sbn_device_ops(sbn_device_type type, sbn_status *st, const char *call);

/* The tables themselves. The CUDA one is defined in libsyncbn_cuda; its
 * name carries the layout version (as the backend host table's does). */
extern const sbn_dev_ops sbn_cpu_device_ops;
#define SBN_CUDA_DEVICE_TABLE sbn_internal_cuda_device_v3
#define SBN_CUDA_DEVICE_TABLE_NAME "sbn_internal_cuda_device_v3"
extern const sbn_dev_ops SBN_CUDA_DEVICE_TABLE;

#endif
