/* ReLU: y = x < 0 ? 0 : x, as PyTorch: NaN and -0.0 pass through unchanged.
 * Backward zeroes dy where y <= 0 (PyTorch's threshold_backward on the
 * result), so the gradient passes where y is NaN. */
#include "module.h"

static sbn_status relu_forward(sbn_module *m, sbn_tensor *y, const sbn_tensor *x) {
  const int64_t n = sbn_tensor_numel(x);
  float *out = sbn_nn_buf_reserve(&m->out, n, "ReLU.forward");
  if (!out) return SBN_STATUS_OUT_OF_MEMORY;
  const float *in = x->data;
  for (int64_t i = 0; i < n; i++) out[i] = in[i] < 0 ? 0.0f : in[i];
  *y = sbn_nn_view(out, x->ndim, x->shape);
  return SBN_STATUS_OK;
}

static sbn_status relu_backward(sbn_module *m, sbn_tensor *dx, const sbn_tensor *dy) {
  const int64_t n = sbn_tensor_numel(dy);
  float *g = sbn_nn_buf_reserve(&m->dx, n, "ReLU.backward");
  if (!g) return SBN_STATUS_OUT_OF_MEMORY;
  const float *d = dy->data, *y = m->y.data;
  for (int64_t i = 0; i < n; i++) g[i] = y[i] <= 0 ? 0.0f : d[i];
  *dx = sbn_nn_view(g, m->x.ndim, m->x.shape);
  return SBN_STATUS_OK;
}

static const sbn_module_ops relu_ops = {relu_forward, relu_backward, NULL, NULL};

sbn_status sbn_nn_relu_create(sbn_module **out) {
  sbn_clear_error();
  if (!out) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_nn_relu_create: out is NULL");
  *out = sbn_nn_module_new(SBN_MODULE_KIND_RELU, &relu_ops, NULL);
  return *out ? SBN_STATUS_OK : sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "sbn_nn_relu_create: out of memory");
}
