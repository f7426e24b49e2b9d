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
 * make check-asan a dangling optimizer pointer is a heap-use-after-free. */
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

int main(void) {
  sbn_status st = sbn_team_run(P, rank_main, NULL);
  int bad = st != SBN_STATUS_OK;
  if (bad) printf("team: %s: %s\n", sbn_status_name(st), sbn_last_error());
  for (int r = 0; r < P; r++) bad += failures[r];
  printf(bad ? "FAIL: optimizer across convert\n" : "optimizer created before convert keeps working: ok\n");
  return bad != 0;
}
