/* Test support: random data, a float64 reference batch norm (simple loops,
 * the oracle for every kernel), and comparisons that print their evidence. */
#ifndef SBN_TESTUTIL_H
#define SBN_TESTUTIL_H

#include <stdint.h>
#include <stdio.h>

#include "syncbn.h"

/* ---- random numbers (splitmix64: reproducible on every platform) ---- */
typedef struct rng { uint64_t s; } rng;
rng rng_seed(uint64_t seed);
uint64_t rng_u64(rng *r);
double rng_uniform(rng *r);          /* [0, 1) */
int rng_int(rng *r, int lo, int hi); /* [lo, hi] */
double rng_normal(rng *r);

/* ---- one rank's tensor data ---- */
typedef struct rank_data {
  int ndim;
  int64_t shape[SBN_MAX_DIMS];
  sbn_layout layout;
  int64_t numel, S;
  float *x, *dy;  /* inputs (memory order of layout) */
  float *y, *dx;  /* library outputs */
} rank_data;

void rank_data_alloc(rank_data *d, int ndim, const int64_t *shape, sbn_layout layout);
void rank_data_free(rank_data *d);
/* Fill x with mean[c] + std[c] * N(0,1) and dy with N(0,1). */
void rank_data_fill(rank_data *d, rng *r, const double *mean, const double *std);
sbn_tensor rank_tensor(rank_data *d, float *data);
/* Channel of element i (memory order). */
int64_t chan_of(const rank_data *d, int64_t i);

/* ---- float64 reference ---- */
typedef struct ref_bn {
  int64_t C;
  double eps, momentum; /* momentum SBN_MOMENTUM_CUMULATIVE for None */
  int affine, track;
  double *w, *b, *rm, *rv;
  int64_t nbt;
} ref_bn;

void ref_init(ref_bn *r, const sbn_bn_options *o, const float *w, const float *b);
void ref_free(ref_bn *r);

typedef struct ref_out { /* per rank, double */
  double *y, *dx, *gw, *gb;
} ref_out;
void ref_out_alloc(ref_out *o, const rank_data *d, int64_t C);
void ref_out_free(ref_out *o);

/* One step over the ranks of one group (training: global batch statistics
 * and running-stat update; eval: running stats, or each rank's own batch
 * statistics without tracking). Fills y, dx, and per-rank gw/gb. */
void ref_step(ref_bn *r, int training, rank_data *ranks, int P, ref_out *out);

/* ---- comparisons ---- */
/* max |a - b| over n values; a float32, b double. */
double max_abs_diff(const float *a, const double *b, int64_t n);
double max_abs(const double *b, int64_t n);
/* max |a - b| / (1 + |b|): relative for large values, absolute near 0. */
double rel_err_f(const float *a, const double *b, int64_t n);
/* max |y - ref| / max(1, |ref|): absolute for unit-scale outputs; eval
 * outputs far from the running mean (|y| ~ 1e4 on the ill-conditioned
 * cases) are held to the same float32-relative standard. */
double y_err(const float *y, const double *ref, int64_t n);
/* Print "name: max err E (tol T) ok|FAIL" and return 1 on failure. */
int check(const char *name, double err, double tol);

/* ---- layer state ---- */
/* A layer's per-channel state and num_batches_tracked (C <= BN_SNAPSHOT_MAX_C),
 * zero-padded so that memcmp of two snapshots shows whether a call changed it. */
enum { BN_SNAPSHOT_MAX_C = 8 };
typedef struct bn_snapshot {
  float rm[BN_SNAPSHOT_MAX_C], rv[BN_SNAPSHOT_MAX_C], gw[BN_SNAPSHOT_MAX_C], gb[BN_SNAPSHOT_MAX_C];
  int64_t nbt;
} bn_snapshot;
void bn_snap(sbn_bn *bn, bn_snapshot *s);

/* SBN_TEST_SANITIZED=1 (set by make check-asan and check-tsan): the slowest
 * tests leave out their largest shapes (over `limit` values), which the
 * normal build runs, and say so. Returns 1 when `numel` is to be skipped. */
int test_skip_large(int64_t numel, int64_t limit);

#define CHECK_OK(call)                                                                  \
  do {                                                                                  \
    sbn_status st_ = (call);                                                            \
    if (st_ != SBN_STATUS_OK) {                                                         \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call,               \
              sbn_status_name(st_), sbn_last_error());                                  \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

#endif
