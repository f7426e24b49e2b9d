/* syncbn-bench-lanes: ns per value of the MPI backend's integer-lane encode,
 * misfit count and decode (src/comm/exact_lanes*.c), the scalar reference
 * against each block-kernel variant this CPU supports, on the shape of a
 * collective at C = 4096 (n = 2C + 1 = 8193 values; each window from the
 * binned sum of 4 ranks' terms, the lanes their sum). Median of many
 * repetitions of one call. Usage: syncbn-bench-lanes [n] [reps] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/comm/exact_lanes.h"

enum { P = 4 };

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static uint64_t rs = 88172645463325252u;
static double urand(void) { /* xorshift64, [0, 1) */
  rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
  return (double)(rs >> 11) * 0x1p-53;
}

static size_t n;
static double *x, *d;
static float *xf, *df;
static uint8_t *top, *topf;
static int64_t *lanes, *lanesf, *scratch;

/* One operation, by number (0..4), the reference or the selected variant. */
static void op(int k, int ref) {
  switch (k) {
    case 0: ref ? sbn_xlanes_encode_ref_f64(scratch, x, top, n) : sbn_xlanes_encode_f64(scratch, x, top, n); break;
    case 1: ref ? sbn_xlanes_encode_ref_f32(scratch, xf, topf, n) : sbn_xlanes_encode_f32(scratch, xf, topf, n); break;
    case 2: ref ? sbn_xlanes_misfits_ref_f64(x, top, n) : sbn_xlanes_misfits_f64(x, top, n); break;
    case 3: ref ? sbn_xlanes_decode_ref_f64(d, lanes, top, n) : sbn_xlanes_decode_f64(d, lanes, top, n); break;
    default: ref ? sbn_xlanes_decode_ref_f32(df, lanesf, topf, n) : sbn_xlanes_decode_f32(df, lanesf, topf, n); break;
  }
}

static double ns_per_value(int k, int ref, int reps) {
  double *t = malloc((size_t)reps * sizeof *t);
  for (int r = 0; r < 20; r++) op(k, ref); /* warm */
  for (int r = 0; r < reps; r++) {
    const double t0 = now();
    op(k, ref);
    t[r] = now() - t0;
  }
  qsort(t, (size_t)reps, sizeof *t, cmp_d);
  const double m = t[reps / 2] * 1e9 / (double)(n ? n : 1);
  free(t);
  return m;
}

/* The window of the binned sum of terms v[0..P-1]; their lane sum. */
static uint8_t window(const double *v, int64_t *sum) {
  sbn_xbin acc = sbn_xsum_zero();
  for (int p = 0; p < P; p++) sbn_xsum_add(&acc, v[p]);
  uint8_t T;
  sbn_xlanes_tops(&T, &acc, 1);
  sum[0] = sum[1] = 0;
  for (int p = 0; p < P; p++) {
    int64_t l[2];
    sbn_xlanes_encode_ref_f64(l, &v[p], &T, 1);
    sum[0] += l[0], sum[1] += l[1];
  }
  return T;
}

int main(int argc, char **argv) {
  n = argc > 1 ? (size_t)atol(argv[1]) : 8193;
  const int reps = argc > 2 ? atoi(argv[2]) : 2001;
  x = malloc(n * sizeof *x), d = malloc(n * sizeof *d), xf = malloc(n * sizeof *xf), df = malloc(n * sizeof *df);
  top = malloc(n), topf = malloc(n);
  lanes = malloc(2 * n * sizeof *lanes), lanesf = malloc(2 * n * sizeof *lanesf), scratch = malloc(2 * n * sizeof *scratch);
  /* sums and sums of squares of a batch: per value a magnitude, the ranks'
   * terms within a factor of 2 of each other (same window, as in training) */
  for (size_t i = 0; i < n; i++) {
    const double mag = ldexp(1.0, (int)(urand() * 40) - 20);
    double v[P], vf[P];
    for (int p = 0; p < P; p++) {
      v[p] = mag * (1.0 + urand()) * (urand() < 0.5 ? -1 : 1);
      vf[p] = (double)(float)v[p];
    }
    top[i] = window(v, &lanes[2 * i]);
    topf[i] = window(vf, &lanesf[2 * i]);
    x[i] = v[0], xf[i] = (float)vf[0];
  }
  static const char *ops[] = {"encode f64", "encode f32", "misfits f64", "decode f64", "decode f32"};
  printf("syncbn-bench-lanes: n = %zu values, median of %d calls, ns per value\n", n, reps);
  printf("%-10s", "variant");
  for (int k = 0; k < 5; k++) printf(" %12s", ops[k]);
  printf("\n%-10s", "reference");
  double ref[5];
  for (int k = 0; k < 5; k++) printf(" %12.3f", ref[k] = ns_per_value(k, 1, reps));
  printf("\n");
  for (int i = 0; i < sbn_xlanes_isa_count(); i++) {
    const char *name = sbn_xlanes_isa_name(i);
    if (sbn_xlanes_set_isa(name) != 0) {
      printf("%-10s (not supported by this CPU)\n", name);
      continue;
    }
    printf("%-10s", name);
    for (int k = 0; k < 5; k++) {
      const double t = ns_per_value(k, 0, reps);
      printf(" %6.3f %4.1fx", t, ref[k] / t);
    }
    printf("\n");
  }
  return 0;
}
