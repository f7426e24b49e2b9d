/* The kernel drivers: split a pass into fixed work units, run them on the
 * rank's threads with the kernels of the selected instruction set, and merge
 * the partial sums of the reduction passes in unit order.
 *
 * Determinism: the units depend only on the shape (CHUNK, rows per block),
 * each unit's sums are computed in a fixed order, and the merge adds unit
 * partials in index order. The thread count only decides who computes which
 * unit, so results are bitwise identical for 1, 2, 4, ... threads. */
#include "bn_kernels.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "cpu_kern.h"
#include "half.h"

enum {
  CHUNK = 16384,     /* channels-first: S is cut into chunks of at most this many values */
  UNIT = 16384,      /* target values per unit of the rows layout */
  MAX_CB = 512,      /* rows layout: at most this many channels per block ... */
  MIN_RB = 32,       /* ... and at least this many rows (partials <= 1/8 of the data) */
  RL_GROUPS = 4,     /* rows layout's reductions: groups of row blocks, at least (see rl_group) */
  RL_GROUP_MAX = 8,  /* ... and at most this many row blocks a group */
  GRAB = 65536,      /* values handed to a thread at a time (256 KiB float32) ... */
  GRAB_ROWS = 1 << 20, /* ... and for the rows layout's reductions (see grain) */
  RL_ROUND = 16,     /* rows layout's reductions: units a thread takes per round, at least */
  PAR_MIN = 32768,   /* below this many values one thread is faster */
  CF_MAJOR_BYTES = 1024  /* channels-first reductions image by image from maps this large */
};

typedef enum pass_kind { PASS_REDUCE, PASS_ELEMWISE } pass_kind;

static int rows_layout(sbn_geom g) { return g.layout == SBN_LAYOUT_CHANNELS_LAST || g.s <= 1; }

/* Where the rows layout's reductions (op: SBN_K_STATS, SBN_K_BRED) take
 * quads by default: both, for 16- and 32-bit storage, below the AVX-512
 * levels. At them only the backward reduce, float32 at any width and 16-bit
 * rows of QUADS16_MIN_C channels or more; the statistics keep the column
 * sweeps, which do the 16-bit types' float64 arithmetic 8 doubles a vector.
 * Measured at the avx512bf16 level (Intel Xeon, 2 threads, out of cache,
 * bench/ab_passes.sh, 3 runs each, against a plain read loop; BENCHMARKS.md
 * "Quads at the AVX-512 levels"), quads against sweeps over the ResNet-50
 * shapes: float32 backward reduce 1.00-1.23x, 16-bit backward reduce
 * 1.05-1.15x (bfloat16) and 0.93-1.11x (float16) at C >= 256 but 0.75-0.95x
 * at C = 64 and 128, float32 statistics 0.86-1.07x, 16-bit statistics
 * 0.6-0.99x. */
enum { QUADS16_MIN_C = 256 };
static int quads_level(sbn_geom g, int op) {
  if (g.dtype == SBN_DTYPE_FLOAT64) return 0;
  if (sbn_cpu_get_isa() < SBN_CPU_ISA_AVX512) return 1;
  return op == SBN_K_BRED && (g.dtype == SBN_DTYPE_FLOAT32 || g.c >= QUADS16_MIN_C);
}

/* Channels per block of the rows layout's reductions. Whole rows up to
 * 2 x MAX_CB channels; wider rows in even blocks of at most MAX_CB (a
 * multiple of 16, so only the last block has a tail narrower than a register
 * block). Which channels a unit holds does not change any sum: a channel's
 * additions depend on the row blocks only, and those stay the ones of
 * MAX_CB-channel blocks (plan). Blocks of 512 and the rest were slower:
 * 2 threads, out of cache, channels-last statistics / backward reduce,
 * 32x640x7x7 (512 + 128) float32 0.223-0.230 -> 0.179-0.180 ms / 0.378-0.396
 * -> 0.304-0.309 ms, 8x768x14x14 (512 + 256) 0.218-0.231 -> 0.190-0.200 /
 * 0.382-0.410 -> 0.318-0.348, 8x1024x14x14 bfloat16 backward reduce
 * 0.343-0.367 -> 0.282-0.310; C = 1536 and 2048 kept blocks of 512 (two
 * blocks of 1024 measured 4-8% slower at 8x2048x7x7, in column sweeps).
 * Where a reduction runs in quads (quads_level, rl_quads), whole rows up
 * to SBN_RL_QUAD_MAX_W and wider ones in even blocks of at most that: a
 * unit then reads its rows end to end. Measured (AMD EPYC, 2 threads, out
 * of cache, against a plain read loop, 3-4 runs alternating): statistics /
 * backward reduce 1.19x / 1.33x
 * (float32) and 1.22x / 1.46x (bfloat16) at 16x1152x14x14, 1.21-1.30x at
 * 8x1040x14x14, 1.22-1.36x at 16x1536x14x14, float32 8x2048x7x7 1.09x /
 * 1.19x, 256x4096 (two blocks of 2048) 1.12-1.26x; 8x1024x14x14, unchanged,
 * 0.96-1.06x. Blocks of 1024 instead of 512 alone gained nothing. */
static int64_t rl_reduce_cb(sbn_geom g, int op) {
  const int quads = quads_level(g, op);
  const int64_t whole = quads ? SBN_RL_QUAD_MAX_W : 2 * MAX_CB, most = quads ? SBN_RL_QUAD_MAX_W : MAX_CB;
  if (g.c <= whole) return g.c;
  const int64_t nb = (g.c + most - 1) / most, cb = (g.c + nb - 1) / nb;
  return (cb + 15) / 16 * 16;
}

static int use_stream(sbn_geom g);

/* Row blocks per group of partials of the rows layout's reductions
 * (cpu_kern.h): one row of 2C partials per row block made the partials
 * 1/16 of a float32 tensor's bytes (1/8 of a 16-bit one's), written by the
 * units, then read across both cores by the merge (skipping the merge made
 * 8x256x56x56 float32 statistics 1.2x faster). Groups of up to
 * RL_GROUP_MAX blocks, at least RL_GROUPS groups where there are enough
 * blocks (hand-outs are whole groups, so fewer groups would leave threads
 * idle). A function of the shape only: the sums' bits do not depend on the
 * thread count. Measured (AMD EPYC, 2 threads, out of cache, against a
 * plain read loop timed beside each pass, BENCHMARKS.md "Groups of row
 * blocks"): channels-last statistics 1.21x, backward reduce 1.18x over
 * 8x64x112x112 ... 8x1024x14x14 with groups of 8 and at least 16 of them;
 * at least 4 groups gave 1.04-1.08x more on the 1-6 MiB shapes (13-49 row
 * blocks), at least 8 or groups of 16 changed nothing. */
static int64_t rl_group(int64_t nrb) {
  const int64_t rg = nrb / RL_GROUPS;
  return rg < 1 ? 1 : rg > RL_GROUP_MAX ? RL_GROUP_MAX : rg;
}

/* Channels per unit of the rows layout's elementwise passes: whole rows,
 * but rows of 2 x EW_CB channels or more whose outputs are streamed go in
 * blocks of EW_CB, whose coefficients stay in L1 while the block's rows
 * pass. Measured (AMD EPYC, 2 threads, out of cache, builds alternating,
 * BENCHMARKS.md): normalize 1.07-1.20x faster at 16x2048x7x7, 32x2048x7x7
 * and 1024x2048 (float32 32x2048x7x7 0.666 -> 0.573 ms), backward
 * elementwise 0.98-1.11x. Unstreamed rows keep whole rows: in blocks of
 * 1024, 8x2048x7x7 went 0.79-0.90x as fast (bench/ab_passes.sh). */
#ifndef EW_CB
#define EW_CB 1024
#endif
static int64_t ew_cb(sbn_geom g) { return g.c >= 2 * EW_CB && use_stream(g) ? EW_CB : g.c; }

/* Units of a pass over a shape; fills k's partition fields. Returns the
 * unit count, the values per unit in *per_unit and the doubles of partial
 * sums in *part (when not NULL). op: the pass (SBN_K_*), whose order
 * (quads or column sweeps) sets a reduction's channel blocks; the partial
 * sums' count does not depend on it. */
static pass_kind kind_of(int op) { return op == SBN_K_STATS || op == SBN_K_BRED ? PASS_REDUCE : PASS_ELEMWISE; }
static int64_t plan(sbn_kargs *k, sbn_geom g, int op, int64_t *per_unit, size_t *part) {
  const pass_kind kind = kind_of(op);
  memset(k, 0, sizeof *k);
  k->n = g.n, k->c = g.c, k->s = g.s;
  if (!rows_layout(g)) {
    k->chunk = g.s < CHUNK ? g.s : CHUNK;
    k->nck = (g.s + k->chunk - 1) / k->chunk;
    if (part) *part = 2 * (size_t)(g.c * k->nck);
    if (per_unit) *per_unit = (kind == PASS_REDUCE ? g.n : 1) * k->chunk;
    return (kind == PASS_REDUCE ? g.c : g.n * g.c) * k->nck;
  }
  /* rows of C channels: blocks of ~UNIT values. The reductions take row
   * blocks of a multiple of 8 rows (8-row steps), sized for blocks of
   * MAX_CB channels (the partial sums are 2 x channels per row block), and
   * channel blocks of rl_reduce_cb; the elementwise passes take whole
   * rows. */
  k->rows = g.n * g.s;
  k->cb = g.c <= MAX_CB ? g.c : MAX_CB;
  k->ncb = (g.c + k->cb - 1) / k->cb;
  if (kind == PASS_ELEMWISE) { /* whole rows (kern_rows.inc: why) */
    const int64_t cb = ew_cb(g), rb = UNIT / cb;
    k->cb = cb, k->ncb = (g.c + cb - 1) / cb;
    k->rb = rb > 1 ? rb : 1;
    if (per_unit) *per_unit = k->rb * k->cb;
    return (k->rows + k->rb - 1) / k->rb * k->ncb;
  }
  int64_t rb = UNIT / k->cb;
  rb = rb < MIN_RB ? MIN_RB : rb / 8 * 8;
  k->rb = rb;
  k->cb = rl_reduce_cb(g, op); /* after rb, which stays that of MAX_CB-channel blocks */
  k->ncb = (g.c + k->cb - 1) / k->cb;
  const int64_t nrb = (k->rows + rb - 1) / rb;
  k->rg = rl_group(nrb);
  if (part) *part = 2 * (size_t)g.c * (size_t)((nrb + k->rg - 1) / k->rg);
  if (per_unit) *per_unit = rb * k->cb;
  return nrb * k->ncb;
}

int sbn_cpu_ws_reserve(sbn_cpu_ws *ws, sbn_geom g) {
  sbn_kargs k;
  size_t need = 0;
  /* An empty tensor runs no pass (its sums are zeros, set directly), so it
   * needs no partials, however large the dimensions that index it: the
   * channels-first plan of [0, C, 2^30, 2^30] would ask for 2^48 bytes. */
  if (g.n > 0 && g.s > 0) plan(&k, g, SBN_K_STATS, NULL, &need); /* the same partials for either reduction */
  if (need < 5 * (size_t)g.c) need = 5 * (size_t)g.c; /* 2 x 5C floats of coefficients */
  if (need <= ws->cap) return 0;
  if (need > (SIZE_MAX - 64) / sizeof(double)) return -1;
  /* 64-byte aligned (the coefficient tables' vector loads never split a
   * line); scratch, so nothing is carried over */
  double *p = aligned_alloc(64, (need * sizeof(double) + 63) / 64 * 64);
  if (!p) return -1;
  free(ws->part);
  ws->part = p;
  ws->cap = need;
  return 0;
}

void sbn_cpu_ws_free(sbn_cpu_ws *ws) {
  free(ws->part);
  ws->part = NULL;
  ws->cap = 0;
}

/* ---- instruction sets ---- */

static int supported_generic(void) { return 1; }

int sbn_cpu_has_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  /* Every AVX2 CPU has F16C (and clang's builtin does not know its name). */
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return 0;
#endif
}

int sbn_cpu_has_avx512(void) {
#if defined(SBN_AVX512_EMU) /* tests only: the AVX-512 levels emulated (avx512_emu.h) */
  return sbn_cpu_has_avx2();
#elif defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init(); /* the builtin also checks that the OS saves the zmm state */
  return sbn_cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return 0;
#endif
}

int sbn_cpu_has_avx512bf16(void) {
#if defined(SBN_AVX512_EMU)
  return sbn_cpu_has_avx512();
#elif defined(__x86_64__) || defined(__i386__)
  return sbn_cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
#else
  return 0;
#endif
}

static const struct isa_row {
  const char *name;
  int (*supported)(void);
  const sbn_ktable *tab; /* indexed by dtype */
} isas[] = {
    [SBN_CPU_ISA_GENERIC] = {"generic", supported_generic, sbn_ktab_generic},
    [SBN_CPU_ISA_AVX2] = {"avx2", sbn_cpu_has_avx2, sbn_ktab_avx2},
    [SBN_CPU_ISA_AVX512] = {"avx512", sbn_cpu_has_avx512, sbn_ktab_avx512},
    [SBN_CPU_ISA_AVX512BF16] = {"avx512bf16", sbn_cpu_has_avx512bf16, sbn_ktab_avx512bf16},
};
enum { N_ISA = sizeof isas / sizeof isas[0] };

int sbn_cpu_isa_count(void) { return N_ISA; }
const char *sbn_cpu_isa_name(int isa) { return isa >= 0 && isa < N_ISA ? isas[isa].name : NULL; }
int sbn_cpu_isa_supported(int isa) { return isa >= 0 && isa < N_ISA && isas[isa].supported(); }
int sbn_cpu_isa_find(const char *name) {
  for (int i = 0; name && i < N_ISA; i++)
    if (strcmp(name, isas[i].name) == 0) return i;
  return -1;
}

static int isa_sel = -1; /* index into isas, -1: not chosen yet */

int sbn_cpu_get_isa(void) {
  int s = __atomic_load_n(&isa_sel, __ATOMIC_RELAXED);
  if (s < 0) {
    const char *want = getenv("SYNCBN_CPU_ISA");
    s = sbn_cpu_isa_find(want);
    const int asked_for_missing = want && *want && !sbn_cpu_isa_supported(s);
    if (!sbn_cpu_isa_supported(s)) /* unset, unknown or unsupported: the best */
      for (s = N_ISA - 1; s > 0 && !isas[s].supported(); s--) {
      }
    /* Ranks' threads may choose at once: the one that publishes the choice
     * says why (once per process), the others take what it published. */
    int unset = -1;
    if (!__atomic_compare_exchange_n(&isa_sel, &unset, s, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return unset;
    if (asked_for_missing && sbn_debug_enabled()) /* the library prints only when asked */
      fprintf(stderr, "syncbn: SYNCBN_CPU_ISA=%s: %s; using %s\n", want,
              sbn_cpu_isa_find(want) < 0 ? "unknown" : "not supported by this CPU", isas[s].name);
  }
  return s;
}

int sbn_cpu_set_isa(int isa) {
  if (!sbn_cpu_isa_supported(isa)) return -1;
  __atomic_store_n(&isa_sel, isa, __ATOMIC_RELAXED);
  return 0;
}

static sbn_kfn kernel(sbn_geom g, int op) {
  const sbn_ktable *t = &isas[sbn_cpu_get_isa()].tab[g.dtype];
  return rows_layout(g) ? t->cl[op] : t->cf[op];
}

/* Stream (non-temporal stores) outputs of at least this many bytes: they
 * would not stay in the core's caches anyway, and streaming saves the read
 * of each output line before it is written (a copy moves 2 tensors, not 3).
 * SYNCBN_STREAM_MIB overrides (0: never). The cost: a consumer that runs
 * right after (ReLU) finds y in memory rather than in a large L3: measured
 * with such a consumer, streaming outputs of 1-3 MiB made the forward
 * 1.04-1.26x faster and forward + consumer 0-12% slower (BENCHMARKS.md,
 * "Streamed outputs of 1-4 MiB"). */
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

static size_t dtype_bytes(sbn_dtype dt) {
  return dt == SBN_DTYPE_FLOAT64 ? 8 : dt == SBN_DTYPE_FLOAT32 ? 4 : 2;
}

/* Streaming pays only for whole cache lines: a channels-first row end
 * leaves at most one partial line (stored normally), a small share of rows
 * of 1 KiB or more (28x28 maps and up; 14x14 float32 rows are 784 bytes,
 * half of them unaligned). Rows of 1 KiB against the former 4 KiB, 2
 * threads: 8x512x28x28 float32 normalize 1.77 -> 1.26 ms, backward
 * elementwise 2.52 -> 1.88 ms. */
enum { STREAM_ROW_MIN = 1024 };
static int use_stream(sbn_geom g) {
  const size_t es = dtype_bytes(g.dtype);
  if ((size_t)(g.n * g.c * g.s) * es < stream_min()) return 0;
  return rows_layout(g) || (size_t)g.s * es >= STREAM_ROW_MIN || g.s >= 8;
}

/* Shorter channels-first rows go as one flat run of each hand-out's rows
 * (kern_flat.inc), at least 8 values a row so that an 8-value vector spans
 * at most two channels: streamed outputs, and unstreamed ones of at least
 * FLAT_MIN bytes. Row by row, each 7x7 or 14x14 row has its own unaligned
 * head and scalar tail. Measured (2 threads, out of cache, 8x2048x7x7
 * float32): normalize 0.248 -> 0.223 ms. (The 0.34 -> 0.245 ms once
 * recorded for the backward elementwise pass came from its float32 stores
 * streaming even where use_stream said not to: fixed, they follow it as
 * every pass does; BENCHMARKS.md.) On a tiny tensor (2x16x4x4, a call of
 * about 1 us) the flat run's setup cost 0.2 us a call, hence the floor. */
enum { FLAT_MIN = 1 << 16 };
static int use_flat(sbn_geom g) {
  const size_t es = dtype_bytes(g.dtype);
  if (rows_layout(g) || (size_t)g.s * es >= STREAM_ROW_MIN || g.s < 8) return 0;
  return use_stream(g) || (size_t)(g.n * g.c * g.s) * es >= FLAT_MIN;
}

/* 16-bit storage: the elementwise coefficients in float32, the mean split
 * in hi + lo (see vec.h), into the workspace. */
static const float *coef_f32(sbn_cpu_ws *ws, sbn_geom g, const double *mean, const double *a,
                             const double *b, const double *c) {
  if (g.dtype == SBN_DTYPE_FLOAT32 || g.dtype == SBN_DTYPE_FLOAT64) return NULL;
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
  /* bfloat16 rows: a copy with each whole block of 16 channels (from 0,
   * as the units' channel blocks are) in the order the 16-value path holds
   * them: the 8 even channels, then the 8 odd ones */
  float *p = f + 5 * C;
  for (int64_t j = 0; g.dtype == SBN_DTYPE_BFLOAT16 && j < 5; j++)
    for (int64_t c0 = 0; c0 + 16 <= C; c0 += 16)
      for (int64_t i = 0; i < 16; i++) p[j * C + c0 + i] = f[j * C + c0 + (i < 8 ? 2 * i : 2 * (i - 8) + 1)];
  return f;
}

static int threads_for(const sbn_cpu_ws *ws, sbn_geom g) {
  return g.n * g.c * g.s < PAR_MIN || ws->threads < 1 ? 1 : ws->threads;
}

/* Units per hand-out: about `grab` values, and at least 4 hand-outs per
 * thread so that a slow or preempted thread can be made up for. The units
 * and the order of the sums do not depend on it. (The channels-first
 * reductions of whole maps take one share a thread instead: cf_grain.)
 *
 * The rows layout's reductions take larger hand-outs: each unit prefetches
 * the next one of its hand-out (kern_rows.inc), so a hand-out's first unit
 * starts cold. With up to 64 units a hand-out the channels-last float32
 * reductions went from 1.3-1.4x the time of channels-first to 1.1x
 * (8x256x56x56, 8x512x28x28, 2 threads). Small tensors have few units (13
 * at 8x512x7x7), and 4 hand-outs per thread made most of them one-unit
 * hand-outs, every unit cold: below 4 rounds of RL_ROUND units per thread
 * the units are split evenly into `threads` x m hand-outs, m = 1 ... 3
 * (rows_grain). Measured (2 threads, out of cache, against 4 hand-outs per
 * thread, interleaved): channels-last statistics and backward reduce
 * 1.22-1.55x faster at 8x512x7x7, 1.10-1.31x at 256x1024, 1.07-1.20x at
 * 8x256x14x14 and 8x128x28x28, every dtype; larger shapes unchanged. */
static int64_t grain(int64_t units, int64_t per_unit, int threads, int64_t grab) {
  int64_t gr = grab / (per_unit > 0 ? per_unit : 1);
  const int64_t cap = units / (4 * (int64_t)threads);
  if (gr > cap) gr = cap;
  return gr < 1 ? 1 : gr;
}

static int64_t rows_grain(int64_t units, int64_t per_unit, int threads) {
  const int64_t m = units / ((int64_t)threads * RL_ROUND);
  if (m >= 4) return grain(units, per_unit, threads, GRAB_ROWS);
  const int64_t hand_outs = (int64_t)threads * (m > 0 ? m : 1);
  const int64_t even = (units + hand_outs - 1) / hand_outs;
  const int64_t gr = GRAB_ROWS / (per_unit > 0 ? per_unit : 1);
  return gr < 1 ? 1 : gr < even ? gr : even;
}

/* Merge unit partials into per-channel (s1, s2) for channels [c0, c1),
 * each channel in unit order. Channels-first: chunk partials of a channel
 * are adjacent; rows layout: one (sums, second sums) row of 2C per row block. */
static void merge_cf(const sbn_kargs *k, int64_t c0, int64_t c1) {
  for (int64_t c = c0; c < c1; c++) {
    const double *p = k->part + 2 * c * k->nck;
    double a = p[0], q = p[1];
    for (int64_t j = 1; j < k->nck; j++) a += p[2 * j], q += p[2 * j + 1];
    k->s1[c] = a, k->s2[c] = q;
  }
}

static void merge_rows(const sbn_kargs *k, int64_t c0, int64_t c1) {
  const int64_t C = k->c, nrb = (k->rows + k->rb - 1) / k->rb, ng = (nrb + k->rg - 1) / k->rg;
  const double *p = k->part;
  for (int64_t c = c0; c < c1; c++) k->s1[c] = p[c], k->s2[c] = p[C + c];
  for (int64_t b = 1; b < ng; b++) {
    p += 2 * C;
    for (int64_t c = c0; c < c1; c++) k->s1[c] += p[c], k->s2[c] += p[C + c];
  }
}

/* Small maps' reductions image by image from this many streams (kern_body.inc
 * K(small_map)): from the first. Measured (AMD EPYC, 2 threads, out of cache,
 * against a plain read loop, five runs of each build, BENCHMARKS.md) on
 * 8x512x7x7, 8x2048x7x7, 8x256x14x14 and 8x1024x14x14 in float32, bfloat16
 * and float16, against channel by channel with the sums kept across images:
 * statistics 1.13x, backward reduce 1.19x closer to it in geometric mean.
 * The tests raise it to compare the two orders' bits. */
enum { CF_STREAMS = 1 };
static int cf_streams = CF_STREAMS; /* atomic */
void sbn_cpu_set_cf_streams(int streams) {
  __atomic_store_n(&cf_streams, streams > 0 ? streams : CF_STREAMS, __ATOMIC_RELAXED);
}
static int cf_major_on = 1; /* atomic */
void sbn_cpu_set_cf_major(int on) { __atomic_store_n(&cf_major_on, on != 0, __ATOMIC_RELAXED); }

/* The rows layout's reductions in quads (kern_rows.inc K(stats_quads)) or
 * in column sweeps: the same bits either way. Quads at the generic and avx2
 * levels, measured on an AMD EPYC with a 32 KiB L1 and a 512 KiB L2, AVX2
 * (BENCHMARKS.md, "Quads"), for both reductions of every storage type.
 * float32 statistics of rows under 4 KiB once streamed better in column
 * sweeps (8x256x56x56 0.80-0.83 of a plain read loop against 0.60-0.61 in
 * the first quads); against today's quads (8 channels a step, plain
 * additions, next lines in memory order) the sweeps lose on every such
 * shape: bench/ab_passes.sh --runs 5, twice, 2 threads, out of cache,
 * medians 8x128x28x28 0.79 -> 0.96 of the read loop, 8x256x14x14 0.75 ->
 * 0.94, 8x512x7x7 0.87 -> 1.08, 8x64x56x56 0.79 -> 0.96, 8x64x112x112
 * 0.86 -> 0.96, 8x256x56x56 0.82 -> 0.92, 8x512x28x28 0.87 -> 0.89
 * (BENCHMARKS.md, "float32 channels-last statistics in quads"). At the
 * AVX-512 levels only the backward reduce, and for 16-bit storage only at
 * widths where it gains (quads_level). Units wider than SBN_RL_QUAD_MAX_W
 * take column sweeps. */
static int rl_quads_mode; /* atomic; sbn_cpu_set_rl_quads */
void sbn_cpu_set_rl_quads(int mode) { __atomic_store_n(&rl_quads_mode, mode, __ATOMIC_RELAXED); }
static int rl_quads(sbn_geom g, const sbn_kargs *k, int op) {
  const int mode = __atomic_load_n(&rl_quads_mode, __ATOMIC_RELAXED);
  if (!rows_layout(g) || g.dtype == SBN_DTYPE_FLOAT64 || k->cb > SBN_RL_QUAD_MAX_W) return 0;
  if (op != SBN_K_STATS && op != SBN_K_BRED) return 0;
  if (mode) return mode == 1;
  return quads_level(g, op);
}

/* Where the rows layout's reductions prefetch what their next unit reads
 * (kern_rows.inc K(pfc)): into L1 on AMD CPUs, whose L2 hint does not reach
 * L1, into L2 elsewhere. Only the hint differs; the results are
 * the same. */
static int prefetch_l1(void) {
#if defined(__x86_64__) || defined(__i386__)
  static int amd = -1; /* atomic */
  int v = __atomic_load_n(&amd, __ATOMIC_RELAXED);
  if (v < 0) {
    __builtin_cpu_init();
    v = __builtin_cpu_is("amd") ? 1 : 0;
    __atomic_store_n(&amd, v, __ATOMIC_RELAXED);
  }
  return v;
#else
  return 0;
#endif
}

/* The channels-first reductions, image by image: a hand-out of channels
 * reads each image's pieces of them in memory order (one stream) instead
 * of each channel's N pieces, a plane apart, one after the other; each
 * channel adds its images' pieces in the same order with the same
 * operations, so every sum keeps its bits (test_cpu_sums_bits). For maps
 * of 1 KiB and more in one chunk (smaller ones, and the statistics of maps
 * under 4 KiB: K(cf_image_major)); the hand-outs (cf_grain) apply to both
 * orders. Measured (AMD
 * EPYC, 2 threads, out of cache, against a plain read loop timed beside it,
 * three runs of each build, BENCHMARKS.md), when memory was fast:
 * 8x256x56x56 statistics 0.58-0.60 -> 0.84-0.86 of it in float32,
 * 0.42-0.44 -> 0.63-0.69 in bfloat16, backward reduce 0.73-0.76 -> 0.94-1.00
 * and 0.61-0.65 -> 0.84-0.92; 8x512x28x28 backward reduce 0.74-0.81 ->
 * 0.91-0.94 (float32); the AVX2 level's backward reduce 1.10x. */
/* Hand-outs of the channels-first reductions of whole maps (one chunk a
 * channel): one even share of the channels per thread, so each image's run
 * of a thread's channels is as long as it can be: every run starts a
 * stream cold, and in smaller hand-outs (about 64K values, at least 4 a
 * thread) the runs were 5-40 KiB. Measured (Intel Xeon, AVX-512, 2
 * threads, out of cache, against a plain read loop timed beside each pass,
 * two alternations, BENCHMARKS.md "Even hand-outs for the channels-first
 * reductions"): statistics 1.05-1.32x faster on every ResNet-50 shape and
 * dtype, backward reduce 0.98-1.17x; the same at the avx2 level on that
 * machine (a matter of memory, not of the instruction set). The price is
 * what 4 hand-outs a thread buy (grain): a thread preempted in its share
 * is not made up for. The order of every sum is the same either way. */
static int64_t cf_grain(int64_t units, int threads) { return (units + threads - 1) / threads; }

static int cf_major(sbn_geom g, int64_t nck) {
  return !rows_layout(g) && nck == 1 && g.n > 1 && g.s * (int64_t)dtype_bytes(g.dtype) >= CF_MAJOR_BYTES &&
         __atomic_load_n(&cf_major_on, __ATOMIC_RELAXED);
}

/* Run a pass: plan, split among the threads, merge the reductions. */
static void run(sbn_cpu_ws *ws, sbn_kargs *k, sbn_geom g, int op, double *s1, double *s2) {
  const pass_kind kind = kind_of(op);
  sbn_kargs p;
  int64_t per_unit = 0;
  const int64_t units = plan(&p, g, op, &per_unit, NULL);
  k->n = p.n, k->c = p.c, k->s = p.s, k->chunk = p.chunk, k->nck = p.nck;
  k->rb = p.rb, k->rows = p.rows, k->cb = p.cb, k->ncb = p.ncb, k->rg = p.rg;
  k->s1 = s1, k->s2 = s2;
  k->cf_streams = __atomic_load_n(&cf_streams, __ATOMIC_RELAXED);
  k->pf_l1 = prefetch_l1();
  k->rl_quads = rl_quads(g, k, op);
  const int threads = threads_for(ws, g);
  sbn_kfn merge = kind == PASS_ELEMWISE ? NULL : rows_layout(g) ? merge_rows : merge_cf;
  k->cf_major = kind == PASS_REDUCE && cf_major(g, k->nck);
  int64_t gr = kind == PASS_ELEMWISE  ? grain(units, per_unit, threads, GRAB)
               : rows_layout(g)         ? rows_grain(units, per_unit, threads)
               : k->nck == 1            ? cf_grain(units, threads)
                                        : grain(units, per_unit, threads, GRAB);
  if (kind == PASS_REDUCE && rows_layout(g) && k->rg > 1) { /* whole groups of row blocks (cpu_kern.h) */
    const int64_t gu = k->rg * k->ncb;
    gr = gr < gu ? gu : gr / gu * gu;
  }
  sbn_cpu_parallel_for(threads, units, gr, kernel(g, op), k, merge, g.c);
}

/* The rows layout's shifts: the first row, one loop per dtype (a switch per
 * channel cost ~3 us of a 2x2048 forward's ~17 on an AMD EPYC). */
static void first_row_shifts(double *shift, const void *x, sbn_dtype dt, int64_t C) {
  const uint16_t *h = x;
  switch (dt) {
    case SBN_DTYPE_BFLOAT16:
      for (int64_t c = 0; c < C; c++) shift[c] = sbn_shift_of(sbn_bf16_to_f32(h[c]));
      break;
    case SBN_DTYPE_FLOAT16:
      for (int64_t c = 0; c < C; c++) shift[c] = sbn_shift_of(sbn_f16_to_f32(h[c]));
      break;
    case SBN_DTYPE_FLOAT64:
      for (int64_t c = 0; c < C; c++) shift[c] = sbn_shift_of(((const double *)x)[c]);
      break;
    default:
      for (int64_t c = 0; c < C; c++) shift[c] = sbn_shift_of(((const float *)x)[c]);
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
  /* The shift: the channel's first value (n = 0, first position), or 0
   * where that is not finite (sbn_shift_of). The rows layout's are the
   * first row, read here; the channels-first kernels read their channels'
   * themselves (kern_body.inc K(cf_shift)). */
  sbn_kargs k;
  memset(&k, 0, sizeof k);
  if (rows_layout(g))
    first_row_shifts(shift, x, g.dtype, C);
  k.x = x, k.m = shift, k.shift = shift, k.part = ws->part;
  run(ws, &k, g, SBN_K_STATS, s1, s2);
}

void sbn_cpu_normalize(sbn_cpu_ws *ws, void *y, const void *x, sbn_geom g, const double *mean,
                       const double *scale, const double *bias) {
  if (g.n == 0 || g.s == 0) return;
  sbn_kargs k;
  memset(&k, 0, sizeof k);
  k.x = x, k.out = y, k.m = mean, k.a = scale, k.b = bias;
  k.f = coef_f32(ws, g, mean, scale, bias, NULL);
  k.fp = k.f ? k.f + 5 * g.c : NULL;
  k.stream = use_stream(g), k.flat = use_flat(g);
  run(ws, &k, g, SBN_K_NORM, NULL, NULL);
}

void sbn_cpu_backward_reduce(sbn_cpu_ws *ws, double *sum_dy, double *sum_dy_xmu, const void *dy,
                             const void *x, sbn_geom g, const double *mean) {
  if (g.n == 0 || g.s == 0) {
    memset(sum_dy, 0, sizeof(double) * (size_t)g.c);
    memset(sum_dy_xmu, 0, sizeof(double) * (size_t)g.c);
    return;
  }
  sbn_kargs k;
  memset(&k, 0, sizeof k);
  k.x = x, k.dy = dy, k.m = mean, k.part = ws->part;
  run(ws, &k, g, SBN_K_BRED, sum_dy, sum_dy_xmu);
}

void sbn_cpu_backward_elemt(sbn_cpu_ws *ws, void *dx, const void *dy, const void *x, sbn_geom g,
                            const double *mean, const double *a, const double *b,
                            const double *c) {
  if (g.n == 0 || g.s == 0) return;
  sbn_kargs k;
  memset(&k, 0, sizeof k);
  k.x = x, k.dy = dy, k.out = dx, k.m = mean, k.a = a, k.b = b, k.cc = c;
  k.f = coef_f32(ws, g, mean, a, b, c);
  k.fp = k.f ? k.f + 5 * g.c : NULL;
  k.stream = use_stream(g), k.flat = use_flat(g);
  run(ws, &k, g, SBN_K_BELT, NULL, NULL);
}
