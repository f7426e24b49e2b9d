/* Layers with float64 parameters (param_dtype FLOAT64, PyTorch's
 * model.double()) against a long double reference with compensated sums,
 * so the reference's own error (~1e-19 relative) is far below the
 * library's.
 *
 * Tolerances, in units of u = 2^-53 (float64's unit roundoff), with n the
 * count per channel and r = |mean| / std of the channel:
 *  - one rank: the sums are sequential float64 additions (error ~ u sqrt(n)
 *    for random data) and the mean itself rounds to u |mean|, which moves
 *    x - mean by u r standard deviations; so y and dx (relative to their
 *    channel's largest |value|, at least 1) within 4 u (sqrt(n) + r)
 *    (4x that in eval, whose running statistics carry their own error),
 *    the gradients within 4 u (sqrt(n) sum|terms| + r sum|dy|);
 *  - a synchronized group: the variance comes from the summed payload
 *    sum(M2 + n mean^2) (device_cpu.c), whose rounding costs u r^2 relative
 *    (1e-8 for the ill-conditioned channel); tolerance 8 u (sqrt(n) + r^2).
 * Channels: standard normal, shifted (mean 3, std 0.5), and ill-conditioned
 * (mean 1e4 times its std). Also: ranks with uneven and empty batches equal
 * one rank holding the concatenated batch; misused dtypes (float64 input to
 * a float32 layer and the reverse, on one rank of a group) fail on every
 * rank and change no state. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static const double U = 0x1p-53;
enum { C = 3, STEPS = 2 };
static const double MEAN[C] = {0, 3, 1e4}, STD[C] = {1, 0.5, 1};

/* ---- long double reference, compensated (Neumaier) sums ---- */
typedef struct ksum { long double s, c; } ksum;
static void kadd(ksum *k, long double v) {
  const long double t = k->s + v;
  k->c += fabsl(k->s) >= fabsl(v) ? (k->s - t) + v : (v - t) + k->s;
  k->s = t;
}
static long double kval(const ksum *k) { return k->s + k->c; }

typedef struct batch {
  int ndim;
  int64_t shape[SBN_MAX_DIMS], numel, S;
  sbn_layout layout;
  double *x, *dy, *y, *dx;
} batch;

static int64_t ch_of(const batch *b, int64_t i) {
  return b->layout == SBN_LAYOUT_CHANNELS_LAST ? i % C : (i / b->S) % C;
}

static void batch_alloc(batch *b, int ndim, const int64_t *shape, sbn_layout layout) {
  memset(b, 0, sizeof *b);
  b->ndim = ndim, b->layout = layout, b->numel = 1, b->S = 1;
  for (int i = 0; i < ndim; i++) b->shape[i] = shape[i], b->numel *= shape[i], b->S *= i >= 2 ? shape[i] : 1;
  const size_t bytes = sizeof(double) * (size_t)(b->numel ? b->numel : 1);
  b->x = calloc(1, bytes), b->dy = calloc(1, bytes), b->y = calloc(1, bytes), b->dx = calloc(1, bytes);
}
static void batch_free(batch *b) { free(b->x), free(b->dy), free(b->y), free(b->dx); }
static sbn_tensor tens(batch *b, double *data) {
  return sbn_tensor_cpu(data, b->ndim, b->shape, SBN_DTYPE_FLOAT64, b->layout);
}
/* Values of full float64 precision (not rounded from float). */
static void batch_fill(batch *b, rng *r) {
  for (int64_t i = 0; i < b->numel; i++) {
    const int64_t c = ch_of(b, i);
    b->x[i] = MEAN[c] + STD[c] * rng_normal(r);
    b->dy[i] = 0.5 + rng_normal(r);
  }
}

/* Per-channel state of the reference layer. */
typedef struct refst {
  long double w[C], b[C], rm[C], rv[C], gw[C], gb[C];
  int64_t nbt;
} refst;

/* One training (or eval) step of the reference over a batch: y, dx (long
 * double, in ry/rdx), gradients accumulated, running statistics updated. */
static void ref64_step(refst *s, const sbn_bn_options *o, int training, const batch *b, long double *ry,
                     long double *rdx, double *sabs_gw, double *sabs_gb) {
  const int batch_stats = training || !o->track_running_stats;
  long double mean[C], invstd[C], var[C];
  const long double n = (long double)b->numel / C;
  ksum s1[C], s2[C], sd[C], sdx[C], sabs[C], sabd[C];
  memset(s1, 0, sizeof s1), memset(s2, 0, sizeof s2), memset(sd, 0, sizeof sd), memset(sdx, 0, sizeof sdx);
  memset(sabs, 0, sizeof sabs), memset(sabd, 0, sizeof sabd);
  for (int64_t i = 0; i < b->numel; i++) kadd(&s1[ch_of(b, i)], b->x[i]);
  for (int c = 0; c < C; c++) mean[c] = batch_stats ? kval(&s1[c]) / n : s->rm[c];
  for (int64_t i = 0; i < b->numel; i++) {
    const int c = (int)ch_of(b, i);
    const long double d = b->x[i] - (batch_stats ? mean[c] : kval(&s1[c]) / n);
    kadd(&s2[c], d * d);
  }
  for (int c = 0; c < C; c++) {
    var[c] = kval(&s2[c]) / n;
    invstd[c] = 1.0L / sqrtl((batch_stats ? var[c] : s->rv[c]) + (long double)o->eps);
  }
  for (int64_t i = 0; i < b->numel; i++) {
    const int c = (int)ch_of(b, i);
    const long double xm = b->x[i] - mean[c];
    kadd(&sd[c], b->dy[i]), kadd(&sdx[c], b->dy[i] * xm), kadd(&sabs[c], fabsl(b->dy[i] * xm));
    kadd(&sabd[c], fabsl(b->dy[i]));
  }
  for (int64_t i = 0; i < b->numel; i++) {
    const int c = (int)ch_of(b, i);
    const long double xm = b->x[i] - mean[c], w = o->affine ? s->w[c] : 1.0L;
    ry[i] = xm * invstd[c] * w + (o->affine ? s->b[c] : 0.0L);
    rdx[i] = batch_stats ? w * invstd[c] * (b->dy[i] - kval(&sd[c]) / n - xm * invstd[c] * invstd[c] * kval(&sdx[c]) / n)
                         : w * invstd[c] * b->dy[i];
  }
  for (int c = 0; c < C; c++) {
    s->gw[c] += kval(&sdx[c]) * invstd[c];
    s->gb[c] += kval(&sd[c]);
    sabs_gw[c] += (double)(kval(&sabs[c]) * invstd[c]);
    sabs_gb[c] += (double)kval(&sabd[c]);
  }
  if (training && o->track_running_stats && n > 0) {
    s->nbt++;
    const long double f = o->momentum == SBN_MOMENTUM_CUMULATIVE ? 1.0L / s->nbt : o->momentum;
    for (int c = 0; c < C; c++) {
      s->rm[c] = (1 - f) * s->rm[c] + f * mean[c];
      s->rv[c] = (1 - f) * s->rv[c] + f * var[c] * n / (n - 1);
    }
  }
}

/* Largest error of `got` over the channel's largest |ref| (at least 1). */
static double err_rel_ch(const double *got, const long double *ref, const batch *b, int c) {
  long double big = 1, e = 0;
  for (int64_t i = 0; i < b->numel; i++)
    if (ch_of(b, i) == c) big = fmaxl(big, fabsl(ref[i]));
  for (int64_t i = 0; i < b->numel; i++)
    if (ch_of(b, i) == c) e = fmaxl(e, fabsl((long double)got[i] - ref[i]));
  return (double)(e / big);
}

static double state(sbn_bn *bn, sbn_bn_tensor_id id, int c) {
  sbn_tensor v;
  if (sbn_bn_tensor(&v, bn, id) != SBN_STATUS_OK || v.dtype != SBN_DTYPE_FLOAT64) return NAN;
  return ((double *)v.data)[c];
}

/* Tolerance of channel c (see the top): synced adds the payload's r^2. */
static double tol_y(int c, double n, int synced) {
  const double r = fabs(MEAN[c]) / STD[c];
  return (synced ? 8 : 4) * U * (sqrt(n) + (synced ? r * r : r));
}

static int single_case(int ndim, const int64_t *shape, sbn_layout layout, int affine, int track, double mom,
                       uint64_t seed) {
  sbn_bn_options o = sbn_bn_options_default(C);
  o.param_dtype = SBN_DTYPE_FLOAT64, o.affine = affine, o.track_running_stats = track, o.momentum = mom;
  sbn_bn *bn;
  CHECK_OK(sbn_bn_create(&bn, &o, NULL));
  refst s;
  memset(&s, 0, sizeof s);
  rng r = rng_seed(seed);
  for (int c = 0; c < C; c++) s.w[c] = 1, s.rv[c] = 1;
  if (affine) { /* weights and biases of full precision, written through the views */
    sbn_tensor w, bb;
    CHECK_OK(sbn_bn_tensor(&w, bn, SBN_BN_TENSOR_WEIGHT));
    CHECK_OK(sbn_bn_tensor(&bb, bn, SBN_BN_TENSOR_BIAS));
    for (int c = 0; c < C; c++) {
      ((double *)w.data)[c] = (double)(s.w[c] = 1 + 0.3 * rng_normal(&r));
      ((double *)bb.data)[c] = (double)(s.b[c] = rng_normal(&r));
    }
  }
  batch b;
  batch_alloc(&b, ndim, shape, layout);
  long double *ry = malloc(sizeof(long double) * (size_t)b.numel), *rdx = malloc(sizeof(long double) * (size_t)b.numel);
  const double n = (double)b.numel / C;
  double ey = 0, edx = 0, eg = 0, ers = 0, worst_y = 0, worst_dx = 0, sabs_gw[C] = {0}, sabs_gb[C] = {0};
  int bad = 0;
  for (int step = 0; step <= STEPS; step++) {
    const int training = step < STEPS; /* then one eval step */
    CHECK_OK(sbn_bn_set_training(bn, training));
    batch_fill(&b, &r);
    sbn_tensor x = tens(&b, b.x), y = tens(&b, b.y), dy = tens(&b, b.dy), dx = tens(&b, b.dx);
    CHECK_OK(sbn_bn_forward(bn, &y, &x));
    CHECK_OK(sbn_bn_backward(bn, &dx, &dy, &x));
    ref64_step(&s, &o, training, &b, ry, rdx, sabs_gw, sabs_gb);
    for (int c = 0; c < C; c++) {
      /* eval normalizes with running statistics: their own error carries over */
      const double ty = tol_y(c, n, 0) * (training ? 1 : 4);
      const double e1 = err_rel_ch(b.y, ry, &b, c), e2 = err_rel_ch(b.dx, rdx, &b, c);
      ey = fmax(ey, e1), edx = fmax(edx, e2);
      worst_y = fmax(worst_y, e1 / ty), worst_dx = fmax(worst_dx, e2 / ty);
      if (affine) { /* sums of |terms| over the steps; x - mean also moves by u |mean| */
        const double rc = fabs(MEAN[c]) / STD[c];
        const double tgb = 4 * U * sqrt(n) * sabs_gb[c], tgw = 4 * U * (sqrt(n) * sabs_gw[c] + rc * sabs_gb[c]);
        eg = fmax(eg, fabs(state(bn, SBN_BN_TENSOR_GRAD_BIAS, c) - (double)s.gb[c]) / tgb);
        eg = fmax(eg, fabs(state(bn, SBN_BN_TENSOR_GRAD_WEIGHT, c) - (double)s.gw[c]) / tgw);
      }
      if (track) {
        const double tr = tol_y(c, n, 0);
        ers = fmax(ers, fabs(state(bn, SBN_BN_TENSOR_RUNNING_MEAN, c) - (double)s.rm[c]) / (double)fmaxl(1, fabsl(s.rm[c])) / tr);
        ers = fmax(ers, fabs(state(bn, SBN_BN_TENSOR_RUNNING_VAR, c) - (double)s.rv[c]) / (double)fmaxl(1, fabsl(s.rv[c])) / tr);
      }
    }
  }
  char sh[96] = "";
  for (int i = 0; i < ndim; i++) snprintf(sh + strlen(sh), sizeof sh - strlen(sh), "%s%lld", i ? "x" : "", (long long)shape[i]);
  printf("one rank %s %s affine=%d track=%d momentum=%s: max error y %.2e dx %.2e (n = %.0f per channel)\n", sh,
         layout ? "CL" : "CF", affine, track, mom == SBN_MOMENTUM_CUMULATIVE ? "None" : "0.1", ey, edx, n);
  bad |= check("  y error / tolerance 4u(sqrt(n) + |mean|/std) per channel", worst_y, 1);
  bad |= check("  dx error / tolerance", worst_dx, 1);
  bad |= check("  grad_weight, grad_bias error / tolerance 4u(sqrt(n) sum|terms| + r sum|dy|)", eg, 1);
  bad |= check("  running_mean, running_var error / tolerance", ers, 1);
  int64_t nbt = -1;
  if (track) {
    sbn_bn_get_num_batches_tracked(bn, &nbt);
    bad |= check("  num_batches_tracked == training steps", (double)llabs(nbt - STEPS), 0);
  }
  free(ry), free(rdx);
  batch_free(&b);
  sbn_bn_destroy(bn);
  return bad;
}

/* ---- P thread ranks (uneven and empty batches) against one rank holding
 * the concatenated batch ---- */
enum { P = 3 };
typedef struct team_arg {
  int ndim;
  sbn_layout layout;
  int64_t shape[P][SBN_MAX_DIMS];
  batch *b; /* per rank */
  double gw[P][C], gb[P][C], rm[P][C], rv[P][C];
  int64_t nbt[P];
  int wrong_rank;   /* >= 0: this rank passes float32 data to the float64 layer */
  sbn_status st[P]; /* the step's status per rank */
  char msg[P][512];
} team_arg;

static int team_rank(sbn_group *w, void *vp) {
  team_arg *a = vp;
  const int rk = sbn_group_rank(w);
  sbn_bn_options o = sbn_bn_options_default(C);
  o.param_dtype = SBN_DTYPE_FLOAT64;
  sbn_bn *bn;
  CHECK_OK(sbn_bn_create(&bn, &o, w));
  batch *b = &a->b[rk];
  sbn_tensor x = tens(b, b->x), y = tens(b, b->y), dy = tens(b, b->dy), dx = tens(b, b->dx);
  if (rk == a->wrong_rank) x.dtype = y.dtype = SBN_DTYPE_FLOAT32;
  sbn_status st = sbn_bn_forward(bn, &y, &x);
  if (st == SBN_STATUS_OK) st = sbn_bn_backward(bn, &dx, &dy, &x);
  a->st[rk] = st;
  snprintf(a->msg[rk], sizeof a->msg[rk], "%s", sbn_last_error());
  for (int c = 0; c < C; c++) {
    a->gw[rk][c] = state(bn, SBN_BN_TENSOR_GRAD_WEIGHT, c), a->gb[rk][c] = state(bn, SBN_BN_TENSOR_GRAD_BIAS, c);
    a->rm[rk][c] = state(bn, SBN_BN_TENSOR_RUNNING_MEAN, c), a->rv[rk][c] = state(bn, SBN_BN_TENSOR_RUNNING_VAR, c);
  }
  sbn_bn_get_num_batches_tracked(bn, &a->nbt[rk]);
  sbn_bn_destroy(bn);
  return 0;
}

static int team_case(int ndim, const int64_t *shape, sbn_layout layout, const int64_t *ns, uint64_t seed) {
  static team_arg a;
  memset(&a, 0, sizeof a);
  a.wrong_rank = -1;
  batch bs[P], all;
  int64_t total = 0, sh[SBN_MAX_DIMS];
  memcpy(sh, shape, sizeof sh);
  rng r = rng_seed(seed);
  for (int p = 0; p < P; p++) {
    sh[0] = ns[p], total += ns[p];
    batch_alloc(&bs[p], ndim, sh, layout);
    batch_fill(&bs[p], &r);
  }
  sh[0] = total;
  batch_alloc(&all, ndim, sh, layout);
  for (int64_t p = 0, off = 0; p < P; off += bs[p].numel, p++) { /* N is outermost in both layouts */
    memcpy(all.x + off, bs[p].x, sizeof(double) * (size_t)bs[p].numel);
    memcpy(all.dy + off, bs[p].dy, sizeof(double) * (size_t)bs[p].numel);
  }
  a.b = bs;
  CHECK_OK(sbn_team_run(P, team_rank, &a));
  /* the single rank */
  sbn_bn_options o = sbn_bn_options_default(C);
  o.param_dtype = SBN_DTYPE_FLOAT64;
  sbn_bn *bn;
  CHECK_OK(sbn_bn_create(&bn, &o, NULL));
  sbn_tensor x = tens(&all, all.x), y = tens(&all, all.y), dy = tens(&all, all.dy), dx = tens(&all, all.dx);
  CHECK_OK(sbn_bn_forward(bn, &y, &x));
  CHECK_OK(sbn_bn_backward(bn, &dx, &dy, &x));
  const double n = (double)all.numel / C;
  double wy = 0, wdx = 0, wst = 0, ey = 0;
  for (int64_t p = 0, off = 0; p < P; off += bs[p].numel, p++)
    for (int64_t i = 0; i < bs[p].numel; i++) {
      const int c = (int)ch_of(&all, off + i);
      const double t = tol_y(c, n, 1);
      ey = fmax(ey, fabs(bs[p].y[i] - all.y[off + i]) / fmax(1, fabs(all.y[off + i])));
      wy = fmax(wy, fabs(bs[p].y[i] - all.y[off + i]) / fmax(1, fabs(all.y[off + i])) / t);
      wdx = fmax(wdx, fabs(bs[p].dx[i] - all.dx[off + i]) / fmax(1, fabs(all.dx[off + i])) / t);
    }
  for (int c = 0; c < C; c++) {
    double gw = 0, gb = 0, gabs = 0;
    for (int p = 0; p < P; p++) gw += a.gw[p][c], gb += a.gb[p][c], gabs += fabs(a.gw[p][c]) + fabs(a.gb[p][c]);
    const double t = tol_y(c, n, 1) * (1 + gabs);
    wst = fmax(wst, fabs(gw - state(bn, SBN_BN_TENSOR_GRAD_WEIGHT, c)) / t);
    wst = fmax(wst, fabs(gb - state(bn, SBN_BN_TENSOR_GRAD_BIAS, c)) / t);
    for (int p = 0; p < P; p++) {
      wst = fmax(wst, fabs(a.rm[p][c] - state(bn, SBN_BN_TENSOR_RUNNING_MEAN, c)) / fmax(1, fabs(a.rm[p][c])) / tol_y(c, n, 1));
      wst = fmax(wst, fabs(a.rv[p][c] - state(bn, SBN_BN_TENSOR_RUNNING_VAR, c)) / fmax(1, fabs(a.rv[p][c])) / tol_y(c, n, 1));
    }
  }
  printf("%d thread ranks N = %lld, %lld, %lld vs one rank N = %lld, %s, %dD: max relative difference y %.2e\n", P,
         (long long)ns[0], (long long)ns[1], (long long)ns[2], (long long)total, layout ? "CL" : "CF", ndim, ey);
  int bad = check("  y difference / tolerance 8u(sqrt(n) + (|mean|/std)^2)", wy, 1);
  bad |= check("  dx difference / tolerance", wdx, 1);
  bad |= check("  summed grads, running stats difference / tolerance", wst, 1);
  sbn_bn_destroy(bn);

  /* One rank passes float32 tensors to its float64 layer: every rank fails,
   * nothing changes (fresh layers: grads 0, running stats 0 and 1, nbt 0). */
  a.wrong_rank = 1;
  for (int p = 0; p < P; p++) memset(bs[p].dy, 0, sizeof(double) * (size_t)bs[p].numel);
  sbn_team_run(P, team_rank, &a);
  int failed = 0, named = 0, changed = 0;
  for (int p = 0; p < P; p++) {
    failed += a.st[p] != SBN_STATUS_OK;
    changed += a.nbt[p] != 0;
    for (int c = 0; c < C; c++) changed += a.gw[p][c] != 0 || a.rm[p][c] != 0 || a.rv[p][c] != 1;
  }
  named = a.st[1] == SBN_STATUS_INVALID_ARGUMENT && strstr(a.msg[1], "float32") && strstr(a.msg[1], "float64");
  printf("  wrong dtype on rank 1: %s (%s); rank 0: %s\n", sbn_status_name(a.st[1]), a.msg[1], sbn_status_name(a.st[0]));
  bad |= check("  ranks that did not fail", P - failed, 0);
  bad |= check("  rank 1's error is INVALID_ARGUMENT naming float32 and float64 (0: yes)", !named, 0);
  bad |= check("  state changed by the failed step", changed, 0);
  for (int p = 0; p < P; p++) batch_free(&bs[p]);
  batch_free(&all);
  return bad;
}

/* Misuse on one rank: dtype pairings, options, views. */
static int misuse(void) {
  int bad = 0;
  int64_t shape[3] = {4, C, 5};
  double xd[60] = {0}, yd[60];
  float xf[60] = {0}, yf[60];
  for (int i = 0; i < 60; i++) xd[i] = xf[i] = (float)(i % 7);
  sbn_bn_options o = sbn_bn_options_default(C);
  bad |= check("default param_dtype is FLOAT32", o.param_dtype != SBN_DTYPE_FLOAT32, 0);
  sbn_bn *b32, *b64, *bx = NULL;
  CHECK_OK(sbn_bn_create(&b32, &o, NULL));
  o.param_dtype = SBN_DTYPE_BFLOAT16;
  bad |= check("param_dtype bfloat16: INVALID_ARGUMENT (0: yes)", sbn_bn_create(&bx, &o, NULL) != SBN_STATUS_INVALID_ARGUMENT, 0);
  o.param_dtype = (sbn_dtype)99;
  bad |= check("param_dtype 99: INVALID_ARGUMENT (0: yes)", sbn_bn_create(&bx, &o, NULL) != SBN_STATUS_INVALID_ARGUMENT, 0);
  o.param_dtype = SBN_DTYPE_FLOAT64;
  CHECK_OK(sbn_bn_create(&b64, &o, NULL));
  sbn_bn_options got;
  CHECK_OK(sbn_bn_get_options(b64, &got));
  bad |= check("sbn_bn_get_options returns param_dtype FLOAT64", got.param_dtype != SBN_DTYPE_FLOAT64, 0);
  sbn_tensor v;
  CHECK_OK(sbn_bn_tensor(&v, b32, SBN_BN_TENSOR_RUNNING_VAR));
  bad |= check("float32 layer's views are float32", v.dtype != SBN_DTYPE_FLOAT32, 0);
  CHECK_OK(sbn_bn_tensor(&v, b64, SBN_BN_TENSOR_RUNNING_VAR));
  bad |= check("float64 layer's views are float64, running_var 1", v.dtype != SBN_DTYPE_FLOAT64 || ((double *)v.data)[2] != 1, 0);
  sbn_tensor x64 = sbn_tensor_cpu(xd, 3, shape, SBN_DTYPE_FLOAT64, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_tensor y64 = sbn_tensor_cpu(yd, 3, shape, SBN_DTYPE_FLOAT64, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_tensor x32 = sbn_tensor_cpu(xf, 3, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_tensor y32 = sbn_tensor_cpu(yf, 3, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_status st = sbn_bn_forward(b32, &y64, &x64);
  printf("float64 input, float32 layer: %s: %s\n", sbn_status_name(st), sbn_last_error());
  bad |= check("  INVALID_ARGUMENT naming both dtypes (0: yes)",
               !(st == SBN_STATUS_INVALID_ARGUMENT && strstr(sbn_last_error(), "float64") && strstr(sbn_last_error(), "float32")), 0);
  st = sbn_bn_forward(b64, &y32, &x32);
  printf("float32 input, float64 layer: %s: %s\n", sbn_status_name(st), sbn_last_error());
  bad |= check("  INVALID_ARGUMENT naming both dtypes (0: yes)",
               !(st == SBN_STATUS_INVALID_ARGUMENT && strstr(sbn_last_error(), "float64") && strstr(sbn_last_error(), "float32")), 0);
  st = sbn_bn_forward(b64, &y32, &x64);
  bad |= check("float64 x with float32 y: INVALID_ARGUMENT (0: yes)", st != SBN_STATUS_INVALID_ARGUMENT, 0);
  int64_t nbt = -1;
  sbn_bn_get_num_batches_tracked(b64, &nbt);
  bad |= check("failed forwards change nothing (nbt, running_var)", (double)nbt + (((double *)v.data)[2] != 1), 0);
  CHECK_OK(sbn_bn_forward(b64, &y64, &x64));
  st = sbn_bn_backward(b64, &y32, &x32, &x32);
  bad |= check("backward with float32 tensors after a float64 forward: INVALID_ARGUMENT (0: yes)",
               st != SBN_STATUS_INVALID_ARGUMENT, 0);
  CHECK_OK(sbn_bn_backward(b64, &y64, &x64, &x64));
  sbn_bn_destroy(b32), sbn_bn_destroy(b64), sbn_bn_destroy(bx);
  return bad;
}

int main(void) {
  int bad = misuse();
  /* 2-D (rows layout), 3-D, 4-D with a tail of 16-value steps, 5-D;
   * 64x3x40x40 = 307200 values: several units and threads. */
  static const int64_t shapes[][5] = {{300, C}, {7, C, 37}, {5, C, 9, 11}, {2, C, 3, 4, 5}, {64, C, 40, 40}};
  static const int ndims[] = {2, 3, 4, 5, 4};
  uint64_t seed = 11;
  for (int i = 0; i < 5; i++)
    for (int lay = 0; lay < 2; lay++) bad |= single_case(ndims[i], shapes[i], (sbn_layout)lay, 1, 1, 0.1, seed++);
  bad |= single_case(4, shapes[2], SBN_LAYOUT_CHANNELS_LAST, 0, 1, SBN_MOMENTUM_CUMULATIVE, seed++);
  bad |= single_case(3, shapes[1], SBN_LAYOUT_CHANNELS_FIRST, 1, 0, 0.1, seed++);
  bad |= single_case(4, shapes[2], SBN_LAYOUT_CHANNELS_FIRST, 0, 0, 0.1, seed++);
  static const int64_t ns[][P] = {{5, 0, 11}, {0, 3, 1}, {40, 24, 0}};
  for (int lay = 0; lay < 2; lay++) {
    bad |= team_case(4, shapes[2], (sbn_layout)lay, ns[0], seed++);
    bad |= team_case(2, shapes[0], (sbn_layout)lay, ns[2], seed++);
    bad |= team_case(5, shapes[3], (sbn_layout)lay, ns[1], seed++);
  }
  printf(bad ? "\nFLOAT64 CHECKS FAILED\n" : "\nall float64 checks passed\n");
  return bad;
}
