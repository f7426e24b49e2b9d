/* What the CPU benchmarks (syncbn-bench, syncbn-bench-passes) share: the
 * clock, medians, the last-level cache size, and the copy bandwidth that
 * every efficiency is a fraction of, measured the same way by both. */
#ifndef SBN_BENCH_MACHINE_H
#define SBN_BENCH_MACHINE_H

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

/* Best of memcpy and the streaming copy, bytes read + written: each copies
 * the arena's first half to its second in 4 MiB pieces, each piece timed on
 * its own (median over the pieces of 3 sweeps), like one of our calls: on a
 * loaded machine a whole-arena copy would also time the waits for a core. */
static inline double copy_bandwidth(char *arena, size_t bytes, int threads, double *bw_memcpy, double *bw_stream) {
  enum { PIECE = 4 << 20, UNIT = 1 << 18 };
  const size_t half = bytes / 2 / PIECE * PIECE, pieces = half / PIECE;
  static double t[3 * 4096];
  *bw_stream = 0;
  for (int kind = 0; kind < 2; kind++) {
    sbn_kfn fn = copy_units;
#if defined(__x86_64__)
    if (kind == 1) {
      if (!sbn_cpu_has_avx2()) break;
      fn = copy_units_nt;
    }
#else
    if (kind == 1) break;
#endif
    int n = 0;
    for (int sweep = 0; sweep < 3; sweep++)
      for (size_t p = 0; p < pieces && n < 3 * 4096; p++) {
        sbn_kargs k;
        memset(&k, 0, sizeof k);
        k.x = arena + p * PIECE, k.out = arena + half + p * PIECE, k.chunk = UNIT;
        double t0 = now();
        sbn_cpu_parallel_for(threads, PIECE / UNIT, 1, fn, &k, NULL, 0);
        t[n++] = now() - t0;
      }
    (kind ? bw_stream : bw_memcpy)[0] = 2.0 * PIECE / median(t, n) / 1e9;
  }
  return *bw_stream > *bw_memcpy ? *bw_stream : *bw_memcpy;
}

#endif
