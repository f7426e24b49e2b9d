/* The CUDA device table (src/core/device.h), in libsyncbn_cuda: the layer's
 * state in the memory of one GPU, the four passes of bn_kernels_cuda.h and
 * the per-channel kernels of bn_finish_cuda.h, all enqueued on the layer's
 * stream. Every entry makes the layer's GPU current and gives the caller's
 * back. Only create/destroy, the num_batches_tracked getter and setter, and
 * the host staging of the payload (to_host) wait for the GPU. */
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "../core/device.h"
#include "../core/error.h"
#include "bn_finish_cuda.h"
#include "bn_kernels_cuda.h"

typedef struct cuda_layer {
  int dev;                       /* the GPU's ordinal */
  sbn_cuda_ws ws;                /* partial sums of the reduction passes */
  sbn_cuda_finish fin;           /* device pointers of the per-channel state */
  double *block;                 /* one allocation: payload, local, mean .. saved_count */
  int64_t *nbt_host;             /* pinned: num_batches_tracked in transit */
  int *flag_host;                /* pinned, mapped: the deferred count error */
  /* The finish that forward_finish (backward_finish, with dx) leaves to the
   * elementwise kernel after it, which does its work (bn_finish_cuda.h) */
  sbn_cuda_finish pending;
  int pend_batch_stats, pend_update, pend_synced;
} cuda_layer;

static sbn_status cuda_fail(cudaError_t e, const char *call, const char *what) {
  (void)cudaGetLastError(); /* clear it: the next call starts clean */
  return sbn_fail(e == cudaErrorMemoryAllocation ? SBN_STATUS_OUT_OF_MEMORY : SBN_STATUS_BACKEND_ERROR,
                  "%s: %s: %s (%s)", call, what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* Make the layer's GPU current; *prev is the caller's. */
static cudaError_t enter(const cuda_layer *k, int *prev) {
  cudaError_t e = cudaGetDevice(prev);
  if (e == cudaSuccess && *prev != k->dev) e = cudaSetDevice(k->dev);
  return e;
}
static void leave(const cuda_layer *k, int prev) {
  if (prev != k->dev) cudaSetDevice(prev);
}

static sbn_status cuda_device_count(int *count) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0; /* no driver or no GPU: none */
  }
  *count = n;
  return SBN_STATUS_OK;
}

static void cuda_destroy(sbn_dev_layer *L) {
  cuda_layer *k = L->impl;
  if (!k) return;
  int prev = k->dev;
  enter(k, &prev);
  if (L->stream) cudaStreamSynchronize(L->stream); /* work in flight still uses the memory */
  else cudaDeviceSynchronize();
  for (int i = 0; i < SBN_DEV_TENSORS; i++) cudaFree(L->tensor[i]), L->tensor[i] = NULL;
  cudaFree(k->block);
  cudaFreeHost(L->payload_host), cudaFreeHost(k->nbt_host), cudaFreeHost(k->flag_host);
  sbn_cuda_ws_free(&k->ws);
  (void)cudaGetLastError();
  leave(k, prev);
  free(k);
  L->impl = NULL;
  L->payload = L->payload_host = NULL;
}

static sbn_status cuda_create(sbn_dev_layer *L, const char *call) {
  const int index = L->opt.device.index;
  /* The CUDA kernels and per-channel state are float32 (inputs float32 or
   * 16-bit); float64 layers are CPU only (README, "GPUs"). */
  if (L->opt.param_dtype != SBN_DTYPE_FLOAT32)
    return sbn_fail(SBN_STATUS_UNSUPPORTED,
                    "%s: param_dtype float64 is not supported on CUDA layers (CPU only); use "
                    "SBN_DTYPE_FLOAT32", call);
  /* The state block is 9C + 5 doubles and each tensor C floats: a C whose
   * sizes wrap in size_t would get a small allocation and be written past. */
  if ((uint64_t)L->opt.num_features > (SIZE_MAX / sizeof(double) - 5) / 9)
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory for %lld channels on cuda:%d", call,
                    (long long)L->opt.num_features, index);
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) count = 0, (void)cudaGetLastError();
  if (index < 0 || index >= count)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: cuda:%d is not a device: %d CUDA device(s)%s%s", call,
                    index, count, e != cudaSuccess ? ", cudaGetDeviceCount: " : "",
                    e != cudaSuccess ? cudaGetErrorString(e) : "");
  cuda_layer *k = calloc(1, sizeof *k);
  if (!k) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
  k->dev = index;
  L->impl = k;
  L->stream = NULL;
  int prev;
  if ((e = enter(k, &prev)) != cudaSuccess) {
    free(k);
    L->impl = NULL;
    return cuda_fail(e, call, "cudaSetDevice");
  }
  const size_t C = (size_t)L->opt.num_features;
  /* payload 2C+1 | local 2C | mean, invstd 2C | saved_count | fwd_bad | ka, kb, kc 3C | nbt | done
   * (what backward reads of a forward is one range: a record's copy) */
  const size_t nd = (2 * C + 1) + 2 * C + 5 * C + 4;
  float *ones = malloc(C * sizeof *ones);
  const char *what = "cudaMalloc";
  if (!ones) e = cudaErrorMemoryAllocation;
  for (int i = 0; e == cudaSuccess && i < SBN_DEV_TENSORS; i++) {
    int has = i <= SBN_BN_TENSOR_GRAD_BIAS ? L->opt.affine : L->opt.track_running_stats;
    if (has) e = cudaMalloc((void **)&L->tensor[i], C * sizeof(float));
    if (e == cudaSuccess && has) e = cudaMemset(L->tensor[i], 0, C * sizeof(float));
  }
  if (e == cudaSuccess) e = cudaMalloc((void **)&k->block, nd * sizeof(double));
  if (e == cudaSuccess) e = cudaMemset(k->block, 0, nd * sizeof(double));
  if (e == cudaSuccess) what = "cudaHostAlloc", e = cudaHostAlloc((void **)&L->payload_host, (2 * C + 1) * sizeof(double), 0);
  if (e == cudaSuccess) e = cudaHostAlloc((void **)&k->nbt_host, sizeof(int64_t), 0);
  if (e == cudaSuccess) e = cudaHostAlloc((void **)&k->flag_host, sizeof(int), cudaHostAllocMapped);
  int *flag_dev = NULL;
  if (e == cudaSuccess) what = "cudaHostGetDevicePointer", e = cudaHostGetDevicePointer((void **)&flag_dev, k->flag_host, 0);
  if (e == cudaSuccess) {
    what = "initial values";
    for (size_t c = 0; c < C; c++) ones[c] = 1.0f;
    if (L->opt.affine) e = cudaMemcpy(L->tensor[SBN_BN_TENSOR_WEIGHT], ones, C * sizeof(float), cudaMemcpyHostToDevice);
    if (e == cudaSuccess && L->opt.track_running_stats)
      e = cudaMemcpy(L->tensor[SBN_BN_TENSOR_RUNNING_VAR], ones, C * sizeof(float), cudaMemcpyHostToDevice);
  }
  free(ones);
  /* The layer's stream may not be ordered after the legacy stream's
   * memsets and copies above: let them finish. */
  if (e == cudaSuccess) what = "initial values", e = cudaStreamSynchronize(NULL);
  if (e != cudaSuccess) {
    sbn_status st = cuda_fail(e, call, what);
    leave(k, prev);
    cuda_destroy(L);
    return st;
  }
  *k->flag_host = 0;
  double *p = k->block;
  L->payload = p;
  sbn_cuda_finish *f = &k->fin;
  f->c = (int64_t)C;
  f->eps = L->opt.eps, f->momentum = L->opt.momentum, f->affine = L->opt.affine;
  f->payload = p, p += 2 * C + 1;
  f->local = p, p += 2 * C;
  f->mean = p, p += C;
  f->invstd = p, p += C;
  f->saved_count = p++;
  f->fwd_bad = (int *)p++; /* zeroed words: 0 as int64 and int */
  f->ka = p, p += C;
  f->kb = p, p += C;
  f->kc = p, p += C;
  f->nbt = (int64_t *)p++;
  f->done = (unsigned *)p;
  f->flag = flag_dev;
  leave(k, prev);
  return SBN_STATUS_OK;
}

/* The data of a tensor argument must be memory of the layer's GPU. */
static sbn_status cuda_check_data(const sbn_dev_layer *L, const void *data, const char *call,
                                  const char *name) {
  const cuda_layer *k = L->impl;
  struct cudaPointerAttributes a;
  cudaError_t e = cudaPointerGetAttributes(&a, data);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %s->data %p is not CUDA memory (%s)", call, name, data,
                    cudaGetErrorString(e));
  }
  if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) {
    if (a.device == k->dev || a.type == cudaMemoryTypeManaged) return SBN_STATUS_OK;
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %s->data is memory of cuda:%d but the layer is on cuda:%d",
                    call, name, a.device, k->dev);
  }
  return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                  "%s: %s->data %p is host memory (%s); a layer on cuda:%d takes device memory of that GPU",
                  call, name, data, a.type == cudaMemoryTypeHost ? "pinned" : "not registered with CUDA",
                  k->dev);
}

static sbn_status cuda_prepare(sbn_dev_layer *L, sbn_geom g, int ranks, const char *call) {
  (void)ranks;
  cuda_layer *k = L->impl;
  int prev;
  cudaError_t e = enter(k, &prev);
  if (e == cudaSuccess) e = (cudaError_t)sbn_cuda_ws_reserve(&k->ws, g);
  leave(k, prev);
  return e == cudaSuccess ? SBN_STATUS_OK : cuda_fail(e, call, "scratch for the partial sums");
}

static sbn_status cuda_set_stream(sbn_dev_layer *L, void *stream) {
  cuda_layer *k = L->impl;
  if (stream) {
    int dev = -1;
    cudaError_t e = cudaStreamGetDevice((cudaStream_t)stream, &dev);
    if (e != cudaSuccess) return cuda_fail(e, "sbn_bn_set_stream", "cudaStreamGetDevice");
    if (dev != k->dev)
      return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                      "sbn_bn_set_stream: the stream belongs to cuda:%d but the layer is on cuda:%d", dev,
                      k->dev);
  }
  L->stream = stream;
  return SBN_STATUS_OK;
}

static sbn_status cuda_deferred(sbn_dev_layer *L, const char *call) {
  cuda_layer *k = L->impl;
  if (!*(volatile int *)k->flag_host) return SBN_STATUS_OK;
  *(volatile int *)k->flag_host = 0;
  return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                  "%s: an earlier forward of this layer found 1 value per channel over all ranks of the group "
                  "(expected more than 1 value per channel when training); it changed nothing",
                  call);
}

/* Run `launch` on the layer's GPU; its nonzero result is a cudaError_t. */
#define ON_DEVICE(L, call, what, expr)                                  \
  do {                                                                  \
    cuda_layer *k_ = (L)->impl;                                         \
    int prev_;                                                          \
    cudaError_t e_ = enter(k_, &prev_);                                 \
    if (e_ == cudaSuccess) e_ = (cudaError_t)(expr);                    \
    leave(k_, prev_);                                                   \
    if (e_ != cudaSuccess) return cuda_fail(e_, call, what);            \
    return SBN_STATUS_OK;                                               \
  } while (0)

static sbn_status cuda_stats(sbn_dev_layer *L, const void *x, sbn_geom g) {
  cuda_layer *k = L->impl;
  const int64_t C = L->opt.num_features;
  ON_DEVICE(L, "sbn_bn_forward", "statistics pass",
            sbn_cuda_stats(&k->ws, L->stream, L->payload, L->payload + C, L->payload + 2 * C, x, g));
}

/* k->pending: the per-channel state with the layer's current tensors (the
 * core may swap them between layers between calls). */
static sbn_cuda_finish *take_pending(sbn_dev_layer *L) {
  cuda_layer *k = L->impl;
  sbn_cuda_finish *fin = &k->pending;
  *fin = k->fin;
  fin->w = L->tensor[SBN_BN_TENSOR_WEIGHT], fin->b = L->tensor[SBN_BN_TENSOR_BIAS];
  fin->gw = L->tensor[SBN_BN_TENSOR_GRAD_WEIGHT], fin->gb = L->tensor[SBN_BN_TENSOR_GRAD_BIAS];
  fin->rm = L->tensor[SBN_BN_TENSOR_RUNNING_MEAN], fin->rv = L->tensor[SBN_BN_TENSOR_RUNNING_VAR];
  return fin;
}

/* The forward's finish runs in the normalize kernel (the core calls
 * normalize right after a successful forward_finish): nothing to launch. */
static sbn_status cuda_forward_finish(sbn_dev_layer *L, const sbn_dev_forward *f) {
  cuda_layer *k = L->impl;
  take_pending(L);
  k->pend_batch_stats = f->batch_stats, k->pend_update = f->update;
  return SBN_STATUS_OK;
}

static sbn_status cuda_normalize(sbn_dev_layer *L, void *y, const void *x, sbn_geom g) {
  cuda_layer *k = L->impl;
  ON_DEVICE(L, "sbn_bn_forward", "statistics and normalize pass",
            sbn_cuda_finish_normalize(L->stream, y, x, g, &k->pending, k->pend_batch_stats, k->pend_update));
}

/* The local sums (for the weight and bias gradients) and a copy in the
 * payload, which the collective sums in place. */
static int reduce_and_copy(cuda_layer *k, sbn_dev_layer *L, const void *dy, const void *x, sbn_geom g) {
  const size_t C = (size_t)L->opt.num_features;
  return sbn_cuda_backward_reduce(&k->ws, L->stream, k->fin.local, k->fin.local + C, dy, x, g, k->fin.mean,
                                  L->payload);
}

static sbn_status cuda_backward_reduce(sbn_dev_layer *L, const void *dy, const void *x, sbn_geom g) {
  cuda_layer *k = L->impl;
  ON_DEVICE(L, "sbn_bn_backward", "reduce pass", reduce_and_copy(k, L, dy, x, g));
}

/* With dx, the backward's finish runs in the elementwise kernel (the core
 * calls backward_elemt right after); without, in a kernel of its own. */
static sbn_status cuda_backward_finish(sbn_dev_layer *L, int synced, int want_dx, int batch_stats) {
  cuda_layer *k = L->impl;
  const sbn_cuda_finish *fin = take_pending(L);
  k->pend_synced = synced, k->pend_batch_stats = batch_stats;
  if (want_dx) return SBN_STATUS_OK;
  ON_DEVICE(L, "sbn_bn_backward", "gradient sums", sbn_cuda_backward_finish(L->stream, fin, synced, 0, batch_stats));
}

static sbn_status cuda_backward_elemt(sbn_dev_layer *L, void *dx, const void *dy, const void *x,
                                      sbn_geom g) {
  cuda_layer *k = L->impl;
  ON_DEVICE(L, "sbn_bn_backward", "gradient sums and elementwise pass",
            sbn_cuda_finish_backward_elemt(L->stream, dx, dy, x, g, &k->pending, k->pend_synced,
                                           k->pend_batch_stats));
}

/* Host staging waits for the stream, which a stream being captured into a
 * graph cannot do: say so instead of invalidating the capture. */
static cudaError_t stage_out(sbn_dev_layer *L, size_t count, int zero) {
  const size_t bytes = count * sizeof(double);
  cudaError_t e = zero ? cudaMemsetAsync(L->payload, 0, bytes, (cudaStream_t)L->stream) : cudaSuccess;
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (e == cudaSuccess) e = cudaStreamIsCapturing((cudaStream_t)L->stream, &cs);
  if (e == cudaSuccess && cs != cudaStreamCaptureStatusNone) return zero ? cudaSuccess : cudaErrorStreamCaptureUnsupported;
  if (e == cudaSuccess && !zero)
    e = cudaMemcpyAsync(L->payload_host, L->payload, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)L->stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize((cudaStream_t)L->stream);
  if (e == cudaSuccess && zero) memset(L->payload_host, 0, bytes);
  return e;
}

static sbn_status cuda_to_host(sbn_dev_layer *L, size_t count, int zero) {
  ON_DEVICE(L, "sbn_bn", "staging the statistics through host memory (a group without a device "
                         "all-reduce waits for the stream; it cannot be captured in a CUDA graph)",
            stage_out(L, count, zero));
}

static sbn_status cuda_from_host(sbn_dev_layer *L, size_t count) {
  ON_DEVICE(L, "sbn_bn", "copying the group's sums to the GPU",
            cudaMemcpyAsync(L->payload, L->payload_host, count * sizeof(double), cudaMemcpyHostToDevice,
                            (cudaStream_t)L->stream));
}

static int zero_grads(sbn_dev_layer *L) {
  int e = 0;
  for (int i = SBN_BN_TENSOR_GRAD_WEIGHT; e == 0 && i <= SBN_BN_TENSOR_GRAD_BIAS; i++)
    if (L->tensor[i])
      e = cudaMemsetAsync(L->tensor[i], 0, sizeof(float) * (size_t)L->opt.num_features, (cudaStream_t)L->stream);
  return e;
}

static sbn_status cuda_zero_grad(sbn_dev_layer *L) {
  ON_DEVICE(L, "sbn_bn_zero_grad", "cudaMemsetAsync", zero_grads(L));
}

static int nbt_copy(const sbn_dev_layer *L, int to_device) {
  const cuda_layer *k = L->impl;
  int e = cudaMemcpyAsync(to_device ? (void *)k->fin.nbt : (void *)k->nbt_host,
                          to_device ? (void *)k->nbt_host : (void *)k->fin.nbt, sizeof(int64_t),
                          to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, (cudaStream_t)L->stream);
  return e ? e : (int)cudaStreamSynchronize((cudaStream_t)L->stream);
}

static sbn_status cuda_get_nbt(const sbn_dev_layer *L, int64_t *out) {
  static const char call[] = "sbn_bn_get_num_batches_tracked";
  cuda_layer *k = L->impl;
  int prev;
  cudaError_t e = enter(k, &prev);
  if (e == cudaSuccess) e = (cudaError_t)nbt_copy(L, 0);
  leave(k, prev);
  if (e != cudaSuccess) return cuda_fail(e, call, "copying num_batches_tracked");
  sbn_status st = cuda_deferred((sbn_dev_layer *)L, call);
  if (st == SBN_STATUS_OK) *out = *k->nbt_host;
  return st;
}

static sbn_status cuda_set_nbt(sbn_dev_layer *L, int64_t value) {
  cuda_layer *k = L->impl;
  int prev;
  cudaError_t e = enter(k, &prev);
  if (e == cudaSuccess) e = cudaStreamSynchronize((cudaStream_t)L->stream); /* nbt_host may be in transit */
  if (e == cudaSuccess) *k->nbt_host = value, e = (cudaError_t)nbt_copy(L, 1);
  leave(k, prev);
  return e == cudaSuccess ? SBN_STATUS_OK : cuda_fail(e, "sbn_bn_set_num_batches_tracked", "copying num_batches_tracked");
}

/* A record of the saved forward: the block's range mean, invstd,
 * saved_count, fwd_bad (2C + 2 doubles), copied on the layer's stream. */
static size_t record_bytes(const sbn_dev_layer *L) {
  return (2 * (size_t)L->opt.num_features + 2) * sizeof(double);
}

static sbn_status cuda_record_alloc(const sbn_dev_layer *L, void **mem, const char *call) {
  const cuda_layer *k = L->impl;
  int prev;
  cudaError_t e = enter(k, &prev);
  if (e == cudaSuccess) e = cudaMalloc(mem, record_bytes(L));
  leave(k, prev);
  return e == cudaSuccess ? SBN_STATUS_OK : cuda_fail(e, call, "cudaMalloc of a record");
}

/* cudaFree waits for the device: copies into or out of the record may
 * still be in flight on some stream. */
static void cuda_record_free(int device_index, void *mem) {
  int prev = device_index;
  if (cudaGetDevice(&prev) == cudaSuccess && prev != device_index) cudaSetDevice(device_index);
  cudaFree(mem);
  (void)cudaGetLastError();
  if (prev != device_index) cudaSetDevice(prev);
}

static sbn_status cuda_record_save(sbn_dev_layer *L, void *mem) {
  cuda_layer *k = L->impl;
  ON_DEVICE(L, "sbn_bn_save_forward", "copying the saved statistics",
            cudaMemcpyAsync(mem, k->fin.mean, record_bytes(L), cudaMemcpyDeviceToDevice,
                            (cudaStream_t)L->stream));
}

static sbn_status cuda_record_load(sbn_dev_layer *L, const void *mem) {
  cuda_layer *k = L->impl;
  ON_DEVICE(L, "sbn_bn_restore_forward", "copying the saved statistics",
            cudaMemcpyAsync(k->fin.mean, mem, record_bytes(L), cudaMemcpyDeviceToDevice,
                            (cudaStream_t)L->stream));
}

SBN_API const sbn_dev_ops SBN_CUDA_DEVICE_TABLE = {
    .name = "cuda",
    .payload_on_device = 1,
    .create = cuda_create,
    .destroy = cuda_destroy,
    .check_data = cuda_check_data,
    .prepare = cuda_prepare,
    .set_stream = cuda_set_stream,
    .deferred = cuda_deferred,
    .stats = cuda_stats,
    .forward_finish = cuda_forward_finish,
    .normalize = cuda_normalize,
    .backward_reduce = cuda_backward_reduce,
    .backward_finish = cuda_backward_finish,
    .backward_elemt = cuda_backward_elemt,
    .to_host = cuda_to_host,
    .from_host = cuda_from_host,
    .zero_grad = cuda_zero_grad,
    .get_nbt = cuda_get_nbt,
    .set_nbt = cuda_set_nbt,
    .record_alloc = cuda_record_alloc,
    .record_free = cuda_record_free,
    .record_save = cuda_record_save,
    .record_load = cuda_record_load,
    .device_count = cuda_device_count,
};
