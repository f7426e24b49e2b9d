/* The scenario of records_case.h: forward x1, save a record, forward x2,
 * backward of x2, restore the record, backward of x1. Every output must be
 * bitwise what two separate steps give (forward x1 + backward x1, then x2),
 * and within float32 rounding of the float64 reference, over 1 (no group),
 * 2 and 3 thread ranks with uneven and empty ranks; x1 and x2 differ in
 * shape and layout, and the first forward is a training one while the second
 * may be an eval one (the record restores whether backward synchronizes).
 * Then the misuse: a record of another layer, an empty record, saving before
 * any forward, NULLs, each a clear status that changes nothing; and the
 * negative control: the same backward without the restore is wrong. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bn_case.h"
#include "records_case.h"

enum { C = 5, PMAX = 3 };

typedef struct step_data {
  rank_data d[PMAX];
  float *y_sep[PMAX], *dx_sep[PMAX]; /* the separate steps' outputs */
} step_data;

typedef struct state { /* a layer's per-channel state, on the host */
  float gw[C], gb[C], rm[C], rv[C];
  int64_t nbt;
} state;

typedef struct shared {
  step_data s1, s2;
  int second_eval, verbose, phase;
  state st[2][PMAX]; /* [twice, separate] */
  int failures[PMAX];
} shared;

/* Tensors on case_dev's device (bn_case.h), or the host arrays themselves. */
static void *dev_in(const float *host, int64_t n) {
  if (!case_dev) return (void *)host;
  const size_t bytes = sizeof(float) * (size_t)(n ? n : 1);
  void *p = case_dev->alloc(bytes);
  case_dev->upload(p, host, bytes);
  return p;
}
/* Brings an output back into host (when on a device) and frees the copy. */
static void dev_back(float *host, void *dev, int64_t n, int download) {
  if (!case_dev) return;
  if (download && n) case_dev->download(host, dev, sizeof(float) * (size_t)n);
  case_dev->release(dev);
}
static sbn_tensor tensor_at(rank_data *d, void *data) {
  sbn_tensor t = rank_tensor(d, data);
  if (case_dev) t.device = case_dev->device;
  return t;
}

static void grab(sbn_bn *bn, state *s) {
  sbn_tensor v;
  float *dst[4] = {s->gw, s->gb, s->rm, s->rv};
  const sbn_bn_tensor_id ids[4] = {SBN_BN_TENSOR_GRAD_WEIGHT, SBN_BN_TENSOR_GRAD_BIAS,
                                   SBN_BN_TENSOR_RUNNING_MEAN, SBN_BN_TENSOR_RUNNING_VAR};
  memset(s, 0, sizeof *s);
  for (int i = 0; i < 4; i++) {
    if (sbn_bn_tensor(&v, bn, ids[i]) != SBN_STATUS_OK) continue;
    if (case_dev) case_dev->download(dst[i], v.data, C * sizeof(float));
    else memcpy(dst[i], v.data, C * sizeof(float));
  }
  sbn_bn_get_num_batches_tracked(bn, &s->nbt);
}

static int expect(const shared *sh, int *fail, int rank, const char *what, sbn_status got, sbn_status want, const char *needle) {
  const char *msg = sbn_last_error();
  int ok = got == want && (!needle || strstr(msg, needle));
  if (!ok || (rank == 0 && sh->verbose))
    printf("rank %d: %s -> %s \"%s\" (expected %s) %s\n", rank, what, sbn_status_name(got), msg,
           sbn_status_name(want), ok ? "ok" : "FAIL");
  *fail += !ok;
  return ok;
}

/* Phase 0: the layer applied twice, and the misuse. */
static int twice(shared *sh, sbn_group *g, int rank, const sbn_bn_options *o) {
  int *fail = &sh->failures[rank];
  rank_data *a = &sh->s1.d[rank], *b = &sh->s2.d[rank];
  sbn_bn *bn, *other;
  sbn_bn_record *rec, *foreign, *none;
  CHECK_OK(sbn_bn_create(&bn, o, g));
  CHECK_OK(sbn_bn_create(&other, o, g));
  if (case_dev && case_dev->rank_begin && case_dev->rank_begin(bn, rank)) return 1;
  void *m[8] = {dev_in(a->x, a->numel), dev_in(a->dy, a->numel), dev_in(a->y, a->numel), dev_in(a->dx, a->numel),
                dev_in(b->x, b->numel), dev_in(b->dy, b->numel), dev_in(b->y, b->numel), dev_in(b->dx, b->numel)};
  sbn_tensor x1 = tensor_at(a, m[0]), dy1 = tensor_at(a, m[1]), y1 = tensor_at(a, m[2]), dx1 = tensor_at(a, m[3]);
  sbn_tensor x2 = tensor_at(b, m[4]), dy2 = tensor_at(b, m[5]), y2 = tensor_at(b, m[6]), dx2 = tensor_at(b, m[7]);
  CHECK_OK(sbn_bn_record_create(&rec, bn));
  CHECK_OK(sbn_bn_record_create(&foreign, other));
  expect(sh, fail, rank, "save before any forward", sbn_bn_save_forward(bn, rec), SBN_STATUS_BAD_STATE,
         "no successful forward");
  expect(sh, fail, rank, "restore of an empty record", sbn_bn_restore_forward(bn, rec), SBN_STATUS_BAD_STATE,
         "holds no forward");
  CHECK_OK(sbn_bn_forward(bn, &y1, &x1));
  CHECK_OK(sbn_bn_save_forward(bn, rec));
  if (sh->second_eval) CHECK_OK(sbn_bn_set_training(bn, 0));
  CHECK_OK(sbn_bn_forward(bn, &y2, &x2));
  CHECK_OK(sbn_bn_backward(bn, &dx2, &dy2, &x2));
  CHECK_OK(sbn_bn_set_training(bn, 1));
  state before, after;
  grab(bn, &before);
  expect(sh, fail, rank, "restore of another layer's record", sbn_bn_restore_forward(bn, foreign),
         SBN_STATUS_INVALID_ARGUMENT, "another layer");
  expect(sh, fail, rank, "save into another layer's record", sbn_bn_save_forward(bn, foreign),
         SBN_STATUS_INVALID_ARGUMENT, "another layer");
  expect(sh, fail, rank, "restore of a NULL record", sbn_bn_restore_forward(bn, NULL), SBN_STATUS_INVALID_ARGUMENT,
         "record is NULL");
  expect(sh, fail, rank, "record of a NULL layer", sbn_bn_record_create(&none, NULL), SBN_STATUS_INVALID_ARGUMENT,
         "layer is NULL");
  expect(sh, fail, rank, "backward of x1 before the restore", sbn_bn_backward(bn, &dx1, &dy1, &x1),
         SBN_STATUS_INVALID_ARGUMENT, "must match the forward's x");
  grab(bn, &after);
  if (memcmp(&before, &after, sizeof before)) printf("rank %d: a failed call changed the layer FAIL\n", rank), ++*fail;
  CHECK_OK(sbn_bn_restore_forward(bn, rec));
  CHECK_OK(sbn_bn_backward(bn, &dx1, &dy1, &x1));
  grab(bn, &sh->st[0][rank]);
  float *host[8] = {a->x, a->dy, a->y, a->dx, b->x, b->dy, b->y, b->dx};
  for (int i = 0; i < 8; i++) dev_back(host[i], m[i], i < 4 ? a->numel : b->numel, i % 4 >= 2);
  if (case_dev && case_dev->rank_end) case_dev->rank_end(rank);
  sbn_bn_record_destroy(foreign);
  sbn_bn_destroy(bn);
  sbn_bn_destroy(other);
  sbn_bn_record_destroy(rec); /* after its layer: allowed */
  return 0;
}

/* Phase 1: the same two steps, each backward right after its forward; then
 * the negative control: a third forward of x1's shape (dy1 as its input:
 * other statistics) and x1's backward without restoring a record. */
static int separate(shared *sh, sbn_group *g, int rank, const sbn_bn_options *o) {
  rank_data *a = &sh->s1.d[rank], *b = &sh->s2.d[rank];
  float *ys1 = sh->s1.y_sep[rank], *dxs1 = sh->s1.dx_sep[rank], *wrong = ys1 + a->numel;
  float *ys2 = sh->s2.y_sep[rank], *dxs2 = sh->s2.dx_sep[rank];
  sbn_bn *sep;
  CHECK_OK(sbn_bn_create(&sep, o, g));
  if (case_dev && case_dev->rank_begin && case_dev->rank_begin(sep, rank)) return 1;
  void *m[9] = {dev_in(a->x, a->numel), dev_in(a->dy, a->numel), dev_in(ys1, a->numel), dev_in(dxs1, a->numel),
                dev_in(b->x, b->numel), dev_in(b->dy, b->numel), dev_in(ys2, b->numel), dev_in(dxs2, b->numel),
                dev_in(wrong, a->numel)};
  sbn_tensor x1 = tensor_at(a, m[0]), dy1 = tensor_at(a, m[1]), y1 = tensor_at(a, m[2]), dx1 = tensor_at(a, m[3]);
  sbn_tensor x2 = tensor_at(b, m[4]), dy2 = tensor_at(b, m[5]), y2 = tensor_at(b, m[6]), dx2 = tensor_at(b, m[7]);
  sbn_tensor w = tensor_at(a, m[8]);
  CHECK_OK(sbn_bn_forward(sep, &y1, &x1));
  CHECK_OK(sbn_bn_backward(sep, &dx1, &dy1, &x1));
  if (sh->second_eval) CHECK_OK(sbn_bn_set_training(sep, 0));
  CHECK_OK(sbn_bn_forward(sep, &y2, &x2));
  CHECK_OK(sbn_bn_backward(sep, &dx2, &dy2, &x2));
  grab(sep, &sh->st[1][rank]);
  CHECK_OK(sbn_bn_set_training(sep, 1));
  CHECK_OK(sbn_bn_forward(sep, &w, &dy1));
  CHECK_OK(sbn_bn_backward(sep, &w, &dy1, &x1));
  float *host[9] = {a->x, a->dy, ys1, dxs1, b->x, b->dy, ys2, dxs2, wrong};
  for (int i = 0; i < 9; i++) dev_back(host[i], m[i], i < 4 || i == 8 ? a->numel : b->numel, i % 4 >= 2 || i == 8);
  if (case_dev && case_dev->rank_end) case_dev->rank_end(rank);
  sbn_bn_destroy(sep);
  return 0;
}

/* Phase 2 (2+ ranks): ranks that differentiate different forwards of one
 * layer (rank 0 restored the first, the others backward the second, of the
 * same shape) get SBN_STATUS_MISMATCH on every rank, naming the forwards,
 * and nothing changes; then the same backward on every rank works. */
static int disagree(shared *sh, sbn_group *g, int rank, const sbn_bn_options *o) {
  int *fail = &sh->failures[rank];
  rank_data *a = &sh->s1.d[rank];
  sbn_bn *bn;
  sbn_bn_record *rec;
  CHECK_OK(sbn_bn_create(&bn, o, g));
  if (case_dev && case_dev->rank_begin && case_dev->rank_begin(bn, rank)) return 1;
  float *scratch = calloc((size_t)(2 * a->numel + 2), sizeof(float)); /* phase 0's outputs stay */
  void *m[4] = {dev_in(a->x, a->numel), dev_in(a->dy, a->numel), dev_in(scratch, a->numel),
                dev_in(scratch + a->numel + 1, a->numel)};
  sbn_tensor x = tensor_at(a, m[0]), x2 = tensor_at(a, m[1]), y = tensor_at(a, m[2]), dx = tensor_at(a, m[3]);
  CHECK_OK(sbn_bn_record_create(&rec, bn));
  CHECK_OK(sbn_bn_forward(bn, &y, &x));
  CHECK_OK(sbn_bn_save_forward(bn, rec));
  CHECK_OK(sbn_bn_forward(bn, &y, &x2));
  state before, after;
  grab(bn, &before);
  if (rank == 0) CHECK_OK(sbn_bn_restore_forward(bn, rec));
  sbn_status st = sbn_bn_backward(bn, &dx, &x2, rank == 0 ? &x : &x2);
  const char *msg = sbn_last_error();
  const int ok = st == SBN_STATUS_MISMATCH && strstr(msg, "for forward #1") && strstr(msg, "for forward #2");
  if (!ok || (rank == 0 && sh->verbose))
    printf("rank %d: ranks differentiating different forwards -> %s \"%s\" (expected SBN_STATUS_MISMATCH naming "
           "forwards #1 and #2) %s\n", rank, sbn_status_name(st), msg, ok ? "ok" : "FAIL");
  *fail += !ok;
  grab(bn, &after);
  if (memcmp(&before, &after, sizeof before)) printf("rank %d: the failed backward changed the layer FAIL\n", rank), ++*fail;
  CHECK_OK(sbn_bn_restore_forward(bn, rec));
  CHECK_OK(sbn_bn_backward(bn, &dx, &x2, &x));
  for (int i = 0; i < 4; i++) dev_back(NULL, m[i], a->numel, 0);
  if (case_dev && case_dev->rank_end) case_dev->rank_end(rank);
  sbn_bn_destroy(bn);
  sbn_bn_record_destroy(rec);
  free(scratch);
  return 0;
}

static int rank_main(sbn_group *world, void *arg) {
  shared *sh = arg;
  const int rank = sbn_group_rank(world), P = sbn_group_size(world);
  sbn_group_set_timeout(world, 20);
  sbn_bn_options o = sbn_bn_options_default(C);
  o.momentum = 0.3;
  if (case_dev) o.device = case_dev->device;
  sbn_group *g = P > 1 ? world : NULL;
  return sh->phase == 2 ? disagree(sh, g, rank, &o) : sh->phase ? separate(sh, g, rank, &o) : twice(sh, g, rank, &o);
}

static void make_step(step_data *s, int P, const int64_t *n, int ndim, const int64_t *rest, sbn_layout layout,
                      uint64_t seed, const double *mean, const double *std) {
  for (int r = 0; r < P; r++) {
    int64_t shape[SBN_MAX_DIMS] = {n[r], C};
    for (int i = 2; i < ndim; i++) shape[i] = rest[i - 2];
    rank_data_alloc(&s->d[r], ndim, shape, layout);
    rng g = rng_seed(seed + 31 * (uint64_t)r);
    rank_data_fill(&s->d[r], &g, mean, std);
    s->y_sep[r] = calloc((size_t)(2 * s->d[r].numel + 1), sizeof(float));
    s->dx_sep[r] = calloc((size_t)(s->d[r].numel + 1), sizeof(float));
  }
}

static void free_step(step_data *s, int P) {
  for (int r = 0; r < P; r++) rank_data_free(&s->d[r]), free(s->y_sep[r]), free(s->dx_sep[r]);
}

static int same_bits(const char *what, const float *a, const float *b, int64_t n) {
  int64_t diff = 0;
  for (int64_t i = 0; i < n; i++) diff += memcmp(&a[i], &b[i], sizeof(float)) != 0;
  if (diff) printf("  %s: %lld of %lld values differ from the separate steps' FAIL\n", what, (long long)diff,
                   (long long)n);
  return diff != 0;
}

static int run(int P, int second_eval) {
  static const int64_t n1[PMAX] = {4, 0, 3}, n2[PMAX] = {2, 5, 1}, rest1[2] = {3, 2}, rest2[1] = {7};
  const double mean1[C] = {1.5, -2, 4, 0, 1e3}, std1[C] = {0.5, 2, 3, 1, 0.25};
  const double mean2[C] = {-1, 3, 0.5, 2, -7}, std2[C] = {2, 0.5, 1, 4, 3};
  shared *sh = calloc(1, sizeof *sh);
  sh->second_eval = second_eval;
  sh->verbose = P == PMAX && !second_eval;
  const int64_t *n1p = P == 1 ? (const int64_t[]){5} : n1;
  make_step(&sh->s1, P, n1p, 4, rest1, SBN_LAYOUT_CHANNELS_LAST, 11, mean1, std1);
  make_step(&sh->s2, P, n2, 3, rest2, SBN_LAYOUT_CHANNELS_FIRST, 12, mean2, std2);
  int bad = 0;
  for (sh->phase = 0; sh->phase < (P > 1 ? 3 : 2); sh->phase++) {
    sbn_status st = sbn_team_run(P, rank_main, sh);
    if (st != SBN_STATUS_OK) printf("P=%d: team failed: %s: %s\n", P, sbn_status_name(st), sbn_last_error()), bad++;
  }

  /* float64 reference: step 1 (training), step 2 (training or eval) */
  sbn_bn_options o = sbn_bn_options_default(C);
  o.momentum = 0.3;
  ref_bn ref;
  ref_init(&ref, &o, NULL, NULL);
  ref_out out1[PMAX], out2[PMAX];
  for (int r = 0; r < P; r++) ref_out_alloc(&out1[r], &sh->s1.d[r], C), ref_out_alloc(&out2[r], &sh->s2.d[r], C);
  ref_step(&ref, 1, sh->s1.d, P, out1);
  ref_step(&ref, !second_eval, sh->s2.d, P, out2);
  double e_y = 0, e_dx = 0, e_wrong = 0, e_state = 0;
  for (int r = 0; r < P; r++) {
    rank_data *a = &sh->s1.d[r], *b = &sh->s2.d[r];
    bad += sh->failures[r];
    bad += same_bits("y of x1", a->y, sh->s1.y_sep[r], a->numel) + same_bits("y of x2", b->y, sh->s2.y_sep[r], b->numel);
    bad += same_bits("dx of x1", a->dx, sh->s1.dx_sep[r], a->numel) +
           same_bits("dx of x2", b->dx, sh->s2.dx_sep[r], b->numel);
    const state *tw = &sh->st[0][r], *sp = &sh->st[1][r];
    bad += same_bits("grad_weight", tw->gw, sp->gw, C) + same_bits("grad_bias", tw->gb, sp->gb, C);
    bad += same_bits("running_mean", tw->rm, sp->rm, C) + same_bits("running_var", tw->rv, sp->rv, C);
    if (tw->nbt != sp->nbt) printf("  num_batches_tracked %lld, separately %lld FAIL\n", (long long)tw->nbt, (long long)sp->nbt), bad++;
    e_y = fmax(e_y, fmax(y_err(a->y, out1[r].y, a->numel), y_err(b->y, out2[r].y, b->numel)));
    e_dx = fmax(e_dx, fmax(rel_err_f(a->dx, out1[r].dx, a->numel), rel_err_f(b->dx, out2[r].dx, b->numel)));
    e_wrong = fmax(e_wrong, rel_err_f(sh->s1.y_sep[r] + a->numel, out1[r].dx, a->numel));
    for (int c = 0; c < C; c++) {
      double gw = out1[r].gw[c] + out2[r].gw[c], gb = out1[r].gb[c] + out2[r].gb[c];
      e_state = fmax(e_state, fabs(tw->gw[c] - gw) / (1 + fabs(gw)));
      e_state = fmax(e_state, fabs(tw->gb[c] - gb) / (1 + fabs(gb)));
      e_state = fmax(e_state, fabs(tw->rm[c] - ref.rm[c]) / (1 + fabs(ref.rm[c])));
      e_state = fmax(e_state, fabs(tw->rv[c] - ref.rv[c]) / (1 + fabs(ref.rv[c])));
    }
  }
  printf("P=%d, second forward %s: applied twice == separate steps bit for bit: %s\n", P,
         second_eval ? "eval" : "training", bad ? "FAIL" : "ok");
  /* float32 storage: a few ulp of the values (|y|, |dx| up to ~10, with 1e3-mean channel) */
  bad += check("  y vs float64 reference", e_y, 1e-5);
  bad += check("  dx vs float64 reference", e_dx, 2e-5);
  bad += check("  grads, running stats vs float64 reference", e_state, 2e-5);
  const int caught = e_wrong > 1e-2;
  printf("  negative control: x1's backward without its record: max err %.3g (must exceed 1e-2) %s\n", e_wrong,
         caught ? "ok" : "FAIL");
  bad += !caught;
  for (int r = 0; r < P; r++) ref_out_free(&out1[r]), ref_out_free(&out2[r]);
  ref_free(&ref);
  free_step(&sh->s1, P);
  free_step(&sh->s2, P);
  free(sh);
  return bad;
}

int records_run_all(void) {
  int bad = 0;
  for (int P = 1; P <= PMAX; P++)
    for (int second_eval = 0; second_eval < 2; second_eval++) bad += run(P, second_eval);
  return bad;
}
