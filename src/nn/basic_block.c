/* torchvision's BasicBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + identity),
 * identity = downsample(x) (conv1x1 stride + BatchNorm2d) when the shape
 * changes. Children are named as in torchvision (conv1, bn1, conv2, bn2,
 * downsample.0, downsample.1) so state-dict keys match; the parameter-free
 * relu is applied inline with ReLU's rules (NaN passes forward, and the
 * gradient passes where the relu's output is not <= 0). */
#include <stdlib.h>
#include <string.h>

#include "module.h"

typedef struct block {
  sbn_module *conv1, *bn1, *conv2, *bn2, *down; /* down may be NULL */
  sbn_nn_buf relu1, dtmp, dsum;
} block;

/* Children may be replaced by convert/revert: look them up by position. */
static void block_children(sbn_module *m, block *b) {
  b->conv1 = m->child[0], b->bn1 = m->child[1], b->conv2 = m->child[2], b->bn2 = m->child[3];
  b->down = m->nchild > 4 ? m->child[4] : NULL;
}

static sbn_status block_forward(sbn_module *m, sbn_tensor *y, const sbn_tensor *x) {
  block *b = m->impl;
  block_children(m, b);
  sbn_tensor t, u, id = *x;
  sbn_status st = sbn_nn_forward(b->conv1, &t, x);
  if (st == SBN_STATUS_OK) st = sbn_nn_forward(b->bn1, &u, &t);
  if (st != SBN_STATUS_OK) return st;
  const int64_t n1 = sbn_tensor_numel(&u);
  float *r = sbn_nn_buf_reserve(&b->relu1, n1, "BasicBlock.forward");
  if (!r) return SBN_STATUS_OUT_OF_MEMORY;
  const float *ud = u.data;
  for (int64_t i = 0; i < n1; i++) r[i] = ud[i] < 0 ? 0.0f : ud[i];
  sbn_tensor a = sbn_nn_view(r, u.ndim, u.shape);
  st = sbn_nn_forward(b->conv2, &t, &a);
  if (st == SBN_STATUS_OK) st = sbn_nn_forward(b->bn2, &u, &t);
  if (st == SBN_STATUS_OK && b->down) st = sbn_nn_forward(b->down, &id, x);
  if (st != SBN_STATUS_OK) return st;
  int same = id.ndim == u.ndim;
  for (int i = 0; same && i < u.ndim; i++) same = id.shape[i] == u.shape[i];
  if (!same) {
    char s1[96], s2[96];
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "BasicBlock.forward: residual %s and main path %s differ (a downsample is needed)",
                    sbn_nn_shape_str(s1, sizeof s1, id.ndim, id.shape), sbn_nn_shape_str(s2, sizeof s2, u.ndim, u.shape));
  }
  const int64_t n = sbn_tensor_numel(&u);
  float *out = sbn_nn_buf_reserve(&m->out, n, "BasicBlock.forward");
  if (!out) return SBN_STATUS_OUT_OF_MEMORY;
  const float *p = u.data, *q = id.data;
  for (int64_t i = 0; i < n; i++) {
    float v = p[i] + q[i];
    out[i] = v < 0 ? 0.0f : v;
  }
  *y = sbn_nn_view(out, u.ndim, u.shape);
  return SBN_STATUS_OK;
}

static sbn_status block_backward(sbn_module *m, sbn_tensor *dx, const sbn_tensor *dy) {
  block *b = m->impl;
  block_children(m, b);
  const int64_t n = sbn_tensor_numel(dy);
  float *ds = sbn_nn_buf_reserve(&b->dsum, n, "BasicBlock.backward");
  if (!ds) return SBN_STATUS_OUT_OF_MEMORY;
  const float *d = dy->data, *out = m->y.data;
  for (int64_t i = 0; i < n; i++) ds[i] = out[i] <= 0 ? 0.0f : d[i];
  sbn_tensor dsum = sbn_nn_view(ds, dy->ndim, dy->shape), t, u, did = dsum;
  sbn_status st = sbn_nn_backward(b->bn2, &t, &dsum);
  if (st == SBN_STATUS_OK) st = sbn_nn_backward(b->conv2, &u, &t);
  if (st != SBN_STATUS_OK) return st;
  const int64_t n1 = sbn_tensor_numel(&u);
  float *g = sbn_nn_buf_reserve(&b->dtmp, n1, "BasicBlock.backward");
  if (!g) return SBN_STATUS_OUT_OF_MEMORY;
  const float *ud = u.data, *r = b->relu1.p;
  for (int64_t i = 0; i < n1; i++) g[i] = r[i] <= 0 ? 0.0f : ud[i];
  sbn_tensor dr = sbn_nn_view(g, u.ndim, u.shape);
  st = sbn_nn_backward(b->bn1, &t, &dr);
  if (st == SBN_STATUS_OK) st = sbn_nn_backward(b->conv1, &u, &t);
  if (st == SBN_STATUS_OK && b->down) st = sbn_nn_backward(b->down, &did, &dsum);
  if (st != SBN_STATUS_OK) return st;
  const int64_t nx = sbn_tensor_numel(&m->x);
  float *gx = sbn_nn_buf_reserve(&m->dx, nx, "BasicBlock.backward");
  if (!gx) return SBN_STATUS_OUT_OF_MEMORY;
  const float *p = u.data, *q = did.data;
  for (int64_t i = 0; i < nx; i++) gx[i] = p[i] + q[i];
  *dx = sbn_nn_view(gx, m->x.ndim, m->x.shape);
  return SBN_STATUS_OK;
}

static void block_destroy(sbn_module *m) {
  block *b = m->impl;
  if (b) free(b->relu1.p), free(b->dtmp.p), free(b->dsum.p), free(b);
}

static const sbn_module_ops block_ops = {block_forward, block_backward, block_destroy, NULL};

sbn_status sbn_nn_basic_block_create(sbn_module **out, int64_t inplanes, int64_t planes, int stride, uint64_t seed) {
  static const char call[] = "sbn_nn_basic_block_create";
  sbn_clear_error();
  if (!out) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: out is NULL", call);
  *out = NULL;
  if (inplanes <= 0 || planes <= 0 || stride <= 0)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: inplanes %lld, planes %lld, stride %d must be > 0", call,
                    (long long)inplanes, (long long)planes, stride);
  block *b = calloc(1, sizeof *b);
  sbn_module *m = b ? sbn_nn_module_new(SBN_MODULE_KIND_BASIC_BLOCK, &block_ops, b) : NULL;
  if (!m) {
    free(b);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
  }
  sbn_bn_options o = sbn_bn_options_default(planes);
  sbn_module *c;
  sbn_status st = sbn_nn_conv2d_create(&c, inplanes, planes, 3, stride, 1, 0, seed);
  if (st == SBN_STATUS_OK && (st = sbn_nn_add_child(m, "conv1", c, call)) != SBN_STATUS_OK) sbn_nn_module_free(c);
  if (st == SBN_STATUS_OK && (st = sbn_nn_batchnorm_create(&c, 2, &o)) == SBN_STATUS_OK &&
      (st = sbn_nn_add_child(m, "bn1", c, call)) != SBN_STATUS_OK)
    sbn_nn_module_free(c);
  if (st == SBN_STATUS_OK && (st = sbn_nn_conv2d_create(&c, planes, planes, 3, 1, 1, 0, seed + 1)) == SBN_STATUS_OK &&
      (st = sbn_nn_add_child(m, "conv2", c, call)) != SBN_STATUS_OK)
    sbn_nn_module_free(c);
  if (st == SBN_STATUS_OK && (st = sbn_nn_batchnorm_create(&c, 2, &o)) == SBN_STATUS_OK &&
      (st = sbn_nn_add_child(m, "bn2", c, call)) != SBN_STATUS_OK)
    sbn_nn_module_free(c);
  if (st == SBN_STATUS_OK && (stride != 1 || inplanes != planes)) {
    sbn_module *seq = NULL, *dc = NULL, *dbn = NULL;
    st = sbn_nn_sequential_create(&seq);
    if (st == SBN_STATUS_OK) st = sbn_nn_conv2d_create(&dc, inplanes, planes, 1, stride, 0, 0, seed + 2);
    if (st == SBN_STATUS_OK) st = sbn_nn_sequential_append(seq, NULL, dc);
    if (st != SBN_STATUS_OK) sbn_nn_module_free(dc);
    if (st == SBN_STATUS_OK) st = sbn_nn_batchnorm_create(&dbn, 2, &o);
    if (st == SBN_STATUS_OK) st = sbn_nn_sequential_append(seq, NULL, dbn);
    if (st != SBN_STATUS_OK) sbn_nn_module_free(dbn);
    if (st == SBN_STATUS_OK) st = sbn_nn_add_child(m, "downsample", seq, call);
    if (st != SBN_STATUS_OK) sbn_nn_module_free(seq);
  }
  if (st != SBN_STATUS_OK) {
    sbn_nn_module_free(m);
    return st;
  }
  *out = m;
  return SBN_STATUS_OK;
}
