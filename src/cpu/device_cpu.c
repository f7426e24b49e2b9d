/* The CPU device table (src/core/device.h): the layer's per-channel state in
 * host memory (float32 or float64: opt.param_dtype), the four passes of
 * bn_kernels.h, and the per-channel math in float64 between them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/device.h"
#include "../core/error.h"
#include "bn_kernels.h"

typedef struct cpu_layer {
  int64_t nbt;             /* num_batches_tracked */
  double saved_count;      /* the count of the saved statistics */
  double *mean, *invstd;   /* saved for backward, C each */
  double *shift, *s1, *s2; /* stats pass; backward: local sum(dy), sum(dy*(x-mean)) */
  double *local_mean, *local_var;
  double *ka, *kb, *kc;    /* per-channel coefficients of the elementwise passes */
  sbn_cpu_ws ws;           /* kernel partial sums: grows with the shape, then reused */
} cpu_layer;

/* The per-channel math between the passes (O(C) a call). Written so the
 * compiler vectorizes it: the state's dtype (float32 or float64, fixed at
 * creation; ld_state/st_state with f64 a constant at each use) and every
 * per-layer choice are hoisted out of the loops. As scalar loops with an
 * accessor call per value they cost 10 ns a channel per forward (21 us at
 * C = 2048, 7% of the 8x2048x7x7 forward). Their divisions and square roots
 * gain with the vector width, so PER_WIDTH builds each for the baseline,
 * AVX2 and AVX-512 (the same body inlined under each target) and picks by
 * the kernels' instruction-set level (sbn_cpu_get_isa: SYNCBN_CPU_ISA, and
 * the tests that switch it compare every level's results bit for bit).
 * 8.6 us at C = 2048 with AVX-512 against 13 us baseline-only; the results
 * are the same, each value being one IEEE operation. */
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#ifdef SBN_AVX512_EMU /* tests only: the AVX-512 levels emulated on AVX2 (avx512_emu.h) */
#define AVX512_TARGET "avx2"
#else
#define AVX512_TARGET "avx512f"
#endif
#define PER_WIDTH(name, params, args)                                              \
  static void name##_generic params { name##_body args; }                         \
  __attribute__((target("avx2"))) static void name##_avx2 params { name##_body args; } \
  __attribute__((target(AVX512_TARGET))) static void name##_avx512 params { name##_body args; } \
  static void name params {                                                        \
    const int isa = sbn_cpu_get_isa();                                             \
    if (isa >= SBN_CPU_ISA_AVX512) name##_avx512 args;                             \
    else if (isa >= SBN_CPU_ISA_AVX2) name##_avx2 args;                            \
    else name##_generic args;                                                      \
  }
#else
#define PER_WIDTH(name, params, args) \
  static void name params { name##_body args; }
#endif
#define BODY static inline __attribute__((always_inline)) void

static int f64_state(const sbn_dev_layer *L) { return L->opt.param_dtype == SBN_DTYPE_FLOAT64; }
static size_t state_size(const sbn_dev_layer *L) { return f64_state(L) ? sizeof(double) : sizeof(float); }
static inline __attribute__((always_inline)) double ld_state(const void *t, int f64, int64_t c) {
  return f64 ? ((const double *)t)[c] : (double)((const float *)t)[c];
}
static inline __attribute__((always_inline)) void st_state(void *t, int f64, int64_t c, double v) {
  if (f64) ((double *)t)[c] = v;
  else ((float *)t)[c] = (float)v;
}
/* v rounded as a stored value would be (an increment accumulated in the
 * state's precision, as PyTorch's += on the gradient). */
static inline __attribute__((always_inline)) double as_stored(double v, int f64) {
  return f64 ? v : (double)(float)v;
}

static void cpu_destroy(sbn_dev_layer *L) {
  cpu_layer *k = L->impl;
  for (int i = 0; i < SBN_DEV_TENSORS; i++) free(L->tensor[i]), L->tensor[i] = NULL;
  free(L->payload);
  L->payload = L->payload_host = NULL;
  if (k) {
    free(k->mean), free(k->invstd), free(k->shift), free(k->s1), free(k->s2);
    free(k->local_mean), free(k->local_var), free(k->ka), free(k->kb), free(k->kc);
    sbn_cpu_ws_free(&k->ws);
    free(k);
  }
  L->impl = NULL;
}

/* n zeroed doubles, 64-byte aligned: the elementwise passes load the
 * channels-last coefficients (ka, kb, kc, mean) as vectors of up to 64
 * bytes, which then never split a cache line. */
static double *alloc_doubles(size_t n) {
  if (n > (SIZE_MAX - 64) / sizeof(double)) return NULL;
  const size_t bytes = (n * sizeof(double) + 63) / 64 * 64;
  double *p = bytes ? aligned_alloc(64, bytes) : NULL;
  if (p) memset(p, 0, bytes);
  return p;
}

static sbn_status cpu_create(sbn_dev_layer *L, const char *call) {
  if (L->opt.device.index != 0) /* inputs say cpu:0; another index would refuse them all */
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: the CPU device has index 0, got %d", call,
                    L->opt.device.index);
  const size_t C = (size_t)L->opt.num_features;
  cpu_layer *k = calloc(1, sizeof *k);
  L->impl = k;
  int ok = k != NULL;
#define SBN_ALLOC_(ptr, n) ok = ok && ((ptr) = alloc_doubles(n)) != NULL
  for (int i = 0; i < SBN_DEV_TENSORS; i++) {
    int has = i <= SBN_BN_TENSOR_GRAD_BIAS ? L->opt.affine : L->opt.track_running_stats;
    if (has) ok = ok && (L->tensor[i] = calloc(C, state_size(L))) != NULL;
  }
  SBN_ALLOC_(L->payload, 2 * C + 1);
  if (ok) {
    SBN_ALLOC_(k->mean, C), SBN_ALLOC_(k->invstd, C), SBN_ALLOC_(k->shift, C);
    SBN_ALLOC_(k->s1, C), SBN_ALLOC_(k->s2, C), SBN_ALLOC_(k->local_mean, C);
    SBN_ALLOC_(k->local_var, C), SBN_ALLOC_(k->ka, C), SBN_ALLOC_(k->kb, C), SBN_ALLOC_(k->kc, C);
  }
#undef SBN_ALLOC_
  if (!ok) {
    cpu_destroy(L);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory for %zu channels", call, C);
  }
  L->payload_host = L->payload;
  for (size_t c = 0; c < C; c++) {
    if (L->opt.affine) st_state(L->tensor[SBN_BN_TENSOR_WEIGHT], f64_state(L), (int64_t)c, 1.0);
    if (L->opt.track_running_stats) st_state(L->tensor[SBN_BN_TENSOR_RUNNING_VAR], f64_state(L), (int64_t)c, 1.0);
  }
  return SBN_STATUS_OK;
}

static sbn_status cpu_check_data(const sbn_dev_layer *L, const void *data, const char *call,
                                 const char *name) {
  (void)L, (void)data, (void)call, (void)name;
  return SBN_STATUS_OK;
}

/* Before the passes over x: scratch for this shape (allocated on the first
 * call with a larger shape only) and the threads this rank may use, the
 * cores shared among the thread ranks of its group (cpu_threads.c). */
static sbn_status cpu_prepare(sbn_dev_layer *L, sbn_geom g, int ranks, const char *call) {
  cpu_layer *k = L->impl;
  if (sbn_cpu_ws_reserve(&k->ws, g) != 0)
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory for the kernels' partial sums", call);
  k->ws.threads = sbn_cpu_threads(ranks);
  return SBN_STATUS_OK;
}

/* Locally the shifted sums give mean and M2 without cancellation; the
 * payload is (n*mean, M2 + n*mean^2, n), what a plain sum over ranks can
 * reduce. */
BODY stats_math_body(int64_t C, double n, const double *restrict shift, const double *restrict s1,
                    const double *restrict s2, double *restrict lm, double *restrict lv, double *restrict sum,
                    double *restrict sumsq) {
  for (int64_t c = 0; c < C; c++) {
    const double m = shift[c] + s1[c] / n;
    double m2 = s2[c] - s1[c] * s1[c] / n;
    m2 = m2 < 0 ? 0 : m2;
    lm[c] = m;
    lv[c] = m2 / n;
    sum[c] = n * m;
    sumsq[c] = m2 + n * m * m;
  }
}
PER_WIDTH(stats_math,
          (int64_t C, double n, const double *restrict shift, const double *restrict s1, const double *restrict s2,
           double *restrict lm, double *restrict lv, double *restrict sum, double *restrict sumsq),
          (C, n, shift, s1, s2, lm, lv, sum, sumsq))

static sbn_status cpu_stats(sbn_dev_layer *L, const void *x, sbn_geom g) {
  cpu_layer *k = L->impl;
  const int64_t C = L->opt.num_features;
  double *sum = L->payload, *sumsq = L->payload + C;
  sbn_cpu_stats(&k->ws, k->shift, k->s1, k->s2, x, g);
  const double n = (double)g.n * (double)g.s;
  if (n > 0) {
    stats_math(C, n, k->shift, k->s1, k->s2, k->local_mean, k->local_var, sum, sumsq);
  } else {
    for (int64_t c = 0; c < C; c++) k->local_mean[c] = k->local_var[c] = sum[c] = sumsq[c] = 0;
  }
  L->payload[2 * C] = n;
  return SBN_STATUS_OK;
}

/* Across ranks the global variance from the summed payload carries a
 * relative error of about 1e-16 * (mean/std)^2 (1e-8 for channels whose
 * mean is 1e4 times their standard deviation); a rank's own statistics use
 * the shifted sums directly (var holds them on entry). */
BODY batch_math_body(int64_t C, double n, int synced, double eps, const double *restrict sum,
                    const double *restrict sumsq, const double *restrict lm, double *restrict mean,
                    double *restrict var, double *restrict invstd) {
  if (synced)
    for (int64_t c = 0; c < C; c++) {
      const double m = sum[c] / n;
      double v = sumsq[c] / n - m * m;
      v = v < 0 ? 0.0 : v; /* rounding below 0; a NaN (inf - inf) stays, as PyTorch's */
      mean[c] = m;
      var[c] = v; /* the batch variance, for the running update */
      invstd[c] = 1.0 / sqrt(v + eps);
    }
  else
    for (int64_t c = 0; c < C; c++) mean[c] = lm[c], invstd[c] = 1.0 / sqrt(var[c] + eps);
}
PER_WIDTH(batch_math,
          (int64_t C, double n, int synced, double eps, const double *restrict sum, const double *restrict sumsq,
           const double *restrict lm, double *restrict mean, double *restrict var, double *restrict invstd),
          (C, n, synced, eps, sum, sumsq, lm, mean, var, invstd))

/* Running statistics (from the state) or the running update, and the
 * normalize coefficients: the loops that touch the state, per state dtype. */
static inline __attribute__((always_inline)) void forward_state(sbn_dev_layer *L, const sbn_dev_forward *f,
                                                                double count, const int f64) {
  cpu_layer *k = L->impl;
  const int64_t C = L->opt.num_features;
  double *restrict mean = k->mean, *restrict invstd = k->invstd;
  const double *restrict var = k->local_var;
  void *rmean = L->tensor[SBN_BN_TENSOR_RUNNING_MEAN], *rvar = L->tensor[SBN_BN_TENSOR_RUNNING_VAR];
  if (!f->batch_stats) {
    const double eps = L->opt.eps;
    for (int64_t c = 0; c < C; c++) {
      mean[c] = ld_state(rmean, f64, c);
      invstd[c] = 1.0 / sqrt(ld_state(rvar, f64, c) + eps);
    }
  }
  if (f->update && count > 0) {
    const double fac = L->opt.momentum == SBN_MOMENTUM_CUMULATIVE ? 1.0 / (double)k->nbt : L->opt.momentum;
    const double unbias = count / (count - 1);
    for (int64_t c = 0; c < C; c++) {
      const double rm = ld_state(rmean, f64, c), rv = ld_state(rvar, f64, c);
      st_state(rmean, f64, c, (1 - fac) * rm + fac * mean[c]);
      st_state(rvar, f64, c, (1 - fac) * rv + fac * var[c] * unbias);
    }
  }
  double *restrict ka = k->ka, *restrict kb = k->kb;
  if (L->opt.affine) {
    const void *w = L->tensor[SBN_BN_TENSOR_WEIGHT], *b = L->tensor[SBN_BN_TENSOR_BIAS];
    for (int64_t c = 0; c < C; c++) ka[c] = ld_state(w, f64, c) * invstd[c], kb[c] = ld_state(b, f64, c);
  } else {
    for (int64_t c = 0; c < C; c++) ka[c] = 1.0 * invstd[c], kb[c] = 0.0;
  }
}
BODY forward_state_f64_body(sbn_dev_layer *L, const sbn_dev_forward *f, double count) {
  forward_state(L, f, count, 1);
}
BODY forward_state_f32_body(sbn_dev_layer *L, const sbn_dev_forward *f, double count) {
  forward_state(L, f, count, 0);
}
PER_WIDTH(forward_state_f64, (sbn_dev_layer * L, const sbn_dev_forward *f, double count), (L, f, count))
PER_WIDTH(forward_state_f32, (sbn_dev_layer * L, const sbn_dev_forward *f, double count), (L, f, count))

/* The CPU always knows the count (f->count). */
static sbn_status cpu_forward_finish(sbn_dev_layer *L, const sbn_dev_forward *f) {
  cpu_layer *k = L->impl;
  const int64_t C = L->opt.num_features;
  double count = 0;
  if (f->batch_stats && f->count == 0) { /* every rank empty: nothing observed */
    for (int64_t c = 0; c < C; c++) k->mean[c] = 0, k->invstd[c] = 0;
  } else if (f->batch_stats) {
    count = f->count;
    batch_math(C, count, f->synced, L->opt.eps, L->payload, L->payload + C, k->local_mean, k->mean, k->local_var,
               k->invstd);
  }
  if (f->update && count > 0 && k->nbt < SBN_NUM_BATCHES_TRACKED_MAX) k->nbt++; /* saturates */
  if (f64_state(L)) forward_state_f64(L, f, count);
  else forward_state_f32(L, f, count);
  k->saved_count = count;
  return SBN_STATUS_OK;
}

static sbn_status cpu_normalize(sbn_dev_layer *L, void *y, const void *x, sbn_geom g) {
  cpu_layer *k = L->impl;
  sbn_cpu_normalize(&k->ws, y, x, g, k->mean, k->ka, k->kb);
  return SBN_STATUS_OK;
}

static sbn_status cpu_backward_reduce(sbn_dev_layer *L, const void *dy, const void *x, sbn_geom g) {
  cpu_layer *k = L->impl;
  const size_t C = (size_t)L->opt.num_features;
  sbn_cpu_backward_reduce(&k->ws, k->s1, k->s2, dy, x, g, k->mean);
  memcpy(L->payload, k->s1, sizeof(double) * C);
  memcpy(L->payload + C, k->s2, sizeof(double) * C);
  return SBN_STATUS_OK;
}

static inline __attribute__((always_inline)) void backward_state(sbn_dev_layer *L, int synced, int want_dx,
                                                                 int batch_stats, const int f64) {
  cpu_layer *k = L->impl;
  const int64_t C = L->opt.num_features;
  const double *restrict sum_dy = k->s1, *restrict sum_dy_xmu = k->s2; /* local */
  const double *restrict gsum_dy = synced ? L->payload : sum_dy;
  const double *restrict gsum_dy_xmu = synced ? L->payload + C : sum_dy_xmu;
  const double *restrict invstd = k->invstd;
  double *restrict ka = k->ka, *restrict kb = k->kb, *restrict kc = k->kc;
  const void *w = L->tensor[SBN_BN_TENSOR_WEIGHT];
  const int affine = L->opt.affine;
  if (want_dx) {
    if (affine)
      for (int64_t c = 0; c < C; c++) ka[c] = ld_state(w, f64, c) * invstd[c];
    else
      for (int64_t c = 0; c < C; c++) ka[c] = 1.0 * invstd[c];
    if (batch_stats && k->saved_count > 0) {
      const double cnt = k->saved_count;
      for (int64_t c = 0; c < C; c++) {
        kb[c] = ka[c] * gsum_dy[c] / cnt;
        kc[c] = ka[c] * invstd[c] * invstd[c] * gsum_dy_xmu[c] / cnt;
      }
    } else {
      for (int64_t c = 0; c < C; c++) kb[c] = 0, kc[c] = 0;
    }
  }
  if (affine) {
    void *gw = L->tensor[SBN_BN_TENSOR_GRAD_WEIGHT], *gb = L->tensor[SBN_BN_TENSOR_GRAD_BIAS];
    for (int64_t c = 0; c < C; c++) {
      st_state(gw, f64, c, ld_state(gw, f64, c) + as_stored(sum_dy_xmu[c] * invstd[c], f64));
      st_state(gb, f64, c, ld_state(gb, f64, c) + as_stored(sum_dy[c], f64));
    }
  }
}
BODY backward_state_f64_body(sbn_dev_layer *L, int synced, int want_dx, int batch_stats) {
  backward_state(L, synced, want_dx, batch_stats, 1);
}
BODY backward_state_f32_body(sbn_dev_layer *L, int synced, int want_dx, int batch_stats) {
  backward_state(L, synced, want_dx, batch_stats, 0);
}
PER_WIDTH(backward_state_f64, (sbn_dev_layer * L, int synced, int want_dx, int batch_stats),
          (L, synced, want_dx, batch_stats))
PER_WIDTH(backward_state_f32, (sbn_dev_layer * L, int synced, int want_dx, int batch_stats),
          (L, synced, want_dx, batch_stats))

static sbn_status cpu_backward_finish(sbn_dev_layer *L, int synced, int want_dx, int batch_stats) {
  if (f64_state(L)) backward_state_f64(L, synced, want_dx, batch_stats);
  else backward_state_f32(L, synced, want_dx, batch_stats);
  return SBN_STATUS_OK;
}

static sbn_status cpu_backward_elemt(sbn_dev_layer *L, void *dx, const void *dy, const void *x,
                                     sbn_geom g) {
  cpu_layer *k = L->impl;
  sbn_cpu_backward_elemt(&k->ws, dx, dy, x, g, k->mean, k->ka, k->kb, k->kc);
  return SBN_STATUS_OK;
}

static sbn_status cpu_to_host(sbn_dev_layer *L, size_t count, int zero) {
  if (zero) memset(L->payload, 0, sizeof(double) * count);
  return SBN_STATUS_OK;
}

static sbn_status cpu_from_host(sbn_dev_layer *L, size_t count) {
  (void)L, (void)count;
  return SBN_STATUS_OK;
}

static sbn_status cpu_zero_grad(sbn_dev_layer *L) {
  for (int i = SBN_BN_TENSOR_GRAD_WEIGHT; i <= SBN_BN_TENSOR_GRAD_BIAS; i++)
    if (L->tensor[i]) memset(L->tensor[i], 0, state_size(L) * (size_t)L->opt.num_features);
  return SBN_STATUS_OK;
}

static sbn_status cpu_get_nbt(const sbn_dev_layer *L, int64_t *out) {
  *out = ((const cpu_layer *)L->impl)->nbt;
  return SBN_STATUS_OK;
}

static sbn_status cpu_set_nbt(sbn_dev_layer *L, int64_t value) {
  ((cpu_layer *)L->impl)->nbt = value;
  return SBN_STATUS_OK;
}

/* A record of the saved forward: mean and invstd per channel, then the
 * count (what backward reads of it; ka..kc are recomputed there). */
static sbn_status cpu_record_alloc(const sbn_dev_layer *L, void **mem, const char *call) {
  const size_t C = (size_t)L->opt.num_features;
  if (!(*mem = alloc_doubles(2 * C + 1)))
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory for a record of %zu channels", call, C);
  return SBN_STATUS_OK;
}

static void cpu_record_free(int device_index, void *mem) {
  (void)device_index;
  free(mem);
}

static sbn_status cpu_record_save(sbn_dev_layer *L, void *mem) {
  const cpu_layer *k = L->impl;
  const size_t C = (size_t)L->opt.num_features;
  double *r = mem;
  memcpy(r, k->mean, C * sizeof *r);
  memcpy(r + C, k->invstd, C * sizeof *r);
  r[2 * C] = k->saved_count;
  return SBN_STATUS_OK;
}

static sbn_status cpu_record_load(sbn_dev_layer *L, const void *mem) {
  cpu_layer *k = L->impl;
  const size_t C = (size_t)L->opt.num_features;
  const double *r = mem;
  memcpy(k->mean, r, C * sizeof *r);
  memcpy(k->invstd, r + C, C * sizeof *r);
  k->saved_count = r[2 * C];
  return SBN_STATUS_OK;
}

static sbn_status cpu_device_count(int *count) {
  *count = 1;
  return SBN_STATUS_OK;
}

const sbn_dev_ops sbn_cpu_device_ops = {
    .name = "cpu",
    .payload_on_device = 0,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .check_data = cpu_check_data,
    .prepare = cpu_prepare,
    .set_stream = NULL,
    .deferred = NULL,
    .stats = cpu_stats,
    .forward_finish = cpu_forward_finish,
    .normalize = cpu_normalize,
    .backward_reduce = cpu_backward_reduce,
    .backward_finish = cpu_backward_finish,
    .backward_elemt = cpu_backward_elemt,
    .to_host = cpu_to_host,
    .from_host = cpu_from_host,
    .zero_grad = cpu_zero_grad,
    .get_nbt = cpu_get_nbt,
    .set_nbt = cpu_set_nbt,
    .record_alloc = cpu_record_alloc,
    .record_free = cpu_record_free,
    .record_save = cpu_record_save,
    .record_load = cpu_record_load,
    .device_count = cpu_device_count,
};
