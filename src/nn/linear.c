/* Linear: y = x W^T + b over the last dimension, with OpenBLAS sgemm. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "module.h"

typedef struct linear {
  int64_t in, out;
  float *w, *b, *gw, *gb;
} linear;

static sbn_status linear_forward(sbn_module *m, sbn_tensor *y, const sbn_tensor *x) {
  linear *L = m->impl;
  if (x->shape[x->ndim - 1] != L->in) {
    char s[96];
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "Linear.forward: input shape %s: last dimension must be in_features = %lld",
                    sbn_nn_shape_str(s, sizeof s, x->ndim, x->shape), (long long)L->in);
  }
  const int64_t rows = sbn_tensor_numel(x) / (L->in ? L->in : 1);
  if (rows > INT32_MAX) { /* the BLAS interface counts rows in int */
    char s[96];
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "Linear.forward: input shape %s has %lld rows (at most %d)",
                    sbn_nn_shape_str(s, sizeof s, x->ndim, x->shape), (long long)rows, INT32_MAX);
  }
  float *out = sbn_nn_buf_reserve(&m->out, rows * L->out, "Linear.forward");
  if (!out) return SBN_STATUS_OUT_OF_MEMORY;
  if (rows > 0 && L->in > 0)
    sbn_nn_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)L->out, (int)L->in, 1.0f, x->data,
                (int)L->in, L->w, (int)L->in, 0.0f, out, (int)L->out);
  else
    memset(out, 0, sizeof(float) * (size_t)(rows * L->out));
  if (L->b)
    for (int64_t r = 0; r < rows; r++)
      for (int64_t j = 0; j < L->out; j++) out[r * L->out + j] += L->b[j];
  int64_t shape[SBN_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  shape[x->ndim - 1] = L->out;
  *y = sbn_nn_view(out, x->ndim, shape);
  return SBN_STATUS_OK;
}

static sbn_status linear_backward(sbn_module *m, sbn_tensor *dx, const sbn_tensor *dy) {
  linear *L = m->impl;
  const int64_t rows = sbn_tensor_numel(dy) / (L->out ? L->out : 1);
  float *g = sbn_nn_buf_reserve(&m->dx, rows * L->in, "Linear.backward");
  if (!g) return SBN_STATUS_OUT_OF_MEMORY;
  const float *d = dy->data, *x = m->x.data;
  if (rows > 0 && L->in > 0 && L->out > 0)
    sbn_nn_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)L->in, (int)L->out, 1.0f, d,
                (int)L->out, L->w, (int)L->in, 0.0f, g, (int)L->in);
  else
    memset(g, 0, sizeof(float) * (size_t)(rows * L->in));
  if (m->local[0].requires_grad && rows > 0)
    sbn_nn_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)L->out, (int)L->in, (int)rows, 1.0f, d,
                (int)L->out, x, (int)L->in, 1.0f, L->gw, (int)L->in);
  if (L->b && m->local[1].requires_grad)
    for (int64_t j = 0; j < L->out; j++) {
      double s = 0;
      for (int64_t r = 0; r < rows; r++) s += d[r * L->out + j];
      L->gb[j] += (float)s;
    }
  *dx = sbn_nn_view(g, m->x.ndim, m->x.shape);
  return SBN_STATUS_OK;
}

static void linear_destroy(sbn_module *m) {
  linear *L = m->impl;
  if (!L) return;
  free(L->w), free(L->b), free(L->gw), free(L->gb), free(L);
}

static const sbn_module_ops linear_ops = {linear_forward, linear_backward, linear_destroy, NULL};

sbn_status sbn_nn_linear_create(sbn_module **out, int64_t in_features, int64_t out_features, int bias,
                                uint64_t seed) {
  static const char call[] = "sbn_nn_linear_create";
  sbn_clear_error();
  if (!out) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: out is NULL", call);
  *out = NULL;
  if (in_features <= 0 || out_features <= 0 || in_features > INT32_MAX / 2 || out_features > INT32_MAX / 2)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: features must be in [1, 2^30), got in %lld out %lld",
                    call, (long long)in_features, (long long)out_features);
  linear *L = calloc(1, sizeof *L);
  sbn_module *m = L ? sbn_nn_module_new(SBN_MODULE_KIND_LINEAR, &linear_ops, L) : NULL;
  if (!m) {
    free(L);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
  }
  L->in = in_features, L->out = out_features;
  size_t nw = (size_t)(in_features * out_features);
  L->w = calloc(nw, sizeof(float)), L->gw = calloc(nw, sizeof(float));
  int ok = L->w && L->gw;
  if (bias) {
    L->b = calloc((size_t)out_features, sizeof(float)), L->gb = calloc((size_t)out_features, sizeof(float));
    ok = ok && L->b && L->gb;
  }
  if (!ok) {
    sbn_nn_module_free(m);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory for the weights", call);
  }
  /* PyTorch: kaiming_uniform(a=sqrt(5)) = U(+-1/sqrt(fan_in)); bias the same bound. */
  const double bound = 1.0 / sqrt((double)in_features);
  sbn_nn_init_uniform(L->w, (int64_t)nw, bound, seed);
  int64_t ws[2] = {out_features, in_features};
  sbn_nn_add_local(m, "weight", SBN_NN_ENTRY_KIND_PARAMETER, SBN_DTYPE_FLOAT32, 2, ws, L->w, L->gw);
  if (bias) {
    sbn_nn_init_uniform(L->b, out_features, bound, seed ^ 0xB1A5ull);
    sbn_nn_add_local(m, "bias", SBN_NN_ENTRY_KIND_PARAMETER, SBN_DTYPE_FLOAT32, 1, &out_features, L->b, L->gb);
  }
  *out = m;
  return SBN_STATUS_OK;
}
