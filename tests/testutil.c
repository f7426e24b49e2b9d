#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

rng rng_seed(uint64_t seed) { return (rng){seed * 0x9E3779B97F4A7C15ull + 12345}; }

uint64_t rng_u64(rng *r) {
  uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double rng_uniform(rng *r) { return (double)(rng_u64(r) >> 11) * 0x1.0p-53; }

int rng_int(rng *r, int lo, int hi) { return lo + (int)(rng_u64(r) % (uint64_t)(hi - lo + 1)); }

double rng_normal(rng *r) {
  double u = rng_uniform(r), v = rng_uniform(r);
  return sqrt(-2.0 * log(1.0 - u)) * cos(6.283185307179586 * v);
}

void rank_data_alloc(rank_data *d, int ndim, const int64_t *shape, sbn_layout layout) {
  memset(d, 0, sizeof *d);
  d->ndim = ndim;
  d->layout = layout;
  d->numel = 1;
  d->S = 1;
  for (int i = 0; i < ndim; i++) {
    d->shape[i] = shape[i];
    d->numel *= shape[i];
    if (i >= 2) d->S *= shape[i];
  }
  size_t bytes = sizeof(float) * (size_t)(d->numel ? d->numel : 1);
  d->x = calloc(1, bytes), d->dy = calloc(1, bytes), d->y = calloc(1, bytes), d->dx = calloc(1, bytes);
}

void rank_data_free(rank_data *d) {
  free(d->x), free(d->dy), free(d->y), free(d->dx);
  memset(d, 0, sizeof *d);
}

int64_t chan_of(const rank_data *d, int64_t i) {
  const int64_t C = d->shape[1];
  return d->layout == SBN_LAYOUT_CHANNELS_LAST ? i % C : (i / d->S) % C;
}

void rank_data_fill(rank_data *d, rng *r, const double *mean, const double *std) {
  for (int64_t i = 0; i < d->numel; i++) {
    int64_t c = chan_of(d, i);
    d->x[i] = (float)(mean[c] + std[c] * rng_normal(r));
    d->dy[i] = (float)rng_normal(r);
  }
}

sbn_tensor rank_tensor(rank_data *d, float *data) {
  return sbn_tensor_cpu(data, d->ndim, d->shape, SBN_DTYPE_FLOAT32, d->layout);
}

void ref_init(ref_bn *r, const sbn_bn_options *o, const float *w, const float *b) {
  memset(r, 0, sizeof *r);
  r->C = o->num_features;
  r->eps = o->eps;
  r->momentum = o->momentum;
  r->affine = o->affine;
  r->track = o->track_running_stats;
  r->w = calloc((size_t)r->C, 8), r->b = calloc((size_t)r->C, 8);
  r->rm = calloc((size_t)r->C, 8), r->rv = calloc((size_t)r->C, 8);
  for (int64_t c = 0; c < r->C; c++) {
    r->w[c] = r->affine && w ? w[c] : 1.0;
    r->b[c] = r->affine && b ? b[c] : 0.0;
    r->rv[c] = 1.0;
  }
}

void ref_free(ref_bn *r) { free(r->w), free(r->b), free(r->rm), free(r->rv); }

void ref_out_alloc(ref_out *o, const rank_data *d, int64_t C) {
  size_t n = (size_t)(d->numel ? d->numel : 1);
  o->y = calloc(n, 8), o->dx = calloc(n, 8), o->gw = calloc((size_t)C, 8), o->gb = calloc((size_t)C, 8);
}

void ref_out_free(ref_out *o) { free(o->y), free(o->dx), free(o->gw), free(o->gb); }

/* Statistics over ranks [0, P): two-pass float64 mean and biased variance. */
static void batch_moments(const rank_data *ranks, int P, int64_t C, double *n, double *mean,
                          double *var) {
  for (int64_t c = 0; c < C; c++) n[c] = mean[c] = var[c] = 0;
  for (int p = 0; p < P; p++)
    for (int64_t i = 0; i < ranks[p].numel; i++) {
      int64_t c = chan_of(&ranks[p], i);
      n[c] += 1, mean[c] += ranks[p].x[i];
    }
  for (int64_t c = 0; c < C; c++) mean[c] /= n[c];
  for (int p = 0; p < P; p++)
    for (int64_t i = 0; i < ranks[p].numel; i++) {
      int64_t c = chan_of(&ranks[p], i);
      double d = ranks[p].x[i] - mean[c];
      var[c] += d * d;
    }
  for (int64_t c = 0; c < C; c++) var[c] /= n[c];
}

/* Forward + backward over ranks [0, P) with the given statistics. */
static void apply(const ref_bn *r, int batch, rank_data *ranks, int P, ref_out *out,
                  const double *n, const double *mean, const double *var) {
  const int64_t C = r->C;
  double *sdy = calloc((size_t)C, 8), *sdyx = calloc((size_t)C, 8);
  for (int p = 0; p < P; p++) {
    for (int64_t c = 0; c < C; c++) out[p].gw[c] = out[p].gb[c] = 0;
    for (int64_t i = 0; i < ranks[p].numel; i++) {
      int64_t c = chan_of(&ranks[p], i);
      double invstd = 1.0 / sqrt(var[c] + r->eps), xmu = ranks[p].x[i] - mean[c];
      out[p].y[i] = xmu * invstd * r->w[c] + r->b[c];
      sdy[c] += ranks[p].dy[i], sdyx[c] += ranks[p].dy[i] * xmu;
      out[p].gb[c] += ranks[p].dy[i];
      out[p].gw[c] += ranks[p].dy[i] * xmu * invstd;
    }
  }
  for (int p = 0; p < P; p++)
    for (int64_t i = 0; i < ranks[p].numel; i++) {
      int64_t c = chan_of(&ranks[p], i);
      double invstd = 1.0 / sqrt(var[c] + r->eps), xmu = ranks[p].x[i] - mean[c];
      double g = ranks[p].dy[i];
      if (batch) g -= sdy[c] / n[c] + xmu * invstd * invstd * sdyx[c] / n[c];
      out[p].dx[i] = r->w[c] * invstd * g;
    }
  free(sdy), free(sdyx);
}

void ref_step(ref_bn *r, int training, rank_data *ranks, int P, ref_out *out) {
  const int64_t C = r->C;
  double *n = calloc((size_t)C, 8), *mean = calloc((size_t)C, 8), *var = calloc((size_t)C, 8);
  if (training) {
    batch_moments(ranks, P, C, n, mean, var);
    if (r->track) {
      r->nbt++;
      double f = r->momentum == SBN_MOMENTUM_CUMULATIVE ? 1.0 / (double)r->nbt : r->momentum;
      for (int64_t c = 0; c < C; c++) {
        /* the buffers are float32 (PyTorch's): round as the layer stores them */
        r->rm[c] = (float)((1 - f) * r->rm[c] + f * mean[c]);
        r->rv[c] = (float)((1 - f) * r->rv[c] + f * var[c] * n[c] / (n[c] - 1));
      }
    }
    apply(r, 1, ranks, P, out, n, mean, var);
  } else if (r->track) {
    apply(r, 0, ranks, P, out, n, r->rm, r->rv);
  } else {
    for (int p = 0; p < P; p++) { /* each rank on its own batch */
      batch_moments(&ranks[p], 1, C, n, mean, var);
      apply(r, 1, &ranks[p], 1, &out[p], n, mean, var);
    }
  }
  free(n), free(mean), free(var);
}

double max_abs_diff(const float *a, const double *b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (!(d <= m)) m = d; /* NaN propagates as failure */
  }
  return m;
}

double max_abs(const double *b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) m = fabs(b[i]) > m ? fabs(b[i]) : m;
  return m;
}

double rel_err_f(const float *a, const double *b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - b[i]) / (1.0 + fabs(b[i]));
    if (!(e <= m)) m = e; /* NaN propagates as failure */
  }
  return m;
}

double y_err(const float *y, const double *ref, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = fabs((double)y[i] - ref[i]) / fmax(1.0, fabs(ref[i]));
    if (!(e <= m)) m = e;
  }
  return m;
}

int check(const char *name, double err, double tol) {
  int bad = !(err <= tol);
  printf("  %-44s max err %.3e (tol %.1e) %s\n", name, err, tol, bad ? "FAIL" : "ok");
  return bad;
}

void bn_snap(sbn_bn *bn, bn_snapshot *s) {
  memset(s, 0, sizeof *s);
  sbn_bn_options o;
  if (sbn_bn_get_options(bn, &o) != SBN_STATUS_OK) return;
  size_t bytes = sizeof(float) * (size_t)(o.num_features < BN_SNAPSHOT_MAX_C ? o.num_features : BN_SNAPSHOT_MAX_C);
  sbn_tensor v;
  if (sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_RUNNING_MEAN) == SBN_STATUS_OK) memcpy(s->rm, v.data, bytes);
  if (sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_RUNNING_VAR) == SBN_STATUS_OK) memcpy(s->rv, v.data, bytes);
  if (sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_GRAD_WEIGHT) == SBN_STATUS_OK) memcpy(s->gw, v.data, bytes);
  if (sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_GRAD_BIAS) == SBN_STATUS_OK) memcpy(s->gb, v.data, bytes);
  sbn_bn_get_num_batches_tracked(bn, &s->nbt);
}

int test_skip_large(int64_t numel, int64_t limit) {
  const char *e = getenv("SBN_TEST_SANITIZED");
  if (!e || atoi(e) == 0 || numel <= limit) return 0;
  printf("  (%lld values: skipped under SBN_TEST_SANITIZED=1; the normal build runs it)\n", (long long)numel);
  return 1;
}
