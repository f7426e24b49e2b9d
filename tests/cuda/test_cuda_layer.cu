// The layer on the GPU against the float64 reference, for every storage
// dtype (float32, bfloat16, float16), both layouts, 2-D..5-D, the options
// (affine, track_running_stats, momentum 0.1 or cumulative), one rank and
// two thread ranks (host-staged), in place and out of place, channels whose
// mean is 100 and 1e4 times their standard deviation, shapes that need many
// blocks (C = 2048 at 7x7, 64 x 56x56, channels-last C = 600), two training
// steps then eval. Each case runs twice: the second run must give the same
// bits (y, dx, gradients, running statistics).
//
// Tolerances (as tests/cpu/test_cpu_dtypes.c, by the storage precision): y
// and dx are rounded once to the storage type, so each may be off by half a
// unit in the last place of its own magnitude (2^-8 |v| bfloat16, 2^-11
// float16, 2^-24 float32 plus the float32 arithmetic), covered by the
// half-ulp bound + 4e-6 for y (|y| < ~8) and + 1e-5 max|dx| for dx (dx mixes
// terms of that size); in eval with running statistics, also the effect of
// one float32 ulp of each (ratio_err_eval). Gradients and running statistics are float32
// roundings of float64 sums of exact inputs: 1e-6 relative. Kernels that
// summed in float32 without shifting would miss these by orders of
// magnitude on the mean = 1e4 x std channels.
#include <math.h>

#include "cuda_testutil.h"
extern "C" {
#include "../cpu/cpu_data.h"
}

enum { MAXP = 2, MAXS = 3 };

typedef struct lcase {
  sbn_dtype dt;
  int P, ndim, steps, inplace;
  int64_t shape[SBN_MAX_DIMS];
  sbn_layout layout;
  sbn_bn_options opt;
  double mean_scale;
  uint64_t seed;
} lcase;

typedef struct run_state {
  const lcase *lc;
  rank_data d[MAXS][MAXP];                 // float copies of the exact values
  void *y[MAXS][MAXP], *dx[MAXS][MAXP];    // results (storage dtype, host)
  float *gw[MAXS][MAXP], *gb[MAXS][MAXP], *rm[MAXS][MAXP], *rv[MAXS][MAXP];
  int64_t nbt[MAXS][MAXP];
  float *w, *b;
} run_state;

static void fetch(float *dst, sbn_bn *bn, sbn_bn_tensor_id id, int64_t C) {
  sbn_tensor v;
  if (sbn_bn_tensor(&v, bn, id) == SBN_STATUS_OK)
    CUDA_OK(cudaMemcpy(dst, v.data, 4 * (size_t)C, cudaMemcpyDeviceToHost));
}

static int rank_fn(sbn_group *world, void *arg) {
  run_state *rs = (run_state *)arg;
  const lcase *lc = rs->lc;
  const int p = sbn_group_rank(world);
  const int64_t C = lc->opt.num_features;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  sbn_bn *bn;
  CHECK_OK(sbn_bn_create(&bn, &lc->opt, lc->P > 1 ? world : NULL));
  CHECK_OK(sbn_bn_set_stream(bn, s));
  sbn_tensor v;
  if (lc->opt.affine) {
    CHECK_OK(sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_WEIGHT));
    CUDA_OK(cudaMemcpy(v.data, rs->w, 4 * (size_t)C, cudaMemcpyHostToDevice));
    CHECK_OK(sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_BIAS));
    CUDA_OK(cudaMemcpy(v.data, rs->b, 4 * (size_t)C, cudaMemcpyHostToDevice));
  }
  for (int st = 0; st <= lc->steps; st++) {
    rank_data *d = &rs->d[st][p];
    const size_t bytes = (size_t)(d->numel ? d->numel : 1) * dt_size(lc->dt);
    void *hx = malloc(bytes), *hdy = malloc(bytes), *gx, *gdy, *gy, *gdx;
    to_storage(hx, d->x, d->numel, lc->dt);
    to_storage(hdy, d->dy, d->numel, lc->dt);
    gx = hook_alloc(bytes), gdy = hook_alloc(bytes), gy = hook_alloc(bytes), gdx = hook_alloc(bytes);
    CUDA_OK(cudaMemset(gy, 0xff, bytes)); // NaN: every element must be written
    CUDA_OK(cudaMemset(gdx, 0xff, bytes));
    CUDA_OK(cudaMemcpy(gx, hx, bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(gdy, hdy, bytes, cudaMemcpyHostToDevice));
    // in place: y over a copy of x, dx over dy (the backward reads the forward's x, kept in gx)
    void *ydst = gy, *dxdst = lc->inplace ? gdy : gdx;
    if (lc->inplace) CUDA_OK(cudaMemcpy(gy, gx, bytes, cudaMemcpyDeviceToDevice));
    CUDA_OK(cudaDeviceSynchronize()); // the layer's stream is not ordered after these
    sbn_tensor x = sbn_tensor_cpu(lc->inplace ? gy : gx, d->ndim, d->shape, lc->dt, d->layout);
    sbn_tensor y = x, dy = x, dx = x;
    y.data = ydst, dy.data = gdy, dx.data = dxdst;
    x.device = y.device = dy.device = dx.device = cuda_dev(0);
    CHECK_OK(sbn_bn_set_training(bn, st < lc->steps));
    CHECK_OK(sbn_bn_zero_grad(bn));
    CHECK_OK(sbn_bn_forward(bn, &y, &x));
    if (lc->inplace) x.data = gx; // the backward needs the forward's input values
    CHECK_OK(sbn_bn_backward(bn, &dx, &dy, &x));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(rs->y[st][p], ydst, bytes, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(rs->dx[st][p], dxdst, bytes, cudaMemcpyDeviceToHost));
    fetch(rs->gw[st][p], bn, SBN_BN_TENSOR_GRAD_WEIGHT, C), fetch(rs->gb[st][p], bn, SBN_BN_TENSOR_GRAD_BIAS, C);
    fetch(rs->rm[st][p], bn, SBN_BN_TENSOR_RUNNING_MEAN, C), fetch(rs->rv[st][p], bn, SBN_BN_TENSOR_RUNNING_VAR, C);
    if (lc->opt.track_running_stats) CHECK_OK(sbn_bn_get_num_batches_tracked(bn, &rs->nbt[st][p]));
    hook_release(gx), hook_release(gdy), hook_release(gy), hook_release(gdx);
    free(hx), free(hdy);
  }
  sbn_bn_destroy(bn);
  CUDA_OK(cudaStreamDestroy(s));
  return 0;
}

// max over i of |got - ref| / (ulp_rel * |ref| + abs)
static double ratio_err(const void *got, sbn_dtype dt, const double *ref, int64_t n, double ulp_rel,
                        double abs_tol) {
  double worst = 0;
  float *g = (float *)malloc((size_t)(n ? n : 1) * 4);
  from_storage(g, got, n, dt);
  for (int64_t i = 0; i < n; i++) {
    double q = fabs((double)g[i] - ref[i]) / (ulp_rel * fabs(ref[i]) + abs_tol);
    if (!(q <= worst)) worst = q;
  }
  free(g);
  return worst;
}

// Eval with running statistics: y = (x - rm) a + b, a = w / sqrt(rv + eps),
// with rm and rv float32. The layer's rv may be the float32 neighbour of the
// reference's: its variance carries the payload format's cancellation
// (~2^-53 (mean/std)^2 relative, 1e-8 at mean = 1e4 x std), enough to
// round to the other side of a float32 boundary (the rv check allows 1e-6).
// One ulp of rv (<= 2^-23 relative) moves y by <= 2^-24 |y - b|, one of rm
// by <= 2^-23 |a rm|; the bound adds both (twice the first). It matters
// where |y| is large: after two steps at momentum 0.1 the running mean is
// ~0.2 of a 1e4 x std batch mean, and eval outputs reach ~1e4.
static double ratio_err_eval(const void *got, const rank_data *d, sbn_dtype dt, const double *ref, double ulp_rel,
                             double abs_tol, const ref_bn *r) {
  double worst = 0;
  float *g = (float *)malloc((size_t)(d->numel ? d->numel : 1) * 4);
  from_storage(g, got, d->numel, dt);
  for (int64_t i = 0; i < d->numel; i++) {
    const int64_t c = chan_of(d, i);
    const double b = r->affine ? r->b[c] : 0.0, a = (r->affine ? r->w[c] : 1.0) / sqrt(r->rv[c] + r->eps);
    const double tol = ulp_rel * fabs(ref[i]) + abs_tol + 0x1p-23 * (fabs(ref[i] - b) + fabs(a * r->rm[c]));
    const double q = fabs((double)g[i] - ref[i]) / tol;
    if (!(q <= worst)) worst = q;
  }
  free(g);
  return worst;
}

static void rs_alloc(run_state *rs, const lcase *lc, rng *r, const double *mean, const double *std) {
  const int64_t C = lc->opt.num_features;
  for (int st = 0; st <= lc->steps; st++)
    for (int p = 0; p < lc->P; p++) {
      int64_t sh[SBN_MAX_DIMS];
      memcpy(sh, lc->shape, sizeof sh);
      if (p == 1) sh[0] = lc->shape[0] > 1 ? lc->shape[0] / 2 : 0; // uneven; may be empty
      rank_data *d = &rs->d[st][p];
      rank_data_alloc(d, lc->ndim, sh, lc->layout);
      rank_data_fill(d, r, mean, std);
      quantize(d->x, d->numel, lc->dt), quantize(d->dy, d->numel, lc->dt);
      size_t bytes = (size_t)(d->numel ? d->numel : 1) * dt_size(lc->dt);
      rs->y[st][p] = malloc(bytes), rs->dx[st][p] = malloc(bytes);
      rs->gw[st][p] = (float *)calloc((size_t)C, 4), rs->gb[st][p] = (float *)calloc((size_t)C, 4);
      rs->rm[st][p] = (float *)calloc((size_t)C, 4), rs->rv[st][p] = (float *)calloc((size_t)C, 4);
    }
}

static void rs_free(run_state *rs, const lcase *lc) {
  for (int st = 0; st <= lc->steps; st++)
    for (int p = 0; p < lc->P; p++) {
      rank_data_free(&rs->d[st][p]);
      free(rs->y[st][p]), free(rs->dx[st][p]);
      free(rs->gw[st][p]), free(rs->gb[st][p]), free(rs->rm[st][p]), free(rs->rv[st][p]);
    }
}

static int same_bits(const run_state *a, const run_state *b, const lcase *lc) {
  const size_t C4 = 4 * (size_t)lc->opt.num_features;
  for (int st = 0; st <= lc->steps; st++)
    for (int p = 0; p < lc->P; p++) {
      size_t bytes = (size_t)a->d[st][p].numel * dt_size(lc->dt);
      if (memcmp(a->y[st][p], b->y[st][p], bytes) || memcmp(a->dx[st][p], b->dx[st][p], bytes) ||
          memcmp(a->gw[st][p], b->gw[st][p], C4) || memcmp(a->gb[st][p], b->gb[st][p], C4) ||
          memcmp(a->rm[st][p], b->rm[st][p], C4) || memcmp(a->rv[st][p], b->rv[st][p], C4) ||
          a->nbt[st][p] != b->nbt[st][p])
        return 0;
    }
  return 1;
}

static int run_case(const lcase *lc) {
  const int64_t C = lc->opt.num_features;
  rng r = rng_seed(lc->seed);
  double *mean = (double *)malloc(8 * (size_t)C), *std = (double *)malloc(8 * (size_t)C);
  float *w = (float *)malloc(4 * (size_t)C), *b = (float *)malloc(4 * (size_t)C);
  for (int64_t c = 0; c < C; c++) {
    std[c] = 0.5 + rng_uniform(&r);
    mean[c] = (rng_uniform(&r) - 0.3) * lc->mean_scale * std[c];
    w[c] = (float)(0.5 + rng_uniform(&r)), b[c] = (float)(rng_uniform(&r) - 0.5);
  }
  static run_state rs[2];
  memset(rs, 0, sizeof rs);
  rng r2 = r;
  rs_alloc(&rs[0], lc, &r, mean, std);
  rs_alloc(&rs[1], lc, &r2, mean, std); // the same data
  int bad = 0;
  for (int k = 0; k < 2; k++) {
    rs[k].lc = lc, rs[k].w = w, rs[k].b = b;
    sbn_status st = sbn_team_run(lc->P, rank_fn, &rs[k]);
    if (st != SBN_STATUS_OK) printf("  team run failed: %s: %s\n", sbn_status_name(st), sbn_last_error()), bad = 1;
  }
  ref_bn ref;
  ref_init(&ref, &lc->opt, w, b);
  const double ulp = lc->dt == SBN_DTYPE_BFLOAT16 ? 0x1p-8 : lc->dt == SBN_DTYPE_FLOAT16 ? 0x1p-11 : 0x1p-24;
  double ey = 0, edx = 0, egw = 0, egb = 0, erm = 0, erv = 0, dxmax = 0;
  int nbt_bad = 0;
  for (int st = 0; st <= lc->steps && !bad; st++) {
    ref_out out[MAXP];
    for (int p = 0; p < lc->P; p++) ref_out_alloc(&out[p], &rs[0].d[st][p], C);
    ref_step(&ref, st < lc->steps, rs[0].d[st], lc->P, out);
    double m = 0;
    for (int p = 0; p < lc->P; p++) m = fmax(m, max_abs(out[p].dx, rs[0].d[st][p].numel));
    dxmax = fmax(dxmax, m);
    for (int p = 0; p < lc->P; p++) {
      const int64_t n = rs[0].d[st][p].numel;
      const int eval_running = st == lc->steps && lc->opt.track_running_stats;
      ey = fmax(ey, eval_running ? ratio_err_eval(rs[0].y[st][p], &rs[0].d[st][p], lc->dt, out[p].y, ulp, 4e-6, &ref)
                                 : ratio_err(rs[0].y[st][p], lc->dt, out[p].y, n, ulp, 4e-6));
      edx = fmax(edx, ratio_err(rs[0].dx[st][p], lc->dt, out[p].dx, n, ulp, 1e-5 * fmax(m, 1e-30)));
      if (lc->opt.affine) {
        egw = fmax(egw, rel_err_f(rs[0].gw[st][p], out[p].gw, C));
        egb = fmax(egb, rel_err_f(rs[0].gb[st][p], out[p].gb, C));
      }
      if (lc->opt.track_running_stats) {
        erm = fmax(erm, rel_err_f(rs[0].rm[st][p], ref.rm, C));
        erv = fmax(erv, rel_err_f(rs[0].rv[st][p], ref.rv, C));
        nbt_bad |= rs[0].nbt[st][p] != ref.nbt;
      }
    }
    for (int p = 0; p < lc->P; p++) ref_out_free(&out[p]);
  }
  const int repeat = !bad && same_bits(&rs[0], &rs[1], lc);
  char sh[96] = "";
  for (int i = 0; i < lc->ndim; i++)
    snprintf(sh + strlen(sh), sizeof sh - strlen(sh), "%s%lld", i ? "x" : "", (long long)lc->shape[i]);
  int f = bad || !(ey <= 1) || !(edx <= 1) || !(egw <= 1e-6) || !(egb <= 1e-6) || !(erm <= 1e-6) ||
          !(erv <= 1e-6) || nbt_bad || !repeat || !(dxmax > 0.01);
  printf("%-4s %s P=%d %s %s affine=%d track=%d mom=%s%s mean=%gxstd: y %.2f dx %.2f (of bound) gw %.1e gb %.1e "
         "rm %.1e rv %.1e nbt %s, repeat %s\n",
         f ? "FAIL" : "ok", dt_name(lc->dt), lc->P, sh, lc->layout ? "CL" : "CF", lc->opt.affine,
         lc->opt.track_running_stats, lc->opt.momentum == SBN_MOMENTUM_CUMULATIVE ? "none" : "0.1",
         lc->inplace ? " in-place" : "", lc->mean_scale, ey, edx, egw, egb, erm, erv, nbt_bad ? "WRONG" : "ok",
         repeat ? "bitwise" : "DIFFERS");
  ref_free(&ref);
  rs_free(&rs[0], lc), rs_free(&rs[1], lc);
  free(mean), free(std), free(w), free(b);
  return f;
}

// ---- channels with a non-finite value, on the GPU and on the CPU ----
// Channel 0 starts with +inf, channel 1 with NaN, channel 2 holds +inf past
// its first value, channel 3 is finite. As in PyTorch, the mean of an inf
// channel is inf and its variance NaN (inf - inf), so its y, invstd and
// running_var are NaN: never the 1/sqrt(eps) of a variance clamped to 0.
// The GPU layer must give the CPU layer's classes (NaN, +inf, -inf,
// finite) everywhere, and finite values within float32 rounding.
enum { NF_N = 4, NF_C = 4, NF_S = 5, NF_P = 2 };
typedef struct nf_run {
  int cuda, layout;
  float x[NF_P][NF_N * NF_C * NF_S], y[NF_P][NF_N * NF_C * NF_S];
  float rm[NF_P][NF_C], rv[NF_P][NF_C];
  int P;
} nf_run;

static int nf_rank(sbn_group *world, void *arg) {
  nf_run *nr = (nf_run *)arg;
  const int p = sbn_group_rank(world);
  sbn_bn_options o = sbn_bn_options_default(NF_C);
  if (nr->cuda) o.device = cuda_dev(0);
  sbn_bn *bn;
  CHECK_OK(sbn_bn_create(&bn, &o, nr->P > 1 ? world : NULL));
  const size_t bytes = sizeof nr->x[p];
  int64_t shape[3] = {NF_N, NF_C, NF_S};
  void *gx = nr->x[p], *gy = nr->y[p];
  if (nr->cuda) {
    gx = hook_alloc(bytes), gy = hook_alloc(bytes);
    CUDA_OK(cudaMemcpy(gx, nr->x[p], bytes, cudaMemcpyHostToDevice));
  }
  sbn_tensor x = sbn_tensor_cpu(gx, 3, shape, SBN_DTYPE_FLOAT32, (sbn_layout)nr->layout), y = x;
  y.data = gy;
  if (nr->cuda) x.device = y.device = cuda_dev(0);
  CHECK_OK(sbn_bn_forward(bn, &y, &x));
  if (nr->cuda) {
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(nr->y[p], gy, bytes, cudaMemcpyDeviceToHost));
    fetch(nr->rm[p], bn, SBN_BN_TENSOR_RUNNING_MEAN, NF_C), fetch(nr->rv[p], bn, SBN_BN_TENSOR_RUNNING_VAR, NF_C);
    hook_release(gx), hook_release(gy);
  } else {
    sbn_tensor v;
    CHECK_OK(sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_RUNNING_MEAN));
    memcpy(nr->rm[p], v.data, sizeof nr->rm[p]);
    CHECK_OK(sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_RUNNING_VAR));
    memcpy(nr->rv[p], v.data, sizeof nr->rv[p]);
  }
  sbn_bn_destroy(bn);
  return 0;
}

static int nf_class(float v) { return isnan(v) ? 0 : isinf(v) ? (v > 0 ? 1 : 2) : 3; }

// Compares a against b (classes, finite values within 1e-5 relative + 1e-6);
// counts the mismatches and returns the largest finite error.
static double nf_compare(const float *a, const float *b, int n, int *mismatches) {
  double err = 0;
  for (int i = 0; i < n; i++) {
    if (nf_class(a[i]) != nf_class(b[i])) {
      ++*mismatches;
      continue;
    }
    if (nf_class(a[i]) == 3) err = fmax(err, fabs((double)a[i] - b[i]) / (1e-5 * fabs((double)b[i]) + 1e-6));
  }
  return err;
}

static int nonfinite_case(int P, int layout) {
  static nf_run run[2];
  rng r = rng_seed(4242 + (uint64_t)(P * 2 + layout));
  for (int k = 0; k < 2; k++) memset(&run[k], 0, sizeof run[k]), run[k].cuda = k, run[k].layout = layout, run[k].P = P;
  for (int p = 0; p < P; p++)
    for (int n = 0; n < NF_N; n++)
      for (int c = 0; c < NF_C; c++)
        for (int s = 0; s < NF_S; s++) {
          const size_t i = layout == SBN_LAYOUT_CHANNELS_LAST ? ((size_t)n * NF_S + s) * NF_C + c
                                                              : ((size_t)n * NF_C + c) * NF_S + s;
          float v = (float)(rng_uniform(&r) * 2 - 1 + c);
          const int first = p == 0 && n == 0 && s == 0, last = p == P - 1 && n == NF_N - 1 && s == NF_S - 1;
          if (c == 0 && first) v = INFINITY;
          if (c == 1 && first) v = NAN;
          if (c == 2 && last) v = INFINITY;
          run[0].x[p][i] = run[1].x[p][i] = v;
        }
  int bad = 0;
  for (int k = 0; k < 2; k++) {
    sbn_status st = sbn_team_run(P, nf_rank, &run[k]);
    if (st != SBN_STATUS_OK) printf("  team run failed: %s: %s\n", sbn_status_name(st), sbn_last_error()), bad = 1;
  }
  int mism = 0, expect_bad = 0;
  double err = 0;
  for (int p = 0; p < P && !bad; p++) {
    err = fmax(err, nf_compare(run[1].y[p], run[0].y[p], NF_N * NF_C * NF_S, &mism));
    err = fmax(err, nf_compare(run[1].rm[p], run[0].rm[p], NF_C, &mism));
    err = fmax(err, nf_compare(run[1].rv[p], run[0].rv[p], NF_C, &mism));
    // PyTorch's: mean inf (channels 0, 2) or NaN (1), variance NaN, channel 3 finite
    expect_bad |= !(run[1].rm[p][0] == INFINITY && run[1].rm[p][2] == INFINITY && isnan(run[1].rm[p][1]));
    for (int c = 0; c < 3; c++) expect_bad |= !isnan(run[1].rv[p][c]);
    expect_bad |= !isfinite(run[1].rm[p][3]) || !isfinite(run[1].rv[p][3]);
  }
  const int f = bad || mism || expect_bad || !(err <= 1);
  printf("%-4s non-finite channels P=%d %s: %d class mismatches GPU vs CPU, finite error %.2f of bound (1e-5 rel); "
         "GPU rm %g %g %g rv %g %g %g (want inf NaN inf, NaN NaN NaN)\n",
         f ? "FAIL" : "ok", P, layout ? "CL" : "CF", mism, err, run[1].rm[0][0], run[1].rm[0][1], run[1].rm[0][2],
         run[1].rv[0][0], run[1].rv[0][1], run[1].rv[0][2]);
  return f;
}

int main(void) {
  if (!gpu_or_skip("test_cuda_layer")) return 0;
  static const int64_t shapes[][5] = {{64, 24}, {4, 6, 33}, {2, 5, 7, 9}, {2, 3, 4, 5, 6}, {4, 16, 32, 32},
                                      {3, 40, 130, 130}, {3, 600, 5, 5}, {8, 64, 56, 56}, {32, 2048, 7, 7},
                                      {512, 300}};
  static const int ndims[] = {2, 3, 4, 5, 4, 4, 4, 4, 4, 2};
  static const double scales[] = {1, 100, 1e4};
  const sbn_dtype dts[] = {SBN_DTYPE_FLOAT32, SBN_DTYPE_BFLOAT16, SBN_DTYPE_FLOAT16};
  int bad = 0, n = 0, k = 0;
  for (int P = 1; P <= NF_P; P++)
    for (int lay = 0; lay < 2; lay++) bad |= nonfinite_case(P, lay), n++;
  for (int di = 0; di < 3; di++)
    for (int si = 0; si < 10; si++)
      for (int lay = 0; lay < 2; lay++) {
        lcase lc;
        memset(&lc, 0, sizeof lc);
        lc.dt = dts[di];
        lc.P = 1 + (k % 2);
        lc.ndim = ndims[si];
        memcpy(lc.shape, shapes[si], sizeof lc.shape);
        lc.layout = (sbn_layout)lay;
        lc.opt = sbn_bn_options_default(shapes[si][1]);
        lc.opt.device = cuda_dev(0);
        lc.opt.affine = k % 5 != 3;
        lc.opt.track_running_stats = k % 7 != 4;
        lc.opt.momentum = k % 3 == 1 ? SBN_MOMENTUM_CUMULATIVE : 0.1;
        lc.steps = 2;
        lc.inplace = k % 4 == 2;
        lc.mean_scale = scales[(si + lay + di) % 3];
        if (lc.dt == SBN_DTYPE_BFLOAT16 && lc.mean_scale > 100) lc.mean_scale = 100; // 1e4: all equal in 8 bits
        lc.seed = 1000 + (uint64_t)k;
        bad |= run_case(&lc);
        n++, k++;
      }
  printf(bad ? "\nSOME GPU LAYER CHECKS FAILED\n" : "\nall %d GPU layer cases passed\n", n);
  return bad;
}
