/* The wrapper's contract besides equivalence (4 thread ranks):
 *  - wrap broadcasts parameters and buffers from rank 0 (ranks built with
 *    different seeds end up bitwise equal), except params_to_ignore;
 *  - ignored parameters are not reduced either (their gradients stay local),
 *    the others are equal on every rank after backward;
 *  - the train-step counter counts sbn_dp_step; buckets follow bucket_bytes;
 *  - convert_sync_batchnorm after wrapping is refused, and so is destroying
 *    the wrapped model (before sbn_dp_destroy); the wrapper's group may be
 *    destroyed first;
 *  - a SyncBatchNorm synchronizing over ranks outside the wrapper's group is
 *    refused on every rank of the wrapper's group;
 *  - more buckets than the communication thread's queue holds (4096) are
 *    all reduced (the overflow failed backward with SBN_STATUS_INTERNAL). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../tools/train/model.h"
#include "syncbn_dp.h"

enum { P = 4 };
static int failures[P];
#define EXPECT(cond, ...)                                   \
  do {                                                      \
    if (!(cond)) {                                          \
      printf("  rank %d FAIL: ", rank), printf(__VA_ARGS__); \
      failures[rank]++;                                     \
    }                                                       \
  } while (0)

static sbn_nn_entry *rank0_entries[2];
static float *grads[P];
static const char *ignored[1] = {"fc.bias"};

static int rank_main(sbn_group *world, void *arg) {
  (void)arg;
  const int rank = sbn_group_rank(world);
  sbn_module *model = NULL, *conv = NULL;
  if (build_resnet(&model, 3, 4, 10, 100 + (uint64_t)rank) != SBN_STATUS_OK) return 1; /* differ per rank */
  if (sbn_nn_convert_sync_batchnorm(&conv, model, world) != SBN_STATUS_OK) return 1;
  sbn_nn_sgd_options so = {0.1, 0.0, 0.0, 0.0, 0};
  sbn_nn_sgd *sgd;
  if (sbn_nn_sgd_create(&sgd, model, &so) != SBN_STATUS_OK) return 1;
  sbn_nn_entry *before = NULL;
  int n = 0;
  sbn_module_entries(&before, &n, model, SBN_NN_STATE);
  float fc_bias_before[10];
  for (int i = 0; i < n; i++)
    if (!strcmp(before[i].name, "fc.bias")) memcpy(fc_bias_before, before[i].data, sizeof fc_bias_before);

  sbn_dp_options o = sbn_dp_options_default();
  o.bucket_bytes = 1024;
  sbn_dp *dp;
  /* A misspelt name (on one rank) is refused on every rank, naming it; nothing changes. */
  static const char *misspelt[1] = {"fc.wieght"};
  o.params_to_ignore = rank == 1 ? misspelt : ignored;
  o.num_params_to_ignore = 1;
  sbn_status st = sbn_dp_wrap(&dp, model, &sgd, 1, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, world, &o);
  if (rank == 0) printf("params_to_ignore misspelt on rank 1 -> rank 0: %s: %s\n", sbn_status_name(st), sbn_last_error());
  if (rank == 1) printf("params_to_ignore misspelt on rank 1 -> rank 1: %s: %s\n", sbn_status_name(st), sbn_last_error());
  EXPECT(st == (rank == 1 ? SBN_STATUS_INVALID_ARGUMENT : SBN_STATUS_PEER_FAILED) &&
             (rank != 1 || strstr(sbn_last_error(), "fc.wieght")) && sbn_module_is_wrapped(model) == 0,
         "misspelt params_to_ignore: %s %s\n", sbn_status_name(st), sbn_last_error());
  o.params_to_ignore = ignored;
  st = sbn_dp_wrap(&dp, model, &sgd, 1, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, world, &o);
  EXPECT(st == SBN_STATUS_OK, "wrap: %s\n", sbn_last_error());
  if (st != SBN_STATUS_OK) return 1;
  EXPECT(sbn_dp_num_buckets(dp) > 3, "expected several 1 KiB buckets, got %d\n", sbn_dp_num_buckets(dp));

  /* broadcast: everything but fc.bias equals rank 0's */
  sbn_nn_entry *e = NULL;
  sbn_module_entries(&e, &n, model, SBN_NN_STATE);
  if (rank == 0) rank0_entries[0] = e;
  sbn_group_barrier(world);
  for (int i = 0; i < n; i++) {
    size_t bytes = (size_t)e[i].numel * (e[i].dtype == SBN_DTYPE_INT64 ? 8 : 4);
    int same = memcmp(e[i].data, rank0_entries[0][i].data, bytes) == 0;
    if (!strcmp(e[i].name, "fc.bias"))
      EXPECT(memcmp(e[i].data, fc_bias_before, sizeof fc_bias_before) == 0 && (rank == 0 || !same),
             "ignored fc.bias was broadcast\n");
    else
      EXPECT(same, "%s differs from rank 0's after wrap\n", e[i].name);
  }
  sbn_group_barrier(world);

  /* one step: gradients equal on every rank except the ignored one */
  static float img[P][2 * 3 * 8 * 8], dl[P][2 * 10];
  for (int i = 0; i < 2 * 3 * 8 * 8; i++) img[rank][i] = (float)((i * 37 + rank * 101) % 17) / 8.0f - 1.0f;
  int64_t shape[4] = {2, 3, 8, 8}, labels[2] = {rank, 9 - rank};
  sbn_tensor x = sbn_tensor_cpu(img[rank], 4, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), y = {0};
  double loss;
  st = sbn_dp_zero_grad(dp);
  if (st == SBN_STATUS_OK) st = sbn_dp_forward(dp, &y, &x);
  if (st == SBN_STATUS_OK) st = sbn_nn_cross_entropy_forward(&loss, &y, labels, 2 * P);
  sbn_tensor dy = y;
  dy.data = dl[rank];
  if (st == SBN_STATUS_OK) st = sbn_nn_cross_entropy_backward(&dy, &y, labels, 2 * P);
  if (st == SBN_STATUS_OK) st = sbn_dp_backward(dp, NULL, &dy);
  EXPECT(st == SBN_STATUS_OK, "step: %s\n", sbn_last_error());
  int64_t total = 0;
  for (int i = 0; i < n; i++) total += e[i].grad ? e[i].numel : 0;
  grads[rank] = malloc(sizeof(float) * (size_t)total);
  int64_t off = 0, bias_off = -1;
  for (int i = 0; i < n; i++)
    if (e[i].grad) {
      if (!strcmp(e[i].name, "fc.bias")) bias_off = off;
      memcpy(grads[rank] + off, e[i].grad, 4 * (size_t)e[i].numel), off += e[i].numel;
    }
  sbn_group_barrier(world);
  for (int64_t i = 0; i < total; i++) {
    int same = grads[rank][i] == grads[0][i], in_bias = i >= bias_off && i < bias_off + 10;
    if (!in_bias && !same) {
      EXPECT(0, "gradient %lld differs from rank 0's after backward\n", (long long)i);
      break;
    }
  }
  if (rank != 0) EXPECT(memcmp(grads[rank] + bias_off, grads[0] + bias_off, 40) != 0, "ignored fc.bias grad was reduced\n");
  EXPECT(sbn_dp_step(dp) == SBN_STATUS_OK && sbn_dp_train_step_counter(dp) == 1, "train step counter\n");

  /* converting after wrapping is refused */
  sbn_module *again = NULL;
  st = sbn_nn_convert_sync_batchnorm(&again, model, world);
  EXPECT(st == SBN_STATUS_BAD_STATE, "convert after wrap gave %s\n", sbn_status_name(st));
  if (rank == 0) printf("  convert after wrap: %s: %s\n", sbn_status_name(st), sbn_last_error());

  /* destroying the wrapped model is refused (the wrapper writes to it when
   * destroyed); the model stays whole and wrapped */
  st = sbn_module_destroy(model);
  EXPECT(st == SBN_STATUS_BAD_STATE && strstr(sbn_last_error(), "sbn_dp_destroy") &&
             sbn_module_is_wrapped(model) == 1 && sbn_module_num_children(model) > 0,
         "destroying the wrapped model gave %s: %s\n", sbn_status_name(st), sbn_last_error());
  if (rank == 0) printf("  destroy the wrapped model: %s: %s\n", sbn_status_name(st), sbn_last_error());

  /* nor may the wrapped model become a child (a root destroyed later would
   * free it under its wrapper) */
  sbn_module *outer = NULL;
  st = sbn_nn_sequential_create(&outer);
  if (st == SBN_STATUS_OK) st = sbn_nn_sequential_append(outer, "inner", model);
  EXPECT(st == SBN_STATUS_BAD_STATE && sbn_module_num_children(outer) == 0,
         "appending the wrapped model to a Sequential gave %s: %s\n", sbn_status_name(st), sbn_last_error());
  if (rank == 0) printf("  append the wrapped model to a Sequential: %s: %s\n", sbn_status_name(st), sbn_last_error());
  sbn_module_destroy(outer);
  sbn_dp_destroy(dp);
  sbn_group_barrier(world);
  if (rank == 0) rank0_entries[0] = NULL;

  /* the group destroyed before its wrapper: the wrapper keeps the handle's
   * memory until sbn_dp_destroy (the sanitizer builds check that nothing is
   * freed twice, touched after freeing or leaked) */
  sbn_group *sub = NULL;
  sbn_dp *dp2 = NULL;
  st = sbn_group_split(&sub, world, 0, rank);
  if (st == SBN_STATUS_OK) st = sbn_dp_wrap(&dp2, model, &sgd, 1, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, sub, &o);
  EXPECT(st == SBN_STATUS_OK, "wrap over a sub-group: %s: %s\n", sbn_status_name(st), sbn_last_error());
  st = sbn_group_destroy(sub);
  EXPECT(st == SBN_STATUS_OK, "destroying the wrapper's group first gave %s\n", sbn_status_name(st));
  sbn_dp_destroy(dp2);
  if (rank == 0) printf("  the wrapper's group destroyed first, then the wrapper: %s\n", sbn_status_name(st));
  free(e), free(before);

  /* SyncBN over the world, wrapper over a half: refused on every rank of the half */
  sbn_group *half = NULL;
  int lo[2] = {0, 1}, hi[2] = {2, 3};
  sbn_status s1 = sbn_group_new(&half, world, 2, lo);
  sbn_group *other = NULL;
  sbn_status s2 = sbn_group_new(&other, world, 2, hi);
  sbn_group *mine = rank < 2 ? half : other;
  EXPECT(mine && (rank < 2 ? s1 : s2) == SBN_STATUS_OK, "new_group\n");
  sbn_dp *bad = NULL;
  st = sbn_dp_wrap(&bad, model, &sgd, 1, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, mine, &o);
  EXPECT(st == SBN_STATUS_INVALID_ARGUMENT && !bad && strstr(sbn_last_error(), "not within"),
         "SyncBN over the world under a half-group wrapper gave %s\n", sbn_status_name(st));
  if (rank == 0) printf("  SyncBN outside the wrapper's group: %s: %s\n", sbn_status_name(st), sbn_last_error());
  EXPECT(sbn_module_is_wrapped(model) == 0, "a refused wrap left the model marked wrapped\n");
  sbn_group_destroy(half), sbn_group_destroy(other);
  sbn_nn_sgd_destroy(sgd);
  sbn_module_destroy(model);
  return 0;
}

/* 2100 BatchNorm1d(1) in one child, bucket_bytes 0: 4200 one-parameter
 * buckets, all launched at once when that child's backward ends. */
enum { MANY_BN = 2100 };
static int many_buckets_main(sbn_group *world, void *arg) {
  (void)arg;
  const int rank = sbn_group_rank(world);
  sbn_module *root = NULL, *body = NULL, *m = NULL;
  sbn_bn_options bo = sbn_bn_options_default(1);
  if (sbn_nn_sequential_create(&root) || sbn_nn_sequential_create(&body)) return 1;
  for (int i = 0; i < MANY_BN; i++)
    if (sbn_nn_batchnorm_create(&m, 1, &bo) || sbn_nn_sequential_append(body, NULL, m)) return 1;
  if (sbn_nn_sequential_append(root, "body", body)) return 1;
  sbn_dp_options o = sbn_dp_options_default();
  o.bucket_bytes = 0;
  sbn_dp *dp = NULL;
  sbn_status st = sbn_dp_wrap(&dp, root, NULL, 0, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, world, &o);
  EXPECT(st == SBN_STATUS_OK, "wrap with %d one-parameter buckets: %s\n", 2 * MANY_BN, sbn_last_error());
  if (st != SBN_STATUS_OK) return sbn_module_destroy(root), 1;
  float xv[4] = {1, 2, 3, 5 + (float)rank}, dyv[4] = {1, -1, 2, 0.5f};
  const int64_t shape[2] = {4, 1};
  sbn_tensor x = sbn_tensor_cpu(xv, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), y;
  sbn_tensor dy = sbn_tensor_cpu(dyv, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  for (int step = 0; step < 3 && st == SBN_STATUS_OK; step++) {
    st = sbn_dp_forward(dp, &y, &x);
    if (st == SBN_STATUS_OK) st = sbn_dp_backward(dp, NULL, &dy);
  }
  EXPECT(st == SBN_STATUS_OK, "backward with %d buckets: %s: %s\n", sbn_dp_num_buckets(dp), sbn_status_name(st),
         sbn_last_error());
  if (rank == 0)
    printf("  %d buckets (the queue holds 4096): backward %s %s\n", sbn_dp_num_buckets(dp), sbn_status_name(st),
           sbn_last_error());
  sbn_dp_destroy(dp);
  sbn_module_destroy(root);
  return 0;
}

int main(void) {
  sbn_status st = sbn_team_run(P, rank_main, NULL);
  int bad = st != SBN_STATUS_OK;
  sbn_status st2 = sbn_team_run(P, many_buckets_main, NULL);
  bad |= st2 != SBN_STATUS_OK;
  for (int r = 0; r < P; r++) bad |= failures[r] != 0, free(grads[r]);
  printf(bad ? "FAILED (%s, %s)\n" : "wrapper contract checks passed\n", sbn_status_name(st), sbn_status_name(st2));
  return bad;
}
