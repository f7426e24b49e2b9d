/* The reduction passes' float64 sums, bit for bit, in every instruction set
 * this CPU runs and with 1, 2 and 4 threads: shift, sum(x - shift),
 * sum((x - shift)^2), sum(dy), sum(dy * (x - mean)) per channel. The
 * layer's outputs (test_cpu_determinism) are rounded to the storage type
 * and can hide a last-bit difference in a sum; these cannot. Values of
 * full precision and magnitudes spread over 2^10, means far from zero, so
 * that the sums round and a change in a channel's order of additions shows
 * in their bits; then, for the types whose exponents allow it (not
 * float16), magnitudes spread over 2^60: with 2^10, a sum of a few values'
 * x - shift is exact in float64, so the order of the first additions of a
 * tree (4 or 8 rows) could change without a bit showing. Shapes
 * reach every loop of the kernels: channels-first 16-value steps, 4-value
 * and single tails, several images, chunks, small maps; rows layout blocks
 * of 16, then 4, then 1 channels, 8-row steps and single rows, channel
 * blocks above 512. Tolerance: 0 differing sums. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/cpu/bn_kernels.h"
#include "cpu_data.h"

enum { NSUM = 5 };

/* All five sums of every channel, in *out (5C doubles). */
static void sums(sbn_cpu_ws *ws, double *out, const void *x, const void *dy, sbn_geom g, const double *mean) {
  const int64_t C = g.c;
  sbn_cpu_stats(ws, out, out + C, out + 2 * C, x, g);
  sbn_cpu_backward_reduce(ws, out + 3 * C, out + 4 * C, dy, x, g, mean);
}

static int one(sbn_dtype dt, sbn_layout lay, int64_t N, int64_t C, int64_t S, int spread, rng *r) {
  const int64_t n = N * C * S;
  const size_t es = dt_size(dt);
  float *tmp = malloc(4 * (size_t)n);
  void *x = malloc(es * (size_t)n), *dy = malloc(es * (size_t)n);
  double *mean = malloc(8 * (size_t)C), *base = malloc(8 * NSUM * (size_t)C), *got = malloc(8 * NSUM * (size_t)C);
  for (int64_t i = 0; i < n; i++) tmp[i] = (float)(7.0 + 3.0 * rng_normal(r) * ldexp(1.0, rng_int(r, 0, spread)));
  to_storage(x, tmp, n, dt);
  for (int64_t i = 0; i < n; i++) tmp[i] = (float)(0.5 + rng_normal(r));
  to_storage(dy, tmp, n, dt);
  if (dt == SBN_DTYPE_FLOAT64) /* values of full float64 precision, the same spread */
    for (int64_t i = 0; i < n; i++) {
      ((double *)x)[i] = 7.0 + 3.0 * rng_normal(r) * ldexp(1.0, rng_int(r, 0, spread));
      ((double *)dy)[i] = 0.5 + rng_normal(r);
    }
  for (int64_t c = 0; c < C; c++) mean[c] = 7.0 + 0.1 * rng_normal(r); /* not a storage value */
  sbn_geom g = {N, C, S, lay, dt};
  sbn_cpu_ws ws = {NULL, 0, 1};
  if (sbn_cpu_ws_reserve(&ws, g)) return 1;
  const int isa = sbn_cpu_get_isa();
  sbn_cpu_set_isa(SBN_CPU_ISA_GENERIC);
  sums(&ws, base, x, dy, g, mean);
  double diff = 0, evidence = 0;
  int runs = 0;
  /* Both orders of the reductions. Channels-first: image by image (small
   * maps from 1 stream, larger ones as by default) and channel by channel
   * (small maps up to 2^30 streams, larger ones with cf_major off). Rows
   * layout: the statistics and backward reduce in quads and in column sweeps. */
  const int orders = 2;
  for (int i = 0; i < sbn_cpu_isa_count(); i++) {
    if (!sbn_cpu_isa_supported(i)) continue;
    sbn_cpu_set_isa(i);
    for (int o = 0; o < orders; o++) {
      if (lay == SBN_LAYOUT_CHANNELS_FIRST) sbn_cpu_set_cf_streams(o ? 1 << 30 : 1), sbn_cpu_set_cf_major(!o);
      else sbn_cpu_set_rl_quads(o ? 2 : 1);
      for (int t = 1; t <= 4; t *= 2, runs++) {
        ws.threads = t;
        memset(got, 0xa5, 8 * NSUM * (size_t)C);
        sums(&ws, got, x, dy, g, mean);
        for (int64_t j = 0; j < NSUM * C; j++) diff += memcmp(&got[j], &base[j], 8) != 0;
      }
    }
    sbn_cpu_set_cf_streams(0), sbn_cpu_set_cf_major(1), sbn_cpu_set_rl_quads(0);
  }
  for (int64_t j = C; j < NSUM * C; j++) evidence += base[j] != 0;
  sbn_cpu_set_isa(isa);
  /* The sums themselves against a plain float64 loop over the same values
   * (its own rounding: at most n * 2^-53 of the sum of |terms|, ~2e-10 at
   * 1.9 M values; 1e-9 of it catches any lost or doubled part: half of
   * the rows of some units left out gave 0.5 in a trial). */
  double worst = 0, shift_bad = 0;
  {
    double *xv = malloc(8 * (size_t)n), *gv = malloc(8 * (size_t)n);
    if (dt == SBN_DTYPE_FLOAT64) {
      memcpy(xv, x, 8 * (size_t)n), memcpy(gv, dy, 8 * (size_t)n);
    } else {
      from_storage(tmp, x, n, dt);
      for (int64_t i = 0; i < n; i++) xv[i] = tmp[i];
      from_storage(tmp, dy, n, dt);
      for (int64_t i = 0; i < n; i++) gv[i] = tmp[i];
    }
    for (int64_t c = 0; c < C; c++) {
      double ref[4] = {0, 0, 0, 0}, mag[4] = {0, 0, 0, 0};
      const double sh = base[c];
      shift_bad += sh != xv[lay ? c : c * S]; /* the shift: the channel's first value (all finite here) */
      for (int64_t i = 0; i < N * S; i++) { /* i: image and position */
        const int64_t at = lay ? i * C + c : (i / S * C + c) * S + i % S;
        const double d = xv[at] - sh, dyv = gv[at], e = dyv * (xv[at] - mean[c]);
        ref[0] += d, ref[1] += d * d, ref[2] += dyv, ref[3] += e;
        mag[0] += fabs(d), mag[1] += d * d, mag[2] += fabs(dyv), mag[3] += fabs(e);
      }
      for (int j = 0; j < 4; j++) {
        const double err = fabs(base[(j + 1) * C + c] - ref[j]) / (mag[j] > 0 ? mag[j] : 1);
        worst = err > worst ? err : worst;
      }
    }
    free(xv), free(gv);
  }
  printf("%s %s %lldx%lldx%lld, spread 2^%d: %lld sums x %d runs (instruction sets x %s1, 2, 4 threads)\n",
         dt_name(dt), lay ? "CL" : "CF", (long long)N, (long long)C, (long long)S, spread, (long long)(NSUM * C), runs,
         lay == SBN_LAYOUT_CHANNELS_FIRST ? "image- and channel-major x " : "quads and column sweeps x ");
  int bad = check("  sums differing from generic, 1 thread", diff, 0);
  bad |= check("  shifts not the channel's first value", shift_bad, 0);
  printf("  largest error against a float64 loop, relative to the sum of |terms|: %.2e (tol 1e-9)\n", worst);
  bad |= !(worst <= 1e-9);
  bad |= check("  evidence: sums not zero (0: yes)", evidence > 0 ? 0 : 1, 0);
  sbn_cpu_ws_free(&ws);
  free(tmp), free(x), free(dy), free(mean), free(base), free(got);
  return bad;
}

int main(void) {
  rng r = rng_seed(31);
  int bad = 0;
  /* Channels-first: S = 55 = 3 x 16 + 4 + 3 over 3 images; 7x7 maps;
   * S = 20007: chunks of 16384 and 3623 (226 x 16 + 4 + 3), several
   * threads; 64 images of 13 values (image by image by default) and 40 of
   * 7x7, 70 channels (blocks of 64 and 6). Rows layout (the same shapes
   * channels-last, and 2-D): C = 39 = 2 x 16 + 4 + 3, 165 rows (20 steps
   * of 8 + 5); C = 1100 = 368 + 368 + 364 in column sweeps (whole rows in
   * quads, up to 2048), C = 2100 = 1056 + 1044 in quads (sweeps: 5 blocks
   * of 432 and the rest); C = 1023 in whole rows (63 x 16 +
   * 3 x 4 + 3); 2-D C = 6 = 4 + 2. Tall inputs, many row blocks and
   * chunks: 3 x 1100 x 411 (1233 rows of 3 channel blocks, the last row
   * block 17 rows; groups of 8 row blocks, the last of 7), 2-D 120000 x 16
   * (118 row blocks, the last 192 rows; groups of 8, the last of 6) and
   * 10 x 300 x 37 (8 row blocks of 48 rows, the last 34; groups of 2).
   * Rows of 4 KiB or 8 KiB (float32 C = 1024, 2048; float16 C = 2048:
   * the AVX-512 build's two-rows-at-a-time order, kern_rows.inc).
   * Channels-first maps of 1 KiB and more, image by image (bn_kernels.c
   * cf_major): 3 x 1100 x 411 (not bfloat16: 822 bytes) and 5 x 37 x 1031
   * (1031 = 64 x 16 + 4 + 3; 37 channels: hand-outs of 2, blocks of 16, 5). */
  static const int64_t shapes[][3] = {{3, 39, 55},    {8, 96, 49},    {2, 8, 20007},  {4, 1100, 12},
                                      {9001, 6, 1},   {3, 1100, 411}, {120000, 16, 1}, {64, 70, 13},
                                      {40, 70, 49},   {5, 1023, 9},   {3, 1024, 7},   {2, 2048, 11},
                                      {5, 37, 1031}, {10, 300, 37},   {2, 2100, 9}};
  const sbn_dtype dts[] = {SBN_DTYPE_FLOAT32, SBN_DTYPE_BFLOAT16, SBN_DTYPE_FLOAT16, SBN_DTYPE_FLOAT64};
  for (int wide = 0; wide < 2; wide++)
    for (int d = 0; d < 4; d++) {
      if (wide && dts[d] == SBN_DTYPE_FLOAT16) continue; /* its exponents span too little */
      for (int s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++)
        for (int lay = 0; lay < 2; lay++)
          bad |= one(dts[d], (sbn_layout)lay, shapes[s][0], shapes[s][1], shapes[s][2], wide ? 60 : 10, &r);
    }
  printf(bad ? "\nSUM BIT CHECKS FAILED\n" : "\nall sum bit checks passed\n");
  return bad;
}
