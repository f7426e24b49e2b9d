/* Internal: the work units of the kernels and the per-ISA tables of them.
 *
 * Channels-first (N, C, S) with S > 1: a unit is one chunk of up to
 * `chunk` contiguous values of one (n, c) row; unit u is row u / nck, chunk
 * u % nck. Channels-last, or S == 1: a unit is a block of up to `rb` rows
 * of C channels. Reduction units write their own partial sums to `part`
 * (2 per channels-first unit; 2C per block: sums then second sums), which
 * the driver merges in unit order. */
#ifndef SBN_CPU_KERN_H
#define SBN_CPU_KERN_H

#include <stdint.h>

typedef struct sbn_kargs {
  int64_t c, s;        /* channels, spatial size */
  int64_t chunk, nck;  /* channels-first units */
  int64_t rb, rows;    /* channels-last units: rows per block, N*S rows */
  const void *x, *dy;  /* inputs */
  void *out;           /* y or dx */
  const double *m;     /* shift (stats) or mean */
  const double *a, *b, *cc; /* per-channel coefficients */
  double *part;        /* partial sums of reduction units */
  const float *f;      /* 16-bit elementwise: mean hi, mean lo, a, b, c (C each) */
  int stream;          /* elementwise: stream the output past the caches */
} sbn_kargs;

/* Process units [u0, u1). */
typedef void (*sbn_kfn)(const sbn_kargs *k, int64_t u0, int64_t u1);

enum { SBN_K_STATS, SBN_K_NORM, SBN_K_BRED, SBN_K_BELT, SBN_K_OPS };
typedef struct sbn_ktable {
  sbn_kfn cf[SBN_K_OPS], cl[SBN_K_OPS];
} sbn_ktable;

/* Indexed by sbn_dtype: FLOAT32, BFLOAT16, FLOAT16. */
extern const sbn_ktable sbn_ktab_generic[3];
extern const sbn_ktable sbn_ktab_avx2[3];

/* Run fn over units [0, n) on `threads` threads, each a contiguous range
 * (cpu_parallel.c, OpenMP). */
void sbn_cpu_parallel_for(int threads, int64_t n, sbn_kfn fn, const sbn_kargs *k);

#endif
