/* The SyncBatchNorm layer: options, state, train/eval, and the orchestration
 * of kernels and the group's collective (ARCHITECTURE.md):
 *   forward:  stats pass -> one all-reduce of 2C+1 doubles -> normalize pass
 *   backward: reduce pass -> one all-reduce of 2C doubles -> elementwise pass
 * Every state change happens after the last check that can fail, so a
 * failed call leaves the layer as it was. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../comm/comm.h"
#include "../cpu/bn_kernels.h"
#include "error.h"
#include "bn_internal.h"
#include "tensor.h"

struct sbn_bn {
  sbn_bn_options opt;
  sbn_group *group; /* NULL: plain BatchNorm */
  int layer_id;     /* ordinal on the group, carried by collectives */
  int training;
  float *weight, *bias, *grad_weight, *grad_bias; /* affine */
  float *running_mean, *running_var;              /* track_running_stats */
  int64_t num_batches_tracked;

  /* Saved by the last successful forward, for backward. */
  int saved;               /* a forward has succeeded */
  int saved_batch_stats;   /* 1: batch statistics (training math); 0: running */
  int saved_synced;        /* the statistics came from the group */
  double saved_count;      /* the (global) count per channel */
  sbn_tensor saved_x;      /* descriptor only: shape/dtype/layout of x */
  double *mean, *invstd;   /* C each */

  /* Scratch, allocated once (no allocation in the steady state). */
  double *shift, *s1, *s2;  /* stats pass */
  double *payload;          /* 2C+1: collective buffer */
  double *new_mean, *new_var, *new_invstd;
  double *ka, *kb, *kc;     /* per-channel coefficients of the elementwise passes */
  sbn_cpu_ws ws;            /* kernel partial sums: grows with the shape, then reused */
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
  return o;
}

static void bn_free(sbn_bn *bn) {
  free(bn->weight), free(bn->bias), free(bn->grad_weight), free(bn->grad_bias);
  free(bn->running_mean), free(bn->running_var);
  free(bn->mean), free(bn->invstd), free(bn->shift), free(bn->s1), free(bn->s2);
  free(bn->payload), free(bn->new_mean), free(bn->new_var), free(bn->new_invstd), free(bn->ka), free(bn->kb);
  free(bn->kc);
  sbn_cpu_ws_free(&bn->ws);
  free(bn);
}

sbn_status sbn_bn_create(sbn_bn **out, const sbn_bn_options *o, sbn_group *group) {
  sbn_clear_error();
  if (out) *out = NULL;
  if (!out || !o)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_create: %s is NULL", out ? "options" : "out");
  if (o->num_features <= 0)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_create: num_features must be > 0, got %lld",
                    (long long)o->num_features);
  if (!(o->eps > 0) || !isfinite(o->eps))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_create: eps must be > 0, got %g", o->eps);
  if (o->momentum != SBN_MOMENTUM_CUMULATIVE && !(o->momentum >= 0 && o->momentum <= 1))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "sbn_bn_create: momentum must be in [0, 1] or SBN_MOMENTUM_CUMULATIVE, got %g",
                    o->momentum);
  if (o->device.type == SBN_DEVICE_CUDA)
    return sbn_fail(SBN_STATUS_NOT_BUILT, "sbn_bn_create: CUDA support is not built into this library");
  if (o->device.type != SBN_DEVICE_CPU)
    return sbn_fail(SBN_STATUS_UNSUPPORTED, "sbn_bn_create: unknown device type %d", (int)o->device.type);
  const size_t C = (size_t)o->num_features;
  sbn_bn *bn = calloc(1, sizeof *bn);
  if (!bn) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "sbn_bn_create: out of memory");
  int ok = 1;
#define SBN_ALLOC_(field, n) ok &= (bn->field = calloc((n), sizeof *bn->field)) != NULL
  if (o->affine) {
    SBN_ALLOC_(weight, C), SBN_ALLOC_(bias, C), SBN_ALLOC_(grad_weight, C), SBN_ALLOC_(grad_bias, C);
  }
  if (o->track_running_stats) {
    SBN_ALLOC_(running_mean, C), SBN_ALLOC_(running_var, C);
  }
  SBN_ALLOC_(mean, C), SBN_ALLOC_(invstd, C), SBN_ALLOC_(shift, C), SBN_ALLOC_(s1, C);
  SBN_ALLOC_(s2, C), SBN_ALLOC_(payload, 2 * C + 1), SBN_ALLOC_(new_mean, C), SBN_ALLOC_(new_var, C);
  SBN_ALLOC_(new_invstd, C), SBN_ALLOC_(ka, C), SBN_ALLOC_(kb, C), SBN_ALLOC_(kc, C);
#undef SBN_ALLOC_
  if (!ok) {
    bn_free(bn);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "sbn_bn_create: out of memory for %zu channels", C);
  }
  for (size_t c = 0; c < C; c++) {
    if (o->affine) bn->weight[c] = 1.0f;
    if (o->track_running_stats) bn->running_var[c] = 1.0f;
  }
  bn->opt = *o;
  bn->training = 1;
  if (group && group->size > 1) {
    bn->group = group;
    bn->layer_id = group->next_layer++;
  } else {
    bn->layer_id = -1;
  }
  *out = bn;
  return SBN_STATUS_OK;
}

sbn_status sbn_bn_destroy(sbn_bn *bn) {
  if (bn) bn_free(bn);
  return SBN_STATUS_OK;
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

/* Before the passes over x: scratch for this shape (allocated on the first
 * call with a larger shape only) and the threads this rank may use, the
 * cores shared among the thread ranks of its group (cpu_threads.c). */
static sbn_status prepare_kernels(sbn_bn *bn, sbn_geom g, const char *call) {
  if (sbn_cpu_ws_reserve(&bn->ws, g) != 0)
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory for the kernels' partial sums", call);
  int ranks = bn->group && strcmp(sbn_group_backend(bn->group), "threads") == 0 ? bn->group->size : 1;
  bn->ws.threads = sbn_cpu_threads(ranks);
  return SBN_STATUS_OK;
}

/* Run the layer's collective (when synchronized) carrying this rank's local
 * status, so a local error becomes an error on every rank. Returns the local
 * status if it failed, else the collective's. */
static sbn_status sync_sums(sbn_bn *bn, sbn_sig_kind kind, size_t count, sbn_dtype dtype,
                            sbn_status local) {
  if (!bn->group) return local;
  sbn_sig sig;
  sbn_sig_init(&sig, kind, bn->layer_id, bn->opt.num_features, dtype,
               "%s of layer #%d (C=%lld, %s)", kind == SBN_SIG_KIND_BN_FORWARD ? "forward" : "backward",
               bn->layer_id, (long long)bn->opt.num_features, sbn_dtype_name(dtype));
  if (local != SBN_STATUS_OK) {
    sbn_sig_set_error(&sig, local);
    memset(bn->payload, 0, sizeof(double) * count);
  }
  sbn_status st = sbn_comm_allreduce(bn->group, bn->payload, count, SBN_DTYPE_FLOAT64, &sig);
  return local != SBN_STATUS_OK ? local : st;
}

/* Batch statistics of x over the layer's group (or locally): fills
 * new_mean, new_var and new_invstd; returns the count per channel in *count.
 *
 * Locally the shifted sums give mean and M2 without cancellation. Across
 * ranks the collective is a plain sum (what MPI and NCCL offer), of
 * (n, n*mean, M2 + n*mean^2) per rank in float64: the global variance then
 * carries a relative error of about 1e-16 * (mean/std)^2, i.e. 1e-8 for
 * channels whose mean is 1e4 times their standard deviation. */
static sbn_status batch_stats(sbn_bn *bn, const void *x, sbn_geom g, int synced, sbn_status local,
                              double *count) {
  const int64_t C = bn->opt.num_features;
  double *sum = bn->payload, *sumsq = bn->payload + C;
  if (local == SBN_STATUS_OK) {
    sbn_cpu_stats(&bn->ws, bn->shift, bn->s1, bn->s2, x, g);
    const double n = (double)g.n * (double)g.s;
    for (int64_t c = 0; c < C; c++) {
      double m = n > 0 ? bn->shift[c] + bn->s1[c] / n : 0.0;
      double m2 = n > 0 ? bn->s2[c] - bn->s1[c] * bn->s1[c] / n : 0.0;
      if (m2 < 0) m2 = 0;
      bn->new_mean[c] = m;
      bn->new_var[c] = n > 0 ? m2 / n : 0.0;
      sum[c] = n * m;
      sumsq[c] = m2 + n * m * m;
    }
    bn->payload[2 * C] = n;
  }
  sbn_status st =
      synced ? sync_sums(bn, SBN_SIG_KIND_BN_FORWARD, (size_t)(2 * C + 1), g.dtype, local) : local;
  if (st != SBN_STATUS_OK) return st;
  const double n = bn->payload[2 * C];
  if (n == 0) { /* every rank empty: nothing observed (see sbn_bn_forward) */
    for (int64_t c = 0; c < C; c++) bn->new_mean[c] = 0, bn->new_var[c] = 0, bn->new_invstd[c] = 0;
    *count = 0;
    return SBN_STATUS_OK;
  }
  if (n == 1)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "sbn_bn_forward: expected more than 1 value per channel when training, got %.0f "
                    "value(s) per channel%s",
                    n, synced ? " over all ranks of the group" : "");
  for (int64_t c = 0; c < C; c++) {
    if (synced) {
      double mean = sum[c] / n, var = sumsq[c] / n - mean * mean;
      bn->new_mean[c] = mean;
      bn->new_var[c] = var > 0 ? var : 0.0;
    }
    bn->new_invstd[c] = 1.0 / sqrt(bn->new_var[c] + bn->opt.eps);
  }
  *count = n;
  return SBN_STATUS_OK;
}

sbn_status sbn_bn_forward(sbn_bn *bn, sbn_tensor *y, const sbn_tensor *x) {
  static const char call[] = "sbn_bn_forward";
  sbn_clear_error();
  if (!bn) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: layer is NULL", call);
  const int64_t C = bn->opt.num_features;
  const int batch_stats_mode = bn->training || !bn->opt.track_running_stats;
  const int synced = bn->training && bn->group != NULL;

  sbn_geom g = {0, 0, 0, SBN_LAYOUT_CHANNELS_FIRST, SBN_DTYPE_FLOAT32};
  sbn_status local = sbn_check_input(&g, x, call, "x", C, bn->opt.device);
  if (local == SBN_STATUS_OK) local = sbn_check_same(y, x, call, "y", "x");
  if (local == SBN_STATUS_OK) local = sbn_check_alias(y, x, call, "y", "x");
  if (local == SBN_STATUS_OK) local = prepare_kernels(bn, g, call);

  double count = 0;
  if (batch_stats_mode) {
    sbn_status st = batch_stats(bn, local == SBN_STATUS_OK ? x->data : NULL, g, synced, local, &count);
    if (st != SBN_STATUS_OK) return st;
  } else {
    if (local != SBN_STATUS_OK) return local;
    for (int64_t c = 0; c < C; c++) {
      bn->new_mean[c] = bn->running_mean[c];
      bn->new_invstd[c] = 1.0 / sqrt((double)bn->running_var[c] + bn->opt.eps);
    }
  }

  /* All checks passed: commit state. */
  if (bn->training && bn->opt.track_running_stats && count > 0) {
    if (bn->num_batches_tracked < SBN_NUM_BATCHES_TRACKED_MAX) bn->num_batches_tracked++; /* saturates */
    const double f = bn->opt.momentum == SBN_MOMENTUM_CUMULATIVE
                         ? 1.0 / (double)bn->num_batches_tracked
                         : bn->opt.momentum;
    const double unbias = count / (count - 1);
    for (int64_t c = 0; c < C; c++) {
      bn->running_mean[c] = (float)((1 - f) * bn->running_mean[c] + f * bn->new_mean[c]);
      bn->running_var[c] = (float)((1 - f) * bn->running_var[c] + f * bn->new_var[c] * unbias);
    }
  }
  double *t = bn->mean;
  bn->mean = bn->new_mean, bn->new_mean = t;
  t = bn->invstd;
  bn->invstd = bn->new_invstd, bn->new_invstd = t;
  bn->saved = 1;
  bn->saved_batch_stats = batch_stats_mode;
  bn->saved_synced = synced;
  bn->saved_count = count;
  bn->saved_x = *x;

  for (int64_t c = 0; c < C; c++) {
    double w = bn->opt.affine ? bn->weight[c] : 1.0, b = bn->opt.affine ? bn->bias[c] : 0.0;
    bn->ka[c] = w * bn->invstd[c];
    bn->kb[c] = b;
  }
  sbn_cpu_normalize(&bn->ws, y->data, x->data, g, bn->mean, bn->ka, bn->kb);
  return SBN_STATUS_OK;
}

sbn_status sbn_bn_backward(sbn_bn *bn, sbn_tensor *dx, const sbn_tensor *dy, const sbn_tensor *x) {
  static const char call[] = "sbn_bn_backward";
  sbn_clear_error();
  if (!bn) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: layer is NULL", call);
  const int64_t C = bn->opt.num_features;
  /* Whether this backward synchronizes is decided by the forward it
   * differentiates, the same on every rank. */
  const int synced = bn->saved && bn->saved_synced;

  sbn_geom g = {0, 0, 0, SBN_LAYOUT_CHANNELS_FIRST, SBN_DTYPE_FLOAT32};
  sbn_status local = SBN_STATUS_OK;
  if (!bn->saved)
    local = sbn_fail(SBN_STATUS_BAD_STATE, "%s: no successful forward to differentiate", call);
  if (local == SBN_STATUS_OK) local = sbn_check_input(&g, x, call, "x", C, bn->opt.device);
  if (local == SBN_STATUS_OK) local = sbn_check_same(x, &bn->saved_x, call, "x", "the forward's x");
  if (local == SBN_STATUS_OK) local = sbn_check_same(dy, x, call, "dy", "x");
  if (local == SBN_STATUS_OK && dx) local = sbn_check_same(dx, x, call, "dx", "x");
  if (local == SBN_STATUS_OK && dx) local = sbn_check_alias(dx, dy, call, "dx", "dy");
  if (local == SBN_STATUS_OK && dx) local = sbn_check_alias(dx, x, call, "dx", "x");
  if (local == SBN_STATUS_OK) local = prepare_kernels(bn, g, call);

  double *sum_dy = bn->s1, *sum_dy_xmu = bn->s2;
  if (local == SBN_STATUS_OK)
    sbn_cpu_backward_reduce(&bn->ws, sum_dy, sum_dy_xmu, dy->data, x->data, g, bn->mean);
  if (synced) {
    if (local == SBN_STATUS_OK) {
      memcpy(bn->payload, sum_dy, sizeof(double) * (size_t)C);
      memcpy(bn->payload + C, sum_dy_xmu, sizeof(double) * (size_t)C);
    }
    sbn_status st = sync_sums(bn, SBN_SIG_KIND_BN_BACKWARD, (size_t)(2 * C), g.dtype, local);
    if (st != SBN_STATUS_OK) return st;
  } else if (local != SBN_STATUS_OK) {
    return local;
  }
  const double *gsum_dy = synced ? bn->payload : sum_dy;
  const double *gsum_dy_xmu = synced ? bn->payload + C : sum_dy_xmu;

  if (dx) {
    for (int64_t c = 0; c < C; c++) {
      double a = (bn->opt.affine ? bn->weight[c] : 1.0) * bn->invstd[c];
      bn->ka[c] = a;
      if (bn->saved_batch_stats && bn->saved_count > 0) {
        bn->kb[c] = a * gsum_dy[c] / bn->saved_count;
        bn->kc[c] = a * bn->invstd[c] * bn->invstd[c] * gsum_dy_xmu[c] / bn->saved_count;
      } else {
        bn->kb[c] = 0, bn->kc[c] = 0;
      }
    }
    sbn_cpu_backward_elemt(&bn->ws, dx->data, dy->data, x->data, g, bn->mean, bn->ka, bn->kb, bn->kc);
  }
  if (bn->opt.affine)
    for (int64_t c = 0; c < C; c++) {
      bn->grad_weight[c] += (float)(sum_dy_xmu[c] * bn->invstd[c]);
      bn->grad_bias[c] += (float)sum_dy[c];
    }
  return SBN_STATUS_OK;
}

sbn_status sbn_bn_zero_grad(sbn_bn *bn) {
  sbn_clear_error();
  if (!bn) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_zero_grad: layer is NULL");
  if (bn->opt.affine) {
    memset(bn->grad_weight, 0, sizeof(float) * (size_t)bn->opt.num_features);
    memset(bn->grad_bias, 0, sizeof(float) * (size_t)bn->opt.num_features);
  }
  return SBN_STATUS_OK;
}

sbn_status sbn_bn_tensor(sbn_tensor *view, sbn_bn *bn, sbn_bn_tensor_id id) {
  static const char *const names[] = {"weight", "bias", "grad_weight", "grad_bias", "running_mean",
                                      "running_var"};
  sbn_clear_error();
  if (!view || !bn)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_tensor: %s is NULL", bn ? "view" : "layer");
  float *data = NULL;
  switch (id) {
    case SBN_BN_TENSOR_WEIGHT: data = bn->weight; break;
    case SBN_BN_TENSOR_BIAS: data = bn->bias; break;
    case SBN_BN_TENSOR_GRAD_WEIGHT: data = bn->grad_weight; break;
    case SBN_BN_TENSOR_GRAD_BIAS: data = bn->grad_bias; break;
    case SBN_BN_TENSOR_RUNNING_MEAN: data = bn->running_mean; break;
    case SBN_BN_TENSOR_RUNNING_VAR: data = bn->running_var; break;
    default: return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_tensor: unknown tensor id %d", (int)id);
  }
  if (!data)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_bn_tensor: the layer has no %s (%s)", names[id],
                    id <= SBN_BN_TENSOR_GRAD_BIAS ? "affine = 0" : "track_running_stats = 0");
  int64_t shape[1] = {bn->opt.num_features};
  *view = sbn_tensor_cpu(data, 1, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
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
  *out = bn->num_batches_tracked;
  return SBN_STATUS_OK;
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
  bn->num_batches_tracked = value;
  return SBN_STATUS_OK;
}

int sbn_bn_swap_storage(sbn_bn *a, sbn_bn *b) {
  if (!a || !b || a->opt.num_features != b->opt.num_features || !a->opt.affine != !b->opt.affine ||
      !a->opt.track_running_stats != !b->opt.track_running_stats)
    return -1;
  float *t;
#define SBN_SWAP_(f) (t = a->f, a->f = b->f, b->f = t)
  SBN_SWAP_(weight), SBN_SWAP_(bias), SBN_SWAP_(grad_weight), SBN_SWAP_(grad_bias);
  SBN_SWAP_(running_mean), SBN_SWAP_(running_var);
#undef SBN_SWAP_
  return 0;
}
