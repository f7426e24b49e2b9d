/* The SyncBatchNorm layer: options, state, train/eval, and the orchestration
 * of kernels and the group's collective (ARCHITECTURE.md):
 *   forward:  stats pass -> one all-reduce of 2C+1 doubles -> normalize pass
 *   backward: reduce pass -> one all-reduce of 2C doubles -> elementwise pass
 * Every state change happens after the last check that can fail, so a
 * failed call leaves the layer as it was. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../comm/comm.h"
#include "bn_internal.h"
#include "device.h"
#include "error.h"
#include "tensor.h"

struct sbn_bn {
  sbn_bn_options opt;
  sbn_group *group; /* NULL: plain BatchNorm */
  int layer_id;     /* ordinal on the group, carried by collectives */
  /* "forward of layer #3 (C=64, float32)" and the backward's, formatted once
   * per input dtype: formatting on every call cost ~0.1 us, a tenth of a
   * small two-rank exchange. */
  char what[2][80];
  int what_dtype[2]; /* the dtype what[i] names, -1: none yet */
  int training;
  const sbn_dev_ops *dev; /* the device's table, chosen at creation */
  sbn_dev_layer L;        /* per-channel state and scratch, on the device */

  /* Saved by the last successful forward, for backward (the statistics
   * themselves are the device's). */
  int saved;             /* a forward has succeeded */
  int saved_batch_stats; /* 1: batch statistics (training math); 0: running */
  uint64_t saved_serial; /* its number among the synchronized forwards; 0: not synchronized */
  uint64_t forwards_synced; /* successful synchronized forwards: every rank counts the same */
  sbn_tensor saved_x;    /* descriptor only: shape/dtype/layout of x */
  uint64_t uid;          /* tells its records from other layers' */
};

/* A saved forward: the layer's bookkeeping above, and the device's
 * statistics in `mem` (device memory). */
struct sbn_bn_record {
  uint64_t uid; /* the layer's */
  const sbn_dev_ops *dev;
  int device_index;
  void *mem;
  int saved, batch_stats;
  uint64_t serial;
  sbn_tensor x;
};

sbn_bn_options sbn_bn_options_default(int64_t num_features) {
  sbn_bn_options o;
  memset(&o, 0, sizeof o);
  o.num_features = num_features;
  o.eps = 1e-5;
  o.momentum = 0.1;
  o.affine = 1;
  o.track_running_stats = 1;
  o.device.type = SBN_DEVICE_CPU;
  o.param_dtype = SBN_DTYPE_FLOAT32;
  return o;
}

sbn_status sbn_bn_create(sbn_bn **out, const sbn_bn_options *o, sbn_group *group) {
  static const char call[] = "sbn_bn_create";
  sbn_clear_error();
  if (out) *out = NULL;
  if (!out || !o)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_create: %s is NULL", out ? "options" : "out");
  if (o->num_features <= 0)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_create: num_features must be > 0, got %lld",
                    (long long)o->num_features);
  /* Past 2^48 channels (2 PiB a state tensor) the devices' per-channel
   * sizes could wrap; no memory holds such a layer anyway. */
  if (o->num_features > (INT64_C(1) << 48))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "sbn_bn_create: num_features = %lld is more than any memory holds (at most 2^48)",
                    (long long)o->num_features);
  if (!(o->eps >= 0) || !isfinite(o->eps)) /* 0 allowed, as in PyTorch */
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_create: eps must be finite and >= 0, got %g", o->eps);
  if (o->momentum != SBN_MOMENTUM_CUMULATIVE && !(o->momentum >= 0 && o->momentum <= 1))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "sbn_bn_create: momentum must be in [0, 1] or SBN_MOMENTUM_CUMULATIVE, got %g",
                    o->momentum);
  if (o->param_dtype != SBN_DTYPE_FLOAT32 && o->param_dtype != SBN_DTYPE_FLOAT64)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "sbn_bn_create: param_dtype must be SBN_DTYPE_FLOAT32 or SBN_DTYPE_FLOAT64, got %s (%d)",
                    sbn_dtype_name(o->param_dtype), (int)o->param_dtype);
  sbn_status st;
  const sbn_dev_ops *dev = sbn_device_ops(o->device.type, &st, call);
  if (!dev) return st;
  sbn_bn *bn = calloc(1, sizeof *bn);
  if (!bn) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "sbn_bn_create: out of memory");
  bn->L.opt = *o;
  if ((st = dev->create(&bn->L, call)) != SBN_STATUS_OK) {
    free(bn);
    return st;
  }
  static uint64_t next_uid = 1;
  bn->uid = __atomic_fetch_add(&next_uid, 1, __ATOMIC_RELAXED);
  bn->dev = dev;
  bn->opt = *o;
  bn->training = 1;
  bn->what_dtype[0] = bn->what_dtype[1] = -1;
  if (group && group->size > 1) {
    bn->group = group;
    bn->layer_id = group->next_layer++;
    sbn_group_retain(group);
  } else {
    bn->layer_id = -1;
  }
  *out = bn;
  return SBN_STATUS_OK;
}

sbn_status sbn_bn_destroy(sbn_bn *bn) {
  if (bn) {
    if (bn->group) sbn_group_release(bn->group);
    bn->dev->destroy(&bn->L);
    free(bn);
  }
  return SBN_STATUS_OK;
}

sbn_status sbn_bn_set_stream(sbn_bn *bn, void *stream) {
  sbn_clear_error();
  if (!bn) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_set_stream: layer is NULL");
  if (!bn->dev->set_stream)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_set_stream: the layer is on the %s, which has no streams",
                    bn->dev->name);
  return bn->dev->set_stream(&bn->L, stream);
}

sbn_status sbn_bn_set_training(sbn_bn *bn, int training) {
  sbn_clear_error();
  if (!bn) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_set_training: layer is NULL");
  bn->training = training != 0;
  return SBN_STATUS_OK;
}

int sbn_bn_is_training(const sbn_bn *bn) { return bn ? bn->training : -1; }

sbn_group *sbn_bn_get_group(const sbn_bn *bn) { return bn ? bn->group : NULL; }

sbn_status sbn_bn_get_options(const sbn_bn *bn, sbn_bn_options *out) {
  sbn_clear_error();
  if (!bn || !out)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_get_options: %s is NULL", bn ? "out" : "layer");
  *out = bn->opt;
  return SBN_STATUS_OK;
}

/* The checks of one tensor argument beyond its descriptor: that its memory
 * is the device's (a host pointer given to a CUDA layer fails here). */
static sbn_status check_data(const sbn_bn *bn, const sbn_tensor *t, const char *call, const char *name) {
  if (!t || !t->data || sbn_tensor_numel(t) <= 0) return SBN_STATUS_OK;
  return bn->dev->check_data(&bn->L, t->data, call, name);
}

/* The input dtypes a layer takes follow its parameters, as in PyTorch: a
 * float64 layer takes float64, a float32 one float32 or 16-bit storage.
 * Part of the local checks, so a mismatch on one rank fails every rank. */
static sbn_status check_dtype(const sbn_bn *bn, sbn_dtype dt, const char *call, const char *name) {
  const int f64 = bn->opt.param_dtype == SBN_DTYPE_FLOAT64;
  if ((dt == SBN_DTYPE_FLOAT64) == f64) return SBN_STATUS_OK;
  return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                  "%s: %s is %s but the layer's parameters are %s (it takes %s inputs; "
                  "convert the input or create the layer with param_dtype %s)",
                  call, name, sbn_dtype_name(dt), sbn_dtype_name(bn->opt.param_dtype),
                  f64 ? "float64" : "float32, bfloat16 or float16", f64 ? "FLOAT32" : "FLOAT64");
}

/* Before the passes over x: the device's scratch for this shape and the
 * ranks sharing this process (the CPU divides its cores among them). */
static sbn_status prepare_kernels(sbn_bn *bn, sbn_geom g, const char *call) {
  int ranks = bn->group && strcmp(sbn_group_backend(bn->group), "threads") == 0 ? bn->group->size : 1;
  return bn->dev->prepare(&bn->L, g, ranks, call);
}

/* what + " for forward #n" (the backward's signature names the forward it
 * differentiates: ranks that restored different records disagree). */
static void append_serial(char *what, size_t cap, uint64_t n) {
  static const char tag[] = " for forward #";
  char digits[24];
  int k = 0;
  do digits[k++] = (char)('0' + n % 10), n /= 10;
  while (n);
  size_t len = strlen(what);
  if (len + sizeof tag + (size_t)k > cap) return;
  memcpy(what + len, tag, sizeof tag - 1), len += sizeof tag - 1;
  while (k) what[len++] = digits[--k];
  what[len] = 0;
}

/* Run the layer's collective (when synchronized) carrying this rank's local
 * status, so a local error becomes an error on every rank. Returns the local
 * status if it failed, else the collective's. serial (backward only, else
 * 0): which synchronized forward is differentiated, part of the signature.
 *
 * The payload is in the device's memory. A group that reduces device
 * buffers (allreduce_device) gets it there, enqueued on the layer's stream;
 * any other group gets it staged through host memory (for a GPU: a copy, a
 * wait for the stream, the host all-reduce, a copy back). The CPU's payload
 * is host memory, so it never needs either. */
static sbn_status sync_sums(sbn_bn *bn, sbn_sig_kind kind, size_t count, sbn_dtype dtype,
                            sbn_status local, uint64_t serial) {
  if (!bn->group) return local;
  const int fwd = kind == SBN_SIG_KIND_BN_FORWARD;
  if (bn->what_dtype[!fwd] != (int)dtype) {
    snprintf(bn->what[!fwd], sizeof bn->what[!fwd], "%s of layer #%d (C=%lld, %s)", fwd ? "forward" : "backward",
             bn->layer_id, (long long)bn->opt.num_features, sbn_dtype_name(dtype));
    bn->what_dtype[!fwd] = (int)dtype;
  }
  sbn_sig sig;
  sbn_sig_init_text(&sig, kind, bn->layer_id, bn->opt.num_features, dtype, bn->what[!fwd]);
  if (serial) sig.extra = serial, append_serial(sig.what, sizeof sig.what, serial);
  if (local != SBN_STATUS_OK) sbn_sig_set_error(&sig, local);
  sbn_status st;
  if (bn->dev->payload_on_device && bn->group->ops->allreduce_device) {
    if (local != SBN_STATUS_OK) bn->dev->to_host(&bn->L, count, 1); /* zeros, also on the device */
    st = bn->group->ops->allreduce_device(bn->group, bn->L.payload, count, SBN_DTYPE_FLOAT64, &sig,
                                          bn->L.stream);
  } else {
    sbn_status cp = bn->dev->to_host(&bn->L, count, local != SBN_STATUS_OK);
    if (cp != SBN_STATUS_OK && local == SBN_STATUS_OK) {
      local = cp;
      sbn_sig_set_error(&sig, local);
      bn->dev->to_host(&bn->L, count, 1);
    }
    st = sbn_comm_allreduce(bn->group, bn->L.payload_host, count, SBN_DTYPE_FLOAT64, &sig);
    if (st == SBN_STATUS_OK && local == SBN_STATUS_OK) st = bn->dev->from_host(&bn->L, count);
  }
  if (local != SBN_STATUS_OK) sbn_failure_told();
  return local != SBN_STATUS_OK ? local : st;
}

/* Batch statistics of x over the layer's group (or locally), in the
 * payload; *count is the count per channel when the host knows it (-1:
 * only the device does, after a device all-reduce). */
static sbn_status batch_stats(sbn_bn *bn, const void *x, sbn_geom g, int synced, sbn_status local,
                              double *count) {
  const int64_t C = bn->opt.num_features;
  if (local == SBN_STATUS_OK) local = bn->dev->stats(&bn->L, x, g);
  sbn_status st =
      synced ? sync_sums(bn, SBN_SIG_KIND_BN_FORWARD, (size_t)(2 * C + 1), g.dtype, local, 0) : local;
  if (st != SBN_STATUS_OK) return st;
  const int on_device = synced && bn->dev->payload_on_device && bn->group->ops->allreduce_device;
  const double n = !synced ? (double)g.n * (double)g.s : on_device ? -1 : bn->L.payload_host[2 * C];
  if (n == 1)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "sbn_bn_forward: expected more than 1 value per channel when training, got %.0f "
                    "value(s) per channel%s",
                    n, synced ? " over all ranks of the group" : "");
  *count = n;
  return SBN_STATUS_OK;
}

/* A device that finds an error after a call returned (a count of 1 known
 * only on the device) reports it on the layer's next call. */
static sbn_status deferred(sbn_bn *bn, const char *call) {
  return bn->dev->deferred ? bn->dev->deferred(&bn->L, call) : SBN_STATUS_OK;
}

sbn_status sbn_bn_forward(sbn_bn *bn, sbn_tensor *y, const sbn_tensor *x) {
  static const char call[] = "sbn_bn_forward";
  sbn_clear_error();
  if (!bn) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: layer is NULL", call);
  const int64_t C = bn->opt.num_features;
  const int batch_stats_mode = bn->training || !bn->opt.track_running_stats;
  const int synced = bn->training && bn->group != NULL;

  sbn_geom g = {0, 0, 0, SBN_LAYOUT_CHANNELS_FIRST, SBN_DTYPE_FLOAT32};
  sbn_status local = deferred(bn, call);
  if (local == SBN_STATUS_OK) local = sbn_check_input(&g, x, call, "x", C, bn->opt.device);
  if (local == SBN_STATUS_OK) local = check_dtype(bn, g.dtype, call, "x");
  if (local == SBN_STATUS_OK) local = sbn_check_same(y, x, call, "y", "x");
  if (local == SBN_STATUS_OK) local = sbn_check_alias(y, x, call, "y", "x");
  if (local == SBN_STATUS_OK) local = check_data(bn, x, call, "x");
  if (local == SBN_STATUS_OK && y->data != x->data) local = check_data(bn, y, call, "y");
  if (local == SBN_STATUS_OK) local = prepare_kernels(bn, g, call);

  sbn_dev_forward f = {batch_stats_mode, synced, bn->training && bn->opt.track_running_stats, 0};
  if (batch_stats_mode) {
    sbn_status st = batch_stats(bn, local == SBN_STATUS_OK ? x->data : NULL, g, synced, local, &f.count);
    if (st != SBN_STATUS_OK) return st;
  } else if (local != SBN_STATUS_OK) {
    return local;
  }

  /* All checks passed: commit state (the device updates the running
   * statistics and computes the normalize coefficients). */
  sbn_status st = bn->dev->forward_finish(&bn->L, &f);
  if (st != SBN_STATUS_OK) return st;
  bn->saved = 1;
  bn->saved_batch_stats = batch_stats_mode;
  bn->saved_serial = synced ? ++bn->forwards_synced : 0;
  bn->saved_x = *x;
  return bn->dev->normalize(&bn->L, y->data, x->data, g);
}

sbn_status sbn_bn_backward(sbn_bn *bn, sbn_tensor *dx, const sbn_tensor *dy, const sbn_tensor *x) {
  static const char call[] = "sbn_bn_backward";
  sbn_clear_error();
  if (!bn) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: layer is NULL", call);
  const int64_t C = bn->opt.num_features;
  /* Whether this backward synchronizes is decided by the forward it
   * differentiates, the same on every rank. */
  const int synced = bn->saved && bn->saved_serial;

  sbn_geom g = {0, 0, 0, SBN_LAYOUT_CHANNELS_FIRST, SBN_DTYPE_FLOAT32};
  sbn_status local = deferred(bn, call);
  if (local == SBN_STATUS_OK && !bn->saved)
    local = sbn_fail(SBN_STATUS_BAD_STATE, "%s: no successful forward to differentiate", call);
  if (local == SBN_STATUS_OK) local = sbn_check_input(&g, x, call, "x", C, bn->opt.device);
  if (local == SBN_STATUS_OK) local = check_dtype(bn, g.dtype, call, "x");
  if (local == SBN_STATUS_OK) local = sbn_check_same(x, &bn->saved_x, call, "x", "the forward's x");
  if (local == SBN_STATUS_OK) local = sbn_check_same(dy, x, call, "dy", "x");
  if (local == SBN_STATUS_OK && dx) local = sbn_check_same(dx, x, call, "dx", "x");
  if (local == SBN_STATUS_OK && dx) local = sbn_check_alias(dx, dy, call, "dx", "dy");
  if (local == SBN_STATUS_OK && dx) local = sbn_check_alias(dx, x, call, "dx", "x");
  if (local == SBN_STATUS_OK) local = check_data(bn, x, call, "x");
  if (local == SBN_STATUS_OK && dy->data != x->data) local = check_data(bn, dy, call, "dy");
  if (local == SBN_STATUS_OK && dx && dx->data != x->data && dx->data != dy->data)
    local = check_data(bn, dx, call, "dx");
  if (local == SBN_STATUS_OK) local = prepare_kernels(bn, g, call);

  if (local == SBN_STATUS_OK) local = bn->dev->backward_reduce(&bn->L, dy->data, x->data, g);
  if (synced) {
    sbn_status st = sync_sums(bn, SBN_SIG_KIND_BN_BACKWARD, (size_t)(2 * C), g.dtype, local, bn->saved_serial);
    if (st != SBN_STATUS_OK) return st;
  } else if (local != SBN_STATUS_OK) {
    return local;
  }
  sbn_status st = bn->dev->backward_finish(&bn->L, synced, dx != NULL, bn->saved_batch_stats);
  if (st == SBN_STATUS_OK && dx) st = bn->dev->backward_elemt(&bn->L, dx->data, dy->data, x->data, g);
  return st;
}

sbn_status sbn_bn_fail_call(sbn_bn *bn, int backward, sbn_status status, const char *message) {
  static const char call[] = "sbn_bn_fail_call";
  sbn_clear_error();
  if (!bn) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: layer is NULL", call);
  if (status <= SBN_STATUS_OK || status >= SBN_STATUS_COUNT_)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: status %d is not a failure", call, (int)status);
  char msg[1024]; /* a copy: message may be sbn_last_error(), which the collective rewrites */
  snprintf(msg, sizeof msg, "%s", message ? message : sbn_status_string(status));
  sbn_fail(status, "%s", msg);
  const int64_t C = bn->opt.num_features;
  /* the collective the call would have joined, as forward / backward decide it */
  if (!backward && bn->training && bn->group)
    sync_sums(bn, SBN_SIG_KIND_BN_FORWARD, (size_t)(2 * C + 1), SBN_DTYPE_FLOAT32, status, 0);
  else if (backward && bn->saved && bn->saved_serial)
    sync_sums(bn, SBN_SIG_KIND_BN_BACKWARD, (size_t)(2 * C), SBN_DTYPE_FLOAT32, status, bn->saved_serial);
  return sbn_fail(status, "%s", msg); /* the whole message (the peers get it shortened) */
}

sbn_status sbn_bn_record_create(sbn_bn_record **out, const sbn_bn *bn) {
  static const char call[] = "sbn_bn_record_create";
  sbn_clear_error();
  if (out) *out = NULL;
  if (!out || !bn) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", call, out ? "layer" : "out");
  sbn_bn_record *r = calloc(1, sizeof *r);
  if (!r) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
  sbn_status st = bn->dev->record_alloc(&bn->L, &r->mem, call);
  if (st != SBN_STATUS_OK) {
    free(r);
    return st;
  }
  r->uid = bn->uid;
  r->dev = bn->dev;
  r->device_index = bn->opt.device.index;
  *out = r;
  return SBN_STATUS_OK;
}

sbn_status sbn_bn_record_destroy(sbn_bn_record *r) {
  if (r) {
    r->dev->record_free(r->device_index, r->mem);
    free(r);
  }
  return SBN_STATUS_OK;
}

static sbn_status check_record(const sbn_bn *bn, const sbn_bn_record *r, const char *call) {
  if (!bn || !r) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", call, bn ? "record" : "layer");
  if (r->uid != bn->uid)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "%s: the record was made for another layer (sbn_bn_record_create with this one)", call);
  return SBN_STATUS_OK;
}

sbn_status sbn_bn_save_forward(sbn_bn *bn, sbn_bn_record *r) {
  static const char call[] = "sbn_bn_save_forward";
  sbn_clear_error();
  sbn_status st = check_record(bn, r, call);
  if (st != SBN_STATUS_OK) return st;
  if (!bn->saved) return sbn_fail(SBN_STATUS_BAD_STATE, "%s: the layer has no successful forward to save", call);
  if ((st = bn->dev->record_save(&bn->L, r->mem)) != SBN_STATUS_OK) return st;
  r->saved = 1;
  r->batch_stats = bn->saved_batch_stats;
  r->serial = bn->saved_serial;
  r->x = bn->saved_x;
  return SBN_STATUS_OK;
}

sbn_status sbn_bn_restore_forward(sbn_bn *bn, const sbn_bn_record *r) {
  static const char call[] = "sbn_bn_restore_forward";
  sbn_clear_error();
  sbn_status st = check_record(bn, r, call);
  if (st != SBN_STATUS_OK) return st;
  if (!r->saved)
    return sbn_fail(SBN_STATUS_BAD_STATE, "%s: the record holds no forward (sbn_bn_save_forward fills it)", call);
  if ((st = bn->dev->record_load(&bn->L, r->mem)) != SBN_STATUS_OK) return st;
  bn->saved = 1;
  bn->saved_batch_stats = r->batch_stats;
  bn->saved_serial = r->serial;
  bn->saved_x = r->x;
  return SBN_STATUS_OK;
}

sbn_status sbn_bn_zero_grad(sbn_bn *bn) {
  sbn_clear_error();
  if (!bn) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_zero_grad: layer is NULL");
  return bn->dev->zero_grad(&bn->L);
}

sbn_status sbn_bn_tensor(sbn_tensor *view, sbn_bn *bn, sbn_bn_tensor_id id) {
  static const char *const names[] = {"weight", "bias", "grad_weight", "grad_bias", "running_mean",
                                      "running_var"};
  sbn_clear_error();
  if (!view || !bn)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_tensor: %s is NULL", bn ? "view" : "layer");
  if ((int)id < 0 || (int)id >= SBN_DEV_TENSORS)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_tensor: unknown tensor id %d", (int)id);
  void *data = bn->L.tensor[id];
  if (!data)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_tensor: the layer has no %s (%s)", names[id],
                    id <= SBN_BN_TENSOR_GRAD_BIAS ? "affine = 0" : "track_running_stats = 0");
  int64_t shape[1] = {bn->opt.num_features};
  *view = sbn_tensor_cpu(data, 1, shape, bn->opt.param_dtype, SBN_LAYOUT_CHANNELS_FIRST);
  view->device = bn->opt.device;
  return SBN_STATUS_OK;
}

sbn_status sbn_bn_get_num_batches_tracked(const sbn_bn *bn, int64_t *out) {
  sbn_clear_error();
  if (!bn || !out)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_get_num_batches_tracked: %s is NULL",
                    bn ? "out" : "layer");
  if (!bn->opt.track_running_stats)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "sbn_bn_get_num_batches_tracked: the layer has no num_batches_tracked "
                    "(track_running_stats = 0)");
  return bn->dev->get_nbt(&bn->L, out);
}

sbn_status sbn_bn_set_num_batches_tracked(sbn_bn *bn, int64_t value) {
  sbn_clear_error();
  if (!bn) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_set_num_batches_tracked: layer is NULL");
  if (!bn->opt.track_running_stats)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "sbn_bn_set_num_batches_tracked: the layer has no num_batches_tracked "
                    "(track_running_stats = 0)");
  if (value < 0 || value > SBN_NUM_BATCHES_TRACKED_MAX)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "sbn_bn_set_num_batches_tracked: value must be in [0, 2^53], got %lld", (long long)value);
  return bn->dev->set_nbt(&bn->L, value);
}

int sbn_bn_swap_storage(sbn_bn *a, sbn_bn *b) {
  if (!a || !b || a->dev != b->dev || a->opt.device.index != b->opt.device.index ||
      a->opt.num_features != b->opt.num_features || !a->opt.affine != !b->opt.affine ||
      !a->opt.track_running_stats != !b->opt.track_running_stats || a->opt.param_dtype != b->opt.param_dtype)
    return -1;
  for (int i = 0; i < SBN_DEV_TENSORS; i++) {
    void *t = a->L.tensor[i];
    a->L.tensor[i] = b->L.tensor[i], b->L.tensor[i] = t;
  }
  return 0;
}
