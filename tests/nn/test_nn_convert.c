/* convert_sync_batchnorm / revert_sync_batchnorm: kinds, state bit for bit,
 * training flags, requires_grad; a root BatchNorm; refusal after wrapping;
 * and that the converted network over 2 thread ranks computes exactly what
 * the original computes on the concatenated batch; a backward that fails in
 * a SyncBatchNorm's collective changes no gradient. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn_testutil.h"

static void kinds(sbn_module *m, char *out, size_t cap) {
  size_t n = strlen(out);
  snprintf(out + n, cap - n, "%s(", sbn_module_kind_name(sbn_module_kind_of(m)));
  for (int i = 0; i < sbn_module_num_children(m); i++) {
    sbn_module *c;
    sbn_module_child(&c, NULL, m, i);
    kinds(c, out, cap);
  }
  n = strlen(out);
  snprintf(out + n, cap - n, ")");
}

static void trains(sbn_module *m, char *out, size_t cap) {
  size_t n = strlen(out);
  snprintf(out + n, cap - n, "%d", sbn_module_is_training(m));
  for (int i = 0; i < sbn_module_num_children(m); i++) {
    sbn_module *c;
    sbn_module_child(&c, NULL, m, i);
    trains(c, out, cap);
  }
}

static int count_kind(const char *s, const char *k) {
  int n = 0;
  for (const char *p = s; (p = strstr(p, k)); p++) n++;
  return n;
}

typedef struct team_arg {
  float *x;      /* full batch (8,3,8,8) */
  float *y_ref;  /* reference output on the full batch (8,5) */
  double err[2];
  int ok[2];
} team_arg;

static int rank_fn(sbn_group *g, void *arg) {
  team_arg *a = arg;
  int r = sbn_group_rank(g);
  sbn_module *net, *conv;
  if (nn_build_net(&net, 3)) return 1;
  rng rr = rng_seed(33);
  nn_randomize(net, &rr);
  CHECK_OK(sbn_nn_convert_sync_batchnorm(&conv, net, g));
  /* Rank r holds samples [3r, ...): uneven halves 3 and 5. */
  int64_t n0 = r == 0 ? 0 : 3, n = r == 0 ? 3 : 5, s[4] = {n, 3, 8, 8};
  sbn_tensor x = sbn_tensor_cpu(a->x + n0 * 192, 4, s, SBN_DTYPE_FLOAT32, 0), y;
  CHECK_OK(sbn_module_forward(conv, &y, &x));
  double e = 0;
  for (int64_t i = 0; i < n * NET_CLASSES; i++) e = fmax(e, fabs(((float *)y.data)[i] - a->y_ref[n0 * NET_CLASSES + i]));
  a->err[r] = e;
  a->ok[r] = 1;
  sbn_module_destroy(net);
  return 0;
}

/* A backward that fails in a SyncBatchNorm's collective (rank 1 calls
 * something else) after the Linear behind it has added its gradient must
 * leave every gradient as it was: accumulated ones (copied back) and zeroed
 * ones (zeroed back). The group stays usable: a correct step then works. */
typedef struct fail_arg {
  float *x;
  int failed_as_expected[2], unchanged[2], zeros_kept[2], after_ok[2];
  char msg[2][300];
} fail_arg;

static int all_grads_zero(sbn_module *m) {
  sbn_nn_entry *e;
  int n, zero = 1;
  if (sbn_module_entries(&e, &n, m, SBN_NN_PARAMETERS) != SBN_STATUS_OK) return 0;
  for (int i = 0; i < n; i++)
    for (int64_t j = 0; j < e[i].numel; j++) zero &= e[i].grad[j] == 0.0f;
  free(e);
  return zero;
}

static int failed_backward_fn(sbn_group *g, void *arg) {
  fail_arg *a = arg;
  const int r = sbn_group_rank(g);
  sbn_module *net, *conv;
  if (nn_build_net(&net, 5)) return 1;
  CHECK_OK(sbn_group_set_timeout(g, 5)); /* a hang becomes a failure */
  CHECK_OK(sbn_nn_convert_sync_batchnorm(&conv, net, g));
  int64_t s[4] = {3, 3, 8, 8}, sy[2] = {3, NET_CLASSES};
  float dys[3 * NET_CLASSES];
  for (int i = 0; i < 3 * NET_CLASSES; i++) dys[i] = 0.25f * (float)(i % 4) - 0.3f;
  sbn_tensor x = sbn_tensor_cpu(a->x + r * 3 * 192, 4, s, SBN_DTYPE_FLOAT32, 0), y, dx;
  sbn_tensor dy = sbn_tensor_cpu(dys, 2, sy, SBN_DTYPE_FLOAT32, 0);
  /* accumulated gradients: a successful backward first */
  CHECK_OK(sbn_module_forward(net, &y, &x));
  CHECK_OK(sbn_module_backward(net, &dx, &dy));
  CHECK_OK(sbn_module_forward(net, &y, &x));
  nn_snapshot before;
  if (nn_snapshot_take(&before, net)) return 1;
  char why[256] = "";
  if (r == 0) {
    sbn_status st = sbn_module_backward(net, &dx, &dy);
    snprintf(a->msg[r], sizeof a->msg[r], "%s: %s", sbn_status_name(st), sbn_last_error());
    a->failed_as_expected[r] = st == SBN_STATUS_MISMATCH;
    a->unchanged[r] = nn_snapshot_diff(&before, net, 1, why, sizeof why) == 0;
    if (!a->unchanged[r]) snprintf(a->msg[r], sizeof a->msg[r], "changed: %s", why);
  } else {
    a->failed_as_expected[r] = sbn_group_barrier(g) == SBN_STATUS_MISMATCH;
    a->unchanged[r] = 1;
  }
  nn_snapshot_free(&before);
  /* zeroed gradients */
  CHECK_OK(sbn_module_zero_grad(net));
  CHECK_OK(sbn_module_forward(net, &y, &x));
  if (r == 0) a->zeros_kept[r] = sbn_module_backward(net, &dx, &dy) == SBN_STATUS_MISMATCH && all_grads_zero(net);
  else a->zeros_kept[r] = sbn_group_barrier(g) == SBN_STATUS_MISMATCH;
  /* the group is still usable */
  sbn_status st = sbn_module_forward(net, &y, &x);
  if (st == SBN_STATUS_OK) st = sbn_module_backward(net, &dx, &dy);
  a->after_ok[r] = st == SBN_STATUS_OK && !all_grads_zero(net);
  sbn_module_destroy(net);
  return 0;
}

static int failed_backward_checks(rng *r) {
  fail_arg a = {0};
  a.x = malloc(sizeof(float) * 6 * 192);
  for (int i = 0; i < 6 * 192; i++) a.x[i] = (float)rng_normal(r);
  sbn_status st = sbn_team_run(2, failed_backward_fn, &a);
  free(a.x);
  int bad = st != SBN_STATUS_OK;
  for (int k = 0; k < 2; k++) {
    printf("failed backward, rank %d: failed together %d, accumulated gradients unchanged %d, zeroed ones still "
           "zero %d, next step ok %d%s%s\n",
           k, a.failed_as_expected[k], a.unchanged[k], a.zeros_kept[k], a.after_ok[k], k ? "" : ": ", a.msg[k]);
    bad |= !a.failed_as_expected[k] || !a.unchanged[k] || !a.zeros_kept[k] || !a.after_ok[k];
  }
  return bad;
}

int main(void) {
  int bad = 0;
  char why[512];
  rng r = rng_seed(606);
  sbn_module *net, *out;
  if (nn_build_net(&net, 1)) return 1;
  nn_randomize(net, &r);
  /* Non-default flags to carry over: some grads, requires_grad, eval layers. */
  sbn_nn_entry *e;
  int n;
  CHECK_OK(sbn_module_entries(&e, &n, net, SBN_NN_PARAMETERS));
  for (int i = 0; i < n; i++)
    for (int64_t j = 0; j < e[i].numel; j++) e[i].grad[j] = (float)rng_normal(&r);
  free(e);
  CHECK_OK(sbn_module_set_requires_grad(net, "1.weight", 0));
  CHECK_OK(sbn_module_set_requires_grad(net, "5.downsample.1.bias", 0));
  sbn_module *bn9, *blk;
  CHECK_OK(sbn_module_find(&bn9, net, "9"));
  CHECK_OK(sbn_module_train(bn9, 0));
  CHECK_OK(sbn_module_find(&blk, net, "4"));
  CHECK_OK(sbn_module_train(blk, 0));
  char k0[2048] = "", t0[256] = "", k1[2048] = "", t1[256] = "", k2[2048] = "", t2[256] = "";
  kinds(net, k0, sizeof k0), trains(net, t0, sizeof t0);
  nn_snapshot snap;
  nn_snapshot_take(&snap, net);

  sbn_status st;
  /* Convert over a group of size 1 (a real group handle). */
  sbn_team *team;
  sbn_group *g;
  CHECK_OK(sbn_team_create(&team, 1));
  CHECK_OK(sbn_team_join(&g, team, 0));
  CHECK_OK(sbn_nn_convert_sync_batchnorm(&out, net, g));
  kinds(net, k1, sizeof k1), trains(net, t1, sizeof t1);
  int d = nn_snapshot_diff(&snap, net, 1, why, sizeof why);
  printf("original:  %s\nconverted: %s\n", k0, k1);
  printf("convert: same root %s, %d BatchNorm*d -> %d SyncBatchNorm, training flags %s -> %s, %d entries differ "
         "(values, grads, requires_grad)%s%s\n",
         out == net ? "yes" : "NO", count_kind(k0, "BatchNorm") , count_kind(k1, "SyncBatchNorm"), t0, t1, d,
         d ? ": " : "", why);
  bad |= out != net || count_kind(k1, "SyncBatchNorm") != 7 || count_kind(k1, "BatchNorm") != 7 || strcmp(t0, t1) || d;

  /* Wrapped: convert and revert refused, nothing changes. */
  CHECK_OK(sbn_module_set_wrapped(net, 1));
  st = sbn_nn_revert_sync_batchnorm(&out, net);
  printf("revert after wrap -> %s: %s\n", sbn_status_name(st), sbn_last_error());
  bad |= st != SBN_STATUS_BAD_STATE;
  /* The documented idiom converts in place (&net, net): a failure keeps the pointer. */
  sbn_module *keep = net;
  st = sbn_nn_convert_sync_batchnorm(&keep, keep, g);
  printf("convert(&net, net) after wrap -> %s, pointer %s\n", sbn_status_name(st), keep == net ? "kept" : "LOST");
  bad |= st != SBN_STATUS_BAD_STATE || keep != net;
  st = sbn_nn_convert_sync_batchnorm(&out, blk, g);
  printf("convert a subtree of a wrapped model -> %s: %s\n", sbn_status_name(st), sbn_last_error());
  bad |= st != SBN_STATUS_BAD_STATE || sbn_module_is_wrapped(blk) != 1;
  CHECK_OK(sbn_module_set_wrapped(net, 0));
  sbn_module *child_bn;
  CHECK_OK(sbn_module_find(&child_bn, net, "4.bn1"));
  st = sbn_nn_revert_sync_batchnorm(&out, child_bn);
  printf("revert a child BatchNorm directly -> %s: %s\n", sbn_status_name(st), sbn_last_error());
  bad |= st != SBN_STATUS_BAD_STATE;

  CHECK_OK(sbn_nn_revert_sync_batchnorm(&out, net));
  kinds(net, k2, sizeof k2), trains(net, t2, sizeof t2);
  d = nn_snapshot_diff(&snap, net, 1, why, sizeof why);
  printf("reverted:  %s\nrevert: kinds %s, training flags %s, %d entries differ bit for bit%s%s\n", k2,
         strcmp(k0, k2) ? "DIFFER" : "identical", strcmp(t0, t2) ? "DIFFER" : "identical", d, d ? ": " : "", why);
  bad |= strcmp(k0, k2) || strcmp(t0, t2) || d;
  /* The reverted kinds keep their dimension checks. */
  sbn_module *bn1d;
  CHECK_OK(sbn_module_find(&bn1d, net, "9"));
  float buf[64] = {0};
  int64_t s4[4] = {2, 12, 1, 1};
  sbn_tensor x4 = sbn_tensor_cpu(buf, 4, s4, SBN_DTYPE_FLOAT32, 0), y;
  st = sbn_module_forward(bn1d, &y, &x4);
  printf("reverted BatchNorm1d on 4D -> %s: %s\n", sbn_status_name(st), sbn_last_error());
  bad |= st != SBN_STATUS_INVALID_ARGUMENT;

  /* Root BatchNorm: a new module; the original is untouched. */
  sbn_module *root, *sroot, *broot;
  sbn_bn_options o = sbn_bn_options_default(5);
  o.momentum = SBN_MOMENTUM_CUMULATIVE;
  CHECK_OK(sbn_nn_batchnorm_create(&root, 3, &o));
  nn_randomize(root, &r);
  CHECK_OK(sbn_module_train(root, 0));
  nn_snapshot rs;
  nn_snapshot_take(&rs, root);
  CHECK_OK(sbn_nn_convert_sync_batchnorm(&sroot, root, g));
  int d1 = nn_snapshot_diff(&rs, sroot, 1, why, sizeof why), d0 = nn_snapshot_diff(&rs, root, 1, NULL, 0);
  sbn_bn *cb;
  sbn_bn_options co;
  CHECK_OK(sbn_module_bn(&cb, sroot));
  CHECK_OK(sbn_bn_get_options(cb, &co));
  printf("root BatchNorm3d -> %s (new module %s, training %d, momentum %g), %d entries differ; original still %s, "
         "%d differ\n",
         sbn_module_kind_name(sbn_module_kind_of(sroot)), sroot != root ? "yes" : "NO", sbn_module_is_training(sroot),
         co.momentum, d1, sbn_module_kind_name(sbn_module_kind_of(root)), d0);
  bad |= sroot == root || sbn_module_kind_of(sroot) != SBN_MODULE_KIND_SYNC_BATCHNORM || d1 || d0 ||
         sbn_module_is_training(sroot) != 0 || co.momentum != SBN_MOMENTUM_CUMULATIVE;
  CHECK_OK(sbn_nn_revert_sync_batchnorm(&broot, sroot));
  d1 = nn_snapshot_diff(&rs, broot, 1, NULL, 0);
  printf("revert of the root -> %s, %d entries differ\n", sbn_module_kind_name(sbn_module_kind_of(broot)), d1);
  bad |= sbn_module_kind_of(broot) != SBN_MODULE_KIND_BATCHNORM3D || d1;
  sbn_module_destroy(broot), sbn_module_destroy(sroot), sbn_module_destroy(root);
  nn_snapshot_free(&rs);
  /* A SyncBatchNorm made directly reverts to BatchNorm2d. */
  CHECK_OK(sbn_nn_sync_batchnorm_create(&sroot, &o, g));
  CHECK_OK(sbn_nn_revert_sync_batchnorm(&broot, sroot));
  printf("SyncBatchNorm created directly reverts to %s\n", sbn_module_kind_name(sbn_module_kind_of(broot)));
  bad |= sbn_module_kind_of(broot) != SBN_MODULE_KIND_BATCHNORM2D;
  sbn_module_destroy(broot), sbn_module_destroy(sroot);
  sbn_module_destroy(net);
  nn_snapshot_free(&snap);
  sbn_group_destroy(g);
  sbn_team_destroy(team);

  /* Converted network over 2 ranks (uneven 3 + 5) == original on all 8. */
  team_arg a = {0};
  a.x = malloc(sizeof(float) * 8 * 192);
  a.y_ref = malloc(sizeof(float) * 8 * NET_CLASSES);
  for (int i = 0; i < 8 * 192; i++) a.x[i] = (float)rng_normal(&r);
  if (nn_build_net(&net, 3)) return 1;
  rng rr = rng_seed(33);
  nn_randomize(net, &rr);
  int64_t s[4] = {8, 3, 8, 8};
  sbn_tensor xf = sbn_tensor_cpu(a.x, 4, s, SBN_DTYPE_FLOAT32, 0);
  CHECK_OK(sbn_module_forward(net, &y, &xf));
  memcpy(a.y_ref, y.data, sizeof(float) * 8 * NET_CLASSES);
  sbn_module_destroy(net);
  CHECK_OK(sbn_team_run(2, rank_fn, &a));
  /* float32 layers on identical inputs; only the BN statistics' summation
   * order differs (2 partial sums vs 1): ~1e-6 of the output scale. */
  bad |= check("converted net on 2 ranks (3+5 samples) vs original on 8, rank 0", a.err[0], 1e-4);
  bad |= check("converted net on 2 ranks (3+5 samples) vs original on 8, rank 1", a.err[1], 1e-4);
  bad |= !a.ok[0] || !a.ok[1];
  free(a.x), free(a.y_ref);
  bad |= failed_backward_checks(&r);
  printf("%s\n", bad ? "FAILED" : "all ok");
  return bad;
}
