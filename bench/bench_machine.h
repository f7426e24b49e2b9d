/* What the CPU benchmarks (syncbn-bench, syncbn-bench-passes,
 * syncbn-bench-consumer) share: the clock, medians, the last-level cache
 * size, and the copy bandwidth that every efficiency is a fraction of,
 * measured the same way by all. */
#ifndef SBN_BENCH_MACHINE_H
#define SBN_BENCH_MACHINE_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../src/cpu/bn_kernels.h"
#include "../src/cpu/cpu_kern.h"

static inline double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static inline double median(double *v, int n) {
  if (n <= 0) return 0;
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Last-level cache in bytes: the largest cache level the kernel lists in
 * sysfs for cpu0; sysconf only if sysfs says nothing (glibc derives it from
 * CPUID, which in a VM may report the whole package, not what the core
 * shares); 32 MiB if neither says. */
static inline size_t llc_bytes(void) {
  size_t best = 0;
  for (int i = 0; i < 8; i++) {
    char path[128], buf[64];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    if (fgets(buf, sizeof buf, f)) {
      char *end;
      double v = strtod(buf, &end);
      size_t b = (size_t)(v * (*end == 'M' ? 1 << 20 : *end == 'K' ? 1 << 10 : 1));
      if (b > best) best = b;
    }
    fclose(f);
  }
  long sc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (!best && sc > 0) best = (size_t)sc;
  return best ? best : (size_t)32 << 20;
}

static inline void copy_units(const sbn_kargs *k, int64_t u0, int64_t u1) {
  const size_t unit = (size_t)k->chunk;
  memcpy((char *)k->out + u0 * unit, (const char *)k->x + u0 * unit, (size_t)(u1 - u0) * unit);
}

/* The same copy with streaming (non-temporal) stores, as the kernels write
 * large outputs: glibc's memcpy streams only above a size tied to the LLC. */
#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2"))) static inline void copy_units_nt(const sbn_kargs *k, int64_t u0, int64_t u1) {
  const size_t unit = (size_t)k->chunk;
  const float *src = (const float *)((const char *)k->x + u0 * unit);
  float *dst = (float *)((char *)k->out + u0 * unit);
  const size_t n = (size_t)(u1 - u0) * unit / 4;
  for (size_t i = 0; i < n; i += 8) _mm256_stream_ps(dst + i, _mm256_load_ps(src + i));
  _mm_sfence();
}
#endif

/* A read-only sweep of the units (float sums, software prefetch 4 KiB ahead
 * as the kernels do), for the read bandwidth. */
static volatile float read_sink;
#if defined(__x86_64__)
__attribute__((target("avx2"))) static inline void read_units_avx2(const sbn_kargs *k, int64_t u0, int64_t u1) {
  const size_t unit = (size_t)k->chunk;
  const float *src = (const float *)((const char *)k->x + u0 * unit);
  const size_t n = (size_t)(u1 - u0) * unit / 4;
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i < n; i += 32) {
    _mm_prefetch((const char *)(src + i + 1024), _MM_HINT_T0);
    _mm_prefetch((const char *)(src + i + 1040), _MM_HINT_T0);
    s0 = _mm256_add_ps(s0, _mm256_load_ps(src + i)), s1 = _mm256_add_ps(s1, _mm256_load_ps(src + i + 8));
    s2 = _mm256_add_ps(s2, _mm256_load_ps(src + i + 16)), s3 = _mm256_add_ps(s3, _mm256_load_ps(src + i + 24));
  }
  float o[8];
  _mm256_storeu_ps(o, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  read_sink = o[0];
}
#endif
static inline void read_units(const sbn_kargs *k, int64_t u0, int64_t u1) {
  const size_t unit = (size_t)k->chunk;
  const float *src = (const float *)((const char *)k->x + u0 * unit);
  const size_t n = (size_t)(u1 - u0) * unit / 4;
  float s[8] = {0};
  for (size_t i = 0; i < n; i += 8)
    for (int j = 0; j < 8; j++) s[j] += src[i + j];
  read_sink = s[0];
}

/* Median seconds to run `fn` over one 4 MiB piece of the arena's first
 * half (into the same place in its second half, for a copy), each piece
 * timed on its own over 3 sweeps: like one of our calls, and on a loaded
 * machine a whole-arena pass would also time the waits for a core. */
enum { BW_PIECE = 4 << 20, BW_UNIT = 1 << 18 };
static inline double piece_seconds(char *arena, size_t bytes, int threads, sbn_kfn fn) {
  const size_t half = bytes / 2 / BW_PIECE * BW_PIECE, pieces = half / BW_PIECE;
  static double t[3 * 4096];
  int n = 0;
  for (int sweep = 0; sweep < 3; sweep++)
    for (size_t p = 0; p < pieces && n < 3 * 4096; p++) {
      sbn_kargs k;
      memset(&k, 0, sizeof k);
      k.x = arena + p * BW_PIECE, k.out = arena + half + p * BW_PIECE, k.chunk = BW_UNIT;
      double t0 = now();
      sbn_cpu_parallel_for(threads, BW_PIECE / BW_UNIT, 1, fn, &k, NULL, 0);
      t[n++] = now() - t0;
    }
  return median(t, n);
}

/* Read bandwidth, bytes read: the arena's first half summed, piece by
 * piece (piece_seconds). A pass that
 * only reads (statistics, backward reduce) moves at most this; on machines
 * whose cores keep too few reads in flight it is well below the copy
 * bandwidth, which also fills the memory system with writes. */
static inline double read_bandwidth(char *arena, size_t bytes, int threads) {
  sbn_kfn fn = read_units;
#if defined(__x86_64__)
  if (sbn_cpu_has_avx2()) fn = read_units_avx2;
#endif
  return (double)BW_PIECE / piece_seconds(arena, bytes, threads, fn) / 1e9;
}

/* The best efficiency (fraction of the copy bandwidth at 3 or 5 tensor
 * passes) a layer can reach when its read-only passes move at the read
 * bandwidth and the others at the copy bandwidth: forward = statistics (reads
 * x) + normalize (x -> y); backward = reduce (reads x, dy) + elementwise
 * (x, dy -> dx). r = read / copy bandwidth. */
static inline double bound_fwd(double r) { return 3.0 / (1.0 / fmin(r, 1.0) + 2.0); }
static inline double bound_bwd(double r) { return 5.0 / (2.0 / fmin(r, 1.0) + 3.0); }

/* Best of memcpy and the streaming copy, bytes read + written: each copies
 * the arena's first half to its second, piece by piece (piece_seconds). */
static inline double copy_bandwidth(char *arena, size_t bytes, int threads, double *bw_memcpy, double *bw_stream) {
  *bw_stream = 0;
  *bw_memcpy = 2.0 * BW_PIECE / piece_seconds(arena, bytes, threads, copy_units) / 1e9;
#if defined(__x86_64__)
  if (sbn_cpu_has_avx2()) *bw_stream = 2.0 * BW_PIECE / piece_seconds(arena, bytes, threads, copy_units_nt) / 1e9;
#endif
  return *bw_stream > *bw_memcpy ? *bw_stream : *bw_memcpy;
}

#endif
