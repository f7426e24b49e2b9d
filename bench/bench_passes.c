/* syncbn-bench-passes: each CPU kernel pass on its own, out of cache, as a
 * fraction of the copy bandwidth and of a ruler, to find which pass holds a
 * layer back (syncbn-bench times whole forward and backward calls).
 *
 * Passes and the tensors each moves: stats 1 (read x), normalize 2 (read x,
 * write y), backward reduce 2 (read x, dy), backward elementwise 3 (read x,
 * dy, write dx). Inputs rotate through at least 8x the last-level cache and
 * 4 sets of tensors (or --arena-mib), so every call reads from memory.
 * Median of --reps calls.
 *
 * The ruler: right after each pass, the simplest loop that moves the same
 * tensors the same way (sums of x, of x and dy; y = x; dx = x + dy, the
 * faster of plain and streaming stores), on the same threads, on another
 * set of cold tensors. The copy bandwidth, measured once, moves with this
 * machine's state (2x between runs on a shared host); the ruler is
 * measured in the same seconds as the pass, so "of ruler" (ruler time /
 * pass time) says how far a pass is from what memory gives a trivial loop
 * at that moment: near 1, the pass is at its bound. (CPUs without AVX2: no
 * ruler, the column prints 0.)
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

/* Ruler loops over units of k->chunk bytes of tensors of k->n bytes: sums of
 * x (and dy), y = x, dx = x + dy; float32 lanes whatever the dtype (the
 * bytes are what they measure). Prefetch 4 KiB ahead, as the kernels do. */
static volatile float ruler_sink;
static inline int64_t ru_len(const sbn_kargs *k, int64_t u0, int64_t u1) {
  const int64_t end = u1 * k->chunk < k->n ? u1 * k->chunk : k->n;
  return (end - u0 * k->chunk) / 64 * 16; /* whole lines of floats */
}
#if defined(__x86_64__)
__attribute__((target("avx2"))) static void ruler_sum(const sbn_kargs *k, int64_t u0, int64_t u1) {
  const int64_t n = ru_len(k, u0, u1);
  const float *a = (const float *)k->x + u0 * k->chunk / 4, *b = k->dy ? (const float *)k->dy + u0 * k->chunk / 4 : NULL;
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (int64_t i = 0; i < n; i += 16) {
    _mm_prefetch((const char *)(a + i + 1024), _MM_HINT_T0);
    s0 = _mm256_add_ps(s0, _mm256_load_ps(a + i)), s1 = _mm256_add_ps(s1, _mm256_load_ps(a + i + 8));
    if (b) {
      _mm_prefetch((const char *)(b + i + 1024), _MM_HINT_T0);
      s2 = _mm256_add_ps(s2, _mm256_load_ps(b + i)), s3 = _mm256_add_ps(s3, _mm256_load_ps(b + i + 8));
    }
  }
  float o[8];
  _mm256_storeu_ps(o, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  ruler_sink = o[0];
}
/* out = x (+ dy); nt: streaming stores */
__attribute__((target("avx2"))) static inline void ruler_write(const sbn_kargs *k, int64_t u0, int64_t u1, int nt) {
  const int64_t n = ru_len(k, u0, u1), o = u0 * k->chunk / 4;
  const float *a = (const float *)k->x + o, *b = k->dy ? (const float *)k->dy + o : NULL;
  float *out = (float *)k->out + o;
  for (int64_t i = 0; i < n; i += 16) {
    _mm_prefetch((const char *)(a + i + 1024), _MM_HINT_T0);
    __m256 v0 = _mm256_load_ps(a + i), v1 = _mm256_load_ps(a + i + 8);
    if (b) {
      _mm_prefetch((const char *)(b + i + 1024), _MM_HINT_T0);
      v0 = _mm256_add_ps(v0, _mm256_load_ps(b + i)), v1 = _mm256_add_ps(v1, _mm256_load_ps(b + i + 8));
    }
    if (nt) _mm256_stream_ps(out + i, v0), _mm256_stream_ps(out + i + 8, v1);
    else _mm256_store_ps(out + i, v0), _mm256_store_ps(out + i + 8, v1);
  }
  if (nt) _mm_sfence();
}
static void ruler_write_plain(const sbn_kargs *k, int64_t u0, int64_t u1) { ruler_write(k, u0, u1, 0); }
static void ruler_write_nt(const sbn_kargs *k, int64_t u0, int64_t u1) { ruler_write(k, u0, u1, 1); }

/* Seconds for ruler p (0 stats, 1 normalize, 2 backward reduce, 3
 * elementwise) over tensors of `bytes` at x, dy, out; nt picks the stores. */
static double ruler(int p, int nt, int threads, int64_t bytes, const void *x, const void *dy, void *out) {
  sbn_kargs k;
  memset(&k, 0, sizeof k);
  k.x = x, k.dy = (p == 2 || p == 3) ? dy : NULL, k.out = out, k.n = bytes, k.chunk = BW_UNIT;
  const int64_t units = (bytes + BW_UNIT - 1) / BW_UNIT;
  const double t0 = now();
  sbn_cpu_parallel_for(threads, units, 1, (p == 0 || p == 2) ? ruler_sum : nt ? ruler_write_nt : ruler_write_plain,
                       &k, NULL, 0);
  return now() - t0;
}
#endif

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
  /* at least 4 sets of the largest shape (4 tensors of 8x64x112x112 float32,
   * or the --shape one) and 8x the last-level cache */
  const int64_t big = custom[0] ? custom[0] * custom[1] * custom[2] : 8 * 64 * 112 * 112;
  size_t arena_bytes = 8 * llc_bytes();
  if (arena_bytes < (size_t)big * 4 * 4 * 4 + (1 << 20)) arena_bytes = (size_t)big * 4 * 4 * 4 + (1 << 20);
  if (arena_mib > 0) arena_bytes = (size_t)(arena_mib * (1 << 20));
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
  printf("efficiency per pass = tensors moved x bytes / time / copy bandwidth; rul = ruler time / pass time\n");
  printf("%-16s %-2s %-5s | %8s %5s %4s | %8s %5s %4s | %8s %5s %4s | %8s %5s %4s\n", "shape", "ly", "dtype",
         "stats ms", "eff", "rul", "norm ms", "eff", "rul", "bred ms", "eff", "rul", "belt ms", "eff", "rul");

  static const int64_t shapes[][3] = {{8, 64, 112 * 112}, {8, 64, 56 * 56},  {8, 256, 56 * 56}, {8, 128, 28 * 28},
                                      {8, 512, 28 * 28},  {8, 256, 14 * 14}, {8, 1024, 14 * 14}, {8, 512, 49},
                                      {8, 2048, 49},      {256, 1024, 1},    {2, 16, 16}};
  const int ns = custom[0] ? 1 : sizeof shapes / sizeof shapes[0];
  static double t[4][1024], tr[4][2][1024];
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
        if (K < 4) {
          fprintf(stderr, "%s: the arena holds %d sets of tensors, fewer than 4; skipped\n", label, K);
          continue;
        }
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
#if defined(__x86_64__)
            /* the ruler, on the next set (cold as well): both store kinds
             * where the pass writes, each on a set of its own (the second
             * on the first one's would find its inputs in the L3) */
            const int64_t tbytes = (int64_t)((size_t)(n * C * S) * (dt ? 2 : 4));
            for (int nt = 0; sbn_cpu_has_avx2() && nt < (p == 1 || p == 3 ? 2 : 1); nt++) {
              step++;
              char *rb = arena + (size_t)(step % K) * set;
              const double sec = ruler(p, nt, threads, tbytes, rb, rb + 2 * tb, rb + 3 * tb);
              if (r >= 0) tr[p][nt][r] = sec;
            }
#endif
          }
        const double bytes = (double)(n * C * S) * (dt ? 2 : 4);
        static const int moved[4] = {1, 2, 2, 3};
        printf("%-16s %-2s %-5s", label, lay ? "cl" : "cf", dt == 2 ? "f16" : dt ? "bf16" : "f32");
        for (int p = 0; p < 4; p++) {
          const double ms = (use_min ? (median(t[p], reps), t[p][0]) : median(t[p], reps)) * 1e3;
          double rms = 0;
#if defined(__x86_64__)
          for (int nt = 0; sbn_cpu_has_avx2() && nt < (p == 1 || p == 3 ? 2 : 1); nt++) {
            const double v = (use_min ? (median(tr[p][nt], reps), tr[p][nt][0]) : median(tr[p][nt], reps)) * 1e3;
            if (nt == 0 || v < rms) rms = v;
          }
#endif
          printf(" | %8.4f %5.2f %4.2f", ms, moved[p] * bytes / (ms * 1e-3) / 1e9 / bw, rms / ms);
        }
        printf("\n");
      }
  sbn_cpu_ws_free(&ws);
  free(arena);
  return 0;
}
