/* syncbn-demo: 4 thread ranks, each holding 2 images of a (8, 16, 16, 16)
 * batch, train a SyncBatchNorm layer for 3 steps; one rank holding all 8
 * images trains a plain BatchNorm on the same data. Prints how closely the
 * two agree (outputs, input gradients, running statistics), and how far a
 * rank with local statistics would be off. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "syncbn.h"

enum { P = 4, N_PER_RANK = 2, C = 16, H = 16, W = 16, STEPS = 3 };
enum { RANK_ELEMS = N_PER_RANK * C * H * W, ALL_ELEMS = P * RANK_ELEMS };

static float x[STEPS][ALL_ELEMS], dy[STEPS][ALL_ELEMS];
static float y_sync[STEPS][ALL_ELEMS], dx_sync[STEPS][ALL_ELEMS];
static float rm_sync[C], rv_sync[C];

static float noise(unsigned *s) { /* uniform in [-1, 1) from a small LCG */
  *s = *s * 1664525u + 1013904223u;
  return (float)((*s >> 8) * (1.0 / 8388608.0) - 1.0);
}

#define TRY(call)                                                                            \
  do {                                                                                       \
    sbn_status st_ = (call);                                                                 \
    if (st_ != SBN_STATUS_OK) {                                                              \
      fprintf(stderr, "%s failed: %s: %s\n", #call, sbn_status_string(st_), sbn_last_error()); \
      return (int)st_;                                                                       \
    }                                                                                        \
  } while (0)

/* Each rank's part: images [rank*2, rank*2+2) of the batch. */
static int rank_main(sbn_group *world, void *arg) {
  (void)arg;
  int rank = sbn_group_rank(world);
  sbn_bn_options opt = sbn_bn_options_default(C);
  sbn_bn *bn;
  TRY(sbn_bn_create(&bn, &opt, world));
  int64_t shape[4] = {N_PER_RANK, C, H, W};
  for (int s = 0; s < STEPS; s++) {
    size_t off = (size_t)rank * RANK_ELEMS;
    sbn_tensor tx = sbn_tensor_cpu(x[s] + off, 4, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    sbn_tensor ty = sbn_tensor_cpu(y_sync[s] + off, 4, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    sbn_tensor tdy = sbn_tensor_cpu(dy[s] + off, 4, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    sbn_tensor tdx = sbn_tensor_cpu(dx_sync[s] + off, 4, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    TRY(sbn_bn_forward(bn, &ty, &tx));
    TRY(sbn_bn_backward(bn, &tdx, &tdy, &tx));
  }
  if (rank == 0) {
    sbn_tensor v;
    TRY(sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_RUNNING_MEAN));
    memcpy(rm_sync, v.data, sizeof rm_sync);
    TRY(sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_RUNNING_VAR));
    memcpy(rv_sync, v.data, sizeof rv_sync);
  }
  sbn_bn_destroy(bn);
  return 0;
}

static double max_diff(const float *a, const float *b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
  return m;
}

int main(void) {
  unsigned seed = 12345;
  for (int s = 0; s < STEPS; s++)
    for (size_t i = 0; i < ALL_ELEMS; i++) {
      size_t c = (i / (H * W)) % C;
      x[s][i] = (float)c * 0.5f + (1.0f + (float)c * 0.1f) * noise(&seed) + 0.3f * (float)(i / (C * H * W)); /* per-image shift */
      dy[s][i] = noise(&seed);
    }
  printf("syncbn %d.%d.%d demo: SyncBatchNorm over %d thread ranks x %d images vs BatchNorm over %d images\n",
         SYNCBN_VERSION_MAJOR, SYNCBN_VERSION_MINOR, SYNCBN_VERSION_PATCH, P, N_PER_RANK, P * N_PER_RANK);
  sbn_status st = sbn_team_run(P, rank_main, NULL);
  if (st != SBN_STATUS_OK) return fprintf(stderr, "team run failed: %s\n", sbn_status_string(st)), 1;

  /* One rank, the whole batch, plain BatchNorm (no group). And a rank that
   * normalizes its 2 images alone, to show what synchronization buys. */
  static float y1[ALL_ELEMS], dx1[ALL_ELEMS], ylocal[RANK_ELEMS];
  sbn_bn_options opt = sbn_bn_options_default(C);
  sbn_bn *bn, *local;
  TRY(sbn_bn_create(&bn, &opt, NULL));
  TRY(sbn_bn_create(&local, &opt, NULL));
  int64_t all_shape[4] = {P * N_PER_RANK, C, H, W}, rank_shape[4] = {N_PER_RANK, C, H, W};
  double worst_y = 0, worst_dx = 0, worst_local = 0;
  for (int s = 0; s < STEPS; s++) {
    sbn_tensor tx = sbn_tensor_cpu(x[s], 4, all_shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    sbn_tensor ty = sbn_tensor_cpu(y1, 4, all_shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    sbn_tensor tdy = sbn_tensor_cpu(dy[s], 4, all_shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    sbn_tensor tdx = sbn_tensor_cpu(dx1, 4, all_shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    TRY(sbn_bn_forward(bn, &ty, &tx));
    TRY(sbn_bn_backward(bn, &tdx, &tdy, &tx));
    worst_y = fmax(worst_y, max_diff(y1, y_sync[s], ALL_ELEMS));
    worst_dx = fmax(worst_dx, max_diff(dx1, dx_sync[s], ALL_ELEMS));
    sbn_tensor lx = sbn_tensor_cpu(x[s], 4, rank_shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    sbn_tensor ly = sbn_tensor_cpu(ylocal, 4, rank_shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    TRY(sbn_bn_forward(local, &ly, &lx));
    worst_local = fmax(worst_local, max_diff(ylocal, y1, RANK_ELEMS));
  }
  sbn_tensor rm, rv;
  TRY(sbn_bn_tensor(&rm, bn, SBN_BN_TENSOR_RUNNING_MEAN));
  TRY(sbn_bn_tensor(&rv, bn, SBN_BN_TENSOR_RUNNING_VAR));
  double worst_stats = fmax(max_diff(rm.data, rm_sync, C), max_diff(rv.data, rv_sync, C));
  printf("  after %d training steps, max |difference| between the %d-rank SyncBN and 1-rank BatchNorm:\n", STEPS, P);
  printf("    outputs y          %.2e\n", worst_y);
  printf("    input gradients dx %.2e\n", worst_dx);
  printf("    running mean/var   %.2e\n", worst_stats);
  printf("  a rank normalizing its %d images alone would be off by %.2e\n", N_PER_RANK, worst_local);
  int agree = worst_y < 2e-6 && worst_dx < 1e-5 && worst_stats < 1e-5;
  printf("  %s\n", agree ? "AGREE: synchronized ranks behave like one rank with the whole batch"
                         : "DISAGREE: this is a bug");
  sbn_bn_destroy(bn);
  sbn_bn_destroy(local);
  return agree ? 0 : 1;
}
