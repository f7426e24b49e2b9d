/* The bad-input matrix: every public function of the include/ headers called with
 * what an adversarial user passes (NULL, negative, overflowing, wrong dtype,
 * wrong order, huge). Each case asserts the status, a non-empty message from
 * sbn_last_error(), and that no state changed (the layer's, the model's,
 * *out cleared or untouched as documented). Functions that return a value
 * instead of a status are checked for their documented answer to NULL.
 * Collectives with bad arguments run on 2 thread ranks: every rank fails.
 * Prints one line per case; exits non-zero on any mismatch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "syncbn.h"
#include "syncbn_custom.h"
#include "syncbn_data.h"
#include "syncbn_dp.h"
#include "syncbn_nn.h"

/* syncbn_mpi.h includes mpi.h for its inline helper; the entry point itself
 * takes the communicator as bytes, so it is declared here. */
SBN_API sbn_status sbn_group_from_mpi_comm(sbn_group **out, const void *comm, size_t comm_size);

#define ANY ((sbn_status)-1) /* any error status */
static int cases, failures;

static void expect(int line, const char *call, sbn_status got, sbn_status want) {
  const char *msg = sbn_last_error();
  int ok = (want == ANY ? got != SBN_STATUS_OK : got == want) && msg && msg[0];
  cases++;
  if (!ok) failures++;
  printf("%-4s %-78.78s -> %-27s %s%.90s%s\n", ok ? "ok" : "FAIL", call, sbn_status_name(got), ok ? "\"" : "(no message?) \"",
         msg ? msg : "(null)", "\"");
  if (!ok) printf("     line %d: expected %s\n", line, want == ANY ? "an error" : sbn_status_name(want));
}
#define BAD(call, want) expect(__LINE__, #call, (call), (want))
static void truth(int line, const char *what, int ok) {
  cases++;
  if (!ok) failures++;
  printf("%-4s %s\n", ok ? "ok" : "FAIL", what);
  if (!ok) printf("     line %d\n", line);
}
#define TRUE(cond) truth(__LINE__, #cond, (cond))

/* Bytes of every state entry of a model, to prove bad calls change nothing. */
typedef struct snap {
  size_t n;
  unsigned char *b;
} snap;
static snap take(sbn_module *m) {
  snap s = {0, NULL};
  sbn_nn_entry *e;
  int n;
  if (sbn_module_entries(&e, &n, m, SBN_NN_STATE) != SBN_STATUS_OK) return s;
  for (int i = 0; i < n; i++) s.n += (size_t)e[i].numel * (e[i].dtype == SBN_DTYPE_INT64 ? 8 : 4) * (e[i].grad ? 2 : 1);
  s.b = malloc(s.n + 1);
  size_t k = 0;
  for (int i = 0; i < n; i++) {
    size_t b = (size_t)e[i].numel * (e[i].dtype == SBN_DTYPE_INT64 ? 8 : 4);
    memcpy(s.b + k, e[i].data, b), k += b;
    if (e[i].grad) memcpy(s.b + k, e[i].grad, b), k += b;
  }
  free(e);
  return s;
}
static int same(snap a, sbn_module *m) {
  snap b = take(m);
  int eq = a.n == b.n && !memcmp(a.b, b.b, a.n);
  free(b.b);
  return eq;
}

/* ---- status, version, tensors, threads ---- */
static void core_values(void) {
  TRUE(strcmp(sbn_status_string((sbn_status)999), "unknown status") == 0);
  TRUE(sbn_status_name((sbn_status)-5) != NULL);
  TRUE(sbn_version() == SYNCBN_VERSION);
  int64_t shape[9] = {2, -1, 3, 1, 1, 1, 1, 1, 1};
  sbn_tensor t = sbn_tensor_cpu(NULL, 9, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  TRUE(t.ndim == SBN_MAX_DIMS); /* clamped */
  t = sbn_tensor_cpu(NULL, -3, NULL, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  TRUE(t.ndim == 0 && sbn_tensor_numel(&t) == 0);
  TRUE(sbn_tensor_numel(NULL) == 0);
  t = sbn_tensor_cpu(NULL, 3, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  TRUE(sbn_tensor_numel(&t) == -1); /* negative dimension */
  BAD(sbn_set_num_threads(-1), SBN_STATUS_INVALID_ARGUMENT);
  TRUE(sbn_num_threads(-5) >= 1 && sbn_num_threads(0) >= 1 && sbn_num_threads(1 << 30) >= 1);
}

/* ---- teams and groups (local calls) ---- */
static int rank_fails(sbn_group *w, void *a) {
  (void)a;
  return sbn_group_rank(w) == 1 ? 12345 : 0; /* not a status */
}
static void groups_local(void) {
  sbn_team *team = (sbn_team *)1;
  BAD(sbn_team_create(NULL, 2), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_team_create(&team, 0), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_team_create(&team, -4), SBN_STATUS_INVALID_ARGUMENT);
#ifndef __SANITIZE_THREAD__ /* TSan's allocator spends minutes refusing 288 GB */
  BAD(sbn_team_create(&team, 1 << 30), ANY); /* huge */
#endif
  sbn_group *g = (sbn_group *)1;
  BAD(sbn_team_join(&g, NULL, 0), SBN_STATUS_INVALID_ARGUMENT);
  TRUE(sbn_team_create(&team, 2) == SBN_STATUS_OK);
  BAD(sbn_team_join(NULL, team, 0), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_team_join(&g, team, 2), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_team_join(&g, team, -1), SBN_STATUS_INVALID_ARGUMENT);
  sbn_group *g0 = NULL, *again = NULL;
  if (sbn_team_join(&g0, team, 0) == SBN_STATUS_OK) {
    BAD(sbn_team_join(&again, team, 0), ANY); /* wrong order: the same rank twice */
    BAD(sbn_group_set_timeout(g0, -1), SBN_STATUS_INVALID_ARGUMENT);
    BAD(sbn_group_set_timeout(g0, NAN), SBN_STATUS_INVALID_ARGUMENT);
    sbn_group_destroy(g0);
  }
  sbn_team_destroy(team);
  BAD(sbn_team_run(0, rank_fails, NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_team_run(2, NULL, NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_team_run(2, rank_fails, NULL), SBN_STATUS_INTERNAL);
  TRUE(strstr(sbn_last_error(), "rank 1") && strstr(sbn_last_error(), "12345"));
  TRUE(sbn_group_rank(NULL) == -1 && sbn_group_size(NULL) == 0);
  TRUE(sbn_group_backend(NULL) != NULL && sbn_group_name(NULL) != NULL);
  TRUE(sbn_group_contains(NULL, NULL) == 0);
  BAD(sbn_group_set_timeout(NULL, 1), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_group_split(NULL, NULL, 0, 0), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_group_new(NULL, NULL, 1, NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_group_allreduce(NULL, NULL, 1, SBN_DTYPE_FLOAT32, SBN_REDUCE_OP_SUM), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_group_broadcast(NULL, NULL, 1, 0), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_group_barrier(NULL), SBN_STATUS_INVALID_ARGUMENT);
  TRUE(sbn_group_destroy(NULL) == SBN_STATUS_OK);
  /* custom groups */
  sbn_custom_ops ops;
  memset(&ops, 0, sizeof ops);
  BAD(sbn_group_create_custom(NULL, 0, 1, &ops, NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_group_create_custom(&g, 0, 1, NULL, NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_group_create_custom(&g, 0, 1, &ops, NULL), ANY); /* version 0, no callbacks */
  ops.version = SBN_CUSTOM_OPS_VERSION;
  BAD(sbn_group_create_custom(&g, 0, 1, &ops, NULL), ANY); /* allreduce and broadcast required */
  BAD(sbn_group_create_custom(&g, 3, 2, &ops, NULL), ANY);  /* rank out of range */
  sbn_custom_set_error(NULL);                                /* must not crash */
  /* MPI: NULL communicator */
  BAD(sbn_group_from_mpi_comm(NULL, NULL, 0), ANY);
  BAD(sbn_group_from_mpi_comm(&g, NULL, 0), ANY);
}

/* ---- collectives with bad arguments: every rank fails ---- */
enum { NCOLL = 9 };
static sbn_status coll_st[2][NCOLL];
static char coll_msg[2][NCOLL][160];
static int coll_rank(sbn_group *w, void *a) {
  (void)a;
  const int r = sbn_group_rank(w);
  sbn_group_set_timeout(w, 10);
  double v[4] = {1, 2, 3, 4};
  int k = 0;
#define REC(call) (coll_st[r][k] = (call), snprintf(coll_msg[r][k], 160, "%s", sbn_last_error()), k++)
  REC(sbn_group_allreduce(w, v, 4, SBN_DTYPE_INT64, SBN_REDUCE_OP_SUM));             /* wrong dtype */
  REC(sbn_group_allreduce(w, v, 4, SBN_DTYPE_FLOAT64, (sbn_reduce_op)7));            /* unknown op */
  REC(sbn_group_allreduce(w, r ? v : NULL, 4, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM)); /* NULL on rank 0 */
  REC(sbn_group_broadcast(w, v, sizeof v, 2));                                        /* root out of range */
  REC(sbn_group_broadcast(w, v, sizeof v, -1));
  int dup[2] = {0, 0}, out_of_range[2] = {0, 5};
  sbn_group *sub = NULL;
  REC(sbn_group_new(&sub, w, 2, dup));
  REC(sbn_group_new(&sub, w, 2, out_of_range));
  REC(sbn_group_new(&sub, w, -1, dup));
  /* a count whose bytes wrap size_t, on rank 1 only (rank 0 a valid one) */
  REC(sbn_group_allreduce(w, v, r ? SIZE_MAX / 8 + 2 : 4, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM));
  return 0;
}
static void collectives(void) {
  memset(coll_st, 0, sizeof coll_st);
  sbn_status st = sbn_team_run(2, coll_rank, NULL);
  static const char *const what[NCOLL] = {
      "allreduce int64 dtype",  "allreduce unknown op", "allreduce NULL buf on rank 0",
      "broadcast root 2 of 2",  "broadcast root -1",    "group_new duplicate ranks",
      "group_new rank 5 of 2",  "group_new n = -1",     "allreduce count wraps size_t (rank 1)"};
  TRUE(st == SBN_STATUS_OK);
  for (int k = 0; k < NCOLL; k++)
    for (int r = 0; r < 2; r++) {
      int ok = coll_st[r][k] != SBN_STATUS_OK && coll_msg[r][k][0];
      cases++, failures += !ok;
      printf("%-4s rank %d: %-38s -> %-27s \"%.90s\"\n", ok ? "ok" : "FAIL", r, what[k], sbn_status_name(coll_st[r][k]),
             coll_msg[r][k]);
    }
}

/* ---- the core layer ---- */
static void layer(void) {
  sbn_bn *bn = (sbn_bn *)1;
  sbn_bn_options o = sbn_bn_options_default(3);
  BAD(sbn_bn_create(NULL, &o, NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_bn_create(&bn, NULL, NULL), SBN_STATUS_INVALID_ARGUMENT);
  TRUE(bn == NULL);
  o.num_features = -3;
  BAD(sbn_bn_create(&bn, &o, NULL), SBN_STATUS_INVALID_ARGUMENT);
  o.num_features = INT64_C(1) << 62; /* huge: out of memory, not a crash */
  BAD(sbn_bn_create(&bn, &o, NULL), ANY);
  o = sbn_bn_options_default(3), o.eps = -1;
  BAD(sbn_bn_create(&bn, &o, NULL), SBN_STATUS_INVALID_ARGUMENT);
  o = sbn_bn_options_default(3), o.momentum = 2;
  BAD(sbn_bn_create(&bn, &o, NULL), SBN_STATUS_INVALID_ARGUMENT);
  o = sbn_bn_options_default(3), o.device.type = (sbn_device_type)9;
  BAD(sbn_bn_create(&bn, &o, NULL), SBN_STATUS_UNSUPPORTED);
  o = sbn_bn_options_default(3);
  if (sbn_bn_create(&bn, &o, NULL) != SBN_STATUS_OK) return;
  float xs[12], ys[12], dys[12];
  for (int i = 0; i < 12; i++) xs[i] = (float)(i % 5) - 1.5f, dys[i] = (float)(i % 3) - 1;
  int64_t sh[2] = {4, 3}, sh_bad[2] = {4, 2}, huge[2] = {INT64_C(1) << 62, 3};
  sbn_tensor x = sbn_tensor_cpu(xs, 2, sh, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_tensor y = sbn_tensor_cpu(ys, 2, sh, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), dy = y, dx = y;
  dy.data = dys;
  /* wrong order: backward before any forward */
  BAD(sbn_bn_backward(bn, &dx, &dy, &x), SBN_STATUS_BAD_STATE);
  sbn_tensor xi = x;
  xi.dtype = SBN_DTYPE_INT64;
  BAD(sbn_bn_forward(bn, &y, &xi), SBN_STATUS_UNSUPPORTED);
  TRUE(strstr(sbn_last_error(), "x has dtype int64") != NULL);
  xi.dtype = (sbn_dtype)-1; /* not a dtype at all: its code in the message */
  BAD(sbn_bn_forward(bn, &y, &xi), SBN_STATUS_UNSUPPORTED);
  TRUE(strstr(sbn_last_error(), "x has dtype code -1, which is not an sbn_dtype") != NULL);
  sbn_tensor xb = sbn_tensor_cpu(xs, 2, sh_bad, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  BAD(sbn_bn_forward(bn, &y, &xb), SBN_STATUS_INVALID_ARGUMENT);
  sbn_tensor xh = sbn_tensor_cpu(xs, 2, huge, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  BAD(sbn_bn_forward(bn, &y, &xh), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_bn_forward(NULL, &y, &x), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_bn_forward(bn, NULL, &x), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_bn_forward(bn, &y, NULL), SBN_STATUS_INVALID_ARGUMENT);
  sbn_tensor yo = y;
  yo.data = ys + 1; /* partial overlap with x? no: with y itself; overlap x */
  yo.data = xs + 1;
  BAD(sbn_bn_forward(bn, &yo, &x), SBN_STATUS_INVALID_ARGUMENT);
  int64_t nbt = -7;
  TRUE(sbn_bn_get_num_batches_tracked(bn, &nbt) == SBN_STATUS_OK && nbt == 0); /* nothing tracked */
  TRUE(sbn_bn_forward(bn, &y, &x) == SBN_STATUS_OK);
  BAD(sbn_bn_backward(bn, &dx, &dy, &xb), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_bn_backward(bn, &dx, NULL, &x), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_bn_backward(NULL, &dx, &dy, &x), SBN_STATUS_INVALID_ARGUMENT);
  sbn_tensor gw;
  TRUE(sbn_bn_tensor(&gw, bn, SBN_BN_TENSOR_GRAD_WEIGHT) == SBN_STATUS_OK && ((float *)gw.data)[0] == 0.0f);
  BAD(sbn_bn_zero_grad(NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_bn_set_training(NULL, 0), SBN_STATUS_INVALID_ARGUMENT);
  TRUE(sbn_bn_is_training(NULL) == -1 && sbn_bn_get_group(NULL) == NULL);
  BAD(sbn_bn_get_options(NULL, &o), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_bn_get_options(bn, NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_bn_tensor(NULL, bn, SBN_BN_TENSOR_WEIGHT), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_bn_tensor(&gw, bn, (sbn_bn_tensor_id)42), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_bn_tensor(&gw, bn, (sbn_bn_tensor_id)-1), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_bn_get_num_batches_tracked(bn, NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_bn_set_num_batches_tracked(bn, -1), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_bn_set_num_batches_tracked(bn, INT64_MAX), SBN_STATUS_INVALID_ARGUMENT);
  TRUE(sbn_bn_get_num_batches_tracked(bn, &nbt) == SBN_STATUS_OK && nbt == 1); /* unchanged by the bad calls */
  TRUE(sbn_bn_destroy(NULL) == SBN_STATUS_OK);
  sbn_bn_destroy(bn);
}

/* ---- modules, loss, optimizer, checkpoints ---- */
static void modules(void) {
  sbn_module *m = (sbn_module *)1, *seq, *lin, *bn;
  BAD(sbn_nn_sequential_create(NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_linear_create(&m, 0, 3, 1, 0), SBN_STATUS_INVALID_ARGUMENT);
  TRUE(m == NULL);
  BAD(sbn_nn_linear_create(&m, INT64_C(1) << 40, 3, 1, 0), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_linear_create(NULL, 2, 3, 1, 0), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_conv2d_create(&m, 3, 4, 0, 1, 0, 1, 0), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_conv2d_create(&m, 3, 4, 3, -1, 0, 1, 0), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_conv2d_create(&m, INT64_C(1) << 40, 4, 3, 1, 0, 1, 0), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_relu_create(NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_maxpool2d_create(&m, 2, -1, 0), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_maxpool2d_create(&m, 3, 1, 0x7fffffff), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_global_avgpool_create(NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_flatten_create(NULL), SBN_STATUS_INVALID_ARGUMENT);
  sbn_bn_options o = sbn_bn_options_default(2);
  BAD(sbn_nn_batchnorm_create(&m, 4, &o), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_batchnorm_create(&m, 2, NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_sync_batchnorm_create(&m, NULL, NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_basic_block_create(&m, 0, 4, 1, 0), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_basic_block_create(NULL, 4, 4, 1, 0), SBN_STATUS_INVALID_ARGUMENT);
  if (sbn_nn_sequential_create(&seq) || sbn_nn_linear_create(&lin, 4, 2, 1, 3) || sbn_nn_batchnorm_create(&bn, 1, &o) ||
      sbn_nn_sequential_append(seq, "fc", lin) || sbn_nn_sequential_append(seq, "bn", bn)) {
    TRUE(!"building the model");
    return;
  }
  snap s0 = take(seq);
  BAD(sbn_nn_sequential_append(NULL, NULL, lin), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_sequential_append(seq, NULL, NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_sequential_append(seq, NULL, lin), ANY);     /* already a child */
  BAD(sbn_nn_sequential_append(seq, "x", seq), ANY);      /* itself */
  BAD(sbn_module_destroy(lin), SBN_STATUS_BAD_STATE);      /* wrong order: a child */
  TRUE(sbn_module_kind_of(NULL) == SBN_MODULE_KIND_COUNT_);
  TRUE(strcmp(sbn_module_kind_name((sbn_module_kind)99), "unknown") == 0);
  TRUE(sbn_module_num_children(NULL) == 0 && sbn_module_is_training(NULL) == -1 && sbn_module_is_wrapped(NULL) == -1);
  sbn_module *c;
  const char *nm;
  BAD(sbn_module_child(&c, &nm, seq, 2), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_module_child(&c, &nm, seq, -1), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_module_child(NULL, &nm, seq, 0), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_module_find(&c, seq, "nope.0"), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_module_find(&c, seq, NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_module_train(NULL, 1), SBN_STATUS_INVALID_ARGUMENT);
  float xs[8] = {1, -2, 3, 0.5f, -1, 2, 0.25f, 4}, dls[4];
  int64_t sh[2] = {2, 4}, bad_sh[2] = {2, 5}, huge[2] = {INT64_C(1) << 61, 8}, neg[2] = {-2, 4};
  sbn_tensor x = sbn_tensor_cpu(xs, 2, sh, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), y, dx;
  sbn_tensor dy = sbn_tensor_cpu(dls, 2, (int64_t[]){2, 2}, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  BAD(sbn_module_backward(seq, &dx, &dy), SBN_STATUS_BAD_STATE); /* wrong order */
  sbn_tensor xb = sbn_tensor_cpu(xs, 2, bad_sh, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  BAD(sbn_module_forward(seq, &y, &xb), SBN_STATUS_INVALID_ARGUMENT);
  sbn_tensor xh = sbn_tensor_cpu(xs, 2, huge, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  BAD(sbn_module_forward(seq, &y, &xh), SBN_STATUS_INVALID_ARGUMENT);
  sbn_tensor xn = sbn_tensor_cpu(xs, 2, neg, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  BAD(sbn_module_forward(seq, &y, &xn), SBN_STATUS_INVALID_ARGUMENT);
  sbn_tensor xd = x;
  xd.dtype = SBN_DTYPE_BFLOAT16;
  BAD(sbn_module_forward(seq, &y, &xd), SBN_STATUS_UNSUPPORTED);
  BAD(sbn_module_forward(seq, NULL, &x), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_module_forward(NULL, &y, &x), SBN_STATUS_INVALID_ARGUMENT);
  TRUE(same(s0, seq)); /* none of the failed forwards changed a parameter or buffer */
  TRUE(sbn_module_forward(seq, &y, &x) == SBN_STATUS_OK);
  BAD(sbn_module_backward(seq, &dx, &xb), SBN_STATUS_INVALID_ARGUMENT); /* dy shape */
  BAD(sbn_module_backward(seq, NULL, &dy), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_module_zero_grad(NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_module_set_requires_grad(seq, "fc.nothing", 0), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_module_set_requires_grad(NULL, NULL, 0), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_module_set_wrapped(NULL, 1), SBN_STATUS_INVALID_ARGUMENT);
  sbn_nn_entry *e;
  int n;
  BAD(sbn_module_entries(NULL, &n, seq, SBN_NN_STATE), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_module_entries(&e, NULL, seq, SBN_NN_STATE), SBN_STATUS_INVALID_ARGUMENT);
  TRUE(sbn_module_num_parameters(NULL) == -1);
  sbn_bn *core;
  BAD(sbn_module_bn(&core, lin), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_convert_sync_batchnorm(NULL, seq, NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_convert_sync_batchnorm(&c, bn, NULL), SBN_STATUS_BAD_STATE); /* a child BatchNorm */
  BAD(sbn_nn_revert_sync_batchnorm(&c, NULL), SBN_STATUS_INVALID_ARGUMENT);
  /* loss */
  double loss = 7;
  int64_t t_bad[2] = {0, 9}, t_neg[2] = {-1, 0}, t_ok[2] = {0, 1};
  sbn_tensor logits = sbn_tensor_cpu(xs, 2, sh, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  BAD(sbn_nn_cross_entropy_forward(&loss, &logits, t_bad, 0), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_cross_entropy_forward(&loss, &logits, t_neg, 0), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_cross_entropy_forward(&loss, &logits, NULL, 0), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_cross_entropy_forward(NULL, &logits, t_ok, 0), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_cross_entropy_forward(&loss, &xh, t_ok, 0), SBN_STATUS_INVALID_ARGUMENT);
  TRUE(loss == 7);
  float dl[8];
  sbn_tensor dlog = sbn_tensor_cpu(dl, 2, bad_sh, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  BAD(sbn_nn_cross_entropy_backward(&dlog, &logits, t_ok, 0), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_cross_entropy_backward(NULL, &logits, t_ok, 0), SBN_STATUS_INVALID_ARGUMENT);
  int64_t correct = -3;
  BAD(sbn_nn_count_correct(&correct, &logits, t_bad), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_count_correct(NULL, &logits, t_ok), SBN_STATUS_INVALID_ARGUMENT);
  /* optimizer */
  sbn_nn_sgd *sgd = (sbn_nn_sgd *)1;
  sbn_nn_sgd_options so = {-0.1, 0, 0, 0, 0};
  BAD(sbn_nn_sgd_create(&sgd, seq, &so), SBN_STATUS_INVALID_ARGUMENT);
  TRUE(sgd == NULL);
  so.lr = 0.1, so.nesterov = 1;
  BAD(sbn_nn_sgd_create(&sgd, seq, &so), SBN_STATUS_INVALID_ARGUMENT);
  so.nesterov = 0, so.momentum = NAN;
  BAD(sbn_nn_sgd_create(&sgd, seq, &so), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_sgd_create(&sgd, NULL, &so), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_sgd_step(NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_sgd_set_lr(NULL, 0.1), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_sgd_entries(&e, &n, NULL), SBN_STATUS_INVALID_ARGUMENT);
  TRUE(sbn_nn_sgd_destroy(NULL) == SBN_STATUS_OK);
  so.momentum = 0.9;
  if (sbn_nn_sgd_create(&sgd, seq, &so) == SBN_STATUS_OK) {
    BAD(sbn_nn_sgd_set_lr(sgd, -1), SBN_STATUS_INVALID_ARGUMENT);
    BAD(sbn_nn_sgd_set_lr(sgd, NAN), SBN_STATUS_INVALID_ARGUMENT);
    BAD(sbn_nn_sgd_entries(NULL, &n, sgd), SBN_STATUS_INVALID_ARGUMENT);
    sbn_nn_sgd_destroy(sgd);
  }
  /* checkpoints */
  snap s1 = take(seq);
  BAD(sbn_nn_save(NULL, seq), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_save("", seq), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_save("/nonexistent-dir/x.safetensors", seq), SBN_STATUS_IO_ERROR);
  BAD(sbn_nn_save("/tmp/x.safetensors", NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_save_entries("/tmp/x.safetensors", NULL, 2), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_load(seq, "/nonexistent-dir/x.safetensors", 0, NULL), SBN_STATUS_IO_ERROR);
  BAD(sbn_nn_load(seq, "/", 0, NULL), SBN_STATUS_IO_ERROR); /* a directory */
  BAD(sbn_nn_load(seq, NULL, 0, NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_nn_load(NULL, "/tmp/x", 0, NULL), SBN_STATUS_INVALID_ARGUMENT);
  unsigned char junk[16] = {255, 255, 255, 255, 255, 255, 255, 127, '{', '}'};
  BAD(sbn_nn_load_memory(seq, junk, sizeof junk, 0, NULL), SBN_STATUS_IO_ERROR); /* huge header length */
  BAD(sbn_nn_load_memory(seq, NULL, 100, 0, NULL), ANY);
  BAD(sbn_nn_load_memory(seq, junk, 3, 0, NULL), SBN_STATUS_IO_ERROR);
  BAD(sbn_nn_load_entries(NULL, 3, junk, sizeof junk, 0, NULL), SBN_STATUS_INVALID_ARGUMENT);
  sbn_nn_load_report_free(NULL);
  TRUE(same(s1, seq)); /* failed loads changed nothing */
  free(s0.b), free(s1.b);
  sbn_module_destroy(seq);
  TRUE(sbn_module_destroy(NULL) == SBN_STATUS_OK);
}

/* ---- datasets ---- */
static void datasets(void) {
  sbn_dataset d;
  memset(&d, 0x5a, sizeof d);
  BAD(sbn_dataset_synthetic(&d, 0, 1), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_dataset_synthetic(&d, -5, 1), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_dataset_synthetic(&d, INT64_MAX, 1), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_dataset_synthetic(NULL, 4, 1), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_dataset_load_cifar10(NULL, NULL, 1), SBN_STATUS_INVALID_ARGUMENT);
  const char *files[1] = {"/nonexistent/data_batch_1.bin"};
  BAD(sbn_dataset_load_cifar10(&d, files, 1), SBN_STATUS_IO_ERROR);
  TRUE(d.images == NULL && d.count == 0);
  BAD(sbn_dataset_load_cifar10(&d, files, -1), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_dataset_load_mnist(&d, NULL, "x"), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_dataset_load_mnist(&d, "/nonexistent/a", "/nonexistent/b"), SBN_STATUS_IO_ERROR);
  TRUE(sbn_synthetic_contrast(0) == 0.5 && sbn_synthetic_contrast(-1000) >= 0); /* any k: no crash */
  if (sbn_dataset_synthetic(&d, 3, 1) != SBN_STATUS_OK) return;
  float img[3 * 16 * 16];
  int32_t lab = 99;
  int64_t idx_bad[1] = {3}, idx_neg[1] = {-1};
  BAD(sbn_dataset_gather(img, &lab, &d, idx_bad, 1), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_dataset_gather(img, &lab, &d, idx_neg, 1), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_dataset_gather(img, &lab, &d, idx_bad, -1), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_dataset_gather(img, &lab, &d, NULL, 1), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_dataset_gather(NULL, &lab, &d, idx_bad, 1), SBN_STATUS_INVALID_ARGUMENT);
  TRUE(lab == 99);
  sbn_dataset_free(&d);
  sbn_dataset_free(NULL);
}

/* ---- the data-parallel wrapper: bad options fail on every rank ---- */
static sbn_status dp_st[2][7];
static char dp_msg[2][7][200];
static int dp_rank(sbn_group *w, void *a) {
  (void)a;
  const int r = sbn_group_rank(w);
  sbn_group_set_timeout(w, 10);
  sbn_module *m;
  if (sbn_nn_linear_create(&m, 3, 2, 1, 5) != SBN_STATUS_OK) return 1;
  sbn_nn_sgd_options so = {0.1, 0, 0, 0, 0};
  sbn_nn_sgd *sgd;
  if (sbn_nn_sgd_create(&sgd, m, &so) != SBN_STATUS_OK) return 1;
  sbn_dp_options o = sbn_dp_options_default();
  sbn_dp *dp = (sbn_dp *)1;
  int k = 0;
#define DREC(call) (dp_st[r][k] = (call), snprintf(dp_msg[r][k], 200, "%s", sbn_last_error()), k++)
  o.num_params_to_ignore = 2; /* NULL list with a count */
  DREC(sbn_dp_wrap(&dp, m, &sgd, 1, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, w, &o));
  const char *names[1] = {"weight"};
  o.params_to_ignore = names, o.num_params_to_ignore = -1; /* negative count */
  DREC(sbn_dp_wrap(&dp, m, &sgd, 1, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, w, &o));
  o = sbn_dp_options_default(), o.reduce = (sbn_dp_reduce)5;
  DREC(sbn_dp_wrap(&dp, m, &sgd, 1, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, w, &o));
  DREC(sbn_dp_wrap(&dp, m, &sgd, 1, (sbn_dp_algorithm)9, w, NULL));
  DREC(sbn_dp_wrap(&dp, m, NULL, 2, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, w, NULL));
  DREC(sbn_dp_wrap(&dp, r == 1 ? NULL : m, &sgd, 1, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, w, NULL)); /* one rank */
  sbn_nn_sgd *const with_null[2] = {sgd, r == 0 ? NULL : sgd}; /* one rank */
  DREC(sbn_dp_wrap(&dp, m, with_null, 2, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, w, NULL));
  int wrapped = sbn_module_is_wrapped(m);
  sbn_nn_sgd_destroy(sgd);
  sbn_module_destroy(m);
  return wrapped != 0 || dp != NULL ? 3 : 0;
}
static void wrapper(void) {
  memset(dp_st, 0, sizeof dp_st);
  sbn_status st = sbn_team_run(2, dp_rank, NULL);
  if (st != SBN_STATUS_OK) printf("     %s\n", sbn_last_error());
  TRUE(st == SBN_STATUS_OK); /* nothing stayed wrapped, *out cleared */
  static const char *const what[7] = {"params_to_ignore NULL, count 2", "num_params_to_ignore -1",
                                      "unknown reduce mode", "unknown algorithm", "NULL optimizers, count 2",
                                      "model NULL on rank 1 only", "optimizers[1] NULL on rank 0 only"};
  for (int k = 0; k < 7; k++)
    for (int r = 0; r < 2; r++) {
      int ok = dp_st[r][k] != SBN_STATUS_OK && dp_msg[r][k][0];
      cases++, failures += !ok;
      printf("%-4s rank %d: sbn_dp_wrap %-32s -> %-27s \"%.90s\"\n", ok ? "ok" : "FAIL", r, what[k],
             sbn_status_name(dp_st[r][k]), dp_msg[r][k]);
    }
  sbn_tensor y;
  BAD(sbn_dp_wrap(NULL, NULL, NULL, 0, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, NULL, NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_dp_forward(NULL, &y, &y), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_dp_backward(NULL, NULL, &y), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_dp_step(NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_dp_zero_grad(NULL), SBN_STATUS_INVALID_ARGUMENT);
  BAD(sbn_dp_set_train_step_counter(NULL, 3), SBN_STATUS_INVALID_ARGUMENT);
  TRUE(sbn_dp_train_step_counter(NULL) == -1 && sbn_dp_num_buckets(NULL) == 0 && sbn_dp_group(NULL) == NULL);
  TRUE(sbn_dp_destroy(NULL) == SBN_STATUS_OK);
  sbn_dp_options o = sbn_dp_options_default();
  TRUE(o.bucket_bytes > 0 && o.params_to_ignore == NULL && o.num_params_to_ignore == 0);
}

int main(void) {
  core_values();
  groups_local();
  collectives();
  layer();
  modules();
  datasets();
  wrapper();
  printf("%d cases, %d failed\n", cases, failures);
  return failures != 0;
}
