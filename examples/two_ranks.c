/* Two thread ranks synchronize one SyncBatchNorm layer (the README example). */
#include <stdio.h>

#include "syncbn.h"

static int rank_main(sbn_group *world, void *arg) {
  (void)arg;
  int rank = sbn_group_rank(world);
  float x[2 * 3], y[2 * 3], dy[2 * 3] = {1, 0, -1, 0.5f, 0.25f, 2}, dx[2 * 3];
  for (int i = 0; i < 6; i++) x[i] = (float)(i + 10 * rank); /* rank 1 sees larger values */
  int64_t shape[2] = {2, 3};                                  /* (N, C): 2 samples, 3 channels */
  sbn_tensor tx = sbn_tensor_cpu(x, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_tensor ty = sbn_tensor_cpu(y, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_tensor tdy = sbn_tensor_cpu(dy, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_tensor tdx = sbn_tensor_cpu(dx, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);

  sbn_bn_options opt = sbn_bn_options_default(3); /* eps 1e-5, momentum 0.1, affine */
  sbn_bn *bn;
  sbn_status st = sbn_bn_create(&bn, &opt, world);
  if (st == SBN_STATUS_OK) st = sbn_bn_forward(bn, &ty, &tx);      /* statistics of all 4 samples */
  if (st == SBN_STATUS_OK) st = sbn_bn_backward(bn, &tdx, &tdy, &tx);
  if (st != SBN_STATUS_OK) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, sbn_status_string(st), sbn_last_error());
  } else {
    sbn_tensor rm;
    sbn_bn_tensor(&rm, bn, SBN_BN_TENSOR_RUNNING_MEAN);
    printf("rank %d: y[0] = %+.4f, running_mean[0] = %.3f (same on both ranks)\n", rank, y[0],
           ((float *)rm.data)[0]);
  }
  sbn_bn_destroy(bn);
  return (int)st;
}

int main(void) {
  sbn_status st = sbn_team_run(2, rank_main, NULL); /* 2 threads, one rank each */
  return st == SBN_STATUS_OK ? 0 : 1;
}
