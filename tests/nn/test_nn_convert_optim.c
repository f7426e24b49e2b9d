/* An optimizer created BEFORE convert_sync_batchnorm keeps working: convert
 * keeps the parameters' storage (as PyTorch's does), so training after the
 * convert with the earlier SGD updates the converted model's parameters.
 *
 * Checked against a reference run where the optimizer is created after the
 * convert (the documented order): after 3 SGD steps with momentum and
 * weight decay, every parameter, gradient and buffer of the two models must
 * be bitwise equal, and the BatchNorm parameters must have moved. Also for a
 * root that is itself a BatchNorm (convert returns a new module), and for
 * revert after convert. On 2 thread ranks (real SyncBatchNorm). Under
 * make check-asan a dangling optimizer pointer is a heap-use-after-free.
 *
 * Also the optimizer's argument checks: a negative or non-finite lr,
 * momentum or weight_decay, a non-finite dampening, and set_lr with a NULL
 * optimizer or a bad lr are refused with a message naming the field and
 * its value, and a refused set_lr keeps the old learning rate. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn_testutil.h"

enum { P = 2, N = 3 };
static int failures[P];

/* One training step of `m` with `opt`: forward, cross-entropy, backward, step. */
static sbn_status train_step(sbn_module *m, sbn_nn_sgd *opt, const float *img, const int64_t *labels, int ndim,
                             const int64_t *shape) {
  static __thread float dl[64 * 64];
  sbn_tensor x = sbn_tensor_cpu((void *)img, ndim, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), y, dx;
  sbn_status st = sbn_module_zero_grad(m);
  if (st == SBN_STATUS_OK) st = sbn_module_forward(m, &y, &x);
  if (st != SBN_STATUS_OK) return st;
  sbn_tensor dy = y;
  dy.data = dl;
  if (y.ndim == 2) { /* classifier output: cross-entropy */
    double loss;
    st = sbn_nn_cross_entropy_forward(&loss, &y, labels, 0);
    if (st == SBN_STATUS_OK) st = sbn_nn_cross_entropy_backward(&dy, &y, labels, 0);
  } else { /* a lone BatchNorm: loss = sum(y * r) with fixed weights r */
    for (int64_t i = 0; i < sbn_tensor_numel(&y); i++) dl[i] = (float)((i * 7) % 5) - 2.0f;
  }
  if (st == SBN_STATUS_OK) st = sbn_module_backward(m, &dx, &dy);
  if (st == SBN_STATUS_OK) st = sbn_nn_sgd_step(opt);
  return st;
}

/* 0 when every entry (state and grads) of a and b is bitwise equal. */
static int compare(sbn_module *a, sbn_module *b, const char *what, int rank) {
  sbn_nn_entry *ea, *eb;
  int na, nb, diff = 0;
  if (sbn_module_entries(&ea, &na, a, SBN_NN_STATE) || sbn_module_entries(&eb, &nb, b, SBN_NN_STATE)) return 1;
  if (na != nb) diff = 1;
  for (int i = 0; !diff && i < na; i++) {
    size_t bytes = nn_entry_bytes(&ea[i]);
    if (strcmp(ea[i].name, eb[i].name) || memcmp(ea[i].data, eb[i].data, bytes) ||
        (ea[i].grad && memcmp(ea[i].grad, eb[i].grad, bytes))) {
      printf("  rank %d %s: \"%s\" differs from the reference FAIL\n", rank, what, ea[i].name);
      diff = 1;
    }
  }
  if (!diff && rank == 0) printf("  %s: %d entries bitwise equal to the reference ok\n", what, na);
  free(ea), free(eb);
  return diff;
}

/* The value of entry `name` in m (first float). */
static float first_value(sbn_module *m, const char *name) {
  sbn_nn_entry *e;
  int n;
  float v = 0;
  if (sbn_module_entries(&e, &n, m, SBN_NN_STATE) != SBN_STATUS_OK) return 0;
  for (int i = 0; i < n; i++)
    if (!strcmp(e[i].name, name)) v = *(float *)e[i].data;
  free(e);
  return v;
}

static int rank_main(sbn_group *world, void *arg) {
  (void)arg;
  const int rank = sbn_group_rank(world);
  int *bad = &failures[rank];
  const sbn_nn_sgd_options so = {0.05, 0.9, 0.0, 1e-3, 0};
  rng r = rng_seed(42 + (uint64_t)rank);
  static __thread float img[N * 3 * 8 * 8];
  for (int i = 0; i < N * 3 * 8 * 8; i++) img[i] = (float)rng_normal(&r);
  int64_t labels[N] = {rank % NET_CLASSES, 2, 4}, shape[4] = {N, 3, 8, 8};

  /* A tree: optimizer first (as a user might), then convert. */
  sbn_module *net, *ref, *out;
  sbn_nn_sgd *early, *late;
  CHECK_OK(nn_build_net(&net, 7) == 0 ? SBN_STATUS_OK : SBN_STATUS_INTERNAL);
  CHECK_OK(nn_build_net(&ref, 7) == 0 ? SBN_STATUS_OK : SBN_STATUS_INTERNAL);
  CHECK_OK(sbn_nn_sgd_create(&early, net, &so));
  const float bn_w0 = first_value(net, "1.weight");
  CHECK_OK(sbn_nn_convert_sync_batchnorm(&out, net, world));
  CHECK_OK(sbn_nn_convert_sync_batchnorm(&out, ref, world));
  CHECK_OK(sbn_nn_sgd_create(&late, ref, &so));
  for (int s = 0; s < 3; s++) {
    CHECK_OK(train_step(net, early, img, labels, 4, shape));
    CHECK_OK(train_step(ref, late, img, labels, 4, shape));
  }
  const float bn_w1 = first_value(net, "1.weight");
  if (bn_w1 == bn_w0) printf("  rank %d: SyncBatchNorm weight did not move (%g) FAIL\n", rank, bn_w1), ++*bad;
  else if (rank == 0) printf("  tree: converted 1.weight[0] %.6f -> %.6f after 3 steps\n", bn_w0, bn_w1);
  *bad += compare(net, ref, "tree, SGD made before convert", rank);

  /* revert, and keep training with the same early optimizer */
  CHECK_OK(sbn_nn_revert_sync_batchnorm(&out, net));
  CHECK_OK(sbn_nn_revert_sync_batchnorm(&out, ref));
  CHECK_OK(train_step(net, early, img, labels, 4, shape));
  CHECK_OK(train_step(ref, late, img, labels, 4, shape));
  *bad += compare(net, ref, "tree, after revert", rank);
  sbn_nn_sgd_destroy(early), sbn_nn_sgd_destroy(late);
  sbn_module_destroy(net), sbn_module_destroy(ref);

  /* A root that is itself a BatchNorm: convert returns a new module that
   * takes over the storage the early optimizer refers to. */
  sbn_bn_options o = sbn_bn_options_default(4);
  sbn_module *bn, *bnref, *sbn, *sbnref;
  CHECK_OK(sbn_nn_batchnorm_create(&bn, 2, &o));
  CHECK_OK(sbn_nn_batchnorm_create(&bnref, 2, &o));
  CHECK_OK(sbn_nn_sgd_create(&early, bn, &so));
  CHECK_OK(sbn_nn_convert_sync_batchnorm(&sbn, bn, world));
  CHECK_OK(sbn_nn_convert_sync_batchnorm(&sbnref, bnref, world));
  CHECK_OK(sbn_nn_sgd_create(&late, sbnref, &so));
  sbn_module_destroy(bn); /* the caller's old root goes; the optimizer must not care */
  sbn_module_destroy(bnref);
  int64_t bshape[4] = {N, 4, 2, 2};
  for (int s = 0; s < 3; s++) {
    CHECK_OK(train_step(sbn, early, img, labels, 4, bshape));
    CHECK_OK(train_step(sbnref, late, img, labels, 4, bshape));
  }
  const float w = first_value(sbn, "weight");
  if (w == 1.0f) printf("  rank %d: root SyncBatchNorm weight still 1 FAIL\n", rank), ++*bad;
  else if (rank == 0) printf("  root: converted weight[0] 1 -> %.6f after 3 steps\n", w);
  *bad += compare(sbn, sbnref, "root BatchNorm, SGD made before convert", rank);
  sbn_nn_sgd_destroy(early), sbn_nn_sgd_destroy(late);
  sbn_module_destroy(sbn), sbn_module_destroy(sbnref);
  return 0;
}

/* One refused call: INVALID_ARGUMENT and a message containing `needle`. */
static int refused(const char *what, sbn_status st, const char *needle) {
  const char *msg = sbn_last_error();
  const int ok = st == SBN_STATUS_INVALID_ARGUMENT && strstr(msg, needle) != NULL;
  printf("  %-4s %-34s -> %s: %s\n", ok ? "ok" : "FAIL", what, sbn_status_name(st), msg);
  if (!ok) printf("       expected INVALID_ARGUMENT with \"%s\" in the message\n", needle);
  return !ok;
}

static int sgd_arguments(void) {
  int bad = 0;
  sbn_module *net;
  if (nn_build_net(&net, 3) != 0) return printf("  FAIL building the net\n"), 1;
  const sbn_nn_sgd_options good = {0.1, 0.9, 0.0, 1e-4, 0};
  const struct {
    const char *what, *needle;
    sbn_nn_sgd_options o;
  } cases[] = {
      {"lr = inf", "options->lr = inf: must be a finite number >= 0", {INFINITY, 0.9, 0, 0, 0}},
      {"lr = nan", "options->lr = nan", {NAN, 0.9, 0, 0, 0}},
      {"lr = -0.1", "options->lr = -0.1: must be", {-0.1, 0.9, 0, 0, 0}},
      {"momentum = inf", "options->momentum = inf", {0.1, INFINITY, 0, 0, 0}},
      {"momentum = -1", "options->momentum = -1", {0.1, -1, 0, 0, 0}},
      {"weight_decay = inf", "options->weight_decay = inf", {0.1, 0.9, 0, INFINITY, 0}},
      {"weight_decay = nan", "options->weight_decay = nan", {0.1, 0.9, 0, NAN, 0}},
      {"dampening = nan", "options->dampening = nan: must be a finite number", {0.1, 0.9, NAN, 0, 0}},
      {"dampening = -inf", "options->dampening = -inf", {0.1, 0.9, -INFINITY, 0, 0}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    sbn_nn_sgd *s = (sbn_nn_sgd *)&bad; /* not NULL: a refusal must set it to NULL */
    char what[64];
    snprintf(what, sizeof what, "sgd_create %s", cases[i].what);
    bad += refused(what, sbn_nn_sgd_create(&s, net, &cases[i].o), cases[i].needle);
    if (s) printf("  FAIL %s left *out set\n", what), bad++;
  }
  sbn_nn_sgd *s = NULL;
  if (sbn_nn_sgd_create(&s, net, &good) != SBN_STATUS_OK) {
    printf("  FAIL sgd_create with good options: %s\n", sbn_last_error());
    sbn_module_destroy(net);
    return bad + 1;
  }
  bad += refused("set_lr(NULL, 0.1)", sbn_nn_sgd_set_lr(NULL, 0.1), "optimizer is NULL");
  bad += refused("set_lr(s, inf)", sbn_nn_sgd_set_lr(s, INFINITY), "lr = inf: must be a finite number >= 0");
  bad += refused("set_lr(s, nan)", sbn_nn_sgd_set_lr(s, NAN), "lr = nan");
  bad += refused("set_lr(s, -1)", sbn_nn_sgd_set_lr(s, -1), "lr = -1");
  /* the refusals kept lr 0.1: one step with zero gradients but weight decay
   * moves a weight by exactly -lr * wd * w (float32, PyTorch's order) */
  sbn_nn_entry *e;
  int n;
  if (sbn_module_zero_grad(net) != SBN_STATUS_OK || sbn_module_entries(&e, &n, net, SBN_NN_PARAMETERS) != SBN_STATUS_OK)
    return printf("  FAIL setup: %s\n", sbn_last_error()), sbn_nn_sgd_destroy(s), sbn_module_destroy(net), bad + 1;
  float *w = e[0].data;
  const float w0 = w[0], want = w0 + (-0.1f) * (0.0f + 1e-4f * w0);
  sbn_status st = sbn_nn_sgd_step(s);
  const int kept = st == SBN_STATUS_OK && w[0] == want;
  printf("  %-4s %-34s -> %s[0] %.9g -> %.9g (with lr 0.1: %.9g)\n", kept ? "ok" : "FAIL",
         "refused set_lr keeps the old lr", e[0].name, w0, w[0], want);
  bad += !kept;
  free(e);
  sbn_nn_sgd_destroy(s);
  sbn_module_destroy(net);
  return bad;
}

int main(void) {
  int bad = sgd_arguments();
  sbn_status st = sbn_team_run(P, rank_main, NULL);
  bad += st != SBN_STATUS_OK;
  if (st != SBN_STATUS_OK) printf("team: %s: %s\n", sbn_status_name(st), sbn_last_error());
  for (int r = 0; r < P; r++) bad += failures[r];
  printf(bad ? "FAIL: optimizer checks\n"
             : "optimizer argument checks, and an optimizer created before convert keeps working: ok\n");
  return bad != 0;
}
