/* The equivalence that matters: P ranks x per-rank batch B with SyncBN and
 * the data-parallel wrapper train exactly like 1 rank x batch P*B with
 * BatchNorm: same losses and same parameters after K SGD steps (momentum,
 * weight decay), with an uneven last batch (ranks get different N).
 *
 *   test_dp_equivalence P        P thread ranks (P = 2, 4 in make test)
 *   mpirun -np P test_dp_equivalence   P MPI processes (when built with MPI)
 *
 * Tolerance: both runs compute in float32 with float64 BN statistics, but
 * the convolution and linear weight gradients are summed over the batch in a
 * different order (per rank, then across ranks), so they differ by float32
 * rounding (~1e-7 relative) per step; after K = 3 steps of SGD with momentum
 * at lr 0.05 that stays far below 1e-4 of the largest parameter, and losses
 * agree within 1e-5 relative. A missing sync (local BN) or a wrong gradient
 * reduction is off by 1e-2 or more (checked by the negative control below). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../tools/train/model.h"
#include "syncbn_dp.h"
#ifdef SBN_TEST_WITH_MPI
#include "syncbn_mpi.h"
#endif

enum { K = 3, C_IN = 3, H = 8, W = 8, CLASSES = 10, MAXP = 8 };
static const int global_batch[K] = {16, 16, 11}; /* the last is uneven */

static float images[K][16 * C_IN * H * W];
static int64_t labels[K][16];

typedef struct outcome {
  double loss[K];
  float *params; /* final parameters, concatenated */
  int64_t nparams;
} outcome;

static void make_data(void) {
  uint64_t s = 99;
  for (int k = 0; k < K; k++)
    for (int i = 0; i < 16; i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      labels[k][i] = (int64_t)(s >> 33) % CLASSES;
      double amp = 0.5 + 0.2 * (double)labels[k][i];
      for (int p = 0; p < C_IN * H * W; p++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        images[k][i * C_IN * H * W + p] = (float)(amp * (((double)(s >> 11) * 0x1.0p-53) - 0.5) + 0.1 * p / 64.0);
      }
    }
}

/* Train K steps on `group` (NULL: one rank, the whole batch, plain BN). */
static int train(sbn_group *group, int sync, outcome *out) {
  const int P = group ? sbn_group_size(group) : 1, r = group ? sbn_group_rank(group) : 0;
  sbn_module *model = NULL, *conv = NULL;
  sbn_nn_sgd *sgd = NULL;
  sbn_dp *dp = NULL;
  sbn_status st = build_resnet(&model, C_IN, 4, CLASSES, 5);
  if (st == SBN_STATUS_OK && sync && group) {
    st = sbn_nn_convert_sync_batchnorm(&conv, model, group);
    if (st == SBN_STATUS_OK) model = conv;
  }
  sbn_nn_sgd_options so = {0.05, 0.9, 0.0, 1e-3, 0};
  if (st == SBN_STATUS_OK) st = sbn_nn_sgd_create(&sgd, model, &so);
  sbn_dp_options o = sbn_dp_options_default();
  o.reduce = SBN_DP_REDUCE_SUM;
  o.bucket_bytes = 2048; /* several buckets, started during backward */
  if (st == SBN_STATUS_OK && group) st = sbn_dp_wrap(&dp, model, &sgd, 1, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, group, &o);
  float dlogits[16 * CLASSES];
  for (int k = 0; k < K && st == SBN_STATUS_OK; k++) {
    const int m = global_batch[k], lo = m * r / P, hi = m * (r + 1) / P;
    int64_t shape[4] = {hi - lo, C_IN, H, W};
    sbn_tensor x = sbn_tensor_cpu(images[k] + (size_t)lo * C_IN * H * W, 4, shape, SBN_DTYPE_FLOAT32,
                                  SBN_LAYOUT_CHANNELS_FIRST), y = {0};
    double loss = 0;
    st = group ? sbn_dp_zero_grad(dp) : sbn_module_zero_grad(model);
    if (st == SBN_STATUS_OK) st = group ? sbn_dp_forward(dp, &y, &x) : sbn_module_forward(model, &y, &x);
    if (st == SBN_STATUS_OK) st = sbn_nn_cross_entropy_forward(&loss, &y, labels[k] + lo, m);
    sbn_tensor dy = y, dx;
    dy.data = dlogits;
    if (st == SBN_STATUS_OK) st = sbn_nn_cross_entropy_backward(&dy, &y, labels[k] + lo, m);
    if (st == SBN_STATUS_OK) st = group ? sbn_dp_backward(dp, NULL, &dy) : sbn_module_backward(model, &dx, &dy);
    if (st == SBN_STATUS_OK) st = group ? sbn_dp_step(dp) : sbn_nn_sgd_step(sgd);
    if (st == SBN_STATUS_OK && group) st = sbn_group_allreduce(group, &loss, 1, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
    out->loss[k] = loss;
  }
  sbn_nn_entry *e = NULL;
  int n = 0;
  if (st == SBN_STATUS_OK) st = sbn_module_entries(&e, &n, model, SBN_NN_PARAMETERS);
  if (st == SBN_STATUS_OK) {
    out->nparams = 0;
    for (int i = 0; i < n; i++) out->nparams += e[i].numel;
    out->params = malloc(sizeof(float) * (size_t)out->nparams);
    int64_t off = 0;
    for (int i = 0; i < n; i++, off += e[i - 1].numel) memcpy(out->params + off, e[i].data, 4 * (size_t)e[i].numel);
  }
  if (st != SBN_STATUS_OK) fprintf(stderr, "rank %d: %s: %s\n", r, sbn_status_name(st), sbn_last_error());
  free(e);
  sbn_dp_destroy(dp);
  sbn_nn_sgd_destroy(sgd);
  sbn_module_destroy(model);
  return st != SBN_STATUS_OK;
}

static outcome ranks_out[MAXP];
static int sync_mode = 1;

static int rank_main(sbn_group *world, void *arg) {
  (void)arg;
  return train(world, sync_mode, &ranks_out[sbn_group_rank(world)]);
}

/* Compare rank 0's outcome with the single-rank run; returns 1 on failure
 * (or, for the negative control, on success). */
static int compare(const outcome *multi, const outcome *single, int P, const char *how, int expect_equal) {
  double loss_err = 0, param_err = 0, pmax = 0;
  for (int k = 0; k < K; k++) loss_err = fmax(loss_err, fabs(multi->loss[k] - single->loss[k]) / fabs(single->loss[k]));
  for (int64_t i = 0; i < single->nparams; i++) {
    param_err = fmax(param_err, fabs((double)multi->params[i] - single->params[i]));
    pmax = fmax(pmax, fabs(single->params[i]));
  }
  param_err /= pmax;
  int equal = loss_err <= 1e-5 && param_err <= 1e-4;
  printf("  %s, P=%d: losses %.5f %.5f %.5f vs one rank %.5f %.5f %.5f\n", how, P, multi->loss[0], multi->loss[1],
         multi->loss[2], single->loss[0], single->loss[1], single->loss[2]);
  printf("    loss rel err %.2e (tol 1e-5), parameter err %.2e of max |param| (tol 1e-4): %s\n", loss_err, param_err,
         equal == expect_equal ? "ok" : "FAIL");
  return equal != expect_equal;
}

int main(int argc, char **argv) {
  make_data();
  outcome single;
  memset(&single, 0, sizeof single);
  if (train(NULL, 0, &single)) return 1;
#ifdef SBN_TEST_WITH_MPI
  if (getenv("OMPI_COMM_WORLD_SIZE")) {
    MPI_Init(&argc, &argv);
    sbn_group *world;
    if (sbn_group_from_mpi(&world, MPI_COMM_WORLD) != SBN_STATUS_OK) return 1;
    int P = sbn_group_size(world), rank = sbn_group_rank(world);
    int bad = train(world, 1, &ranks_out[0]);
    if (!bad && rank == 0) bad = compare(&ranks_out[0], &single, P, "MPI ranks, SyncBN + wrapper", 1);
    sbn_group_destroy(world);
    MPI_Finalize();
    free(ranks_out[0].params), free(single.params);
    if (rank == 0) printf(bad ? "FAILED\n" : "data-parallel equivalence holds over MPI\n");
    return bad;
  }
#endif
  int P = argc > 1 ? atoi(argv[1]) : 2;
  if (P < 2 || P > MAXP) return fprintf(stderr, "P must be in [2, %d]\n", MAXP), 2;
  int bad = 0;
  sbn_status st = sbn_team_run(P, rank_main, NULL);
  if (st != SBN_STATUS_OK) return fprintf(stderr, "team run: %s\n", sbn_status_name(st)), 1;
  bad |= compare(&ranks_out[0], &single, P, "thread ranks, SyncBN + wrapper", 1);
  for (int r = 1; r < P; r++) /* every rank ends with the same parameters */
    if (memcmp(ranks_out[r].params, ranks_out[0].params, 4 * (size_t)single.nparams) != 0) {
      printf("  rank %d's parameters differ from rank 0's: FAIL\n", r);
      bad = 1;
    }
  for (int r = 0; r < P; r++) free(ranks_out[r].params);
  sync_mode = 0; /* negative control: local BN must NOT match */
  st = sbn_team_run(P, rank_main, NULL);
  if (st != SBN_STATUS_OK) return 1;
  bad |= compare(&ranks_out[0], &single, P, "negative control, local BN + wrapper", 0);
  for (int r = 0; r < P; r++) free(ranks_out[r].params);
  free(single.params);
  printf(bad ? "FAILED\n" : "data-parallel equivalence holds (and the control differs)\n");
  return bad;
}
