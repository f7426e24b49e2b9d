/* Flatten(start_dim = 1): (N, d1, ..., dk) -> (N, d1*...*dk). No copy: the
 * output is a view of the input and dx a view of dy. */
#include "module.h"

static sbn_status flatten_forward(sbn_module *m, sbn_tensor *y, const sbn_tensor *x) {
  (void)m;
  if (x->ndim < 2) {
    char s[96];
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "Flatten.forward: expected at least 2D input, got %s",
                    sbn_nn_shape_str(s, sizeof s, x->ndim, x->shape));
  }
  int64_t shape[2] = {x->shape[0], 1};
  for (int i = 1; i < x->ndim; i++) shape[1] *= x->shape[i];
  *y = sbn_nn_view(x->data, 2, shape);
  return SBN_STATUS_OK;
}

static sbn_status flatten_backward(sbn_module *m, sbn_tensor *dx, const sbn_tensor *dy) {
  *dx = sbn_nn_view(dy->data, m->x.ndim, m->x.shape);
  return SBN_STATUS_OK;
}

static const sbn_module_ops flatten_ops = {flatten_forward, flatten_backward, NULL, NULL};

sbn_status sbn_nn_flatten_create(sbn_module **out) {
  sbn_clear_error();
  if (!out) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_nn_flatten_create: out is NULL");
  *out = sbn_nn_module_new(SBN_MODULE_KIND_FLATTEN, &flatten_ops, NULL);
  return *out ? SBN_STATUS_OK : sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "sbn_nn_flatten_create: out of memory");
}
