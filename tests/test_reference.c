/* Single-rank kernels (group NULL) against the float64 reference: y, dx,
 * grad_weight, grad_bias, running statistics and num_batches_tracked, over
 * all layouts and dims, standard-normal data and channels whose mean is 1e4
 * times their standard deviation (float32 BatchNorm misses those by ~1e-3).
 * Also: gradients accumulate across backward calls until zero_grad. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bn_case.h"

static int fixed_case(int ndim, const int64_t *shape, sbn_layout layout, double scale, double mom,
                      int affine, int track, uint64_t seed) {
  case_cfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.P = 1;
  cfg.ndim = ndim;
  memcpy(cfg.shape[0], shape, sizeof(int64_t) * (size_t)ndim);
  cfg.layout = layout;
  cfg.opt = sbn_bn_options_default(shape[1]);
  cfg.opt.momentum = mom;
  cfg.opt.affine = affine;
  cfg.opt.track_running_stats = track;
  cfg.steps = 3;
  cfg.mean_scale = scale;
  cfg.seed = seed;
  case_err e;
  char desc[512];
  int bad = case_run(&cfg, &e, NULL, NULL);
  printf("%-4s %s\n", bad ? "FAIL" : "ok", case_describe(desc, sizeof desc, &cfg));
  bad |= check("y (abs)", e.y, TOL_Y);
  bad |= check("dx (relative to max |dx|)", e.dx, TOL_DX_REL);
  bad |= check("grad_weight (rel)", e.gw, 1e-6);
  bad |= check("grad_bias (rel)", e.gb, 1e-6);
  bad |= check("running_mean (rel)", e.rm, 1e-6);
  bad |= check("running_var (rel)", e.rv, 1e-6);
  return bad;
}

/* Two backward calls without zero_grad accumulate exactly twice the gradient. */
static int accumulation(void) {
  int64_t shape[4] = {3, 4, 5, 5};
  rank_data d;
  rank_data_alloc(&d, 4, shape, SBN_LAYOUT_CHANNELS_FIRST);
  rng r = rng_seed(7);
  double mean[4] = {1, -2, 3, 0.5}, std[4] = {1, 2, 0.5, 3};
  rank_data_fill(&d, &r, mean, std);
  sbn_bn_options o = sbn_bn_options_default(4);
  sbn_bn *bn;
  CHECK_OK(sbn_bn_create(&bn, &o, NULL));
  sbn_tensor x = rank_tensor(&d, d.x), y = rank_tensor(&d, d.y), dy = rank_tensor(&d, d.dy),
             dx = rank_tensor(&d, d.dx);
  CHECK_OK(sbn_bn_forward(bn, &y, &x));
  CHECK_OK(sbn_bn_backward(bn, &dx, &dy, &x));
  sbn_tensor gw;
  CHECK_OK(sbn_bn_tensor(&gw, bn, SBN_BN_TENSOR_GRAD_WEIGHT));
  float once[4];
  memcpy(once, gw.data, sizeof once);
  CHECK_OK(sbn_bn_backward(bn, NULL, &dy, &x)); /* dx NULL allowed */
  double err = 0;
  for (int c = 0; c < 4; c++) err = fmax(err, fabs(((float *)gw.data)[c] - 2.0 * once[c]));
  int bad = check("grad_weight accumulates (2x after two backwards)", err, 1e-5);
  CHECK_OK(sbn_bn_zero_grad(bn));
  err = 0;
  for (int c = 0; c < 4; c++) err = fmax(err, fabs(((float *)gw.data)[c]));
  bad |= check("zero_grad clears", err, 0);
  bad |= check("grad_weight nonzero before (evidence)", once[0] != 0 ? 0 : 1, 0);
  sbn_bn_destroy(bn);
  rank_data_free(&d);
  return bad;
}

int main(void) {
  int bad = 0;
  /* The last two are large enough for several work units and threads: the
   * rows layout's register blocks of 16 channels with a remainder of 3
   * (5x19x23x29) and of 4 + 3 (2-D 2001x35), and rows left over after the
   * 8-row steps. */
  static const int64_t shapes[][5] = {
      {16, 8}, {4, 6, 33}, {2, 5, 7, 9}, {2, 3, 3, 4, 5}, {8, 16, 32, 32}, {12, 3, 2}, {5, 19, 23, 29}, {2001, 35}};
  static const int ndims[] = {2, 3, 4, 5, 4, 3, 4, 2};
  uint64_t seed = 1;
  for (int i = 0; i < 8; i++)
    for (int layout = 0; layout < 2; layout++)
      for (int sc = 0; sc < 2; sc++) {
        bad |= fixed_case(ndims[i], shapes[i], (sbn_layout)layout, sc ? 1e4 : 1.0, sc ? SBN_MOMENTUM_CUMULATIVE : 0.1,
                          1, 1, seed++);
      }
  int64_t s4[4] = {4, 3, 6, 6};
  bad |= fixed_case(4, s4, SBN_LAYOUT_CHANNELS_FIRST, 1.0, 0.3, 0, 1, 99);
  bad |= fixed_case(4, s4, SBN_LAYOUT_CHANNELS_LAST, 1.0, 0.1, 1, 0, 100);
  bad |= fixed_case(4, s4, SBN_LAYOUT_CHANNELS_LAST, 1e4, 0.1, 0, 0, 101);
  bad |= accumulation();
  printf(bad ? "\nFAILED\n" : "\nall reference checks passed\n");
  return bad;
}
