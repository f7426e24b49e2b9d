/* The kernel drivers: split a pass into fixed work units, run them on the
 * rank's threads with the kernels of the selected instruction set, and merge
 * the partial sums of the reduction passes in unit order.
 *
 * Determinism: the units depend only on the shape (CHUNK, rows per block),
 * each unit's sums are computed in a fixed order, and the merge adds unit
 * partials in index order. The thread count only decides who computes which
 * unit, so results are bitwise identical for 1, 2, 4, ... threads. */
#include "bn_kernels.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kern.h"
#include "half.h"

enum {
  CHUNK = 16384,      /* channels-first unit: values of one row (64 KiB float32) */
  CL_BLOCK = 32768,   /* channels-last block: about this many values ... */
  CL_MIN_ROWS = 32,   /* ... and at least this many rows (partials <= 1/8 of data) */
  PAR_MIN = 65536     /* below this many values one thread is faster */
};

/* Units of a shape; fills k's partition fields. Returns the unit count and
 * the doubles of partial sums in *part. */
static int64_t plan(sbn_kargs *k, sbn_geom g, size_t *part) {
  memset(k, 0, sizeof *k);
  k->c = g.c;
  k->s = g.s;
  if (g.layout == SBN_LAYOUT_CHANNELS_FIRST && g.s > 1) {
    k->chunk = CHUNK;
    k->nck = (g.s + CHUNK - 1) / CHUNK;
    int64_t units = g.n * g.c * k->nck;
    if (part) *part = 2 * (size_t)units;
    return units;
  }
  /* channels-last, or channels-first with S == 1 (the same memory order) */
  k->rows = g.n * g.s;
  k->rb = CL_BLOCK / g.c > CL_MIN_ROWS ? CL_BLOCK / g.c : CL_MIN_ROWS;
  int64_t units = (k->rows + k->rb - 1) / k->rb;
  if (part) *part = 2 * (size_t)g.c * (size_t)units;
  return units;
}

static int cf_units(const sbn_kargs *k) { return k->nck > 0; }

int sbn_cpu_ws_reserve(sbn_cpu_ws *ws, sbn_geom g) {
  sbn_kargs k;
  size_t need = 0;
  plan(&k, g, &need);
  if (need < 3 * (size_t)g.c) need = 3 * (size_t)g.c; /* 5C floats of coefficients */
  if (need <= ws->cap) return 0;
  double *p = realloc(ws->part, need * sizeof(double));
  if (!p) return -1;
  ws->part = p;
  ws->cap = need;
  return 0;
}

void sbn_cpu_ws_free(sbn_cpu_ws *ws) {
  free(ws->part);
  ws->part = NULL;
  ws->cap = 0;
}

/* ---- instruction set ---- */

static int isa_sel = -1; /* sbn_cpu_isa, -1: not chosen yet */

int sbn_cpu_has_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  /* AVX2 CPUs all have F16C; FMA is checked for the target's sake. */
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return 0;
#endif
}

sbn_cpu_isa sbn_cpu_get_isa(void) {
  int s = __atomic_load_n(&isa_sel, __ATOMIC_RELAXED);
  if (s < 0) {
    const char *e = getenv("SYNCBN_CPU_ISA");
    s = sbn_cpu_has_avx2() && !(e && strcmp(e, "generic") == 0) ? SBN_CPU_ISA_AVX2
                                                                 : SBN_CPU_ISA_GENERIC;
    __atomic_store_n(&isa_sel, s, __ATOMIC_RELAXED);
  }
  return (sbn_cpu_isa)s;
}

int sbn_cpu_set_isa(sbn_cpu_isa isa) {
  if (isa == SBN_CPU_ISA_AVX2 && !sbn_cpu_has_avx2()) return -1;
  __atomic_store_n(&isa_sel, (int)isa, __ATOMIC_RELAXED);
  return 0;
}

static sbn_kfn kernel(sbn_geom g, const sbn_kargs *k, int op) {
  const sbn_ktable *t =
      sbn_cpu_get_isa() == SBN_CPU_ISA_AVX2 ? &sbn_ktab_avx2[g.dtype] : &sbn_ktab_generic[g.dtype];
  return cf_units(k) ? t->cf[op] : t->cl[op];
}

/* Stream (non-temporal stores) outputs of at least this many bytes: they
 * would not stay in the core's caches anyway, and streaming saves the read
 * of each output line before it is written (a copy moves 2 tensors, not 3).
 * SYNCBN_STREAM_MIB overrides (0: never). The cost: a consumer that runs
 * right after (ReLU) finds y in memory rather than in a large L3. */
static size_t stream_min(void) {
  static long mib = -2;
  long m = __atomic_load_n(&mib, __ATOMIC_RELAXED);
  if (m == -2) {
    const char *e = getenv("SYNCBN_STREAM_MIB");
    m = e ? atol(e) : 4;
    __atomic_store_n(&mib, m, __ATOMIC_RELAXED);
  }
  return m <= 0 ? SIZE_MAX : (size_t)m << 20;
}

static size_t dtype_bytes(sbn_dtype dt) { return dt == SBN_DTYPE_FLOAT32 ? 4 : 2; }

/* Streaming pays only for whole cache lines: channels-first rows shorter
 * than 4 KiB (7x7, 14x14 maps) would leave partial lines at every row end. */
static int use_stream(sbn_geom g, const sbn_kargs *k) {
  const size_t es = dtype_bytes(g.dtype);
  if ((size_t)(g.n * g.c * g.s) * es < stream_min()) return 0;
  return !cf_units(k) || (size_t)g.s * es >= 4096;
}

/* 16-bit storage: the elementwise coefficients in float32, the mean split
 * in hi + lo (see vec.h), into the workspace. */
static const float *coef_f32(sbn_cpu_ws *ws, sbn_geom g, const double *mean, const double *a,
                             const double *b, const double *c) {
  if (g.dtype == SBN_DTYPE_FLOAT32) return NULL;
  float *f = (float *)ws->part;
  const int64_t C = g.c;
  for (int64_t i = 0; i < C; i++) {
    float hi = (float)mean[i];
    f[i] = hi;
    f[C + i] = (float)(mean[i] - (double)hi);
    f[2 * C + i] = (float)a[i];
    f[3 * C + i] = (float)b[i];
    f[4 * C + i] = c ? (float)c[i] : 0.0f;
  }
  return f;
}

static int threads_for(const sbn_cpu_ws *ws, sbn_geom g) {
  return g.n * g.c * g.s < PAR_MIN || ws->threads < 1 ? 1 : ws->threads;
}

/* Merge unit partials into per-channel (s1, s2), in unit order. */
static void merge(double *s1, double *s2, const sbn_kargs *k, int64_t n, int64_t units,
                  const double *part) {
  const int64_t C = k->c;
  memset(s1, 0, sizeof(double) * (size_t)C);
  memset(s2, 0, sizeof(double) * (size_t)C);
  if (cf_units(k)) {
    for (int64_t i = 0; i < n; i++)
      for (int64_t c = 0; c < C; c++)
        for (int64_t j = 0; j < k->nck; j++) {
          const double *p = part + 2 * ((i * C + c) * k->nck + j);
          s1[c] += p[0];
          s2[c] += p[1];
        }
  } else {
    for (int64_t u = 0; u < units; u++) {
      const double *p = part + 2 * C * u;
      for (int64_t c = 0; c < C; c++) s1[c] += p[c], s2[c] += p[C + c];
    }
  }
}

static double load1(const void *x, sbn_dtype dt, int64_t i) {
  switch (dt) {
    case SBN_DTYPE_BFLOAT16: return sbn_bf16_to_f32(((const uint16_t *)x)[i]);
    case SBN_DTYPE_FLOAT16: return sbn_f16_to_f32(((const uint16_t *)x)[i]);
    default: return ((const float *)x)[i];
  }
}

void sbn_cpu_stats(sbn_cpu_ws *ws, double *shift, double *s1, double *s2, const void *x,
                   sbn_geom g) {
  const int64_t C = g.c;
  if (g.n == 0 || g.s == 0) {
    memset(shift, 0, sizeof(double) * (size_t)C);
    memset(s1, 0, sizeof(double) * (size_t)C);
    memset(s2, 0, sizeof(double) * (size_t)C);
    return;
  }
  /* The shift: the channel's first value (n = 0, first position). */
  const int cf = g.layout == SBN_LAYOUT_CHANNELS_FIRST;
  for (int64_t c = 0; c < C; c++) shift[c] = load1(x, g.dtype, cf ? c * g.s : c);
  sbn_kargs k;
  const int64_t units = plan(&k, g, NULL);
  k.x = x;
  k.m = shift;
  k.part = ws->part;
  sbn_cpu_parallel_for(threads_for(ws, g), units, kernel(g, &k, SBN_K_STATS), &k);
  merge(s1, s2, &k, g.n, units, ws->part);
}

void sbn_cpu_normalize(sbn_cpu_ws *ws, void *y, const void *x, sbn_geom g, const double *mean,
                       const double *scale, const double *bias) {
  if (g.n == 0 || g.s == 0) return;
  sbn_kargs k;
  const int64_t units = plan(&k, g, NULL);
  k.x = x, k.out = y, k.m = mean, k.a = scale, k.b = bias;
  k.f = coef_f32(ws, g, mean, scale, bias, NULL);
  k.stream = use_stream(g, &k);
  sbn_cpu_parallel_for(threads_for(ws, g), units, kernel(g, &k, SBN_K_NORM), &k);
}

void sbn_cpu_backward_reduce(sbn_cpu_ws *ws, double *sum_dy, double *sum_dy_xmu, const void *dy,
                             const void *x, sbn_geom g, const double *mean) {
  if (g.n == 0 || g.s == 0) {
    memset(sum_dy, 0, sizeof(double) * (size_t)g.c);
    memset(sum_dy_xmu, 0, sizeof(double) * (size_t)g.c);
    return;
  }
  sbn_kargs k;
  const int64_t units = plan(&k, g, NULL);
  k.x = x, k.dy = dy, k.m = mean, k.part = ws->part;
  sbn_cpu_parallel_for(threads_for(ws, g), units, kernel(g, &k, SBN_K_BRED), &k);
  merge(sum_dy, sum_dy_xmu, &k, g.n, units, ws->part);
}

void sbn_cpu_backward_elemt(sbn_cpu_ws *ws, void *dx, const void *dy, const void *x, sbn_geom g,
                            const double *mean, const double *a, const double *b,
                            const double *c) {
  if (g.n == 0 || g.s == 0) return;
  sbn_kargs k;
  const int64_t units = plan(&k, g, NULL);
  k.x = x, k.dy = dy, k.out = dx, k.m = mean, k.a = a, k.b = b, k.cc = c;
  k.f = coef_f32(ws, g, mean, a, b, c);
  k.stream = use_stream(g, &k);
  sbn_cpu_parallel_for(threads_for(ws, g), units, kernel(g, &k, SBN_K_BELT), &k);
}
