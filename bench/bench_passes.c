/* syncbn-bench-passes: each CPU kernel pass on its own, out of cache, as a
 * fraction of the copy bandwidth, to find which pass holds a layer back
 * (syncbn-bench times whole forward and backward calls).
 *
 * Passes and the tensors each moves: stats 1 (read x), normalize 2 (read x,
 * write y), backward reduce 2 (read x, dy), backward elementwise 3 (read x,
 * dy, write dx). Inputs rotate through 4x the last-level cache (or
 * --arena-mib), so every call reads from memory. Median of --reps calls.
 *
 * Usage: syncbn-bench-passes [--threads T] [--reps R] [--arena-mib M]
 *                            [--only SHAPE] [--shape NxCxHxW] [--isa NAME] [--min]
 * --only picks built-in shapes by prefix; --shape runs one shape of any
 * size instead. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/cpu/bn_kernels.h"
#include "../src/cpu/cpu_kern.h"
#include "../src/cpu/half.h"
#include "bench_machine.h"

/* Copy bandwidth as syncbn-bench measures it (bench_machine.h). */
static double copy_bw(char *arena, size_t bytes, int threads) {
  double bw_memcpy, bw_stream;
  return copy_bandwidth(arena, bytes, threads, &bw_memcpy, &bw_stream);
}

/* "NxC" or "NxCxHxW..." into (N, C, product of the rest); 0 if well formed. */
static int parse_shape(const char *str, int64_t out[3]) {
  int64_t dims[8];
  int nd = 0;
  for (const char *p = str; nd < 8;) {
    char *end;
    const long long v = strtoll(p, &end, 10);
    if (end == p || v < 1 || v > (1LL << 31)) return -1;
    dims[nd++] = v;
    if (!*end) break;
    if (*end != 'x') return -1;
    p = end + 1;
  }
  if (nd < 2 || nd > 5) return -1;
  out[0] = dims[0], out[1] = dims[1], out[2] = 1;
  for (int i = 2; i < nd; i++) out[2] *= dims[i];
  return 0;
}

int main(int argc, char **argv) {
  int threads = 2, reps = 31, use_min = 0;
  double arena_mib = 0;
  const char *only = NULL;
  int64_t custom[3] = {0, 0, 0}; /* --shape: N, C, spatial size, instead of the built-in list */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--arena-mib") && i + 1 < argc) arena_mib = atof(argv[++i]);
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
      if (parse_shape(argv[++i], custom)) return fprintf(stderr, "--shape %s: expected NxC or NxCxHxW...\n", argv[i]), 2;
    }
    else if (!strcmp(argv[i], "--min")) use_min = 1; /* fastest call: steadier under load */
    else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
      if (sbn_cpu_set_isa(sbn_cpu_isa_find(argv[++i])) != 0) return fprintf(stderr, "isa %s not run here\n", argv[i]), 2;
    } else
      return fprintf(stderr, "usage: %s [--threads T] [--reps R] [--arena-mib M] [--only SHAPE] [--shape NxCxHxW] [--isa NAME] [--min]\n", argv[0]), 2;
  }
  if (reps < 1 || reps > 1001) reps = 31;
  const size_t arena_bytes = arena_mib > 0 ? (size_t)(arena_mib * (1 << 20)) : 4 * llc_bytes();
  char *arena = aligned_alloc(64, arena_bytes);
  if (!arena) return 1;
  for (size_t i = 0; i < arena_bytes / 4; i++) ((float *)arena)[i] = (float)(i % 1000) * 1e-3f - 0.5f;
  const double bw = copy_bw(arena, arena_bytes, threads);
  double load[3];
  getloadavg(load, 3);
  printf("copy bandwidth %.2f GB/s, %d thread(s), %s kernels, arena %zu MiB, load %.2f\n", bw, threads,
         sbn_cpu_isa_name(sbn_cpu_get_isa()), arena_bytes >> 20, load[0]);
  const double rbw = read_bandwidth(arena, arena_bytes, threads);
  printf("read bandwidth %.2f GB/s = %.2f of the copy bandwidth: the read-only passes (stats, bred) reach at most that\n",
         rbw, rbw / bw);
  printf("efficiency per pass = tensors moved x bytes / time / copy bandwidth\n");
  printf("%-16s %-2s %-5s | %8s %5s | %8s %5s | %8s %5s | %8s %5s\n", "shape", "ly", "dtype", "stats ms", "eff",
         "norm ms", "eff", "bred ms", "eff", "belt ms", "eff");

  static const int64_t shapes[][3] = {{8, 64, 112 * 112}, {8, 64, 56 * 56},  {8, 256, 56 * 56}, {8, 128, 28 * 28},
                                      {8, 512, 28 * 28},  {8, 256, 14 * 14}, {8, 1024, 14 * 14}, {8, 512, 49},
                                      {8, 2048, 49},      {256, 1024, 1},    {2, 16, 16}};
  const int ns = custom[0] ? 1 : sizeof shapes / sizeof shapes[0];
  static double t[4][1024];
  sbn_cpu_ws ws = {NULL, 0, threads};
  const int64_t maxc = custom[1] > 2048 ? custom[1] : 2048;
  /* 64-byte aligned, as the layer allocates them (device_cpu.c) */
  const size_t cbytes = ((size_t)maxc * 8 + 63) / 64 * 64;
  double *mean = aligned_alloc(64, cbytes), *a = aligned_alloc(64, cbytes), *b = aligned_alloc(64, cbytes),
         *c = aligned_alloc(64, cbytes), *s1 = aligned_alloc(64, cbytes), *s2 = aligned_alloc(64, cbytes),
         *sh = aligned_alloc(64, cbytes);
  for (int64_t i = 0; i < maxc; i++) mean[i] = 0.01 * (double)i, a[i] = 1.5, b[i] = 0.25, c[i] = 0.125;
  for (int si = 0; si < ns; si++)
    for (int dt = 0; dt < 3; dt++)
      for (int lay = 0; lay < 2; lay++) {
        const int64_t *shp = custom[0] ? custom : shapes[si];
        const int64_t n = shp[0], C = shp[1], S = shp[2];
        char label[48];
        if (S == 1) snprintf(label, sizeof label, "%lldx%lld", (long long)n, (long long)C);
        else {
          int side = (int)lround(sqrt((double)S));
          snprintf(label, sizeof label, "%lldx%lldx%dx%d", (long long)n, (long long)C, side, (int)S / side);
        }
        if (only && strncmp(label, only, strlen(only))) continue;
        static const sbn_dtype dts[3] = {SBN_DTYPE_FLOAT32, SBN_DTYPE_BFLOAT16, SBN_DTYPE_FLOAT16};
        sbn_geom g = {n, C, S, lay ? SBN_LAYOUT_CHANNELS_LAST : SBN_LAYOUT_CHANNELS_FIRST, dts[dt]};
        const size_t tb = ((size_t)(n * C * S) * (dt ? 2 : 4) + 63) & ~(size_t)63, set = 4 * tb;
        const int K = (int)(arena_bytes / set);
        if (K < 2) continue;
        if (sbn_cpu_ws_reserve(&ws, g)) return 1;
        long step = 0;
        for (int r = -2; r < reps; r++)
          for (int p = 0; p < 4; p++, step++) {
            char *base = arena + (size_t)(step % K) * set;
            void *x = base, *y = base + tb, *dy = base + 2 * tb, *dx = base + 3 * tb;
            double t0 = now();
            switch (p) {
              case 0: sbn_cpu_stats(&ws, sh, s1, s2, x, g); break;
              case 1: sbn_cpu_normalize(&ws, y, x, g, mean, a, b); break;
              case 2: sbn_cpu_backward_reduce(&ws, s1, s2, dy, x, g, mean); break;
              default: sbn_cpu_backward_elemt(&ws, dx, dy, x, g, mean, a, b, c); break;
            }
            if (r >= 0) t[p][r] = now() - t0;
          }
        const double bytes = (double)(n * C * S) * (dt ? 2 : 4);
        static const int moved[4] = {1, 2, 2, 3};
        printf("%-16s %-2s %-5s", label, lay ? "cl" : "cf", dt == 2 ? "f16" : dt ? "bf16" : "f32");
        for (int p = 0; p < 4; p++) {
          const double ms = (use_min ? (median(t[p], reps), t[p][0]) : median(t[p], reps)) * 1e3;
          printf(" | %8.4f %5.2f", ms, moved[p] * bytes / (ms * 1e-3) / 1e9 / bw);
        }
        printf("\n");
      }
  sbn_cpu_ws_free(&ws);
  free(arena);
  return 0;
}
