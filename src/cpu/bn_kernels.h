/* Internal: CPU kernels for the four batch-norm passes, the interface the
 * layer (src/core/bn.c) calls.
 *
 * Storage is float32, bfloat16, float16 or float64 (sbn_geom.dtype);
 * arithmetic and accumulation are float64 (kern_f64.inc: the float64 bodies). Each pass is one sweep over its tensors, split
 * into fixed work units (see bn_kernels.c) that depend only on the shape, run
 * on `threads` threads, vectorized (AVX-512 or AVX2 when the CPU has it,
 * else portable C with the same operation order). Results are bitwise identical for any
 * thread count and for every instruction set. */
#ifndef SBN_CPU_BN_KERNELS_H
#define SBN_CPU_BN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "syncbn.h"
#include "../core/geom.h"


/* Per-layer scratch for the partial sums of the reduction passes. It grows
 * on the first call with a larger shape and is then reused: the steady state
 * does not allocate. threads: threads per call (>= 1), set by the caller. */
typedef struct sbn_cpu_ws {
  double *part;
  size_t cap; /* doubles */
  int threads;
} sbn_cpu_ws;

/* Make ws large enough for g. Returns 0, or -1 when out of memory (ws is
 * unchanged then). */
int sbn_cpu_ws_reserve(sbn_cpu_ws *ws, sbn_geom g);
void sbn_cpu_ws_free(sbn_cpu_ws *ws);

/* Threads per rank: sbn_set_num_threads() if set, else SYNCBN_NUM_THREADS,
 * else max(1, usable cores / (ranks_in_process * local MPI processes)). */
int sbn_cpu_threads(int ranks_in_process);

/* Pass 1 (read x). Per channel: a shift k (a value of the channel, so that
 * the sums stay well-conditioned when |mean| >> std), s1 = sum(x - k) and
 * s2 = sum((x - k)^2). Empty input: all zero. */
void sbn_cpu_stats(sbn_cpu_ws *ws, double *shift, double *s1, double *s2, const void *x,
                   sbn_geom g);

/* Pass 2 (read x, write y): y = (x - mean) * scale + bias per channel. y may be x. */
void sbn_cpu_normalize(sbn_cpu_ws *ws, void *y, const void *x, sbn_geom g, const double *mean,
                       const double *scale, const double *bias);

/* Backward pass 1 (read x, dy): sum_dy = sum(dy), sum_dy_xmu = sum(dy * (x - mean)). */
void sbn_cpu_backward_reduce(sbn_cpu_ws *ws, double *sum_dy, double *sum_dy_xmu, const void *dy,
                             const void *x, sbn_geom g, const double *mean);

/* Backward pass 2 (read x, dy, write dx):
 * dx = (a * dy - b) - c * (x - mean) per channel. dx may be dy or x. */
void sbn_cpu_backward_elemt(sbn_cpu_ws *ws, void *dx, const void *dy, const void *x, sbn_geom g,
                            const double *mean, const double *a, const double *b,
                            const double *c);

/* Instruction sets of the kernels: a table (bn_kernels.c), ordered from the
 * most portable to the fastest, so another level is one more row. The best
 * one the CPU supports is chosen once; SYNCBN_CPU_ISA=<name> (generic, avx2,
 * avx512, avx512bf16) overrides it when the CPU supports that level (otherwise the best,
 * with a note on stderr under SYNCBN_DEBUG=1), and tests switch with
 * sbn_cpu_set_isa. Every level gives the same bits (tests/cpu check it). */
typedef enum sbn_cpu_isa {
  SBN_CPU_ISA_GENERIC = 0,
  SBN_CPU_ISA_AVX2 = 1,
  SBN_CPU_ISA_AVX512 = 2,
  SBN_CPU_ISA_AVX512BF16 = 3 /* avx512 + AVX512_BF16: the 16-bit elementwise passes 16 a zmm */
} sbn_cpu_isa;
int sbn_cpu_isa_count(void);
const char *sbn_cpu_isa_name(int isa);   /* NULL when out of range */
int sbn_cpu_isa_supported(int isa);      /* 1 when this CPU can run it */
int sbn_cpu_isa_find(const char *name);  /* index, or -1 */
int sbn_cpu_get_isa(void);
int sbn_cpu_has_avx2(void);
int sbn_cpu_has_avx512(void); /* F, BW, VL, DQ (and AVX2) */
int sbn_cpu_has_avx512bf16(void); /* the above and AVX512_BF16 */
/* Returns 0, or -1 if the CPU lacks the instruction set. */
int sbn_cpu_set_isa(int isa);

/* Channels-first reductions of small maps read image by image once a unit
 * would read at least this many streams (N x tensors), channel by channel
 * below; the sums' bits are the same either way. A test hook (default 1:
 * always image by image; 0 restores it): tests/cpu compare the two orders
 * bit for bit. */
void sbn_cpu_set_cf_streams(int streams);
/* Test hook: 0 reads the larger maps' channels-first reductions channel by
 * channel too (the order before cf_major), else image by image (the default). */
void sbn_cpu_set_cf_major(int on);
/* Test hook: the rows layout's reductions four rows at a time across a
 * unit (1) or in column sweeps (2), or as the instruction set and shape
 * choose (0, the default: bn_kernels.c rl_quads); the sums' bits are the
 * same. */
void sbn_cpu_set_rl_quads(int mode);

#endif
