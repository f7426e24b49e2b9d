/* Bitwise determinism of the CPU kernels: the same inputs give the same
 * bits of y, dx, grad_weight, grad_bias and running statistics
 *  - with 1, 2 and 4 threads per rank (sbn_set_num_threads),
 *  - with every instruction set of the kernels this CPU runs (generic, avx2,
 *    avx512),
 *  - with 1 and 2 threads per rank in a team of 2 synchronized ranks,
 * for float32, bfloat16, float16 and float64 (a float64 layer), both layouts, shapes large enough to be
 * split across threads, with rows split into several units and streamed
 * outputs. Evidence: the number of differing values (must be 0) and a
 * checksum that shows the outputs are not trivially zero. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/cpu/bn_kernels.h"
#include "cpu_data.h"

typedef struct outs { /* everything a rank produces in 2 training steps */
  unsigned char *bytes;
  size_t n;
} outs;

typedef struct cfg {
  sbn_dtype dt;
  int ndim;
  int64_t shape[SBN_MAX_DIMS];
  sbn_layout layout;
  int P;
  void *x[2], *dy[2];
  int64_t numel;
  outs out[2];
} cfg;

static void append(outs *o, const void *p, size_t n) {
  o->bytes = realloc(o->bytes, o->n + n);
  memcpy(o->bytes + o->n, p, n);
  o->n += n;
}

static int rank_fn(sbn_group *world, void *argp) {
  cfg *c = argp;
  int p = sbn_group_rank(world);
  const int64_t C = c->shape[1];
  sbn_bn_options o = sbn_bn_options_default(C);
  o.param_dtype = c->dt == SBN_DTYPE_FLOAT64 ? SBN_DTYPE_FLOAT64 : SBN_DTYPE_FLOAT32;
  sbn_bn *bn;
  CHECK_OK(sbn_bn_create(&bn, &o, c->P > 1 ? world : NULL));
  const size_t bytes = (size_t)c->numel * dt_size(c->dt);
  void *y = malloc(bytes), *dx = malloc(bytes);
  sbn_tensor x = sbn_tensor_cpu(c->x[p], c->ndim, c->shape, c->dt, c->layout);
  sbn_tensor dy = sbn_tensor_cpu(c->dy[p], c->ndim, c->shape, c->dt, c->layout);
  sbn_tensor ty = sbn_tensor_cpu(y, c->ndim, c->shape, c->dt, c->layout);
  sbn_tensor tdx = sbn_tensor_cpu(dx, c->ndim, c->shape, c->dt, c->layout);
  for (int step = 0; step < 2; step++) {
    CHECK_OK(sbn_bn_forward(bn, &ty, &x));
    CHECK_OK(sbn_bn_backward(bn, &tdx, &dy, &x));
    append(&c->out[p], y, bytes);
    append(&c->out[p], dx, bytes);
  }
  for (int id = SBN_BN_TENSOR_GRAD_WEIGHT; id <= SBN_BN_TENSOR_RUNNING_VAR; id++) {
    sbn_tensor t;
    CHECK_OK(sbn_bn_tensor(&t, bn, (sbn_bn_tensor_id)id));
    append(&c->out[p], t.data, dt_size(t.dtype) * (size_t)C);
  }
  free(y), free(dx);
  sbn_bn_destroy(bn);
  return 0;
}

static int run(cfg *c, outs *res) {
  for (int p = 0; p < c->P; p++) c->out[p] = (outs){NULL, 0};
  sbn_status st = sbn_team_run(c->P, rank_fn, c);
  if (st != SBN_STATUS_OK) return printf("  run failed: %s\n", sbn_status_name(st)), 1;
  res->n = 0, res->bytes = NULL;
  for (int p = 0; p < c->P; p++) append(res, c->out[p].bytes, c->out[p].n), free(c->out[p].bytes);
  return 0;
}

/* differing 2-byte or 4-byte values */
static double differing(const outs *a, const outs *b) {
  if (a->n != b->n) return INFINITY;
  size_t d = 0;
  for (size_t i = 0; i < a->n; i += 2) d += memcmp(a->bytes + i, b->bytes + i, 2) != 0;
  return (double)d;
}

static int one_config(sbn_dtype dt, int ndim, const int64_t *shape, sbn_layout layout, int P, uint64_t seed) {
  cfg c;
  memset(&c, 0, sizeof c);
  c.dt = dt, c.ndim = ndim, c.layout = layout, c.P = P;
  memcpy(c.shape, shape, sizeof c.shape);
  c.numel = 1;
  for (int i = 0; i < ndim; i++) c.numel *= shape[i];
  rng r = rng_seed(seed);
  float *tmp = malloc((size_t)c.numel * 4);
  for (int p = 0; p < P; p++) {
    c.x[p] = malloc((size_t)c.numel * dt_size(dt));
    c.dy[p] = malloc((size_t)c.numel * dt_size(dt));
    for (int64_t i = 0; i < c.numel; i++) tmp[i] = (float)(3.0 + 2.0 * rng_normal(&r));
    to_storage(c.x[p], tmp, c.numel, dt);
    for (int64_t i = 0; i < c.numel; i++) tmp[i] = (float)rng_normal(&r);
    to_storage(c.dy[p], tmp, c.numel, dt);
    for (int64_t i = 0; dt == SBN_DTYPE_FLOAT64 && i < c.numel; i++) /* full float64 precision */
      ((double *)c.x[p])[i] = 3.0 + 2.0 * rng_normal(&r), ((double *)c.dy[p])[i] = rng_normal(&r);
  }
  free(tmp);
  char sh[64] = "";
  for (int i = 0; i < ndim; i++) snprintf(sh + strlen(sh), sizeof sh - strlen(sh), "%s%lld", i ? "x" : "", (long long)shape[i]);
  printf("%s %s %s, %d rank(s):\n", dt_name(dt), sh, layout ? "CL" : "CF", P);

  int bad = 0;
  outs base;
  sbn_set_num_threads(1);
  bad |= run(&c, &base);
  double sum = 0;
  for (size_t i = 0; i + 2 <= base.n; i += 2) sum += (double)(base.bytes[i] ^ base.bytes[i + 1]);
  printf("  evidence: %zu output bytes, byte checksum %.0f\n", base.n, sum);
  bad |= check("evidence: outputs not all zero", sum > 0 ? 0 : 1, 0);
  static const int threads[] = {2, 4};
  for (int t = 0; t < 2 && !bad; t++) {
    outs o;
    sbn_set_num_threads(threads[t]);
    bad |= run(&c, &o);
    char name[64];
    snprintf(name, sizeof name, "values differing, %d vs 1 thread(s)", threads[t]);
    bad |= check(name, differing(&o, &base), 0);
    free(o.bytes);
  }
  sbn_set_num_threads(0);
  /* every other instruction set this CPU runs, 2 threads */
  const int isa = sbn_cpu_get_isa();
  for (int i = 0; i < sbn_cpu_isa_count() && !bad; i++) {
    if (i == isa || !sbn_cpu_isa_supported(i)) continue;
    outs o;
    sbn_cpu_set_isa(i);
    sbn_set_num_threads(2);
    bad |= run(&c, &o);
    char name[96];
    snprintf(name, sizeof name, "values differing, %s vs %s kernels (2 threads)", sbn_cpu_isa_name(i),
             sbn_cpu_isa_name(isa));
    bad |= check(name, differing(&o, &base), 0);
    sbn_cpu_set_isa(isa);
    sbn_set_num_threads(0);
    free(o.bytes);
  }
  free(base.bytes);
  for (int p = 0; p < P; p++) free(c.x[p]), free(c.dy[p]);
  return bad;
}

int main(void) {
  int bad = 0;
  printf("kernels: %s (SYNCBN_CPU_ISA=%s); compared with every other instruction set this CPU runs\n",
         sbn_cpu_isa_name(sbn_cpu_get_isa()), getenv("SYNCBN_CPU_ISA") ? getenv("SYNCBN_CPU_ISA") : "unset");
  /* SYNCBN_CPU_ISA must pick the kernels when the CPU runs them */
  const char *want = getenv("SYNCBN_CPU_ISA");
  if (want && sbn_cpu_isa_supported(sbn_cpu_isa_find(want)))
    bad |= check("SYNCBN_CPU_ISA selects those kernels (0: yes)",
                 strcmp(want, sbn_cpu_isa_name(sbn_cpu_get_isa())) != 0, 0);
  /* All above the one-thread limit. 3x5x150x130: rows of 19500 values = 2 chunks.
   * 4x1100x3x4: channels-last blocks of 512 + 512 + 76 channels, 48 rows = a block
   * of 32 and one of 16. 8x96x7x7: small maps (pieces of 49 values).
   * Rows layout (channels-last and 2-D), register blocks of 16 channels, then
   * 4, then 1, over 8-row steps then single rows: 5x19x23x29: C = 16 + 3,
   * 3335 rows in units of 856 (the last 767 = 95 steps of 8 + 7 rows);
   * 7x3x45x41: C = 3 (single channels only), 12915 rows in units of 5456;
   * 9001x6: 2-D, C = 4 + 2; 3x35x130x9: C = 2 x 16 + 3, 3510 rows. */
  static const int64_t shapes[][5] = {{3, 5, 150, 130}, {4, 24, 40, 40}, {4096, 40}, {2, 64, 130, 130},
                                      {4, 1100, 3, 4},  {8, 96, 7, 7},   {5, 19, 23, 29}, {7, 3, 45, 41},
                                      {9001, 6},        {3, 35, 130, 9}};
  static const int ndims[] = {4, 4, 2, 4, 4, 4, 4, 4, 2, 4};
  enum { NSHAPES = sizeof ndims / sizeof ndims[0] };
  const sbn_dtype dts[] = {SBN_DTYPE_FLOAT32, SBN_DTYPE_BFLOAT16, SBN_DTYPE_FLOAT16, SBN_DTYPE_FLOAT64};
  uint64_t seed = 100;
  for (int di = 0; di < 4; di++)
    for (int si = 0; si < NSHAPES; si++)
      for (int lay = 0; lay < 2; lay++, seed++) {
        int64_t numel = 1;
        for (int i = 0; i < ndims[si]; i++) numel *= shapes[si][i];
        if (test_skip_large(numel, 200000)) continue; /* minutes each under TSan */
        bad |= one_config(dts[di], ndims[si], shapes[si], (sbn_layout)lay, 1 + (si + lay) % 2, seed);
      }
  printf(bad ? "\nDETERMINISM CHECKS FAILED\n" : "\nall determinism checks passed\n");
  return bad;
}
