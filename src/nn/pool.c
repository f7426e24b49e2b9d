/* Pooling over NCHW: MaxPool2d (kernel, stride, padding; PyTorch's
 * first-maximum tie rule, NaN propagates) and global average pooling
 * (AdaptiveAvgPool2d((1, 1))). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "module.h"
#include "../core/checked.h"

typedef struct maxpool {
  int k, stride, pad;
  int64_t *arg; /* per output: index of the maximum in its H*W plane */
  size_t arg_cap;
} maxpool;

static sbn_status maxpool_forward(sbn_module *m, sbn_tensor *y, const sbn_tensor *x) {
  maxpool *p = m->impl;
  char s[96];
  if (x->ndim != 4)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "MaxPool2d.forward: expected 4D input, got %s",
                    sbn_nn_shape_str(s, sizeof s, x->ndim, x->shape));
  const int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
  int64_t hp, wp, total;
  if (!sbn_add_i64(&hp, H, 2 * (int64_t)p->pad) || !sbn_add_i64(&wp, W, 2 * (int64_t)p->pad))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "MaxPool2d.forward: input %s: padded size overflows",
                    sbn_nn_shape_str(s, sizeof s, x->ndim, x->shape));
  if (hp < p->k || wp < p->k)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "MaxPool2d.forward: input %s is smaller than the kernel %d",
                    sbn_nn_shape_str(s, sizeof s, x->ndim, x->shape), p->k);
  const int64_t Ho = (hp - p->k) / p->stride + 1, Wo = (wp - p->k) / p->stride + 1;
  if (!sbn_mul_i64(&total, N, C) || !sbn_mul_i64(&total, total, Ho) || !sbn_mul_i64(&total, total, Wo) ||
      !sbn_bytes(&(size_t){0}, total, 8))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "MaxPool2d.forward: input %s: output size overflows",
                    sbn_nn_shape_str(s, sizeof s, x->ndim, x->shape));
  float *out = sbn_nn_buf_reserve(&m->out, total, "MaxPool2d.forward");
  if (!out) return SBN_STATUS_OUT_OF_MEMORY;
  if ((size_t)total > p->arg_cap) {
    int64_t *a = realloc(p->arg, sizeof *a * (size_t)total);
    if (!a) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "MaxPool2d.forward: out of memory");
    p->arg = a, p->arg_cap = (size_t)total;
  }
  const float *in = x->data;
  for (int64_t nc = 0; nc < N * C; nc++) {
    const float *plane = in + nc * H * W;
    for (int64_t oh = 0; oh < Ho; oh++)
      for (int64_t ow = 0; ow < Wo; ow++) {
        int64_t h0 = oh * p->stride - p->pad, w0 = ow * p->stride - p->pad;
        int64_t h1 = h0 + p->k < H ? h0 + p->k : H, w1 = w0 + p->k < W ? w0 + p->k : W;
        if (h0 < 0) h0 = 0;
        if (w0 < 0) w0 = 0;
        float best = -INFINITY;
        int64_t bi = h0 * W + w0;
        for (int64_t h = h0; h < h1; h++)
          for (int64_t w = w0; w < w1; w++) {
            float v = plane[h * W + w];
            if (v > best || isnan(v)) best = v, bi = h * W + w;
          }
        int64_t o = (nc * Ho + oh) * Wo + ow;
        out[o] = best;
        p->arg[o] = bi;
      }
  }
  int64_t shape[4] = {N, C, Ho, Wo};
  *y = sbn_nn_view(out, 4, shape);
  return SBN_STATUS_OK;
}

static sbn_status maxpool_backward(sbn_module *m, sbn_tensor *dx, const sbn_tensor *dy) {
  maxpool *p = m->impl;
  const int64_t NC = m->x.shape[0] * m->x.shape[1], HW = m->x.shape[2] * m->x.shape[3];
  const int64_t O = m->y.shape[2] * m->y.shape[3];
  float *g = sbn_nn_buf_reserve(&m->dx, NC * HW, "MaxPool2d.backward");
  if (!g) return SBN_STATUS_OUT_OF_MEMORY;
  memset(g, 0, sizeof(float) * (size_t)(NC * HW));
  const float *d = dy->data;
  for (int64_t nc = 0; nc < NC; nc++)
    for (int64_t o = 0; o < O; o++) g[nc * HW + p->arg[nc * O + o]] += d[nc * O + o];
  *dx = sbn_nn_view(g, 4, m->x.shape);
  return SBN_STATUS_OK;
}

static void maxpool_destroy(sbn_module *m) {
  maxpool *p = m->impl;
  if (p) free(p->arg), free(p);
}

static const sbn_module_ops maxpool_ops = {maxpool_forward, maxpool_backward, maxpool_destroy, NULL};

sbn_status sbn_nn_maxpool2d_create(sbn_module **out, int kernel_size, int stride, int padding) {
  static const char call[] = "sbn_nn_maxpool2d_create";
  sbn_clear_error();
  if (!out) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: out is NULL", call);
  *out = NULL;
  if (stride == 0) stride = kernel_size;
  if (kernel_size <= 0 || stride <= 0 || padding < 0 || padding > kernel_size / 2)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "%s: kernel %d, stride %d, padding %d: need kernel > 0, stride > 0 and padding at most "
                    "half the kernel",
                    call, kernel_size, stride, padding);
  maxpool *p = calloc(1, sizeof *p);
  sbn_module *m = p ? sbn_nn_module_new(SBN_MODULE_KIND_MAXPOOL2D, &maxpool_ops, p) : NULL;
  if (!m) {
    free(p);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
  }
  p->k = kernel_size, p->stride = stride, p->pad = padding;
  *out = m;
  return SBN_STATUS_OK;
}

static sbn_status avgpool_forward(sbn_module *m, sbn_tensor *y, const sbn_tensor *x) {
  char s[96];
  if (x->ndim != 4 || x->shape[2] * x->shape[3] == 0)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "AdaptiveAvgPool2d.forward: expected 4D input with non-empty H, W, got %s",
                    sbn_nn_shape_str(s, sizeof s, x->ndim, x->shape));
  const int64_t NC = x->shape[0] * x->shape[1], HW = x->shape[2] * x->shape[3];
  float *out = sbn_nn_buf_reserve(&m->out, NC, "AdaptiveAvgPool2d.forward");
  if (!out) return SBN_STATUS_OUT_OF_MEMORY;
  const float *in = x->data;
  for (int64_t i = 0; i < NC; i++) {
    double acc = 0;
    for (int64_t j = 0; j < HW; j++) acc += in[i * HW + j];
    out[i] = (float)(acc / (double)HW);
  }
  int64_t shape[4] = {x->shape[0], x->shape[1], 1, 1};
  *y = sbn_nn_view(out, 4, shape);
  return SBN_STATUS_OK;
}

static sbn_status avgpool_backward(sbn_module *m, sbn_tensor *dx, const sbn_tensor *dy) {
  const int64_t NC = m->x.shape[0] * m->x.shape[1], HW = m->x.shape[2] * m->x.shape[3];
  float *g = sbn_nn_buf_reserve(&m->dx, NC * HW, "AdaptiveAvgPool2d.backward");
  if (!g) return SBN_STATUS_OUT_OF_MEMORY;
  const float *d = dy->data;
  for (int64_t i = 0; i < NC; i++) {
    float v = (float)((double)d[i] / (double)HW);
    for (int64_t j = 0; j < HW; j++) g[i * HW + j] = v;
  }
  *dx = sbn_nn_view(g, 4, m->x.shape);
  return SBN_STATUS_OK;
}

static const sbn_module_ops avgpool_ops = {avgpool_forward, avgpool_backward, NULL, NULL};

sbn_status sbn_nn_global_avgpool_create(sbn_module **out) {
  sbn_clear_error();
  if (!out) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_nn_global_avgpool_create: out is NULL");
  *out = sbn_nn_module_new(SBN_MODULE_KIND_ADAPTIVE_AVGPOOL2D, &avgpool_ops, NULL);
  return *out ? SBN_STATUS_OK
              : sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "sbn_nn_global_avgpool_create: out of memory");
}
