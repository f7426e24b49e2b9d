/* One randomized SyncBN scenario (bn_case.h's case_cfg), runnable on any
 * group: the same code runs a rank over MPI and, in rank 0, all ranks over
 * the threads backend, so the two can be compared bitwise. Every rank
 * generates every rank's inputs from the configuration's seed (the inputs
 * are small), exactly as bn_case.c does. Header-only: test support. */
#ifndef SBN_MPI_CASE_H
#define SBN_MPI_CASE_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bn_case.h"

/* What one rank recorded in one step. */
typedef struct mrec {
  float *y, *dx;                /* numel each (owned) */
  float *gw, *gb, *rm, *rv;     /* C each, NULL when the layer has none */
  int64_t nbt;
} mrec;

typedef struct mcase {
  case_cfg cfg;
  int use_split; /* halves: sbn_group_split instead of sbn_group_new */
  float *w, *b;
  rank_data data[CASE_MAX_STEPS + 1][CASE_MAX_RANKS];
  mrec rec[CASE_MAX_STEPS + 1][CASE_MAX_RANKS]; /* filled by mcase_rank */
  sbn_status status[CASE_MAX_RANKS];
  char msg[CASE_MAX_RANKS][256];
} mcase;

static inline int mcase_steps(const mcase *mc) { return mc->cfg.steps + 1; }

/* Inputs of every rank, as case_run generates them. */
static inline void mcase_generate(mcase *mc, const case_cfg *cfg, int use_split) {
  memset(mc, 0, sizeof *mc);
  mc->cfg = *cfg;
  mc->use_split = use_split;
  const int64_t C = cfg->opt.num_features;
  rng r = rng_seed(cfg->seed);
  mc->w = malloc(4 * (size_t)C), mc->b = malloc(4 * (size_t)C);
  double *mean = malloc(8 * (size_t)C), *std = malloc(8 * (size_t)C);
  for (int64_t c = 0; c < C; c++) {
    mc->w[c] = (float)(0.5 + rng_uniform(&r));
    mc->b[c] = (float)(rng_uniform(&r) - 0.5);
    std[c] = 0.2 + 2 * rng_uniform(&r);
    mean[c] = cfg->mean_scale * std[c] * (rng_uniform(&r) - 0.3);
  }
  for (int s = 0; s < mcase_steps(mc); s++)
    for (int p = 0; p < cfg->P; p++) {
      rank_data_alloc(&mc->data[s][p], cfg->ndim, cfg->shape[p], cfg->layout);
      rank_data_fill(&mc->data[s][p], &r, mean, std);
    }
  free(mean), free(std);
}

static inline void mrec_free(mrec *r) {
  free(r->y), free(r->dx), free(r->gw), free(r->gb), free(r->rm), free(r->rv);
  memset(r, 0, sizeof *r);
}

static inline void mcase_free(mcase *mc) {
  for (int s = 0; s < mcase_steps(mc); s++)
    for (int p = 0; p < mc->cfg.P; p++) rank_data_free(&mc->data[s][p]), mrec_free(&mc->rec[s][p]);
  free(mc->w), free(mc->b);
}

/* A layer's tensors are in host or (case_dev, bn_case.h) device memory. */
static inline float *mcase_copy(sbn_bn *bn, sbn_bn_tensor_id id, int64_t C) {
  sbn_tensor v;
  if (sbn_bn_tensor(&v, bn, id) != SBN_STATUS_OK) return NULL;
  float *p = malloc(4 * (size_t)C);
  if (case_dev) case_dev->download(p, v.data, 4 * (size_t)C);
  else memcpy(p, v.data, 4 * (size_t)C);
  return p;
}

static inline sbn_status mcase_set(sbn_bn *bn, sbn_bn_tensor_id id, const float *src, int64_t C) {
  sbn_tensor v;
  sbn_status st = sbn_bn_tensor(&v, bn, id);
  if (st != SBN_STATUS_OK) return st;
  if (case_dev) case_dev->upload(v.data, src, 4 * (size_t)C);
  else memcpy(v.data, src, 4 * (size_t)C);
  return SBN_STATUS_OK;
}

/* One step's forward and backward; with case_dev, on device copies of x
 * and dy, into device y and dx (poisoned as the host ones), copied back. */
static inline sbn_status mcase_step(sbn_bn *bn, rank_data *d, float *y, float *dx) {
  if (!case_dev) {
    sbn_tensor tx = rank_tensor(d, d->x), ty = rank_tensor(d, y);
    sbn_tensor tdy = rank_tensor(d, d->dy), tdx = rank_tensor(d, dx);
    sbn_status st = sbn_bn_forward(bn, &ty, &tx);
    return st == SBN_STATUS_OK ? sbn_bn_backward(bn, &tdx, &tdy, &tx) : st;
  }
  const size_t bytes = 4 * (size_t)(d->numel ? d->numel : 1);
  float *host[4] = {d->x, d->dy, y, dx};
  void *dev[4];
  for (int i = 0; i < 4; i++) dev[i] = case_dev->alloc(bytes), case_dev->upload(dev[i], host[i], bytes);
  sbn_tensor tx = rank_tensor(d, dev[0]), tdy = rank_tensor(d, dev[1]);
  sbn_tensor ty = rank_tensor(d, dev[2]), tdx = rank_tensor(d, dev[3]);
  tx.device = tdy.device = ty.device = tdx.device = case_dev->device;
  sbn_status st = sbn_bn_forward(bn, &ty, &tx);
  if (st == SBN_STATUS_OK) st = sbn_bn_backward(bn, &tdx, &tdy, &tx);
  if (st == SBN_STATUS_OK) case_dev->download(y, dev[2], bytes), case_dev->download(dx, dev[3], bytes);
  for (int i = 0; i < 4; i++) case_dev->release(dev[i]);
  return st;
}

#define MCASE_TRY(call)                                                              \
  do {                                                                               \
    sbn_status st_ = (call);                                                         \
    if (st_ != SBN_STATUS_OK) {                                                      \
      mc->status[rank] = st_;                                                        \
      snprintf(mc->msg[rank], sizeof mc->msg[rank], "%s: %s", #call, sbn_last_error()); \
      goto done;                                                                     \
    }                                                                                \
  } while (0)

/* Run rank `rank` of the case on `world` (its group of cfg.P ranks): the
 * two-sub-group case makes the halves {0..P/2-1}, {P/2..P-1} with
 * sbn_group_new (both lists, on every rank) or sbn_group_split. Records
 * outputs in mc->rec[*][rank]; returns 0 or the failing status. */
static inline int mcase_rank(sbn_group *world, mcase *mc, int rank) {
  const case_cfg *cfg = &mc->cfg;
  const int64_t C = cfg->opt.num_features;
  const int h = cfg->P / 2;
  sbn_group *group = world, *sub = NULL, *other = NULL;
  sbn_bn *bn = NULL;
  mc->status[rank] = SBN_STATUS_OK;
  if (cfg->halves) {
    if (mc->use_split) {
      MCASE_TRY(sbn_group_split(&sub, world, rank < h ? 0 : 1, rank));
    } else {
      int lo[CASE_MAX_RANKS], hi[CASE_MAX_RANKS];
      for (int i = 0; i < cfg->P; i++) {
        if (i < h) lo[i] = i;
        else hi[i - h] = i;
      }
      sbn_group *a = NULL, *b = NULL;
      sbn_status sa = sbn_group_new(&a, world, h, lo);
      sbn_status sb = sbn_group_new(&b, world, cfg->P - h, hi);
      if ((rank < h) != (sa == SBN_STATUS_OK) || (rank >= h) != (sb == SBN_STATUS_OK)) {
        mc->status[rank] = SBN_STATUS_INTERNAL;
        snprintf(mc->msg[rank], sizeof mc->msg[rank], "new_group results wrong: %s / %s",
                 sbn_status_name(sa), sbn_status_name(sb));
        sbn_group_destroy(a), sbn_group_destroy(b);
        return mc->status[rank];
      }
      sub = rank < h ? a : b;
      other = rank < h ? b : a; /* NULL */
    }
    group = sub;
  }
  sbn_bn_options opt = cfg->opt;
  if (case_dev) opt.device = case_dev->device;
  MCASE_TRY(sbn_bn_create(&bn, &opt, group));
  if (case_dev && case_dev->rank_begin && case_dev->rank_begin(bn, rank) != 0) {
    mc->status[rank] = SBN_STATUS_INTERNAL;
    snprintf(mc->msg[rank], sizeof mc->msg[rank], "the device hook's rank_begin failed");
    goto done;
  }
  if (cfg->opt.affine) {
    MCASE_TRY(mcase_set(bn, SBN_BN_TENSOR_WEIGHT, mc->w, C));
    MCASE_TRY(mcase_set(bn, SBN_BN_TENSOR_BIAS, mc->b, C));
  }
  for (int s = 0; s < mcase_steps(mc); s++) {
    rank_data *d = &mc->data[s][rank];
    mrec *rec = &mc->rec[s][rank];
    rec->y = malloc(4 * (size_t)(d->numel ? d->numel : 1));
    rec->dx = malloc(4 * (size_t)(d->numel ? d->numel : 1));
    for (int64_t i = 0; i < d->numel; i++) rec->y[i] = rec->dx[i] = NAN; /* every element must be written */
    MCASE_TRY(sbn_bn_set_training(bn, s < cfg->steps));
    MCASE_TRY(sbn_bn_zero_grad(bn));
    MCASE_TRY(mcase_step(bn, d, rec->y, rec->dx));
    rec->gw = mcase_copy(bn, SBN_BN_TENSOR_GRAD_WEIGHT, C);
    rec->gb = mcase_copy(bn, SBN_BN_TENSOR_GRAD_BIAS, C);
    rec->rm = mcase_copy(bn, SBN_BN_TENSOR_RUNNING_MEAN, C);
    rec->rv = mcase_copy(bn, SBN_BN_TENSOR_RUNNING_VAR, C);
    if (cfg->opt.track_running_stats) MCASE_TRY(sbn_bn_get_num_batches_tracked(bn, &rec->nbt));
  }
done:
  sbn_bn_destroy(bn);
  if (bn && case_dev && case_dev->rank_end) case_dev->rank_end(rank);
  sbn_group_destroy(sub);
  sbn_group_destroy(other);
  return mc->status[rank];
}

#endif
