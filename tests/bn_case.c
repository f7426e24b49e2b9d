#include "bn_case.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Tolerances. The library computes in float64 and rounds once to float32,
 * so its outputs sit within a few float32 ulps of the float64 reference:
 *  y:  |y| <= ~8 in training (weights in [0.5, 1.5], |x_hat| < 6) -> ulp
 *      5e-7; TOL_Y = 2e-6 (the bound) leaves 4 ulps. Measured as
 *      |y - ref| / max(1, |ref|) (see y_err).
 *  dx: relative to max|dx| (dx mixes terms of that size): 1e-5.
 *  gw, gb, running stats: float32 rounding of a float64 sum, relative to
 *      the value's magnitude (plus 1 for values near 0): 1e-6.
 * A kernel that accumulated in float32 or lost the shift would miss these by
 * orders of magnitude on the mean_scale = 1e4 cases. */
#define TOL_REL 1e-6

typedef struct step_rec { /* what one rank recorded after one step */
  float *gw, *gb, *rm, *rv;
  int64_t nbt;
} step_rec;

typedef struct ctx {
  const case_cfg *cfg;
  rank_data data[CASE_MAX_STEPS + 1][CASE_MAX_RANKS];
  step_rec rec[CASE_MAX_STEPS + 1][CASE_MAX_RANKS];
  float *w, *b;
  int failed;
} ctx;

static int nsteps(const case_cfg *cfg) { return cfg->steps + 1; }

void case_random(case_cfg *cfg, rng *r, int P, int halves) {
  memset(cfg, 0, sizeof *cfg);
  cfg->P = P;
  cfg->halves = halves && P >= 2;
  cfg->ndim = rng_int(r, 2, 5);
  cfg->layout = rng_int(r, 0, 1) ? SBN_LAYOUT_CHANNELS_LAST : SBN_LAYOUT_CHANNELS_FIRST;
  int64_t C = rng_int(r, 1, 7);
  cfg->opt = sbn_bn_options_default(C);
  cfg->opt.affine = rng_int(r, 0, 3) != 0;
  cfg->opt.track_running_stats = rng_int(r, 0, 3) != 0;
  static const double moms[] = {0.1, 0.3, SBN_MOMENTUM_CUMULATIVE};
  cfg->opt.momentum = moms[rng_int(r, 0, 2)];
  cfg->steps = rng_int(r, 1, 3);
  cfg->mean_scale = rng_int(r, 0, 4) == 0 ? 1e4 : 1.0;
  cfg->seed = rng_u64(r);
  int same_spatial = rng_int(r, 0, 2) != 0;
  int64_t sp[SBN_MAX_DIMS];
  for (int i = 2; i < cfg->ndim; i++) sp[i] = rng_int(r, 1, cfg->ndim >= 4 ? 3 : 5);
  for (int p = 0; p < P; p++) {
    cfg->shape[p][0] = rng_int(r, 0, 3) == 0 ? 0 : rng_int(r, 1, 4); /* empty ranks happen */
    cfg->shape[p][1] = C;
    for (int i = 2; i < cfg->ndim; i++) cfg->shape[p][i] = same_spatial ? sp[i] : rng_int(r, 1, 3);
  }
  /* Without tracking, eval uses each rank's own batch: every rank needs more
   * than one value. Otherwise each group's count must exceed 1. */
  for (int half = 0; half < (cfg->halves ? 2 : 1); half++) {
    int lo = cfg->halves && half ? P / 2 : 0, hi = cfg->halves && !half ? P / 2 : P;
    int64_t total = 0;
    for (int p = lo; p < hi; p++) {
      if (!cfg->opt.track_running_stats && cfg->shape[p][0] < 2) cfg->shape[p][0] = 2;
      int64_t cnt = cfg->shape[p][0];
      for (int i = 2; i < cfg->ndim; i++) cnt *= cfg->shape[p][i];
      total += cnt;
    }
    if (total <= 1) cfg->shape[lo][0] = 2;
    /* Ill-conditioned channels: enough values per group that the batch's
     * own std is near the population's (a 2-value batch can have any
     * mean/std ratio, beyond what the float64 sum-reduction resolves). */
    if (cfg->mean_scale > 1 && total < 24) cfg->shape[lo][0] += 24;
  }
}

const char *case_describe(char *buf, size_t cap, const case_cfg *cfg) {
  int len = snprintf(buf, cap, "P=%d%s %dD %s C=%lld affine=%d track=%d mom=%s steps=%d scale=%g N={",
                     cfg->P, cfg->halves ? "(2 groups)" : "", cfg->ndim,
                     cfg->layout == SBN_LAYOUT_CHANNELS_LAST ? "CL" : "CF",
                     (long long)cfg->opt.num_features, cfg->opt.affine, cfg->opt.track_running_stats,
                     cfg->opt.momentum == SBN_MOMENTUM_CUMULATIVE ? "none" : cfg->opt.momentum == 0.1 ? "0.1" : "0.3",
                     cfg->steps, cfg->mean_scale);
  for (int p = 0; p < cfg->P && len < (int)cap; p++)
    len += snprintf(buf + len, cap - len, "%s%lld", p ? "," : "", (long long)cfg->shape[p][0]);
  if (len < (int)cap) len += snprintf(buf + len, cap - len, "} S={");
  for (int p = 0; p < cfg->P && len < (int)cap; p++) {
    int64_t s = 1;
    for (int i = 2; i < cfg->ndim; i++) s *= cfg->shape[p][i];
    len += snprintf(buf + len, cap - len, "%s%lld", p ? "," : "", (long long)s);
  }
  if (len < (int)cap) snprintf(buf + len, cap - len, "}");
  return buf;
}

const case_device *case_dev;

static void copy_param(float **dst, sbn_bn *bn, sbn_bn_tensor_id id, int64_t C) {
  sbn_tensor v;
  if (sbn_bn_tensor(&v, bn, id) != SBN_STATUS_OK) return;
  *dst = malloc(sizeof(float) * (size_t)C);
  if (case_dev) case_dev->download(*dst, v.data, sizeof(float) * (size_t)C);
  else memcpy(*dst, v.data, sizeof(float) * (size_t)C);
}

static void set_param(sbn_bn *bn, sbn_bn_tensor_id id, const float *src, int64_t C) {
  sbn_tensor v;
  if (sbn_bn_tensor(&v, bn, id) != SBN_STATUS_OK) return;
  if (case_dev) case_dev->upload(v.data, src, sizeof(float) * (size_t)C);
  else memcpy(v.data, src, sizeof(float) * (size_t)C);
}

/* One step of a rank on the layer's device: x and dy uploaded, y and dx
 * (poisoned on the host) uploaded too so unwritten elements show, the
 * results brought back into d->y and d->dx. */
static int device_step(sbn_bn *bn, rank_data *d) {
  const size_t bytes = sizeof(float) * (size_t)(d->numel ? d->numel : 1);
  float *host[4] = {d->x, d->dy, d->y, d->dx};
  void *dev[4];
  for (int i = 0; i < 4; i++) {
    dev[i] = case_dev->alloc(bytes);
    case_dev->upload(dev[i], host[i], bytes);
  }
  sbn_tensor x = rank_tensor(d, dev[0]), dy = rank_tensor(d, dev[1]), y = rank_tensor(d, dev[2]);
  sbn_tensor dx = rank_tensor(d, dev[3]);
  x.device = dy.device = y.device = dx.device = case_dev->device;
  sbn_status st = sbn_bn_forward(bn, &y, &x);
  if (st == SBN_STATUS_OK) st = sbn_bn_backward(bn, &dx, &dy, &x);
  if (st == SBN_STATUS_OK) case_dev->download(d->y, dev[2], bytes), case_dev->download(d->dx, dev[3], bytes);
  for (int i = 0; i < 4; i++) case_dev->release(dev[i]);
  CHECK_OK(st);
  return 0;
}

/* Which group a rank synchronizes with: the world, or its half. */
static void group_range(const case_cfg *cfg, int rank, int *lo, int *hi) {
  if (!cfg->halves) *lo = 0, *hi = cfg->P;
  else if (rank < cfg->P / 2) *lo = 0, *hi = cfg->P / 2;
  else *lo = cfg->P / 2, *hi = cfg->P;
}

static int rank_main(sbn_group *world, void *arg) {
  ctx *cx = arg;
  const case_cfg *cfg = cx->cfg;
  const int rank = sbn_group_rank(world);
  const int64_t C = cfg->opt.num_features;
  sbn_group *group = world, *sub = NULL;
  if (cfg->halves) { /* every rank calls new_group for both halves */
    int lo_ranks[CASE_MAX_RANKS], hi_ranks[CASE_MAX_RANKS], h = cfg->P / 2;
    for (int i = 0; i < cfg->P; i++) {
      if (i < h) lo_ranks[i] = i;
      else hi_ranks[i - h] = i;
    }
    sbn_group *a = NULL, *b = NULL;
    sbn_status sa = sbn_group_new(&a, world, h, lo_ranks);
    sbn_status sb = sbn_group_new(&b, world, cfg->P - h, hi_ranks);
    if ((rank < h) != (sa == SBN_STATUS_OK) || (rank >= h) != (sb == SBN_STATUS_OK)) {
      fprintf(stderr, "rank %d: new_group results wrong: %s / %s\n", rank, sbn_status_name(sa),
              sbn_status_name(sb));
      return 1;
    }
    sub = rank < h ? a : b;
    group = sub;
  }
  sbn_bn *bn;
  sbn_bn_options opt = cfg->opt;
  if (case_dev) opt.device = case_dev->device;
  CHECK_OK(sbn_bn_create(&bn, &opt, group));
  if (case_dev && case_dev->rank_begin && case_dev->rank_begin(bn, rank) != 0) return 1;
  if (cfg->opt.affine) {
    set_param(bn, SBN_BN_TENSOR_WEIGHT, cx->w, C);
    set_param(bn, SBN_BN_TENSOR_BIAS, cx->b, C);
  }
  for (int s = 0; s < nsteps(cfg); s++) {
    rank_data *d = &cx->data[s][rank];
    CHECK_OK(sbn_bn_set_training(bn, s < cfg->steps));
    CHECK_OK(sbn_bn_zero_grad(bn));
    if (case_dev) {
      if (device_step(bn, d) != 0) return 1;
    } else {
      sbn_tensor x = rank_tensor(d, d->x), y = rank_tensor(d, d->y);
      sbn_tensor dy = rank_tensor(d, d->dy), dx = rank_tensor(d, d->dx);
      CHECK_OK(sbn_bn_forward(bn, &y, &x));
      CHECK_OK(sbn_bn_backward(bn, &dx, &dy, &x));
    }
    step_rec *rec = &cx->rec[s][rank];
    copy_param(&rec->gw, bn, SBN_BN_TENSOR_GRAD_WEIGHT, C);
    copy_param(&rec->gb, bn, SBN_BN_TENSOR_GRAD_BIAS, C);
    copy_param(&rec->rm, bn, SBN_BN_TENSOR_RUNNING_MEAN, C);
    copy_param(&rec->rv, bn, SBN_BN_TENSOR_RUNNING_VAR, C);
    if (cfg->opt.track_running_stats) CHECK_OK(sbn_bn_get_num_batches_tracked(bn, &rec->nbt));
  }
  sbn_bn_destroy(bn);
  if (case_dev && case_dev->rank_end) case_dev->rank_end(rank);
  sbn_group_destroy(sub);
  return 0;
}

#define WORST(field, v) \
  do {                  \
    double v_ = (v);    \
    if (!(v_ <= err->field)) err->field = v_; \
  } while (0)

/* Plain BatchNorm (group NULL) on the concatenated batch of ranks [lo, hi)
 * for every step; compares y and dx with the P-rank outputs. */
static void compare_single(ctx *cx, int lo, int hi, case_err *err) {
  const case_cfg *cfg = cx->cfg;
  for (int p = lo; p < hi; p++)
    for (int i = 2; i < cfg->ndim; i++)
      if (cfg->shape[p][i] != cfg->shape[lo][i]) return; /* not concatenable */
  if (!cfg->opt.track_running_stats) return; /* eval would use the concatenation's stats */
  int64_t shape[SBN_MAX_DIMS];
  memcpy(shape, cfg->shape[lo], sizeof shape);
  shape[0] = 0;
  for (int p = lo; p < hi; p++) shape[0] += cfg->shape[p][0];
  rank_data all;
  rank_data_alloc(&all, cfg->ndim, shape, cfg->layout);
  sbn_bn *bn;
  if (sbn_bn_create(&bn, &cfg->opt, NULL) != SBN_STATUS_OK) {
    err->single = INFINITY;
    return;
  }
  sbn_tensor v;
  if (cfg->opt.affine) {
    sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_WEIGHT), memcpy(v.data, cx->w, 4 * (size_t)cfg->opt.num_features);
    sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_BIAS), memcpy(v.data, cx->b, 4 * (size_t)cfg->opt.num_features);
  }
  for (int s = 0; s < nsteps(cfg); s++) {
    int64_t off = 0; /* N is the outer dimension in both layouts */
    for (int p = lo; p < hi; p++) {
      memcpy(all.x + off, cx->data[s][p].x, 4 * (size_t)cx->data[s][p].numel);
      memcpy(all.dy + off, cx->data[s][p].dy, 4 * (size_t)cx->data[s][p].numel);
      off += cx->data[s][p].numel;
    }
    sbn_tensor x = rank_tensor(&all, all.x), y = rank_tensor(&all, all.y);
    sbn_tensor dy = rank_tensor(&all, all.dy), dx = rank_tensor(&all, all.dx);
    sbn_bn_set_training(bn, s < cfg->steps);
    sbn_bn_zero_grad(bn);
    if (sbn_bn_forward(bn, &y, &x) != SBN_STATUS_OK || sbn_bn_backward(bn, &dx, &dy, &x) != SBN_STATUS_OK) {
      err->single = INFINITY;
      break;
    }
    off = 0;
    double dxmax = 0;
    for (int64_t i = 0; i < all.numel; i++) dxmax = fmax(dxmax, fabs(all.dx[i]));
    for (int p = lo; p < hi; p++) {
      for (int64_t i = 0; i < cx->data[s][p].numel; i++) {
        WORST(single, fabs((double)cx->data[s][p].y[i] - all.y[off + i]) / (TOL_Y * fmax(1.0, fabs(all.y[off + i]))));
        WORST(single, fabs((double)cx->data[s][p].dx[i] - all.dx[off + i]) / (TOL_DX_REL * (dxmax + 1e-30)));
      }
      off += cx->data[s][p].numel;
    }
    if (cfg->opt.affine) { /* per-rank gradients sum to the single-rank ones */
      sbn_tensor gw, gb;
      sbn_bn_tensor(&gw, bn, SBN_BN_TENSOR_GRAD_WEIGHT), sbn_bn_tensor(&gb, bn, SBN_BN_TENSOR_GRAD_BIAS);
      for (int64_t c = 0; c < cfg->opt.num_features; c++) {
        /* each per-rank value is a float32 rounding (relative 6e-8) of an
         * exact sum: allow 1e-6 of the sum of their magnitudes */
        double sw = 0, sb = 0, aw = 1, ab = 1;
        for (int p = lo; p < hi; p++) {
          sw += cx->rec[s][p].gw[c], sb += cx->rec[s][p].gb[c];
          aw += fabs(cx->rec[s][p].gw[c]), ab += fabs(cx->rec[s][p].gb[c]);
        }
        WORST(single, fabs(sw - ((float *)gw.data)[c]) / (1e-6 * aw));
        WORST(single, fabs(sb - ((float *)gb.data)[c]) / (1e-6 * ab));
      }
    }
  }
  sbn_bn_destroy(bn);
  rank_data_free(&all);
}

int case_run(const case_cfg *cfg, case_err *err, float **outputs, size_t *n_outputs) {
  memset(err, 0, sizeof *err);
  ctx *cx = calloc(1, sizeof *cx);
  cx->cfg = cfg;
  const int64_t C = cfg->opt.num_features;
  rng r = rng_seed(cfg->seed);
  cx->w = malloc(4 * (size_t)C), cx->b = malloc(4 * (size_t)C);
  double *mean = malloc(8 * (size_t)C), *std = malloc(8 * (size_t)C);
  for (int64_t c = 0; c < C; c++) {
    cx->w[c] = (float)(0.5 + rng_uniform(&r));
    cx->b[c] = (float)(rng_uniform(&r) - 0.5);
    std[c] = 0.2 + 2 * rng_uniform(&r);
    mean[c] = cfg->mean_scale * std[c] * (rng_uniform(&r) - 0.3);
  }
  for (int s = 0; s < nsteps(cfg); s++)
    for (int p = 0; p < cfg->P; p++) {
      rank_data_alloc(&cx->data[s][p], cfg->ndim, cfg->shape[p], cfg->layout);
      rank_data_fill(&cx->data[s][p], &r, mean, std);
      /* poison outputs: every element must be written */
      for (int64_t i = 0; i < cx->data[s][p].numel; i++) cx->data[s][p].y[i] = cx->data[s][p].dx[i] = NAN;
    }
  sbn_status st = sbn_team_run(cfg->P, rank_main, cx);
  int failed = st != SBN_STATUS_OK;
  if (failed) printf("  team run failed: %s\n", sbn_status_name(st));

  for (int half = 0; !failed && half < (cfg->halves ? 2 : 1); half++) {
    int lo, hi;
    group_range(cfg, half ? cfg->P - 1 : 0, &lo, &hi);
    ref_bn ref;
    ref_init(&ref, &cfg->opt, cx->w, cx->b);
    for (int s = 0; s < nsteps(cfg); s++) {
      ref_out out[CASE_MAX_RANKS];
      for (int p = lo; p < hi; p++) ref_out_alloc(&out[p], &cx->data[s][p], C);
      ref_step(&ref, s < cfg->steps, &cx->data[s][lo], hi - lo, &out[lo]);
      double dxmax = 0;
      for (int p = lo; p < hi; p++) dxmax = fmax(dxmax, max_abs(out[p].dx, cx->data[s][p].numel));
      for (int p = lo; p < hi; p++) {
        const rank_data *d = &cx->data[s][p];
        const step_rec *rec = &cx->rec[s][p];
        WORST(y, y_err(d->y, out[p].y, d->numel));
        WORST(dx, max_abs_diff(d->dx, out[p].dx, d->numel) / (dxmax + 1e-30));
        if (cfg->opt.affine) {
          WORST(gw, rel_err_f(rec->gw, out[p].gw, C));
          WORST(gb, rel_err_f(rec->gb, out[p].gb, C));
        }
        if (cfg->opt.track_running_stats) {
          WORST(rm, rel_err_f(rec->rm, ref.rm, C));
          WORST(rv, rel_err_f(rec->rv, ref.rv, C));
          if (rec->nbt != ref.nbt) err->nbt_bad = 1;
        }
        if (outputs) {
          *outputs = realloc(*outputs, sizeof(float) * (*n_outputs + 2 * (size_t)d->numel));
          memcpy(*outputs + *n_outputs, d->y, 4 * (size_t)d->numel);
          memcpy(*outputs + *n_outputs + d->numel, d->dx, 4 * (size_t)d->numel);
          *n_outputs += 2 * (size_t)d->numel;
        }
      }
      for (int p = lo; p < hi; p++) ref_out_free(&out[p]);
    }
    ref_free(&ref);
    compare_single(cx, lo, hi, err);
  }
  /* gw/gb are relative to 1+|value| of sums of up to ~100 terms of size ~1:
   * float32 rounding of the sum gives < 1e-7; allow 1e-6. */
  if (!failed)
    failed = !(err->y <= TOL_Y) || !(err->dx <= TOL_DX_REL) || !(err->gw <= TOL_REL) ||
             !(err->gb <= TOL_REL) || !(err->rm <= TOL_REL) || !(err->rv <= TOL_REL) ||
             !(err->single <= 1.0) || err->nbt_bad;
  for (int s = 0; s < nsteps(cfg); s++)
    for (int p = 0; p < cfg->P; p++) {
      rank_data_free(&cx->data[s][p]);
      free(cx->rec[s][p].gw), free(cx->rec[s][p].gb), free(cx->rec[s][p].rm), free(cx->rec[s][p].rv);
    }
  free(cx->w), free(cx->b), free(mean), free(std), free(cx);
  return failed;
}
