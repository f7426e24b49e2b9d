/* syncbn-bench: the CPU kernels against the machine's memory bandwidth and
 * against PyTorch, in one run (method and results: BENCHMARKS.md).
 *
 *  1. copy bandwidth: a large parallel memcpy, bytes read + written;
 *  2. forward and backward of one rank (group NULL) over the ResNet-50
 *     batch-norm shapes at N = 8 and 32 plus 2-D (256, 1024), both layouts,
 *     float32 and bfloat16: median time, GB/s at 3 (forward) and 5 (backward)
 *     tensor passes, efficiency = that / copy bandwidth;
 *  3. PyTorch's CPU F.batch_norm training forward + backward on the same
 *     shapes and thread count (bench/torch_bn.py), our speedup;
 *  4. synchronization cost: 2 thread ranks with SyncBN against the same 2
 *     ranks running plain BatchNorm, and against 1 rank alone;
 *  5. CSV, a table on stdout, and a PNG plot (gnuplot).
 *
 * Inputs rotate through an arena larger than the last-level cache (this VM
 * reports a 260 MiB L3), so every timed call reads from memory.
 *
 * Usage: syncbn-bench [--quick] [--threads T] [--out DIR] [--no-torch]
 *                     [--rotate-mib M] [--time S] */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../src/cpu/bn_kernels.h"
#include "../src/cpu/cpu_kern.h"
#include "../src/cpu/half.h"
#include "syncbn.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- options ---- */
static struct {
  int quick, threads, torch;
  double rotate_mib, time_s;
  const char *out;
} opt = {0, 0, 1, 640, 0.4, "build/bench"};

#define MAX_REPS 60
enum { MIN_REPS = 5 };

/* ---- copy bandwidth ---- */
static void copy_units(const sbn_kargs *k, int64_t u0, int64_t u1) {
  const size_t unit = (size_t)k->chunk;
  memcpy((char *)k->out + u0 * unit, (const char *)k->x + u0 * unit, (size_t)(u1 - u0) * unit);
}

/* The same copy with streaming (non-temporal) stores, as the kernels write
 * large outputs: glibc's memcpy streams only above a size tied to the L3
 * (which this VM reports as 260 MiB), so it may not. */
#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2"))) static void copy_units_nt(const sbn_kargs *k, int64_t u0, int64_t u1) {
  const size_t unit = (size_t)k->chunk;
  const float *src = (const float *)((const char *)k->x + u0 * unit);
  float *dst = (float *)((char *)k->out + u0 * unit);
  const size_t n = (size_t)(u1 - u0) * unit / 4;
  for (size_t i = 0; i < n; i += 8) _mm256_stream_ps(dst + i, _mm256_load_ps(src + i));
  _mm_sfence();
}
#endif

/* Best of memcpy and the streaming copy (median of 9 each), bytes read +
 * written; *how says which. */
static double copy_bandwidth(char *arena, size_t bytes, int threads, double *bw_memcpy, double *bw_stream) {
  size_t half = bytes / 2 / (1 << 20) * (1 << 20);
  sbn_kargs k;
  memset(&k, 0, sizeof k);
  k.x = arena, k.out = arena + half, k.chunk = 1 << 20;
  double t[9];
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
    for (int r = 0; r < 9; r++) {
      double t0 = now();
      sbn_cpu_parallel_for(threads, (int64_t)(half >> 20), 1, fn, &k, NULL, 0);
      t[r] = now() - t0;
    }
    (kind ? bw_stream : bw_memcpy)[0] = 2.0 * (double)half / median(t, 9) / 1e9;
  }
  return *bw_stream > *bw_memcpy ? *bw_stream : *bw_memcpy;
}

/* ---- shapes ---- */
typedef struct shape {
  int64_t n, c, hw; /* hw = H*W (1: 2-D input) */
  char label[32];
} shape;

static int make_shapes(shape *s) {
  static const int64_t resnet[][2] = {{64, 112 * 112}, {64, 56 * 56}, {256, 56 * 56},
                                      {128, 28 * 28}, {512, 28 * 28}, {256, 14 * 14},
                                      {1024, 14 * 14}, {512, 7 * 7}, {2048, 7 * 7}};
  int k = 0;
  for (int ni = 0; ni < 2; ni++) {
    int64_t n = ni ? 32 : 8;
    if (ni && opt.quick) break;
    for (int i = 0; i < 9; i++) {
      s[k] = (shape){n, resnet[i][0], resnet[i][1], ""};
      int side = (int)lround(sqrt((double)resnet[i][1]));
      snprintf(s[k].label, sizeof s[k].label, "%lldx%lldx%dx%d", (long long)n,
               (long long)resnet[i][0], side, side);
      k++;
    }
  }
  s[k] = (shape){256, 1024, 1, "256x1024"};
  return k + 1;
}

static sbn_tensor tensor_of(const shape *s, void *data, sbn_dtype dt, sbn_layout lay) {
  int64_t sh[4] = {s->n, s->c, 1, 1};
  if (s->hw == 1) return sbn_tensor_cpu(data, 2, sh, dt, lay);
  int64_t side = lround(sqrt((double)s->hw));
  sh[2] = side, sh[3] = s->hw / side;
  return sbn_tensor_cpu(data, 4, sh, dt, lay);
}

/* Fill the arena with values ~U(-2, 2) in storage dtype dt. */
static void fill(char *arena, size_t bytes, sbn_dtype dt) {
  uint64_t z = 0x9e3779b97f4a7c15ull;
  size_t n = bytes / (dt == SBN_DTYPE_FLOAT32 ? 4 : 2);
  for (size_t i = 0; i < n; i++) {
    z ^= z << 13, z ^= z >> 7, z ^= z << 17;
    float v = (float)((double)(z >> 11) * 0x1p-53 * 4.0 - 2.0);
    if (dt == SBN_DTYPE_FLOAT32) ((float *)arena)[i] = v;
    else ((uint16_t *)arena)[i] = sbn_f32_to_bf16(v);
  }
}

/* ---- one rank: forward and backward timing over rotated sets ---- */
typedef struct result {
  const shape *s;
  sbn_layout lay;
  sbn_dtype dt;
  double fwd_ms, bwd_ms, torch_fwd_ms, torch_bwd_ms;
} result;

static size_t align64(size_t b) { return (b + 63) & ~(size_t)63; }

static int time_layer(result *res, char *arena, size_t arena_bytes) {
  const shape *s = res->s;
  const size_t tb = align64((size_t)(s->n * s->c * s->hw) * (res->dt == SBN_DTYPE_FLOAT32 ? 4 : 2));
  const size_t set = 4 * tb; /* x, y, dy, dx */
  int K = (int)(arena_bytes / set);
  if (K < 2) return fprintf(stderr, "arena too small for %s\n", s->label), 1;
  sbn_bn_options o = sbn_bn_options_default(s->c);
  sbn_bn *bn;
  if (sbn_bn_create(&bn, &o, NULL) != SBN_STATUS_OK) return 1;
  double tf[MAX_REPS], tbw[MAX_REPS];
  for (int pass = 0; pass < 2; pass++) {
    double *t = pass ? tbw : tf, t_start = now();
    int r = 0, i = 0;
    for (; r < MAX_REPS && (r < MIN_REPS || now() - t_start < opt.time_s); i++) {
      char *base = arena + (size_t)(i % K) * set;
      sbn_tensor x = tensor_of(s, base, res->dt, res->lay), y = tensor_of(s, base + tb, res->dt, res->lay);
      sbn_tensor dy = tensor_of(s, base + 2 * tb, res->dt, res->lay),
                 dx = tensor_of(s, base + 3 * tb, res->dt, res->lay);
      double t0 = now();
      sbn_status st = pass ? sbn_bn_backward(bn, &dx, &dy, &x) : sbn_bn_forward(bn, &y, &x);
      double dt = now() - t0;
      if (st != SBN_STATUS_OK) {
        fprintf(stderr, "%s: %s\n", s->label, sbn_last_error());
        sbn_bn_destroy(bn);
        return 1;
      }
      if (i > 0) t[r++] = dt; /* the first call of a pass is a warm-up */
    }
    (pass ? &res->bwd_ms : &res->fwd_ms)[0] = 1e3 * median(t, r);
  }
  sbn_bn_destroy(bn);
  return 0;
}

/* ---- synchronization cost: 2 thread ranks ---- */
typedef struct sync_arg {
  const shape *s;
  int synced; /* 1: SyncBN over the team; 0: each rank plain BN */
  char *arena[2];
  size_t arena_bytes;
  double ms; /* rank 0's median forward+backward */
} sync_arg;

static int sync_rank(sbn_group *world, void *argp) {
  sync_arg *a = argp;
  int rank = sbn_group_rank(world);
  const shape *s = a->s;
  const size_t tb = align64((size_t)(s->n * s->c * s->hw) * 4), set = 4 * tb;
  int K = (int)(a->arena_bytes / set);
  sbn_bn_options o = sbn_bn_options_default(s->c);
  sbn_bn *bn;
  if (sbn_bn_create(&bn, &o, a->synced ? world : NULL) != SBN_STATUS_OK) return 1;
  double t[MAX_REPS];
  int r = 0;
  double t_start = now();
  for (int i = 0;; i++) {
    char *base = a->arena[rank] + (size_t)(i % K) * set;
    sbn_tensor x = tensor_of(s, base, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST),
               y = tensor_of(s, base + tb, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST),
               dy = tensor_of(s, base + 2 * tb, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST),
               dx = tensor_of(s, base + 3 * tb, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    sbn_group_barrier(world); /* both ranks start together, synced or not */
    double t0 = now();
    if (sbn_bn_forward(bn, &y, &x) != SBN_STATUS_OK || sbn_bn_backward(bn, &dx, &dy, &x) != SBN_STATUS_OK) {
      fprintf(stderr, "sync rank %d: %s\n", rank, sbn_last_error());
      sbn_bn_destroy(bn);
      return 1;
    }
    double dt = now() - t0;
    if (i > 0) t[r++] = dt; /* the first step is a warm-up */
    /* both ranks must agree on stopping: rank 0's clock decides */
    double go = r < MAX_REPS && (r < MIN_REPS || now() - t_start < opt.time_s);
    sbn_group_broadcast(world, &go, sizeof go, 0);
    if (!go) break;
  }
  if (rank == 0) a->ms = 1e3 * median(t, r);
  sbn_bn_destroy(bn);
  return 0;
}

/* ---- PyTorch peer ---- */
static const char *dtype_str(sbn_dtype d) { return d == SBN_DTYPE_FLOAT32 ? "float32" : "bfloat16"; }
static const char *layout_str(sbn_layout l) { return l == SBN_LAYOUT_CHANNELS_LAST ? "cl" : "cf"; }

static int run_torch(result *res, int nres, int threads) {
  char shapes_path[512], cmd[1024], line[512];
  snprintf(shapes_path, sizeof shapes_path, "%s/torch_shapes.csv", opt.out);
  FILE *f = fopen(shapes_path, "w");
  if (!f) return 1;
  for (int i = 0; i < nres; i++)
    fprintf(f, "%s,%lld,%lld,%lld,%s,%s\n", res[i].s->label, (long long)res[i].s->n,
            (long long)res[i].s->c, (long long)res[i].s->hw, layout_str(res[i].lay), dtype_str(res[i].dt));
  fclose(f);
  const char *dir = getenv("SYNCBN_BENCH_DIR") ? getenv("SYNCBN_BENCH_DIR") : "bench";
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/torch_bn.py %s %d %g %d %g", dir, shapes_path, threads,
           opt.rotate_mib, opt.quick ? 3 : MIN_REPS, opt.time_s);
  FILE *p = popen(cmd, "r");
  if (!p) return 1;
  int got = 0;
  while (fgets(line, sizeof line, p)) {
    if (line[0] == '#') {
      printf("  %s", line + 1);
      continue;
    }
    char label[64], lay[8], dt[16];
    double fw, bw;
    if (sscanf(line, "%63[^,],%7[^,],%15[^,],%lf,%lf", label, lay, dt, &fw, &bw) != 5) continue;
    for (int i = 0; i < nres; i++)
      if (!strcmp(res[i].s->label, label) && !strcmp(layout_str(res[i].lay), lay) &&
          !strcmp(dtype_str(res[i].dt), dt))
        res[i].torch_fwd_ms = fw, res[i].torch_bwd_ms = bw, got++;
  }
  int rc = pclose(p);
  return got == nres && rc == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* progress shows when piped to a log */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) opt.quick = 1;
    else if (!strcmp(argv[i], "--no-torch")) opt.torch = 0;
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) opt.threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--out") && i + 1 < argc) opt.out = argv[++i];
    else if (!strcmp(argv[i], "--rotate-mib") && i + 1 < argc) opt.rotate_mib = atof(argv[++i]);
    else if (!strcmp(argv[i], "--time") && i + 1 < argc) opt.time_s = atof(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--quick] [--threads T] [--out DIR] [--no-torch] [--rotate-mib M] [--time S]\n",
              argv[0]);
      return 2;
    }
  }
  if (opt.threads > 0) sbn_set_num_threads(opt.threads);
  const int T = sbn_num_threads(1);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", opt.out);
  if (system(cmd) != 0) return 1;
  double load[3] = {0};
  getloadavg(load, 3);
  long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  printf("syncbn-bench: %d thread(s) per rank, %s kernels, L3 %ld MiB, load average %.2f %.2f %.2f\n",
         T, sbn_cpu_get_isa() == SBN_CPU_ISA_AVX2 ? "AVX2" : "generic", l3 >> 20, load[0], load[1], load[2]);

  shape shapes[20];
  const int ns = make_shapes(shapes);
  size_t max_set = 0;
  for (int i = 0; i < ns; i++) {
    size_t set = 4 * align64((size_t)(shapes[i].n * shapes[i].c * shapes[i].hw) * 4);
    if (set > max_set) max_set = set;
  }
  size_t arena_bytes = (size_t)(opt.rotate_mib * (1 << 20));
  if (arena_bytes < 2 * max_set) arena_bytes = 2 * max_set;
  char *arena = aligned_alloc(64, arena_bytes);
  if (!arena) return fprintf(stderr, "out of memory (%zu MiB arena)\n", arena_bytes >> 20), 1;
  memset(arena, 0, arena_bytes);
  printf("inputs rotate through a %zu MiB arena (x, y, dy, dx per set; >= %.0f MiB and >= 2 sets)\n",
         arena_bytes >> 20, opt.rotate_mib);

  double bw_memcpy = 0, bw_stream = 0;
  const double bw = copy_bandwidth(arena, arena_bytes, T, &bw_memcpy, &bw_stream);
  printf("copy bandwidth: %.2f GB/s = best of memcpy %.2f and streaming-store copy %.2f GB/s\n"
         "  (%zu MiB on %d thread(s), bytes read + written, median of 9)\n\n",
         bw, bw_memcpy, bw_stream, arena_bytes / 2 >> 20, T);

  /* forward/backward over shapes x layouts x dtypes */
  static result res[20 * 4];
  int nres = 0;
  const sbn_dtype dts[2] = {SBN_DTYPE_FLOAT32, SBN_DTYPE_BFLOAT16};
  for (int d = 0; d < 2; d++) {
    fill(arena, arena_bytes, dts[d]);
    for (int i = 0; i < ns; i++)
      for (int l = 0; l < 2; l++) {
        result *r = &res[nres];
        memset(r, 0, sizeof *r);
        r->s = &shapes[i], r->dt = dts[d], r->lay = l ? SBN_LAYOUT_CHANNELS_LAST : SBN_LAYOUT_CHANNELS_FIRST;
        if (time_layer(r, arena, arena_bytes)) return 1;
        nres++;
      }
  }

  int have_torch = opt.torch && run_torch(res, nres, T) == 0;
  if (opt.torch && !have_torch) printf("PyTorch peer unavailable or incomplete: speedups not reported\n");

  char path[600];
  snprintf(path, sizeof path, "%s/bench_cpu.csv", opt.out);
  FILE *csv = fopen(path, "w");
  if (!csv) return 1;
  fprintf(csv, "shape,n,c,hw,layout,dtype,pass,passes,ms,gbps,efficiency,tensor_mib,torch_ms,speedup\n");
  printf("%-16s %-2s %-8s %9s %7s %5s | %9s %7s %5s | %8s %7s\n", "shape", "ly", "dtype", "fwd ms", "GB/s",
         "eff", "bwd ms", "GB/s", "eff", "torch ms", "speedup");
  double log_speed = 0, log_speed_dt[2] = {0};
  int n_speed = 0, n_speed_dt[2] = {0};
  for (int i = 0; i < nres; i++) {
    result *r = &res[i];
    const double mib = (double)(r->s->n * r->s->c * r->s->hw) * (r->dt == SBN_DTYPE_FLOAT32 ? 4 : 2);
    const double gf = 3 * mib / (r->fwd_ms * 1e-3) / 1e9, gb = 5 * mib / (r->bwd_ms * 1e-3) / 1e9;
    const double ours = r->fwd_ms + r->bwd_ms, theirs = r->torch_fwd_ms + r->torch_bwd_ms;
    const double sp = have_torch && theirs > 0 ? theirs / ours : 0;
    if (sp > 0) {
      log_speed += log(sp), n_speed++;
      log_speed_dt[r->dt != SBN_DTYPE_FLOAT32] += log(sp), n_speed_dt[r->dt != SBN_DTYPE_FLOAT32]++;
    }
    for (int p = 0; p < 2; p++)
      fprintf(csv, "%s,%lld,%lld,%lld,%s,%s,%s,%d,%.4f,%.3f,%.4f,%.3f,%.4f,%.3f\n", r->s->label,
              (long long)r->s->n, (long long)r->s->c, (long long)r->s->hw, layout_str(r->lay),
              dtype_str(r->dt), p ? "backward" : "forward", p ? 5 : 3, p ? r->bwd_ms : r->fwd_ms, p ? gb : gf,
              (p ? gb : gf) / bw, mib / (1 << 20), p ? r->torch_bwd_ms : r->torch_fwd_ms, sp);
    printf("%-16s %-2s %-8s %9.3f %7.2f %5.2f | %9.3f %7.2f %5.2f | %8.2f %7.2f\n", r->s->label,
           layout_str(r->lay), dtype_str(r->dt), r->fwd_ms, gf, gf / bw, r->bwd_ms, gb, gb / bw, theirs, sp);
  }
  fclose(csv);
  if (n_speed)
    printf("\nspeedup vs PyTorch %s (forward+backward, geometric mean over %d configurations): %.2fx "
           "(float32 %.2fx, bfloat16 %.2fx)\n",
           "F.batch_norm", n_speed, exp(log_speed / n_speed),
           n_speed_dt[0] ? exp(log_speed_dt[0] / n_speed_dt[0]) : 0,
           n_speed_dt[1] ? exp(log_speed_dt[1] / n_speed_dt[1]) : 0);

  /* synchronization cost, float32 channels-first, N = 8 shapes per rank */
  printf("\nsynchronization: 2 thread ranks (1 thread each), forward+backward per step, float32 CF\n");
  printf("%-16s %9s %11s %11s %9s %9s\n", "per-rank shape", "MiB/rank", "1 rank ms", "2 plain ms",
         "2 sync ms", "overhead");
  snprintf(path, sizeof path, "%s/bench_sync.csv", opt.out);
  FILE *scsv = fopen(path, "w");
  if (!scsv) return 1;
  fprintf(scsv, "shape,mib_per_rank,one_rank_ms,two_plain_ms,two_sync_ms,overhead_vs_plain,overhead_vs_one\n");
  fill(arena, arena_bytes, SBN_DTYPE_FLOAT32);
  sbn_set_num_threads(1);
  for (int i = 0; i < ns; i++) {
    const shape *s = &shapes[i];
    if (s->n != 8 && s->hw != 1) continue;
    sync_arg a = {s, 0, {arena, arena + arena_bytes / 2}, arena_bytes / 2, 0};
    if (a.arena_bytes < 2 * 4 * align64((size_t)(s->n * s->c * s->hw) * 4)) continue;
    double ms[3];
    for (int mode = 0; mode < 3; mode++) { /* 1 rank alone, 2 plain, 2 synced */
      a.synced = mode == 2;
      if (sbn_team_run(mode == 0 ? 1 : 2, sync_rank, &a) != SBN_STATUS_OK) return 1;
      ms[mode] = a.ms;
    }
    const double mib = (double)(s->n * s->c * s->hw) * 4 / (1 << 20);
    printf("%-16s %9.2f %11.3f %11.3f %9.3f %8.1f%%\n", s->label, mib, ms[0], ms[1], ms[2],
           100 * (ms[2] / ms[1] - 1));
    fprintf(scsv, "%s,%.3f,%.4f,%.4f,%.4f,%.4f,%.4f\n", s->label, mib, ms[0], ms[1], ms[2], ms[2] / ms[1] - 1,
            ms[2] / ms[0] - 1);
  }
  fclose(scsv);
  sbn_set_num_threads(opt.threads);

  /* plot data: one row per shape, efficiency of f32/bf16 x CF/CL x fwd/bwd */
  snprintf(path, sizeof path, "%s/bench_eff.dat", opt.out);
  FILE *dat = fopen(path, "w");
  if (!dat) return 1;
  for (int i = 0; i < ns; i++) {
    fprintf(dat, "%d %s", i, shapes[i].label);
    for (int d = 0; d < 2; d++)
      for (int l = 0; l < 2; l++)
        for (int k = 0; k < nres; k++)
          if (res[k].s == &shapes[i] && res[k].dt == dts[d] && (int)res[k].lay == l) {
            double mib = (double)(shapes[i].n * shapes[i].c * shapes[i].hw) * (d ? 2 : 4);
            fprintf(dat, " %.4f %.4f", 3 * mib / (res[k].fwd_ms * 1e-3) / 1e9 / bw,
                    5 * mib / (res[k].bwd_ms * 1e-3) / 1e9 / bw);
          }
    fprintf(dat, "\n");
  }
  fclose(dat);
  const char *dir = getenv("SYNCBN_BENCH_DIR") ? getenv("SYNCBN_BENCH_DIR") : "bench";
  snprintf(cmd, sizeof cmd, "gnuplot -e \"dat='%s/bench_eff.dat'; out='%s/bench_cpu.png'\" %s/plot_cpu.gp",
           opt.out, opt.out, dir);
  int plotted = system(cmd) == 0;
  getloadavg(load, 3);
  printf("\nwrote %s/bench_cpu.csv, %s/bench_sync.csv%s; load average at the end %.2f %.2f %.2f\n", opt.out,
         opt.out, plotted ? ", bench_cpu.png" : " (no plot: gnuplot missing)", load[0], load[1], load[2]);
  free(arena);
  return 0;
}
