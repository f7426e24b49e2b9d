/* bfloat16 and float16 storage against the float64 reference.
 *
 * 1. The scalar conversions (used by the portable kernels and every tail)
 *    against the F16C instructions (all 65536 halves widened; ~3M floats
 *    narrowed, including every rounding boundary) and against the definition
 *    of round-to-nearest-even for bfloat16.
 * 2. The layer on 16-bit x and dy (rounded from N(mean, std) data; the
 *    reference reads the same rounded values exactly), 1 and 2 ranks, both
 *    layouts, 2-D..4-D, rows split into several units, streamed outputs,
 *    ill-conditioned channels (mean = 100 and 1e4 x std).
 *
 * Tolerances (justified by the storage precision): y and dx are rounded
 * once to the storage type, so each value may be off by half a unit in the
 * last place of its own magnitude: 2^-8 |v| for bfloat16 (8 significant
 * bits), 2^-11 |v| for float16 (11). On top, the float32 double rounding and
 * the float32 elementwise arithmetic (~1e-7 relative to the terms), covered
 * by 4e-6 absolute for y (|y| < ~8) and 1e-5 x max|dx| for dx (as for
 * float32, dx mixes terms of that size). The per-channel results (grad
 * weight/bias, running statistics) are float64 sums of exactly
 * representable inputs, so they keep the float32 tolerance 1e-6 relative.
 * A kernel that rounded y twice to 16 bits, lost the split mean, or summed
 * in 16/32 bits would exceed these. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/cpu/bn_kernels.h"
#include "cpu_data.h"

/* ---- 1. conversions ---- */

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f) {
  return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
__attribute__((target("f16c"))) static float hw_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
#endif

static int test_conversions(void) {
  int bad = 0;
#if defined(__x86_64__)
  if (sbn_cpu_has_avx2()) {
    long wrong = 0, n = 0;
    for (uint32_t h = 0; h < 65536; h++, n++) {
      float a = sbn_f16_to_f32((uint16_t)h), b = hw_f16_to_f32((uint16_t)h);
      if (sbn_f32_bits(a) != sbn_f32_bits(b) && !(a != a && b != b)) wrong++;
    }
    bad |= check("float16 -> float32, all 65536 (mismatches)", (double)wrong, 0);
    wrong = 0, n = 0;
    rng r = rng_seed(5);
    for (uint32_t h = 0; h < 0x7c00; h++) /* each half, its neighbours and midpoints */
      for (int s = 0; s < 2; s++) {
        uint32_t u = sbn_f32_bits(sbn_f16_to_f32((uint16_t)h)) | (s ? 0x80000000u : 0);
        for (int d = -2; d <= 2; d++) {
          uint32_t v = u + (uint32_t)d * 0x1000u; /* crosses the midpoint at +-0x1000 */
          for (int e = -1; e <= 1; e++, n++) {
            float f = sbn_bits_f32(v + (uint32_t)e);
            if (sbn_f32_to_f16(f) != hw_f32_to_f16(f)) wrong++;
          }
        }
      }
    for (int i = 0; i < 1000000; i++, n++) {
      float f = sbn_bits_f32((uint32_t)rng_u64(&r));
      uint16_t a = sbn_f32_to_f16(f), b = hw_f32_to_f16(f);
      if (a != b && !(f != f && (a & 0x7c00) == 0x7c00 && (a & 0x3ff))) wrong++; /* NaN payloads may differ */
    }
    printf("  float32 -> float16: %ld values compared with F16C\n", n);
    bad |= check("float32 -> float16 (mismatches)", (double)wrong, 0);
  } else {
    printf("  (no F16C: hardware comparison skipped)\n");
  }
#endif
  /* bfloat16: the result is the nearest bfloat16, ties to even */
  rng r = rng_seed(9);
  long wrong = 0;
  for (int i = 0; i < 2000000; i++) {
    uint32_t u = (uint32_t)rng_u64(&r);
    if (i & 1) u = (u & 0xffff8000u) | (i & 2 ? 0x8000u : 0x7fffu); /* ties and near-ties */
    float f = sbn_bits_f32(u);
    if (f != f || isinf(f)) continue;
    uint16_t b = sbn_f32_to_bf16(f);
    double lo = sbn_bf16_to_f32((uint16_t)(u >> 16)), hi = sbn_bf16_to_f32((uint16_t)((u >> 16) + 1));
    double dl = fabs(f - lo), dh = fabs(f - hi);
    uint16_t want = dl < dh ? (uint16_t)(u >> 16) : dh < dl ? (uint16_t)((u >> 16) + 1)
                                                            : (uint16_t)(((u >> 16) & 1) ? (u >> 16) + 1 : u >> 16);
    if (isinf(hi)) /* beyond the largest bfloat16: from its half-way point up, inf */
      want = (uint16_t)((u & 0xffffu) >= 0x8000u ? (u >> 16) + 1 : u >> 16);
    if (b != want) wrong++;
  }
  bad |= check("float32 -> bfloat16 nearest-even (mismatches)", (double)wrong, 0);
  return bad;
}

/* ---- 2. the layer ---- */

typedef struct run_arg {
  int P;
  sbn_dtype dt;
  rank_data *d;     /* per rank: float copies (exact values) */
  void **x, **dy, **y, **dx; /* per rank: storage buffers */
  float *w, *b;     /* initial parameters */
  float *gw[2], *gb[2], *rm[2], *rv[2];
  void **y_eval;
  int failed;
} run_arg;

static sbn_tensor st_tensor(rank_data *d, void *data, sbn_dtype dt) {
  return sbn_tensor_cpu(data, d->ndim, d->shape, dt, d->layout);
}

static int rank_fn(sbn_group *world, void *argp) {
  run_arg *a = argp;
  int p = sbn_group_rank(world);
  rank_data *d = &a->d[p];
  sbn_bn_options o = sbn_bn_options_default(d->shape[1]);
  sbn_bn *bn;
  CHECK_OK(sbn_bn_create(&bn, &o, a->P > 1 ? world : NULL));
  sbn_tensor w, b;
  CHECK_OK(sbn_bn_tensor(&w, bn, SBN_BN_TENSOR_WEIGHT));
  CHECK_OK(sbn_bn_tensor(&b, bn, SBN_BN_TENSOR_BIAS));
  memcpy(w.data, a->w, 4 * (size_t)d->shape[1]);
  memcpy(b.data, a->b, 4 * (size_t)d->shape[1]);
  sbn_tensor x = st_tensor(d, a->x[p], a->dt), y = st_tensor(d, a->y[p], a->dt);
  sbn_tensor dy = st_tensor(d, a->dy[p], a->dt), dx = st_tensor(d, a->dx[p], a->dt);
  CHECK_OK(sbn_bn_forward(bn, &y, &x));
  CHECK_OK(sbn_bn_backward(bn, &dx, &dy, &x));
  sbn_tensor t;
  CHECK_OK(sbn_bn_tensor(&t, bn, SBN_BN_TENSOR_GRAD_WEIGHT));
  memcpy(a->gw[p], t.data, 4 * (size_t)d->shape[1]);
  CHECK_OK(sbn_bn_tensor(&t, bn, SBN_BN_TENSOR_GRAD_BIAS));
  memcpy(a->gb[p], t.data, 4 * (size_t)d->shape[1]);
  CHECK_OK(sbn_bn_tensor(&t, bn, SBN_BN_TENSOR_RUNNING_MEAN));
  memcpy(a->rm[p], t.data, 4 * (size_t)d->shape[1]);
  CHECK_OK(sbn_bn_tensor(&t, bn, SBN_BN_TENSOR_RUNNING_VAR));
  memcpy(a->rv[p], t.data, 4 * (size_t)d->shape[1]);
  CHECK_OK(sbn_bn_set_training(bn, 0));
  sbn_tensor ye = st_tensor(d, a->y_eval[p], a->dt);
  CHECK_OK(sbn_bn_forward(bn, &ye, &x));
  sbn_bn_destroy(bn);
  return 0;
}

/* max over i of |got - ref| / (ulp_rel * |ref| + abs) */
static double ratio_err(const void *got, sbn_dtype dt, const double *ref, int64_t n, double ulp_rel,
                        double abs_tol, double *max_abs_err) {
  double worst = 0;
  float *g = malloc((size_t)(n ? n : 1) * 4);
  from_storage(g, got, n, dt);
  for (int64_t i = 0; i < n; i++) {
    double e = fabs((double)g[i] - ref[i]), q = e / (ulp_rel * fabs(ref[i]) + abs_tol);
    if (!(q <= worst)) worst = q;
    if (e > *max_abs_err) *max_abs_err = e;
  }
  free(g);
  return worst;
}

static double rel_err(const float *got, const double *ref, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = fabs(got[i] - ref[i]) / fmax(1.0, fabs(ref[i]));
    if (!(e <= m)) m = e;
  }
  return m;
}

static int layer_case(sbn_dtype dt, int P, int ndim, const int64_t *shape0, sbn_layout layout,
                      double mean_scale, uint64_t seed) {
  const int64_t C = shape0[1];
  rank_data d[2];
  void *x[2], *dy[2], *y[2], *dx[2], *ye[2];
  float *gw[2], *gb[2], *rm[2], *rv[2];
  rng r = rng_seed(seed);
  double *mean = malloc(8 * (size_t)C), *std = malloc(8 * (size_t)C);
  float *w = malloc(4 * (size_t)C), *b = malloc(4 * (size_t)C);
  for (int64_t c = 0; c < C; c++) {
    std[c] = 0.5 + rng_uniform(&r);
    mean[c] = (rng_uniform(&r) - 0.3) * mean_scale * std[c];
    w[c] = (float)(0.5 + rng_uniform(&r)), b[c] = (float)(rng_uniform(&r) - 0.5);
  }
  for (int p = 0; p < P; p++) {
    int64_t sh[SBN_MAX_DIMS];
    memcpy(sh, shape0, sizeof sh);
    if (p == 1) sh[0] = shape0[0] > 1 ? shape0[0] / 2 : 1; /* uneven ranks */
    rank_data_alloc(&d[p], ndim, sh, layout);
    rank_data_fill(&d[p], &r, mean, std);
    quantize(d[p].x, d[p].numel, dt);
    quantize(d[p].dy, d[p].numel, dt);
    size_t bytes = (size_t)(d[p].numel ? d[p].numel : 1) * dt_size(dt);
    x[p] = malloc(bytes), dy[p] = malloc(bytes), y[p] = malloc(bytes), dx[p] = malloc(bytes), ye[p] = malloc(bytes);
    to_storage(x[p], d[p].x, d[p].numel, dt);
    to_storage(dy[p], d[p].dy, d[p].numel, dt);
    gw[p] = malloc(4 * (size_t)C), gb[p] = malloc(4 * (size_t)C), rm[p] = malloc(4 * (size_t)C), rv[p] = malloc(4 * (size_t)C);
  }
  run_arg a = {P, dt, d, x, dy, y, dx, w, b, {gw[0], gw[1]}, {gb[0], gb[1]}, {rm[0], rm[1]}, {rv[0], rv[1]}, ye, 0};
  sbn_status st = sbn_team_run(P, rank_fn, &a);
  int bad = st != SBN_STATUS_OK;
  if (bad) printf("  team run failed: %s\n", sbn_status_name(st));

  /* reference: one training step, then eval with the running statistics */
  sbn_bn_options o = sbn_bn_options_default(C);
  ref_bn ref;
  ref_init(&ref, &o, w, b);
  ref_out out[2], out_eval[2];
  for (int p = 0; p < P; p++) ref_out_alloc(&out[p], &d[p], C), ref_out_alloc(&out_eval[p], &d[p], C);
  ref_step(&ref, 1, d, P, out);
  ref_step(&ref, 0, d, P, out_eval);

  const double ulp = dt == SBN_DTYPE_BFLOAT16 ? 0x1p-8 : dt == SBN_DTYPE_FLOAT16 ? 0x1p-11 : 0x1p-23;
  double ey = 0, edx = 0, eye = 0, egw = 0, egb = 0, erm = 0, erv = 0, ay = 0, adx = 0;
  for (int p = 0; p < P && !bad; p++) {
    const int64_t n = d[p].numel;
    ey = fmax(ey, ratio_err(y[p], dt, out[p].y, n, ulp, 4e-6, &ay));
    eye = fmax(eye, ratio_err(ye[p], dt, out_eval[p].y, n, ulp, 4e-6, &ay));
    edx = fmax(edx, ratio_err(dx[p], dt, out[p].dx, n, ulp, 1e-5 * fmax(max_abs(out[p].dx, n), 1e-30), &adx));
    egw = fmax(egw, rel_err(gw[p], out[p].gw, C));
    egb = fmax(egb, rel_err(gb[p], out[p].gb, C));
    erm = fmax(erm, rel_err(rm[p], ref.rm, C));
    erv = fmax(erv, rel_err(rv[p], ref.rv, C));
  }
  char sh[96] = "";
  for (int i = 0; i < ndim; i++)
    snprintf(sh + strlen(sh), sizeof sh - strlen(sh), "%s%lld", i ? "x" : "", (long long)shape0[i]);
  printf("%s P=%d %s %s mean=%gxstd: max |y err| %.2e, max |dx err| %.2e\n", dt_name(dt), P,
         sh, layout ? "CL" : "CF", mean_scale, ay, adx);
  bad |= check("y / (half-ulp bound + 4e-6)", ey, 1.0);
  bad |= check("eval y / (half-ulp bound + 4e-6)", eye, 1.0);
  bad |= check("dx / (half-ulp bound + 1e-5 max|dx|)", edx, 1.0);
  bad |= check("grad_weight (rel)", egw, 1e-6);
  bad |= check("grad_bias (rel)", egb, 1e-6);
  bad |= check("running_mean (rel)", erm, 1e-6);
  bad |= check("running_var (rel)", erv, 1e-6);
  bad |= check("evidence: max |dx| > 0.01 (nonzero data)", max_abs(out[0].dx, d[0].numel) > 0.01 ? 0 : 1, 0);

  for (int p = 0; p < P; p++) {
    ref_out_free(&out[p]), ref_out_free(&out_eval[p]);
    free(x[p]), free(dy[p]), free(y[p]), free(dx[p]), free(ye[p]);
    free(gw[p]), free(gb[p]), free(rm[p]), free(rv[p]);
    rank_data_free(&d[p]);
  }
  ref_free(&ref);
  free(mean), free(std), free(w), free(b);
  return bad;
}

int main(void) {
  int bad = 0;
  printf("kernels: %s (SYNCBN_CPU_ISA=%s)\nconversions:\n", sbn_cpu_isa_name(sbn_cpu_get_isa()),
         getenv("SYNCBN_CPU_ISA") ? getenv("SYNCBN_CPU_ISA") : "unset");
  /* SYNCBN_CPU_ISA must pick the kernels when the CPU runs them */
  const char *want = getenv("SYNCBN_CPU_ISA");
  if (want && sbn_cpu_isa_supported(sbn_cpu_isa_find(want)))
    bad |= check("SYNCBN_CPU_ISA selects those kernels (0: yes)",
                 strcmp(want, sbn_cpu_isa_name(sbn_cpu_get_isa())) != 0, 0);
  bad |= test_conversions();
  /* 3x600x5x5: channels-last blocks of 512 + 88 channels (5 register blocks
   * of 16, 2 of 4), 75 rows = 2 blocks of 32 (8 rows at a time) and 11 rows
   * (8 + 3 one at a time). 5x19x23x29: C = 16 + 3, 4 row blocks, the last of
   * 95 steps of 8 + 7 rows. 7x3x45x41: C = 3, single channels only. */
  static const int64_t shapes[][5] = {{64, 24},      {4, 6, 33},     {2, 5, 7, 9},  {4, 16, 32, 32},
                                      {3, 40, 130, 130}, {3, 600, 5, 5}, {5, 19, 23, 29}, {7, 3, 45, 41}};
  static const int ndims[] = {2, 3, 4, 4, 4, 4, 4, 4};
  enum { NSHAPES = sizeof ndims / sizeof ndims[0] };
  static const double scales[] = {1, 100, 1e4};
  const sbn_dtype dts[] = {SBN_DTYPE_BFLOAT16, SBN_DTYPE_FLOAT16, SBN_DTYPE_FLOAT32};
  uint64_t seed = 11;
  for (int di = 0; di < 3; di++)
    for (int si = 0; si < NSHAPES; si++)
      for (int lay = 0; lay < 2; lay++)
        for (int P = 1; P <= 2; P++) {
          int64_t numel = 1;
          for (int i = 0; i < ndims[si]; i++) numel *= shapes[si][i];
          if (test_skip_large(numel, 200000)) { /* minutes each under TSan */
            seed++;
            continue;
          }
          double scale = scales[(si + lay + P) % 3];
          if (dts[di] == SBN_DTYPE_BFLOAT16 && scale > 100) scale = 100; /* 1e4: all values equal in 8 bits */
          bad |= layer_case(dts[di], P, ndims[si], shapes[si], (sbn_layout)lay, scale, seed++);
        }
  printf(bad ? "\nSOME DTYPE CHECKS FAILED\n" : "\nall dtype checks passed\n");
  return bad;
}
