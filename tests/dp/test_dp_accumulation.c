/* Gradient accumulation through the data-parallel wrapper: M backwards
 * (micro-batches) before one step must leave each parameter's gradient
 * equal to one process's over the concatenation of every rank's
 * micro-batches, in both reduce modes:
 *   SBN_DP_REDUCE_SUM:     each rank divides its loss by the global count;
 *   SBN_DP_REDUCE_AVERAGE: by its own count (equal batches).
 * A backward reduces only the gradients it computes; reducing the
 * accumulated ones would count the earlier micro-batches P times under SUM
 * (each backward again: 0.56 off where the largest gradient is 0.17, P = 3).
 *
 * Tolerance: both sides sum in float32 in different orders (per rank, then
 * across ranks): ~1e-7 relative per term; 1e-5 of the largest gradient. The
 * error being caught is of the size of the gradients themselves.
 *
 *   test_dp_accumulation     (2 and 3 thread ranks, 3 micro-batches) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "syncbn_dp.h"

enum { MAXP = 3, N = 4, D = 5, HIDDEN = 6, K = 3, M = 3, MAXG = 256 };

static float X[M][MAXP * N * D];
static int64_t labels[M][MAXP * N];
static float ref[MAXG];
static int nref;

static sbn_status build(sbn_module **out) {
  sbn_module *net = NULL, *m = NULL;
  sbn_status st = sbn_nn_sequential_create(&net);
  if (st == SBN_STATUS_OK) st = sbn_nn_linear_create(&m, D, HIDDEN, 1, 7);
  if (st == SBN_STATUS_OK) st = sbn_nn_sequential_append(net, NULL, m);
  if (st == SBN_STATUS_OK) st = sbn_nn_relu_create(&m);
  if (st == SBN_STATUS_OK) st = sbn_nn_sequential_append(net, NULL, m);
  if (st == SBN_STATUS_OK) st = sbn_nn_linear_create(&m, HIDDEN, K, 1, 8);
  if (st == SBN_STATUS_OK) st = sbn_nn_sequential_append(net, NULL, m);
  *out = net;
  return st;
}

static int grads_of(sbn_module *net, float *out) {
  sbn_nn_entry *e = NULL;
  int c = 0, n = 0;
  if (sbn_module_entries(&e, &c, net, SBN_NN_PARAMETERS) != SBN_STATUS_OK) return -1;
  for (int i = 0; i < c; i++)
    for (int64_t j = 0; j < e[i].numel && n < MAXG; j++) out[n++] = e[i].grad[j];
  free(e);
  return n;
}

/* One micro-batch: forward, cross-entropy divided by `div`, backward. */
static sbn_status micro(sbn_module *net, sbn_dp *dp, const float *x, const int64_t *t, int n, double div) {
  int64_t sh[2] = {n, D};
  sbn_tensor xt = sbn_tensor_cpu((void *)x, 2, sh, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), y, dx;
  float dl[MAXP * N * K];
  sbn_status st = dp ? sbn_dp_forward(dp, &y, &xt) : sbn_module_forward(net, &y, &xt);
  sbn_tensor dlt = sbn_tensor_cpu(dl, 2, y.shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  if (st == SBN_STATUS_OK) st = sbn_nn_cross_entropy_backward(&dlt, &y, t, div);
  if (st == SBN_STATUS_OK) st = dp ? sbn_dp_backward(dp, NULL, &dlt) : sbn_module_backward(net, &dx, &dlt);
  return st;
}

static sbn_dp_reduce mode;
static double worst[MAXP];
static int failed_rank[MAXP];

static int rank_main(sbn_group *g, void *arg) {
  (void)arg;
  const int P = sbn_group_size(g), r = sbn_group_rank(g);
  sbn_module *net = NULL;
  sbn_dp *dp = NULL;
  sbn_dp_options o = sbn_dp_options_default();
  o.reduce = mode;
  o.bucket_bytes = 64; /* several buckets */
  sbn_status st = build(&net);
  if (st == SBN_STATUS_OK) st = sbn_dp_wrap(&dp, net, NULL, 0, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, g, &o);
  if (st == SBN_STATUS_OK) st = sbn_dp_zero_grad(dp);
  const double div = mode == SBN_DP_REDUCE_SUM ? (double)M * P * N : (double)M * N;
  for (int mb = 0; st == SBN_STATUS_OK && mb < M; mb++)
    st = micro(net, dp, X[mb] + r * N * D, labels[mb] + r * N, N, div);
  float got[MAXG];
  const int n = st == SBN_STATUS_OK ? grads_of(net, got) : -1;
  failed_rank[r] = st != SBN_STATUS_OK || n != nref;
  if (failed_rank[r]) fprintf(stderr, "rank %d: %s\n", r, sbn_last_error());
  double w = 0;
  for (int i = 0; i < n && i < nref; i++) w = fmax(w, fabs((double)got[i] - (double)ref[i]));
  worst[r] = w;
  sbn_dp_destroy(dp);
  sbn_module_destroy(net);
  return 0;
}

int main(void) {
  for (int mb = 0; mb < M; mb++)
    for (int i = 0; i < MAXP * N * D; i++) X[mb][i] = (float)sin(0.7 * (mb * MAXP * N * D + i) + 0.3);
  for (int mb = 0; mb < M; mb++)
    for (int i = 0; i < MAXP * N; i++) labels[mb][i] = (mb + i) % K;
  int failures = 0;
  for (int P = 2; P <= MAXP; P++) {
    /* the reference: one process, the ranks' micro-batches concatenated */
    sbn_module *net = NULL;
    if (build(&net) != SBN_STATUS_OK || sbn_module_zero_grad(net) != SBN_STATUS_OK) return 1;
    for (int mb = 0; mb < M; mb++)
      if (micro(net, NULL, X[mb], labels[mb], P * N, (double)M * P * N) != SBN_STATUS_OK) return 1;
    nref = grads_of(net, ref);
    sbn_module_destroy(net);
    double gmax = 0;
    for (int i = 0; i < nref; i++) gmax = fmax(gmax, fabs(ref[i]));
    const double tol = 1e-5 * gmax;
    for (int k = 0; k < 2; k++) {
      mode = k ? SBN_DP_REDUCE_SUM : SBN_DP_REDUCE_AVERAGE;
      if (sbn_team_run(P, rank_main, NULL) != SBN_STATUS_OK) {
        printf("FAIL P=%d: the ranks did not run: %s\n", P, sbn_last_error());
        failures++;
        continue;
      }
      for (int r = 0; r < P; r++) {
        const int ok = !failed_rank[r] && worst[r] <= tol;
        failures += !ok;
        printf("%-4s P=%d %-7s %d micro-batches, rank %d: max |grad - one process| %.2e (tol %.2e; largest "
               "gradient %.2e)\n",
               ok ? "ok" : "FAIL", P, k ? "SUM" : "AVERAGE", M, r, worst[r], tol, gmax);
      }
    }
  }
  if (failures) {
    printf("FAILED: %d checks\n", failures);
    return 1;
  }
  printf("all gradient-accumulation checks passed\n");
  return 0;
}
