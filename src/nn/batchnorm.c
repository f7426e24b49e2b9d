/* BatchNorm1d/2d/3d and SyncBatchNorm modules: thin wrappers of the core
 * sbn_bn layer (group NULL for BatchNormXd). PyTorch's input checks per
 * kind; parameters and buffers are views of the core layer's memory, except
 * num_batches_tracked, kept here as an int64 (the authoritative value between
 * calls, written to the core layer before each forward and read back after)
 * so that it can be listed, broadcast and loaded like any other buffer. */
#include <stdlib.h>
#include <string.h>

#include "module.h"

typedef struct bnmod {
  sbn_bn *bn;
  sbn_module_kind revert_kind; /* what revert_sync_batchnorm makes of a SyncBatchNorm */
  int64_t nbt;
  int track, affine;
} bnmod;

static sbn_status bn_forward(sbn_module *m, sbn_tensor *y, const sbn_tensor *x) {
  bnmod *b = m->impl;
  const char *name = sbn_module_kind_name(m->kind);
  int ok = 1;
  const char *want = "";
  switch (m->kind) {
    case SBN_MODULE_KIND_BATCHNORM1D: ok = x->ndim == 2 || x->ndim == 3, want = "2D or 3D"; break;
    case SBN_MODULE_KIND_BATCHNORM2D: ok = x->ndim == 4, want = "4D"; break;
    case SBN_MODULE_KIND_BATCHNORM3D: ok = x->ndim == 5, want = "5D"; break;
    default: ok = x->ndim >= 2, want = "at least 2D"; break;
  }
  if (!ok)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s.forward: expected %s input (got %dD input)", name, want,
                    x->ndim);
  if (b->track) {
    sbn_status st = sbn_bn_set_num_batches_tracked(b->bn, b->nbt);
    if (st != SBN_STATUS_OK)
      return sbn_fail(st, "%s.forward: num_batches_tracked = %lld is invalid", name, (long long)b->nbt);
  }
  float *out = sbn_nn_buf_reserve(&m->out, sbn_tensor_numel(x), "BatchNorm.forward");
  if (!out) return SBN_STATUS_OUT_OF_MEMORY;
  sbn_tensor yv = sbn_nn_view(out, x->ndim, x->shape);
  sbn_status st = sbn_bn_forward(b->bn, &yv, x);
  if (st != SBN_STATUS_OK) return st;
  if (b->track) sbn_bn_get_num_batches_tracked(b->bn, &b->nbt);
  *y = yv;
  return SBN_STATUS_OK;
}

static sbn_status bn_backward(sbn_module *m, sbn_tensor *dx, const sbn_tensor *dy) {
  bnmod *b = m->impl;
  float *g = sbn_nn_buf_reserve(&m->dx, sbn_tensor_numel(dy), "BatchNorm.backward");
  if (!g) return SBN_STATUS_OUT_OF_MEMORY;
  /* A parameter without requires_grad keeps its gradient: save and restore
   * around the core layer, which always accumulates. */
  float *keep[2] = {NULL, NULL};
  int64_t C = 0;
  if (b->affine) {
    C = m->local[0].numel;
    for (int i = 0; i < 2; i++)
      if (!m->local[i].requires_grad) {
        keep[i] = malloc(sizeof(float) * (size_t)C);
        if (!keep[i]) {
          free(keep[0]);
          return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "BatchNorm.backward: out of memory");
        }
        memcpy(keep[i], m->local[i].grad, sizeof(float) * (size_t)C);
      }
  }
  sbn_tensor dxv = sbn_nn_view(g, m->x.ndim, m->x.shape);
  sbn_status st = sbn_bn_backward(b->bn, &dxv, dy, &m->x);
  for (int i = 0; i < 2; i++)
    if (keep[i]) {
      memcpy(m->local[i].grad, keep[i], sizeof(float) * (size_t)C);
      free(keep[i]);
    }
  if (st != SBN_STATUS_OK) return st;
  *dx = dxv;
  return SBN_STATUS_OK;
}

static void bn_destroy(sbn_module *m) {
  bnmod *b = m->impl;
  if (!b) return;
  sbn_bn_destroy(b->bn);
  free(b);
}

static sbn_status bn_train(sbn_module *m, int training) {
  bnmod *b = m->impl;
  return sbn_bn_set_training(b->bn, training);
}

static const sbn_module_ops bn_ops = {bn_forward, bn_backward, bn_destroy, bn_train};

/* Modules, their optimizers and checkpoints are float32 in host memory
 * throughout: entries are read and written as such (a CUDA layer's would be
 * device pointers, which a save or a broadcast would dereference). */
static sbn_status check_module_options(const sbn_bn_options *o, sbn_module_kind kind) {
  if (o->param_dtype != SBN_DTYPE_FLOAT32)
    return sbn_fail(SBN_STATUS_UNSUPPORTED,
                    "%s: nn modules are float32; a layer with param_dtype %s is available through "
                    "sbn_bn_create only", sbn_module_kind_name(kind),
                    o->param_dtype == SBN_DTYPE_FLOAT64 ? "float64" : "other than float32");
  if (o->device.type != SBN_DEVICE_CPU)
    return sbn_fail(SBN_STATUS_UNSUPPORTED,
                    "%s: nn modules run on the CPU; a layer on %s is available through sbn_bn_create only",
                    sbn_module_kind_name(kind), o->device.type == SBN_DEVICE_CUDA ? "a CUDA device" : "another device");
  return SBN_STATUS_OK;
}

sbn_status sbn_nn_bn_module_wrap(sbn_module **out, sbn_module_kind kind, sbn_bn *bn, sbn_module_kind revert_kind) {
  sbn_bn_options o;
  sbn_status st = sbn_bn_get_options(bn, &o);
  if (st != SBN_STATUS_OK) return st;
  if ((st = check_module_options(&o, kind)) != SBN_STATUS_OK) return st;
  bnmod *b = calloc(1, sizeof *b);
  sbn_module *m = b ? sbn_nn_module_new(kind, &bn_ops, b) : NULL;
  if (!m) {
    free(b);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "BatchNorm: out of memory");
  }
  b->bn = bn;
  b->revert_kind = revert_kind;
  b->affine = o.affine != 0;
  b->track = o.track_running_stats != 0;
  m->training = sbn_bn_is_training(bn) == 1;
  int64_t C = o.num_features;
  sbn_tensor v, g;
  if (b->affine) {
    sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_WEIGHT), sbn_bn_tensor(&g, bn, SBN_BN_TENSOR_GRAD_WEIGHT);
    sbn_nn_add_local(m, "weight", SBN_NN_ENTRY_KIND_PARAMETER, SBN_DTYPE_FLOAT32, 1, &C, v.data, g.data);
    sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_BIAS), sbn_bn_tensor(&g, bn, SBN_BN_TENSOR_GRAD_BIAS);
    sbn_nn_add_local(m, "bias", SBN_NN_ENTRY_KIND_PARAMETER, SBN_DTYPE_FLOAT32, 1, &C, v.data, g.data);
  }
  if (b->track) {
    sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_RUNNING_MEAN);
    sbn_nn_add_local(m, "running_mean", SBN_NN_ENTRY_KIND_BUFFER, SBN_DTYPE_FLOAT32, 1, &C, v.data, NULL);
    sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_RUNNING_VAR);
    sbn_nn_add_local(m, "running_var", SBN_NN_ENTRY_KIND_BUFFER, SBN_DTYPE_FLOAT32, 1, &C, v.data, NULL);
    sbn_bn_get_num_batches_tracked(bn, &b->nbt);
    sbn_nn_add_local(m, "num_batches_tracked", SBN_NN_ENTRY_KIND_BUFFER, SBN_DTYPE_INT64, 0, NULL, &b->nbt, NULL);
  }
  *out = m;
  return SBN_STATUS_OK;
}

sbn_module_kind sbn_nn_bn_revert_kind(const sbn_module *m) { return ((const bnmod *)m->impl)->revert_kind; }
int64_t *sbn_nn_bn_nbt(sbn_module *m) { return &((bnmod *)m->impl)->nbt; }

static sbn_status bn_create(sbn_module **out, sbn_module_kind kind, const sbn_bn_options *options,
                            sbn_group *group, const char *call) {
  if (!out) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: out is NULL", call);
  *out = NULL;
  sbn_bn_options o = options ? *options : sbn_bn_options_default(0);
  if (!options)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: options is NULL (use sbn_bn_options_default(C))", call);
  /* Before the core layer exists: creating it takes an ordinal on the group. */
  sbn_status st = check_module_options(&o, kind);
  if (st != SBN_STATUS_OK) return st;
  sbn_bn *bn;
  st = sbn_bn_create(&bn, &o, group);
  if (st != SBN_STATUS_OK) return st;
  st = sbn_nn_bn_module_wrap(out, kind, bn,
                             kind == SBN_MODULE_KIND_SYNC_BATCHNORM ? SBN_MODULE_KIND_BATCHNORM2D : kind);
  if (st != SBN_STATUS_OK) sbn_bn_destroy(bn);
  return st;
}

sbn_status sbn_nn_batchnorm_create(sbn_module **out, int dims, const sbn_bn_options *options) {
  sbn_clear_error();
  if (dims < 1 || dims > 3)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_nn_batchnorm_create: dims must be 1, 2 or 3, got %d", dims);
  return bn_create(out, (sbn_module_kind)(SBN_MODULE_KIND_BATCHNORM1D + dims - 1), options, NULL,
                   "sbn_nn_batchnorm_create");
}

sbn_status sbn_nn_sync_batchnorm_create(sbn_module **out, const sbn_bn_options *options, sbn_group *group) {
  sbn_clear_error();
  return bn_create(out, SBN_MODULE_KIND_SYNC_BATCHNORM, options, group, "sbn_nn_sync_batchnorm_create");
}

sbn_status sbn_module_bn(sbn_bn **out, sbn_module *m) {
  sbn_clear_error();
  if (!out || !m) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_module_bn: NULL argument");
  if (m->kind < SBN_MODULE_KIND_BATCHNORM1D || m->kind > SBN_MODULE_KIND_SYNC_BATCHNORM)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_module_bn: a %s is not a batch-norm module",
                    sbn_module_kind_name(m->kind));
  *out = ((bnmod *)m->impl)->bn;
  return SBN_STATUS_OK;
}
