/* Internal: the work units of the kernels and the per-ISA tables of them.
 *
 * Channels-first (N, C, S) with S > 1 splits S into nck chunks of up to
 * `chunk` values.
 *  - Reductions: unit u = (channel u / nck, chunk u % nck) over all N
 *    images: its sums run through the N row pieces in order, with vector
 *    accumulators kept across them, and land in part[2u], part[2u+1].
 *    Small maps (a piece under 1 KiB) fold each piece's sums alone and add
 *    them in image order, so a unit's state is two doubles and the units
 *    of a hand-out can be read image by image (kern_body.inc).
 *  - Elementwise: unit u = (row u / nck of the N*C rows, chunk u % nck),
 *    in memory order.
 * Channels-last, or S == 1 (the same memory order: rows of C channels):
 * unit u = (row block u / ncb of rb rows, channel block u % ncb of cb
 * channels). Reductions: whole rows up to 1024 channels, wider rows in
 * even blocks of at most 512; rb a multiple of 8 (that of 512-channel
 * blocks, ~16K values). Their sums go to one row of partials per group of
 * rg row blocks: part + 2C * (row block / rg) (sums at c, second sums at
 * C + c); the first block of a group starts from zero, each later one
 * carries on from what the one before it stored, and hand-outs are whole
 * groups (rg * ncb units), so a group's blocks run in order on one thread.
 * A channel's additions in a group are then those of one block of rg * rb
 * rows, whoever runs it; the driver merges the groups' partials per channel
 * in group order (kern_rows.inc: how a unit adds).
 * Elementwise: whole rows (cb = C; wide streamed rows in blocks, bn_kernels.c
 * ew_cb).
 * Units depend only on the shape, never on the thread count. */
#ifndef SBN_CPU_KERN_H
#define SBN_CPU_KERN_H

#include <math.h>
#include <stdint.h>

enum { SBN_RL_QUAD_MAX_W = 2048 }; /* widest unit the quads order takes (kern_rows.inc) */

typedef struct sbn_kargs {
  int64_t n, c, s;          /* batch, channels, spatial size */
  int64_t chunk, nck;       /* channels-first: chunks of S (nck == 0: rows layout) */
  int64_t rb, rows;         /* rows layout: rows per block, N*S rows */
  int64_t rg;               /* rows layout's reductions: row blocks per group of partials */
  int64_t cb, ncb;          /* rows layout: channels per block, blocks */
  const void *x, *dy;       /* inputs */
  void *out;                /* y or dx */
  const double *m;          /* shift (rows layout's statistics) or mean */
  double *shift;            /* channels-first statistics: the shifts, taken by the units (cf_shift) */
  const double *a, *b, *cc; /* per-channel coefficients */
  double *part;             /* partial sums of reduction units */
  double *s1, *s2;          /* reductions: merged per-channel results */
  const float *f;           /* 16-bit elementwise: mean hi, mean lo, a, b, c (C each) */
  const float *fp;          /* the same with each whole block of 16 channels as even, odd */
  int stream;               /* elementwise: stream the output past the caches */
  int flat;                 /* channels-first elementwise: short rows as one flat stream */
  int cf_streams;           /* channels-first reductions of small maps: image by image from
                               this many streams (N x tensors read) */
  int cf_major;             /* channels-first reductions of maps of 1 KiB and more: image by
                               image, a hand-out's channels in memory order (bn_kernels.c) */
  int pf_l1;                /* rows layout's reductions: the next unit's lines prefetched into
                               L1, not L2 */
  int rl_quads;             /* rows layout's reductions: four rows at a time across the unit
                               (kern_rows.inc K(stats_quads)), not column sweeps */
} sbn_kargs;

/* The rows layout's reductions: the partials of row block rbi's group, and
 * whether the block carries on from the group's blocks before it. */
static inline double *sbn_rl_part(const sbn_kargs *k, int64_t rbi, int *cont) {
  *cont = rbi % k->rg != 0;
  return k->part + 2 * k->c * (rbi / k->rg);
}

/* The statistics' shift of a channel from its first value v: v, or 0 where
 * v is infinite or NaN (inf - inf would make the mean of a channel holding
 * +inf NaN, where PyTorch reports inf). */
static inline double sbn_shift_of(double v) { return isfinite(v) ? v : 0.0; }

/* Process units [u0, u1). */
typedef void (*sbn_kfn)(const sbn_kargs *k, int64_t u0, int64_t u1);

enum { SBN_K_STATS, SBN_K_NORM, SBN_K_BRED, SBN_K_BELT, SBN_K_OPS };
typedef struct sbn_ktable {
  sbn_kfn cf[SBN_K_OPS], cl[SBN_K_OPS];
} sbn_ktable;

/* Indexed by sbn_dtype: FLOAT32, BFLOAT16, FLOAT16, FLOAT64. */
enum { SBN_KTAB_DTYPES = 4 };
extern const sbn_ktable sbn_ktab_generic[SBN_KTAB_DTYPES];
extern const sbn_ktable sbn_ktab_avx2[SBN_KTAB_DTYPES];
extern const sbn_ktable sbn_ktab_avx512[SBN_KTAB_DTYPES];
extern const sbn_ktable sbn_ktab_avx512bf16[SBN_KTAB_DTYPES];

/* Run fn over units [0, n) on `threads` threads, handing out `grain`
 * units at a time to whichever thread is free (a preempted thread does not
 * hold up the others); then, if merge is not NULL, merge over [0, nm) split
 * evenly among the same threads (cpu_parallel.c, the library's own pool). */
void sbn_cpu_parallel_for(int threads, int64_t n, int64_t grain, sbn_kfn fn, const sbn_kargs *k,
                          sbn_kfn merge, int64_t nm);

#endif
