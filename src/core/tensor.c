/* Tensor descriptors: construction, sizes and the checks of layer inputs. */
#include "tensor.h"

#include <stdio.h>
#include <string.h>

#include "checked.h"
#include "error.h"

sbn_tensor sbn_tensor_cpu(void *data, int ndim, const int64_t *shape, sbn_dtype dtype,
                          sbn_layout layout) {
  sbn_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.ndim = ndim < 0 ? 0 : ndim > SBN_MAX_DIMS ? SBN_MAX_DIMS : ndim;
  for (int i = 0; i < t.ndim && shape; i++) t.shape[i] = shape[i];
  t.dtype = dtype;
  t.layout = layout;
  t.device.type = SBN_DEVICE_CPU;
  return t;
}

int64_t sbn_tensor_numel(const sbn_tensor *t) {
  if (!t || t->ndim <= 0) return 0;
  int64_t n;
  return sbn_shape_numel(&n, t->ndim < SBN_MAX_DIMS ? t->ndim : SBN_MAX_DIMS, t->shape) ? n : -1;
}

const char *sbn_dtype_name(sbn_dtype dtype) {
  switch (dtype) {
    case SBN_DTYPE_FLOAT32: return "float32";
    case SBN_DTYPE_BFLOAT16: return "bfloat16";
    case SBN_DTYPE_FLOAT16: return "float16";
    case SBN_DTYPE_FLOAT64: return "float64";
    case SBN_DTYPE_INT64: return "int64";
  }
  return "unknown dtype";
}

size_t sbn_dtype_size(sbn_dtype dtype) {
  switch (dtype) {
    case SBN_DTYPE_FLOAT32: return 4;
    case SBN_DTYPE_BFLOAT16:
    case SBN_DTYPE_FLOAT16: return 2;
    case SBN_DTYPE_FLOAT64:
    case SBN_DTYPE_INT64: return 8;
  }
  return 0;
}

const char *sbn_shape_str(char *buf, size_t cap, const sbn_tensor *t) {
  size_t len = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < t->ndim && i < SBN_MAX_DIMS && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  if (len < cap) snprintf(buf + len, cap - len, "]");
  return buf;
}

static const char *device_str(char *buf, size_t cap, sbn_device d) {
  if (d.type == SBN_DEVICE_CPU && d.index == 0) snprintf(buf, cap, "cpu");
  else if (d.type == SBN_DEVICE_CPU) snprintf(buf, cap, "cpu:%d", d.index);
  else if (d.type == SBN_DEVICE_CUDA) snprintf(buf, cap, "cuda:%d", d.index);
  else snprintf(buf, cap, "device type %d", (int)d.type);
  return buf;
}

sbn_status sbn_check_input(sbn_geom *geom, const sbn_tensor *t, const char *call,
                           const char *name, int64_t num_features, sbn_device device) {
  char sh[96], d1[32], d2[32];
  if (!t) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", call, name);
  if (t->ndim < 2 || t->ndim > SBN_MAX_DIMS)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: expected 2D to 5D input (got %dD %s)", call,
                    t->ndim, name);
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] < 0)
      return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %s has a negative dimension: %s", call, name,
                      sbn_shape_str(sh, sizeof sh, t));
  size_t bytes;
  if (sbn_tensor_numel(t) < 0 || !sbn_bytes(&bytes, sbn_tensor_numel(t), 8))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %s has shape %s whose size overflows", call, name,
                    sbn_shape_str(sh, sizeof sh, t));
  if (t->shape[1] == 0)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %s has C = 0 channels: %s", call, name,
                    sbn_shape_str(sh, sizeof sh, t));
  if (t->shape[1] != num_features)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "%s: %s has %lld channels (shape %s) but the layer has num_features = %lld", call,
                    name, (long long)t->shape[1], sbn_shape_str(sh, sizeof sh, t),
                    (long long)num_features);
  if (t->layout != SBN_LAYOUT_CHANNELS_FIRST && t->layout != SBN_LAYOUT_CHANNELS_LAST)
    return sbn_fail(SBN_STATUS_UNSUPPORTED, "%s: %s has unknown layout %d", call, name, (int)t->layout);
  if (t->dtype == SBN_DTYPE_INT64)
    return sbn_fail(SBN_STATUS_UNSUPPORTED,
                    "%s: %s has dtype int64; layer tensors are float32, bfloat16, float16 or float64", call,
                    name);
  if (t->dtype != SBN_DTYPE_FLOAT32 && t->dtype != SBN_DTYPE_BFLOAT16 &&
      t->dtype != SBN_DTYPE_FLOAT16 && t->dtype != SBN_DTYPE_FLOAT64)
    return sbn_fail(SBN_STATUS_UNSUPPORTED,
                    "%s: %s has dtype code %d, which is not an sbn_dtype; layer tensors are float32, "
                    "bfloat16, float16 or float64", call, name, (int)t->dtype);
  if (t->device.type != device.type || t->device.index != device.index)
    return sbn_fail(SBN_STATUS_UNSUPPORTED, "%s: %s is on %s but the layer is on %s", call, name,
                    device_str(d1, sizeof d1, t->device), device_str(d2, sizeof d2, device));
  if (!t->data && sbn_tensor_numel(t) > 0)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %s->data is NULL for shape %s", call, name,
                    sbn_shape_str(sh, sizeof sh, t));
  geom->n = t->shape[0];
  geom->c = t->shape[1];
  sbn_shape_numel(&geom->s, t->ndim - 2, t->shape + 2); /* fits: checked above */
  geom->layout = t->layout;
  geom->dtype = t->dtype;
  return SBN_STATUS_OK;
}

sbn_status sbn_check_same(const sbn_tensor *t, const sbn_tensor *ref, const char *call,
                          const char *name, const char *ref_name) {
  char s1[96], s2[96];
  if (!t) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", call, name);
  int same = t->ndim == ref->ndim && t->dtype == ref->dtype && t->layout == ref->layout &&
             t->device.type == ref->device.type && t->device.index == ref->device.index;
  for (int i = 0; same && i < t->ndim; i++) same = t->shape[i] == ref->shape[i];
  if (!same)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "%s: %s (shape %s, %s, layout %d) must match %s (shape %s, %s, layout %d)", call,
                    name, sbn_shape_str(s1, sizeof s1, t), sbn_dtype_name(t->dtype), (int)t->layout,
                    ref_name, sbn_shape_str(s2, sizeof s2, ref), sbn_dtype_name(ref->dtype),
                    (int)ref->layout);
  if (!t->data && sbn_tensor_numel(t) > 0)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %s->data is NULL", call, name);
  return SBN_STATUS_OK;
}

sbn_status sbn_check_alias(const sbn_tensor *a, const sbn_tensor *b, const char *call,
                           const char *a_name, const char *b_name) {
  if (a->data == b->data) return SBN_STATUS_OK;
  const char *a0 = a->data, *b0 = b->data;
  size_t an = 0, bn = 0; /* sizes were checked by sbn_check_input/same */
  sbn_bytes(&an, sbn_tensor_numel(a), sbn_dtype_size(a->dtype));
  sbn_bytes(&bn, sbn_tensor_numel(b), sbn_dtype_size(b->dtype));
  if (an && bn && a0 < b0 + bn && b0 < a0 + an)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "%s: %s and %s partially overlap (in place needs the same pointer)", call,
                    a_name, b_name);
  return SBN_STATUS_OK;
}
