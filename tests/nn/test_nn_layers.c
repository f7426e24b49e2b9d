/* Finite-difference gradient checks of every layer of the module layer, the
 * cross-entropy loss and the whole reference network; PyTorch's input
 * checks; requires_grad; the SGD update rule against a float64 replay;
 * inputs that lie in the module's own buffers (its output fed back in, a
 * gradient it returned passed as dy or as the next input) give the same
 * bits as copies of those inputs.
 *
 * Method: L = sum_i r_i y_i (r random, double accumulation) or the
 * cross-entropy of the output. For a sample of elements v of x and of every
 * parameter, the central difference (L(v+h) - L(v-h)) / (v+h - v-h) is
 * compared with the analytic gradient from backward (dy = r). The
 * perturbed values are float32 and the denominator is the exact difference
 * of the stored values, so the only noise is the float32 rounding of the
 * outputs that change: about sqrt(#outputs) * 6e-8 * |y| / 2h < 1e-4 of
 * the gradient scale for h = 1e-2 and these sizes. Truncation error is 0
 * for the linear layers and O(h^2) ~ 1e-4 relative for batch norm (whose
 * third derivative is O(1) at unit variance). Tolerance: 2e-3 of the
 * tensor's largest analytic gradient. Kinks (ReLU at 0, max-pool switches)
 * are avoided by construction in the single-layer checks (inputs kept
 * away from 0, distinct pool values 0.05 apart); in composite checks an
 * element whose difference quotients at h and h/2 disagree crossed a kink
 * and is skipped (at most 25% may be); these use h = 1e-3 (fewer kinks
 * crossed; the block's gradient scale ~10 keeps the noise near 1e-4).
 * The whole network is not checked by FD: through 12 float32 layers the
 * difference quotients are dominated by rounding noise; its forward and
 * backward are instead matched against PyTorch (tests/nn/torch_peer.py). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn_testutil.h"

static sbn_tensor view_of(float *p, int ndim, const int64_t *shape) {
  return sbn_tensor_cpu(p, ndim, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
}

#define FD_TOL 2e-3
#define FD_SAMPLES 16

typedef struct fd_ctx {
  sbn_module *m;
  float *x;
  int ndim;
  int64_t shape[SBN_MAX_DIMS];
  double *r;          /* weights of the weighted sum (numel of y) */
  const int64_t *tgt; /* or: cross-entropy targets */
  double divisor;
} fd_ctx;

static int eval_L(fd_ctx *c, double *L) {
  sbn_tensor x = sbn_tensor_cpu(c->x, c->ndim, c->shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), y;
  if (sbn_module_forward(c->m, &y, &x) != SBN_STATUS_OK) return 1;
  if (c->tgt) return sbn_nn_cross_entropy_forward(L, &y, c->tgt, c->divisor) != SBN_STATUS_OK;
  const float *yd = y.data;
  double s = 0;
  for (int64_t i = 0; i < sbn_tensor_numel(&y); i++) s += c->r[i] * yd[i];
  *L = s;
  return 0;
}

static double fd_at(fd_ctx *c, float *p, double h, int *err) {
  float v = *p, vp = (float)(v + h), vm = (float)(v - h);
  double Lp, Lm;
  *p = vp;
  *err |= eval_L(c, &Lp);
  *p = vm;
  *err |= eval_L(c, &Lm);
  *p = v;
  return (Lp - Lm) / ((double)vp - (double)vm);
}

/* Check the analytic gradient g of tensor p (n values) by FD. */
static int fd_tensor(fd_ctx *c, const char *layer, const char *tname, float *p, const float *g, int64_t n,
                     int robust, rng *r, double *worst) {
  double scale = 1e-3;
  for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(g[i]));
  int checks = n < FD_SAMPLES ? (int)n : FD_SAMPLES, skipped = 0, err = 0;
  double maxe = 0;
  for (int k = 0; k < checks; k++) {
    int64_t i = n <= FD_SAMPLES ? k : (int64_t)(rng_u64(r) % (uint64_t)n);
    const double h = robust ? 1e-3 : 1e-2;
    double fd = fd_at(c, &p[i], h, &err);
    if (robust) {
      double fd2 = fd_at(c, &p[i], h / 2, &err);
      if (fabs(fd - fd2) > 2e-3 * scale) {
        skipped++;
        continue;
      }
    }
    maxe = fmax(maxe, fabs(fd - g[i]));
  }
  double rel = maxe / scale;
  int bad = err || rel > FD_TOL || skipped * 4 > checks;
  printf("  %-28s %-22s checked %2d skipped %d  max |fd - grad| %.2e  scale %.2e  rel %.1e (tol %.0e) %s\n", layer,
         tname, checks - skipped, skipped, maxe, scale, rel, FD_TOL, bad ? "FAIL" : "ok");
  if (rel > *worst) *worst = rel;
  return bad;
}

/* Gradient check of module m at input x (shape): dx and every parameter. */
static int fd_module(const char *name, sbn_module *m, float *x, int ndim, const int64_t *shape,
                     const int64_t *tgt, double divisor, int robust, rng *r, double *worst) {
  fd_ctx c = {m, x, ndim, {0}, NULL, tgt, divisor};
  memcpy(c.shape, shape, sizeof(int64_t) * (size_t)ndim);
  sbn_tensor xt = sbn_tensor_cpu(x, ndim, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), y, dx;
  CHECK_OK(sbn_module_zero_grad(m));
  CHECK_OK(sbn_module_forward(m, &y, &xt));
  int64_t ny = sbn_tensor_numel(&y);
  float *dy = malloc(sizeof(float) * (size_t)ny);
  c.r = malloc(sizeof(double) * (size_t)ny);
  if (tgt) {
    sbn_tensor dyt = sbn_tensor_cpu(dy, y.ndim, y.shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    CHECK_OK(sbn_nn_cross_entropy_backward(&dyt, &y, tgt, divisor));
  } else {
    for (int64_t i = 0; i < ny; i++) dy[i] = (float)rng_normal(r), c.r[i] = dy[i];
  }
  sbn_tensor dyt = sbn_tensor_cpu(dy, y.ndim, y.shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  CHECK_OK(sbn_module_backward(m, &dx, &dyt));
  int64_t nx = sbn_tensor_numel(&xt);
  float *gx = malloc(sizeof(float) * (size_t)nx);
  memcpy(gx, dx.data, sizeof(float) * (size_t)nx);
  sbn_nn_entry *e;
  int n;
  CHECK_OK(sbn_module_entries(&e, &n, m, SBN_NN_PARAMETERS));
  float **gp = calloc((size_t)n + 1, sizeof *gp);
  for (int i = 0; i < n; i++) {
    gp[i] = malloc(sizeof(float) * (size_t)e[i].numel);
    memcpy(gp[i], e[i].grad, sizeof(float) * (size_t)e[i].numel);
  }
  int bad = fd_tensor(&c, name, "input", x, gx, nx, robust, r, worst);
  for (int i = 0; i < n; i++) bad |= fd_tensor(&c, name, e[i].name, e[i].data, gp[i], e[i].numel, robust, r, worst);
  for (int i = 0; i < n; i++) free(gp[i]);
  free(gp), free(e), free(gx), free(dy), free(c.r);
  return bad;
}

static float *rand_input(rng *r, int64_t n, double away_from_zero) {
  float *x = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    double v = rng_normal(r);
    if (away_from_zero > 0) v = (v < 0 ? -1 : 1) * (away_from_zero + fabs(v));
    x[i] = (float)v;
  }
  return x;
}

static int layer_checks(rng *r, double *worst) {
  int bad = 0;
  sbn_module *m;
  {
    int64_t s[2] = {3, 5};
    float *x = rand_input(r, 15, 0);
    CHECK_OK(sbn_nn_linear_create(&m, 5, 4, 1, 11));
    bad |= fd_module("Linear(5,4) x(3,5)", m, x, 2, s, NULL, 0, 0, r, worst);
    int64_t s3[3] = {2, 3, 5};
    float *x3 = rand_input(r, 30, 0);
    bad |= fd_module("Linear(5,4) x(2,3,5)", m, x3, 3, s3, NULL, 0, 0, r, worst);
    sbn_module_destroy(m), free(x), free(x3);
    CHECK_OK(sbn_nn_linear_create(&m, 5, 4, 0, 12));
    float *x2 = rand_input(r, 15, 0);
    bad |= fd_module("Linear(5,4,bias=False)", m, x2, 2, s, NULL, 0, 0, r, worst);
    sbn_module_destroy(m), free(x2);
  }
  {
    int64_t s[4] = {2, 3, 7, 6};
    float *x = rand_input(r, 2 * 3 * 7 * 6, 0);
    CHECK_OK(sbn_nn_conv2d_create(&m, 3, 4, 3, 2, 1, 1, 13));
    bad |= fd_module("Conv2d(3,4,k3,s2,p1)", m, x, 4, s, NULL, 0, 0, r, worst);
    sbn_module_destroy(m);
    CHECK_OK(sbn_nn_conv2d_create(&m, 3, 5, 1, 1, 0, 0, 14));
    bad |= fd_module("Conv2d(3,5,k1,no bias)", m, x, 4, s, NULL, 0, 0, r, worst);
    sbn_module_destroy(m);
    CHECK_OK(sbn_nn_conv2d_create(&m, 3, 2, 5, 3, 2, 1, 15));
    bad |= fd_module("Conv2d(3,2,k5,s3,p2)", m, x, 4, s, NULL, 0, 0, r, worst);
    sbn_module_destroy(m), free(x);
  }
  {
    int64_t s[3] = {2, 3, 4};
    float *x = rand_input(r, 24, 0.05);
    CHECK_OK(sbn_nn_relu_create(&m));
    bad |= fd_module("ReLU", m, x, 3, s, NULL, 0, 0, r, worst);
    sbn_module_destroy(m), free(x);
  }
  {
    /* Distinct values 0.05 apart in random order: no max switch within h. */
    int64_t s[4] = {2, 2, 7, 7}, n = 2 * 2 * 7 * 7;
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(0.05 * (double)(i - n / 2));
    for (int64_t i = n - 1; i > 0; i--) {
      int64_t j = (int64_t)(rng_u64(r) % (uint64_t)(i + 1));
      float t = x[i];
      x[i] = x[j], x[j] = t;
    }
    CHECK_OK(sbn_nn_maxpool2d_create(&m, 3, 2, 1));
    bad |= fd_module("MaxPool2d(k3,s2,p1)", m, x, 4, s, NULL, 0, 0, r, worst);
    sbn_module_destroy(m);
    CHECK_OK(sbn_nn_maxpool2d_create(&m, 2, 0, 0));
    bad |= fd_module("MaxPool2d(2)", m, x, 4, s, NULL, 0, 0, r, worst);
    sbn_module_destroy(m), free(x);
  }
  {
    int64_t s[4] = {2, 3, 4, 5};
    float *x = rand_input(r, 120, 0);
    CHECK_OK(sbn_nn_global_avgpool_create(&m));
    bad |= fd_module("AdaptiveAvgPool2d(1)", m, x, 4, s, NULL, 0, 0, r, worst);
    sbn_module_destroy(m);
    CHECK_OK(sbn_nn_flatten_create(&m));
    bad |= fd_module("Flatten", m, x, 4, s, NULL, 0, 0, r, worst);
    sbn_module_destroy(m), free(x);
  }
  {
    static const struct { int dims, ndim; int64_t s[5]; const char *name; } bns[] = {
        {1, 2, {6, 4}, "BatchNorm1d x(6,4)"},       {1, 3, {3, 4, 5}, "BatchNorm1d x(3,4,5)"},
        {2, 4, {3, 4, 3, 3}, "BatchNorm2d x(3,4,3,3)"}, {3, 5, {2, 3, 2, 3, 2}, "BatchNorm3d x(2,3,2,3,2)"}};
    for (int k = 0; k < 4; k++) {
      sbn_bn_options o = sbn_bn_options_default(bns[k].s[1]);
      CHECK_OK(sbn_nn_batchnorm_create(&m, bns[k].dims, &o));
      nn_randomize(m, r);
      int64_t n = 1;
      for (int i = 0; i < bns[k].ndim; i++) n *= bns[k].s[i];
      float *x = rand_input(r, n, 0);
      bad |= fd_module(bns[k].name, m, x, bns[k].ndim, bns[k].s, NULL, 0, 0, r, worst);
      CHECK_OK(sbn_module_train(m, 0));
      char nm[64];
      snprintf(nm, sizeof nm, "%s eval", bns[k].name);
      bad |= fd_module(nm, m, x, bns[k].ndim, bns[k].s, NULL, 0, 0, r, worst);
      sbn_module_destroy(m), free(x);
    }
    sbn_bn_options o = sbn_bn_options_default(4);
    CHECK_OK(sbn_nn_sync_batchnorm_create(&m, &o, NULL));
    nn_randomize(m, r);
    int64_t s[3] = {3, 4, 5};
    float *x = rand_input(r, 60, 0);
    bad |= fd_module("SyncBatchNorm(group NULL)", m, x, 3, s, NULL, 0, 0, r, worst);
    sbn_module_destroy(m), free(x);
  }
  {
    int64_t s[4] = {3, 4, 6, 6};
    float *x = rand_input(r, 3 * 4 * 36, 0);
    CHECK_OK(sbn_nn_basic_block_create(&m, 4, 4, 1, 21));
    nn_randomize(m, r);
    bad |= fd_module("BasicBlock(4,4)", m, x, 4, s, NULL, 0, 1, r, worst);
    sbn_module_destroy(m);
    CHECK_OK(sbn_nn_basic_block_create(&m, 4, 6, 2, 22));
    nn_randomize(m, r);
    bad |= fd_module("BasicBlock(4,6,s2)+downsample", m, x, 4, s, NULL, 0, 1, r, worst);
    sbn_module_destroy(m), free(x);
  }
  return bad;
}

static int loss_checks(rng *r) {
  /* Cross-entropy against a direct float64 formula, and its gradient by FD
   * on a Flatten (identity) module. */
  int64_t s[2] = {5, 7}, tgt[5];
  float z[35];
  for (int i = 0; i < 35; i++) z[i] = (float)(2 * rng_normal(r));
  for (int i = 0; i < 5; i++) tgt[i] = rng_int(r, 0, 6);
  sbn_tensor zt = sbn_tensor_cpu(z, 2, s, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  double loss, loss10, ref = 0;
  CHECK_OK(sbn_nn_cross_entropy_forward(&loss, &zt, tgt, 0));
  CHECK_OK(sbn_nn_cross_entropy_forward(&loss10, &zt, tgt, 10));
  for (int i = 0; i < 5; i++) {
    double se = 0;
    for (int k = 0; k < 7; k++) se += exp((double)z[i * 7 + k]);
    ref += log(se) - z[i * 7 + tgt[i]];
  }
  int bad = check("cross-entropy mean vs float64 formula", fabs(loss - ref / 5), 1e-12 * fabs(ref));
  bad |= check("cross-entropy divisor=10 vs float64 formula", fabs(loss10 - ref / 10), 1e-12 * fabs(ref));
  int64_t badt[5] = {0, 1, 7, 0, 0};
  sbn_status st = sbn_nn_cross_entropy_forward(&loss, &zt, badt, 0);
  printf("  target out of range -> %s: %s\n", sbn_status_name(st), sbn_last_error());
  bad |= st != SBN_STATUS_INVALID_ARGUMENT;
  sbn_module *fl;
  CHECK_OK(sbn_nn_flatten_create(&fl));
  double worst = 0;
  bad |= fd_module("cross-entropy (logits)", fl, z, 2, s, tgt, 0, 0, r, &worst);
  sbn_module_destroy(fl);
  return bad;
}

static int expect(sbn_status got, sbn_status want, const char *what) {
  printf("  %-50s -> %s: %s\n", what, sbn_status_name(got), sbn_last_error());
  if (got != want) {
    printf("  FAIL: expected %s\n", sbn_status_name(want));
    return 1;
  }
  return 0;
}

static int input_checks(void) {
  int bad = 0;
  sbn_module *m;
  float buf[2 * 3 * 4 * 5 * 2] = {0};
  for (int i = 0; i < 240; i++) buf[i] = (float)(i % 7) - 3;
  int64_t s2[2] = {4, 3}, s3[3] = {2, 3, 4}, s4[4] = {2, 3, 4, 5}, s5[5] = {2, 3, 2, 2, 2};
  sbn_tensor x2 = sbn_tensor_cpu(buf, 2, s2, SBN_DTYPE_FLOAT32, 0), x3 = sbn_tensor_cpu(buf, 3, s3, SBN_DTYPE_FLOAT32, 0);
  sbn_tensor x4 = sbn_tensor_cpu(buf, 4, s4, SBN_DTYPE_FLOAT32, 0), x5 = sbn_tensor_cpu(buf, 5, s5, SBN_DTYPE_FLOAT32, 0);
  sbn_tensor y, dx;
  sbn_bn_options o = sbn_bn_options_default(3);
  CHECK_OK(sbn_nn_batchnorm_create(&m, 1, &o));
  bad |= expect(sbn_module_forward(m, &y, &x4), SBN_STATUS_INVALID_ARGUMENT, "BatchNorm1d on 4D");
  bad |= expect(sbn_module_forward(m, &y, &x2), SBN_STATUS_OK, "BatchNorm1d on 2D");
  bad |= expect(sbn_module_forward(m, &y, &x3), SBN_STATUS_OK, "BatchNorm1d on 3D");
  sbn_module_destroy(m);
  CHECK_OK(sbn_nn_batchnorm_create(&m, 2, &o));
  bad |= expect(sbn_module_backward(m, &dx, &x4), SBN_STATUS_BAD_STATE, "BatchNorm2d backward before forward");
  bad |= expect(sbn_module_forward(m, &y, &x3), SBN_STATUS_INVALID_ARGUMENT, "BatchNorm2d on 3D");
  bad |= expect(sbn_module_forward(m, &y, &x4), SBN_STATUS_OK, "BatchNorm2d on 4D");
  bad |= expect(sbn_module_backward(m, &dx, &x3), SBN_STATUS_INVALID_ARGUMENT, "BatchNorm2d backward, dy of wrong shape");
  sbn_module_destroy(m);
  CHECK_OK(sbn_nn_batchnorm_create(&m, 3, &o));
  bad |= expect(sbn_module_forward(m, &y, &x4), SBN_STATUS_INVALID_ARGUMENT, "BatchNorm3d on 4D");
  bad |= expect(sbn_module_forward(m, &y, &x5), SBN_STATUS_OK, "BatchNorm3d on 5D");
  sbn_module_destroy(m);
  CHECK_OK(sbn_nn_sync_batchnorm_create(&m, &o, NULL));
  bad |= expect(sbn_module_forward(m, &y, &x5), SBN_STATUS_OK, "SyncBatchNorm on 5D");
  int64_t s1[1] = {3};
  sbn_tensor x1 = sbn_tensor_cpu(buf, 1, s1, SBN_DTYPE_FLOAT32, 0);
  bad |= expect(sbn_module_forward(m, &y, &x1), SBN_STATUS_INVALID_ARGUMENT, "SyncBatchNorm on 1D");
  sbn_module_destroy(m);
  bad |= expect(sbn_nn_batchnorm_create(&m, 4, &o), SBN_STATUS_INVALID_ARGUMENT, "BatchNorm4d");
  CHECK_OK(sbn_nn_linear_create(&m, 4, 2, 1, 1));
  bad |= expect(sbn_module_forward(m, &y, &x2), SBN_STATUS_INVALID_ARGUMENT, "Linear(4,2) on (4,3)");
  sbn_module_destroy(m);
  CHECK_OK(sbn_nn_conv2d_create(&m, 4, 2, 3, 1, 0, 1, 1));
  bad |= expect(sbn_module_forward(m, &y, &x4), SBN_STATUS_INVALID_ARGUMENT, "Conv2d(4,..) on 3 channels");
  sbn_module_destroy(m);
  CHECK_OK(sbn_nn_conv2d_create(&m, 3, 2, 7, 1, 0, 1, 1));
  bad |= expect(sbn_module_forward(m, &y, &x4), SBN_STATUS_INVALID_ARGUMENT, "Conv2d k7 on 4x5");
  sbn_module_destroy(m);
  sbn_module *seq, *c;
  CHECK_OK(sbn_nn_sequential_create(&seq));
  CHECK_OK(sbn_nn_relu_create(&c));
  CHECK_OK(sbn_nn_sequential_append(seq, "act", c));
  bad |= expect(sbn_nn_sequential_append(seq, NULL, c), SBN_STATUS_BAD_STATE, "append a module that has a parent");
  bad |= expect(sbn_module_destroy(c), SBN_STATUS_BAD_STATE, "destroy a child");
  bad |= expect(sbn_nn_sequential_append(seq, NULL, seq), SBN_STATUS_INVALID_ARGUMENT, "append a container into itself");
  sbn_module_destroy(seq);
  return bad;
}

/* A 2-D tensor lies the same in both layouts and the module layer takes it
 * tagged either way: a BatchNorm1d then gives the bits of the channels-first
 * call (its core layer refused a channels-last x, naming an internal y, and
 * a channels-last dy after a channels-first x). */
static int layout_2d_checks(void) {
  int bad = 0;
  float xv[4 * 3], dyv[4 * 3], yv[2][4 * 3], dxv[2][4 * 3];
  for (int i = 0; i < 12; i++) xv[i] = (float)(i % 5) - 1.5f, dyv[i] = (float)((i * 7) % 3) - 1;
  const int64_t s2[2] = {4, 3};
  sbn_bn_options o = sbn_bn_options_default(3);
  for (int tag = 0; tag < 2; tag++) {
    sbn_module *m;
    CHECK_OK(sbn_nn_batchnorm_create(&m, 1, &o));
    /* tag 1: x channels-last; dy is tried with either tag */
    sbn_tensor x = sbn_tensor_cpu(xv, 2, s2, SBN_DTYPE_FLOAT32, (sbn_layout)tag);
    sbn_tensor dy = sbn_tensor_cpu(dyv, 2, s2, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    sbn_tensor y, dx;
    char what[96];
    snprintf(what, sizeof what, "BatchNorm1d on 2D tagged %s", tag ? "channels-last" : "channels-first");
    sbn_status st = sbn_module_forward(m, &y, &x);
    bad |= expect(st, SBN_STATUS_OK, what);
    if (st == SBN_STATUS_OK) memcpy(yv[tag], y.data, sizeof yv[tag]);
    snprintf(what, sizeof what, "  its backward, dy tagged channels-first");
    st = sbn_module_backward(m, &dx, &dy);
    bad |= expect(st, SBN_STATUS_OK, what);
    if (st == SBN_STATUS_OK) memcpy(dxv[tag], dx.data, sizeof dxv[tag]);
    dy.layout = SBN_LAYOUT_CHANNELS_LAST;
    bad |= expect(sbn_module_backward(m, &dx, &dy), SBN_STATUS_OK, "  its backward, dy tagged channels-last");
    sbn_module_destroy(m);
  }
  const int same = !memcmp(yv[0], yv[1], sizeof yv[0]) && !memcmp(dxv[0], dxv[1], sizeof dxv[0]);
  printf("  2D channels-last tag gives the channels-first bits (y, dx): %s\n", same ? "ok" : "FAIL");
  return bad | !same;
}

/* Modules are float32 on the CPU: other layers are refused before a core
 * layer exists, so a refused SyncBatchNorm takes no ordinal on its group
 * (rank 0's refused float64 module made its next layer #1 against rank 1's
 * #0: SBN_STATUS_MISMATCH). */
static int refused_forward[2];
static int refused_rank(sbn_group *world, void *arg) {
  (void)arg;
  const int rank = sbn_group_rank(world);
  sbn_module *m = NULL;
  sbn_bn_options o = sbn_bn_options_default(2);
  if (rank == 0) {
    sbn_bn_options f64 = o;
    f64.param_dtype = SBN_DTYPE_FLOAT64;
    if (sbn_nn_sync_batchnorm_create(&m, &f64, world) != SBN_STATUS_UNSUPPORTED) return 1;
  }
  CHECK_OK(sbn_nn_sync_batchnorm_create(&m, &o, world));
  float xv[6] = {1, 2, 3, 5, (float)rank, 7};
  const int64_t shape[2] = {3, 2};
  sbn_tensor x = sbn_tensor_cpu(xv, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), y;
  refused_forward[rank] = sbn_module_forward(m, &y, &x);
  if (refused_forward[rank] != SBN_STATUS_OK) printf("  rank %d: %s\n", rank, sbn_last_error());
  sbn_module_destroy(m);
  return 0;
}

static int refused_module_checks(void) {
  int bad = 0;
  sbn_module *m = NULL;
  sbn_bn_options o = sbn_bn_options_default(3);
  o.device.type = SBN_DEVICE_CUDA;
  bad |= expect(sbn_nn_batchnorm_create(&m, 2, &o), SBN_STATUS_UNSUPPORTED, "BatchNorm2d on a CUDA device");
  bad |= expect(sbn_nn_sync_batchnorm_create(&m, &o, NULL), SBN_STATUS_UNSUPPORTED, "SyncBatchNorm on a CUDA device");
  bad |= m != NULL;
  sbn_status st = sbn_team_run(2, refused_rank, NULL);
  bad |= expect(st, SBN_STATUS_OK, "2 ranks: refused float64 module on rank 0, then one layer each");
  bad |= expect(refused_forward[0], SBN_STATUS_OK, "  rank 0's forward (the ranks' layers pair up)");
  bad |= expect(refused_forward[1], SBN_STATUS_OK, "  rank 1's forward");
  return bad;
}

static int requires_grad_checks(rng *r) {
  /* A parameter without requires_grad keeps its gradient (zero) in backward. */
  sbn_module *m;
  if (nn_build_net(&m, 41)) return 1;
  nn_randomize(m, r);
  CHECK_OK(sbn_module_set_requires_grad(m, "0.weight", 0));
  CHECK_OK(sbn_module_set_requires_grad(m, "1.bias", 0));
  CHECK_OK(sbn_module_set_requires_grad(m, "8.bias", 0));
  CHECK_OK(sbn_module_set_requires_grad(m, "4.bn2.weight", 0));
  int bad = sbn_module_set_requires_grad(m, "nope.weight", 0) != SBN_STATUS_INVALID_ARGUMENT;
  int64_t s[4] = {4, 3, 8, 8};
  float *x = rand_input(r, 4 * 192, 0);
  sbn_tensor xt = sbn_tensor_cpu(x, 4, s, SBN_DTYPE_FLOAT32, 0), y, dx;
  CHECK_OK(sbn_module_zero_grad(m));
  CHECK_OK(sbn_module_forward(m, &y, &xt));
  float dy[4 * NET_CLASSES];
  for (int i = 0; i < 4 * NET_CLASSES; i++) dy[i] = (float)rng_normal(r);
  sbn_tensor dyt = sbn_tensor_cpu(dy, 2, y.shape, SBN_DTYPE_FLOAT32, 0);
  CHECK_OK(sbn_module_backward(m, &dx, &dyt));
  sbn_nn_entry *e;
  int n;
  CHECK_OK(sbn_module_entries(&e, &n, m, SBN_NN_PARAMETERS));
  int frozen = 0, moving = 0;
  for (int i = 0; i < n; i++) {
    double a = 0;
    for (int64_t j = 0; j < e[i].numel; j++) a += fabs(e[i].grad[j]);
    if (!e[i].requires_grad) {
      frozen++;
      if (a != 0) printf("  FAIL: %s has requires_grad = 0 but a gradient\n", e[i].name), bad = 1;
    } else if (a > 0) {
      moving++;
    }
  }
  printf("  requires_grad: %d frozen parameters kept zero gradients, %d of %d others have gradients\n", frozen,
         moving, n - frozen);
  bad |= frozen != 4 || moving != n - frozen;
  free(e), free(x);
  sbn_module_destroy(m);
  return bad;
}

static int sgd_checks(rng *r) {
  /* PyTorch's rule replayed in float64 for 3 steps over two settings. */
  static const sbn_nn_sgd_options opts[] = {{0.1, 0.9, 0.0, 1e-2, 1}, {0.05, 0.8, 0.3, 0.0, 0}, {0.2, 0, 0, 0.1, 0}};
  int bad = 0;
  for (int k = 0; k < 3; k++) {
    sbn_module *m;
    CHECK_OK(sbn_nn_linear_create(&m, 3, 2, 1, 5));
    sbn_nn_entry *e;
    int n;
    CHECK_OK(sbn_module_entries(&e, &n, m, SBN_NN_PARAMETERS));
    double p[8], buf[8] = {0};
    int idx = 0;
    for (int i = 0; i < n; i++)
      for (int64_t j = 0; j < e[i].numel; j++) p[idx++] = e[i].data ? ((float *)e[i].data)[j] : 0;
    sbn_nn_sgd *opt;
    CHECK_OK(sbn_nn_sgd_create(&opt, m, &opts[k]));
    double maxe = 0;
    for (int step = 0; step < 3; step++) {
      idx = 0;
      for (int i = 0; i < n; i++)
        for (int64_t j = 0; j < e[i].numel; j++, idx++) {
          e[i].grad[j] = (float)rng_normal(r);
          const sbn_nn_sgd_options *o = &opts[k];
          double d = e[i].grad[j] + o->weight_decay * p[idx];
          if (o->momentum != 0) {
            buf[idx] = step == 0 ? d : o->momentum * buf[idx] + (1 - o->dampening) * d;
            d = o->nesterov ? d + o->momentum * buf[idx] : buf[idx];
          }
          p[idx] -= o->lr * d;
        }
      CHECK_OK(sbn_nn_sgd_step(opt));
      idx = 0;
      for (int i = 0; i < n; i++)
        for (int64_t j = 0; j < e[i].numel; j++) maxe = fmax(maxe, fabs(((float *)e[i].data)[j] - p[idx++]));
    }
    char name[128];
    snprintf(name, sizeof name, "SGD lr %.2g momentum %.2g dampening %.2g wd %.2g nesterov %d vs float64 replay",
             opts[k].lr, opts[k].momentum, opts[k].dampening, opts[k].weight_decay, opts[k].nesterov);
    bad |= check(name, maxe, 1e-6); /* float32 arithmetic on O(1) values, 3 steps */
    sbn_nn_sgd_destroy(opt), free(e), sbn_module_destroy(m);
  }
  sbn_nn_sgd *opt;
  sbn_module *m;
  CHECK_OK(sbn_nn_linear_create(&m, 3, 2, 1, 5));
  sbn_nn_sgd_options o = {0.1, 0, 0, 0, 1};
  bad |= expect(sbn_nn_sgd_create(&opt, m, &o), SBN_STATUS_INVALID_ARGUMENT, "SGD Nesterov without momentum");
  sbn_module_destroy(m);
  return bad;
}

/* ---- inputs in the module's own buffers ---- */

/* A copy of a tensor's values (the reference input), owned by the caller. */
static sbn_tensor copy_tensor(const sbn_tensor *t) {
  const int64_t n = sbn_tensor_numel(t);
  float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
  memcpy(p, t->data, sizeof(float) * (size_t)n);
  return view_of(p, t->ndim, t->shape);
}

static sbn_tensor pattern_like(const sbn_tensor *t, float *buf, float scale) {
  const int64_t n = sbn_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) buf[i] = scale * (float)((i * 7 % 11) - 5) / 5.0f;
  return view_of(buf, t->ndim, t->shape);
}

/* What a sequence of calls leaves: the last output, the last input
 * gradient and the tree's state and gradients. */
typedef struct alias_result {
  sbn_tensor y, dx;
  nn_snapshot state;
} alias_result;

static void alias_result_free(alias_result *r) {
  free(r->y.data), free(r->dx.data);
  nn_snapshot_free(&r->state);
}

static int same_tensor(const char *what, const sbn_tensor *a, const sbn_tensor *b) {
  int same = a->ndim == b->ndim;
  for (int i = 0; same && i < a->ndim; i++) same = a->shape[i] == b->shape[i];
  if (same) same = !memcmp(a->data, b->data, sizeof(float) * (size_t)sbn_tensor_numel(a));
  if (!same) printf("  FAIL: %s differs from the run on copies\n", what);
  return !same;
}

/* Three uses, each run twice from the same state: on copies of the inputs
 * (the reference) and on the module's own views.
 *   own_output: y1 = f(x); y2 = f(y1); dx = f'(dy)
 *   own_dx_as_dy: y = f(x); d1 = f'(dy0); y = f(x); dx = f'(d1)   (y's shape == x's)
 *   own_dx_as_x: y = f(x); d1 = f'(dy0); y2 = f(d1); dx = f'(dy) */
enum { OWN_OUTPUT, OWN_DX_AS_DY, OWN_DX_AS_X };
static const char *const use_names[] = {"its output as the next input", "its input gradient as dy",
                                        "its input gradient as the next input"};

static sbn_status alias_run(sbn_module *m, const nn_snapshot *s0, const sbn_tensor *x, int use, int copies,
                            alias_result *out) {
  nn_snapshot_restore(s0, m);
  sbn_status st = sbn_module_zero_grad(m);
  sbn_tensor y, y2, d1, dx, in;
  float dyb[4096], dyb0[4096];
  if (st == SBN_STATUS_OK) st = sbn_module_forward(m, &y, x);
  if (st != SBN_STATUS_OK) return st;
  sbn_tensor dy0 = pattern_like(&y, dyb0, 1.0f), c = {0};
  if (use == OWN_OUTPUT) {
    in = copies ? (c = copy_tensor(&y)) : y;
    st = sbn_module_forward(m, &y2, &in);
  } else {
    st = sbn_module_backward(m, &d1, &dy0);
    if (st == SBN_STATUS_OK) {
      in = copies ? (c = copy_tensor(&d1)) : d1;
      st = use == OWN_DX_AS_DY ? sbn_module_forward(m, &y2, x) : sbn_module_forward(m, &y2, &in);
    }
  }
  sbn_tensor dy = use == OWN_DX_AS_DY ? in : pattern_like(&y2, dyb, 0.5f);
  if (st == SBN_STATUS_OK) st = sbn_module_backward(m, &dx, &dy);
  if (st == SBN_STATUS_OK) {
    out->y = copy_tensor(&y2), out->dx = copy_tensor(&dx);
    if (nn_snapshot_take(&out->state, m)) st = SBN_STATUS_INTERNAL;
  }
  free(c.data);
  return st;
}

static int alias_case(const char *name, sbn_module *m, const float *xv, int ndim, const int64_t *shape) {
  int bad = 0;
  nn_snapshot s0;
  if (nn_snapshot_take(&s0, m)) return 1;
  sbn_tensor x = view_of((float *)xv, ndim, shape), y;
  CHECK_OK(sbn_module_forward(m, &y, &x));
  const int same_shape = y.ndim == ndim && !memcmp(y.shape, shape, sizeof(int64_t) * (size_t)ndim);
  for (int use = OWN_OUTPUT; use <= OWN_DX_AS_X; use++) {
    if (use == OWN_DX_AS_DY && !same_shape) continue;
    alias_result ref = {0}, own = {0};
    sbn_status st1 = alias_run(m, &s0, &x, use, 1, &ref);
    sbn_status st2 = alias_run(m, &s0, &x, use, 0, &own);
    char why[128] = "";
    int b = st1 != SBN_STATUS_OK || st2 != SBN_STATUS_OK;
    if (b) printf("  FAIL: status %s / %s: %s\n", sbn_status_name(st1), sbn_status_name(st2), sbn_last_error());
    if (!b) b |= same_tensor("the output", &ref.y, &own.y) | same_tensor("dx", &ref.dx, &own.dx);
    if (!b && nn_snapshot_diff(&ref.state, m, 1, why, sizeof why)) {
      printf("  FAIL: state or gradient %s differs from the run on copies\n", why);
      b = 1;
    }
    printf("  %-26s given %-38s: %s\n", name, use_names[use], b ? "FAIL" : "same bits as on copies");
    bad |= b;
    if (!st1) alias_result_free(&ref);
    if (!st2) alias_result_free(&own);
  }
  nn_snapshot_free(&s0);
  return bad;
}

/* dy in the current input-gradient buffer and the saved x in the other
 * one: no buffer is free, so backward refuses before writing anything. */
static int alias_refused(void) {
  sbn_module *m;
  float xv[8] = {1, 2, 3, 4, -1, 0.5f, 2, -3}, dyv[8] = {1, -1, 2, 0.5f, 1, 1, -2, 3};
  int64_t sh[2] = {2, 4};
  sbn_tensor x = view_of(xv, 2, sh), dy = view_of(dyv, 2, sh), y, d1, d2, d3;
  CHECK_OK(sbn_nn_linear_create(&m, 4, 4, 1, 7));
  CHECK_OK(sbn_module_forward(m, &y, &x));
  CHECK_OK(sbn_module_backward(m, &d1, &dy));
  CHECK_OK(sbn_module_forward(m, &y, &d1));  /* x lies in the dx buffer */
  CHECK_OK(sbn_module_backward(m, &d2, &dy)); /* dx moves to the second buffer */
  nn_snapshot s;
  if (nn_snapshot_take(&s, m)) return 1;
  int bad = expect(sbn_module_backward(m, &d3, &d2), SBN_STATUS_INVALID_ARGUMENT,
                   "Linear backward, dy and x in both dx buffers");
  bad |= !strstr(sbn_last_error(), "copy one of them first");
  char why[128];
  if (nn_snapshot_diff(&s, m, 1, why, sizeof why)) printf("  FAIL: %s changed\n", why), bad = 1;
  nn_snapshot_free(&s);
  sbn_module_destroy(m);
  return bad;
}

static int alias_checks(rng *r) {
  int bad = 0;
  sbn_module *m, *a, *b;
  float *x2 = rand_input(r, 6 * 4, 0.1), *x4 = rand_input(r, 2 * 3 * 4 * 4, 0.1);
  int64_t s2[2] = {6, 4}, s4[4] = {2, 3, 4, 4};
  sbn_bn_options o1 = sbn_bn_options_default(4), o3 = sbn_bn_options_default(3);
  CHECK_OK(sbn_nn_linear_create(&m, 4, 4, 1, 11));
  bad |= alias_case("Linear(4, 4)", m, x2, 2, s2);
  sbn_module_destroy(m);
  CHECK_OK(sbn_nn_conv2d_create(&m, 3, 3, 3, 1, 1, 1, 12));
  bad |= alias_case("Conv2d(3, 3, 3, padding 1)", m, x4, 4, s4);
  sbn_module_destroy(m);
  CHECK_OK(sbn_nn_relu_create(&m));
  bad |= alias_case("ReLU", m, x4, 4, s4);
  sbn_module_destroy(m);
  CHECK_OK(sbn_nn_maxpool2d_create(&m, 2, 2, 0));
  bad |= alias_case("MaxPool2d(2)", m, x4, 4, s4);
  sbn_module_destroy(m);
  CHECK_OK(sbn_nn_global_avgpool_create(&m));
  bad |= alias_case("AdaptiveAvgPool2d", m, x4, 4, s4);
  sbn_module_destroy(m);
  CHECK_OK(sbn_nn_batchnorm_create(&m, 1, &o1));
  bad |= alias_case("BatchNorm1d(4)", m, x2, 2, s2);
  sbn_module_destroy(m);
  CHECK_OK(sbn_nn_batchnorm_create(&m, 2, &o3));
  bad |= alias_case("BatchNorm2d(3)", m, x4, 4, s4);
  sbn_module_destroy(m);
  CHECK_OK(sbn_nn_basic_block_create(&m, 3, 3, 1, 13));
  bad |= alias_case("BasicBlock(3, 3)", m, x4, 4, s4);
  sbn_module_destroy(m);
  /* The first child's input is the second child's output buffer. */
  CHECK_OK(sbn_nn_sequential_create(&m));
  CHECK_OK(sbn_nn_linear_create(&a, 4, 4, 1, 14));
  CHECK_OK(sbn_nn_sequential_append(m, NULL, a));
  CHECK_OK(sbn_nn_linear_create(&b, 4, 4, 0, 15));
  CHECK_OK(sbn_nn_sequential_append(m, NULL, b));
  CHECK_OK(sbn_nn_relu_create(&b));
  CHECK_OK(sbn_nn_sequential_append(m, NULL, b));
  CHECK_OK(sbn_nn_flatten_create(&b));
  CHECK_OK(sbn_nn_sequential_append(m, NULL, b));
  bad |= alias_case("Sequential(Linear x2, ReLU, Flatten)", m, x2, 2, s2);
  sbn_module_destroy(m);
  bad |= alias_refused();
  free(x2), free(x4);
  return bad;
}

int main(void) {
  rng r = rng_seed(5005);
  double worst = 0;
  int bad = 0;
  printf("finite-difference gradient checks (tolerance %.0e of the tensor's gradient scale)\n", FD_TOL);
  bad |= layer_checks(&r, &worst);
  printf("cross-entropy\n");
  bad |= loss_checks(&r);
  printf("input checks (PyTorch's dimension rules)\n");
  bad |= input_checks();
  bad |= layout_2d_checks();
  bad |= refused_module_checks();
  printf("requires_grad\n");
  bad |= requires_grad_checks(&r);
  printf("SGD\n");
  bad |= sgd_checks(&r);
  printf("inputs in the module's own buffers\n");
  bad |= alias_checks(&r);
  printf("\nworst FD relative error %.2e (tol %.0e): %s\n", worst, FD_TOL, bad ? "FAILED" : "all ok");
  return bad ? 1 : 0;
}
