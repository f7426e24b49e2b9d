/* syncbn-bench: the CPU kernels against the machine's memory bandwidth and
 * against PyTorch, in one run (method and results: BENCHMARKS.md).
 *
 *  1. copy bandwidth: a large parallel copy, bytes read + written (best of
 *     memcpy and a streaming-store copy), at the start and at the end;
 *  2. forward and backward of one rank (group NULL) over the ResNet-50
 *     batch-norm shapes at N = 8 and 32 plus 2-D (256, 1024), both layouts,
 *     float32 and bfloat16: median time, GB/s at 3 (forward) and 5
 *     (backward) tensor passes, efficiency = that / copy bandwidth;
 *  3. PyTorch's CPU F.batch_norm training forward + autograd backward on
 *     the same shapes, threads and rotation, as a coprocess whose calls
 *     interleave with ours round by round (bench/torch_bn.py);
 *  4. per dtype and layout: geometric-mean speedup, the slowest shape, the
 *     lowest efficiency (all shapes, and shapes above 8 MiB), and the
 *     ceiling: the speedup that efficiency 1.0 would give against the same
 *     PyTorch times (where PyTorch runs near the bandwidth, no kernel of
 *     ours can reach a speedup goal above it), and the floor: the time the
 *     3 + 5 passes take at what this machine gives, the reductions at the
 *     read bandwidth or the float64 arithmetic's rate (bench_arith.h),
 *     whichever is slower, the elementwise passes at the copy bandwidth;
 *     "attain" is PyTorch's time over the floor, about the most any
 *     implementation of these passes could reach here (a small tensor
 *     that stays in the L3 between passes can beat its floor a little);
 *  5. the fixed cost of a call on a tiny tensor, ours and PyTorch's;
 *  6. synchronization: 2 thread ranks with SyncBN against the same 2 ranks
 *     running plain BatchNorm, rounds of each interleaved;
 *  7. CSV files, the table on stdout, a PNG plot (gnuplot).
 *
 * Rotation: every call reads inputs last touched a whole arena earlier. The
 * arena is 8x the last-level cache read from the machine (sysfs) and at
 * least 4 sets of the largest shape, so both sides read from memory;
 * forward runs on set i and backward on set i - D (D = half the sets, at
 * least 2 steps back), as the peer does with its autograd graphs. (With 4x
 * the LLC and 2 sets of the largest shapes, a backward read the tensors its
 * forward had touched one step earlier, partly still in the L3.)
 *
 * Usage: syncbn-bench [--quick] [--threads T] [--out DIR] [--no-torch]
 *                     [--arena-mib M] [--time S] [--rounds R] [--only SHAPE] */
#define _GNU_SOURCE
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../src/cpu/bn_kernels.h"
#include "../src/cpu/cpu_kern.h"
#include "../src/cpu/half.h"
#include "bench_arith.h"
#include "bench_machine.h"
#include "syncbn.h"

static struct {
  int quick, threads, torch, rounds;
  double arena_mib, time_s;
  const char *out, *only; /* only: run the shapes whose label starts with this */
} opt = {0, 0, 1, 5, 0, 0.08, "build/bench", NULL};

enum { MAX_SAMPLES = 2048 };

/* ---- the machine ---- */

static void cpu_model(char *out, size_t n) {
  snprintf(out, n, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[256];
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "model name", 10)) {
      char *p = strchr(line, ':');
      if (p) {
        p += 2;
        p[strcspn(p, "\n")] = 0;
        snprintf(out, n, "%s", p);
      }
      break;
    }
  fclose(f);
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
  s[k++] = (shape){256, 1024, 1, "256x1024"};
  int kept = 0;
  for (int i = 0; i < k; i++)
    if (!opt.only || !strncmp(s[i].label, opt.only, strlen(opt.only))) s[kept++] = s[i];
  return kept;
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

static size_t align64(size_t b) { return (b + 63) & ~(size_t)63; }
static size_t dt_bytes(sbn_dtype d) { return d == SBN_DTYPE_FLOAT32 ? 4 : 2; }
static const char *dtype_str(sbn_dtype d) { return d == SBN_DTYPE_FLOAT32 ? "float32" : "bfloat16"; }
static const char *layout_str(sbn_layout l) { return l == SBN_LAYOUT_CHANNELS_LAST ? "cl" : "cf"; }

/* ---- the PyTorch coprocess ---- */
static struct {
  FILE *to, *from;
  pid_t pid;
  char banner[160];
} peer;

static int peer_start(int threads) {
  int in[2], out[2];
  if (pipe(in) || pipe(out)) return -1;
  peer.pid = fork();
  if (peer.pid < 0) return -1;
  if (peer.pid == 0) {
    dup2(in[0], 0), dup2(out[1], 1);
    close(in[0]), close(in[1]), close(out[0]), close(out[1]);
    const char *dir = getenv("SYNCBN_BENCH_DIR") ? getenv("SYNCBN_BENCH_DIR") : "bench";
    char script[512], t[16];
    snprintf(script, sizeof script, "%s/torch_bn.py", dir);
    snprintf(t, sizeof t, "%d", threads);
    execl("/usr/bin/python3", "python3", script, t, (char *)NULL);
    _exit(127);
  }
  close(in[0]), close(out[1]);
  peer.to = fdopen(in[1], "w"), peer.from = fdopen(out[0], "r");
  if (!peer.to || !peer.from) return -1;
  setvbuf(peer.to, NULL, _IOLBF, 0);
  if (!fgets(peer.banner, sizeof peer.banner, peer.from) || strncmp(peer.banner, "#torch ", 7)) return -1;
  peer.banner[strcspn(peer.banner, "\n")] = 0;
  return 0;
}

static int peer_cmd(const char *cmd, char *reply, size_t n) {
  if (!peer.to) return -1;
  fprintf(peer.to, "%s\n", cmd);
  fflush(peer.to);
  return fgets(reply, (int)n, peer.from) ? 0 : -1;
}

static void peer_stop(void) {
  if (!peer.to) return;
  fprintf(peer.to, "quit\n");
  fclose(peer.to), fclose(peer.from);
  waitpid(peer.pid, NULL, 0);
  peer.to = peer.from = NULL;
}

/* After a round of PyTorch calls its OpenMP workers spin for a while before
 * they sleep (libgomp's active wait); on a machine with as many cores as
 * threads a spinning worker would take a core from our next calls. Wait
 * until the peer's CPU time stops growing (under 0.1 ms per 1 ms), at most
 * 100 ms. (Usually it is idle within the first millisecond.) */
static void peer_wait_idle(void) {
  clockid_t cid;
  if (!peer.to || clock_getcpuclockid(peer.pid, &cid) != 0) return;
  struct timespec a, b, ms = {0, 1000000};
  if (clock_gettime(cid, &a) != 0) return;
  for (int i = 0; i < 100; i++) {
    nanosleep(&ms, NULL);
    if (clock_gettime(cid, &b) != 0) return;
    const double used = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    if (used < 1e-4) return;
    a = b;
  }
}

/* "r F,F,...;B,B,..." -> appended samples */
static void parse_times(const char *r, double *fw, int *nf, double *bw, int *nb) {
  const char *p = r + 2;
  double *dst = fw;
  int *cnt = nf;
  while (*p && *p != '\n') {
    char *end;
    double v = strtod(p, &end);
    if (end == p) {
      if (*p == ';') dst = bw, cnt = nb;
      p++;
      continue;
    }
    if (*cnt < MAX_SAMPLES) dst[(*cnt)++] = v;
    p = end;
  }
}

/* ---- one configuration: ours and PyTorch, interleaved rounds ---- */
typedef struct result {
  const shape *s;
  sbn_layout lay;
  sbn_dtype dt;
  double fwd_ms, bwd_ms, torch_fwd_ms, torch_bwd_ms;
  int have_torch;
} result;

static double of[MAX_SAMPLES], ob[MAX_SAMPLES], tf[MAX_SAMPLES], tbk[MAX_SAMPLES];

/* The speedup over PyTorch that efficiency 1.0 would give: its fwd+bwd
 * time over 8 tensor passes at the copy bandwidth. Where PyTorch itself runs
 * near the bandwidth, this is below the speedup goal: no kernel of ours can
 * reach it on this machine. */
static double ceiling(const result *r, double bw) {
  const double bytes = (double)(r->s->n * r->s->c * r->s->hw) * (r->dt == SBN_DTYPE_FLOAT32 ? 4 : 2);
  return (r->torch_fwd_ms + r->torch_bwd_ms) * 1e-3 / (8 * bytes / (bw * 1e9));
}

/* The float64 arithmetic's rate, values/s, per dtype (float32, bfloat16)
 * and reduction (statistics, backward reduce); 0: not measured. */
static double ar_rate[2][2];

/* Seconds of the forward + backward floor: each reduction at the read
 * bandwidth or the arithmetic's rate, whichever is slower; the elementwise
 * passes (2 tensors forward, 3 backward) at the copy bandwidth. */
static double floor_s(const result *r, double bw, double rbw) {
  const double vals = (double)(r->s->n * r->s->c * r->s->hw);
  const int d = r->dt == SBN_DTYPE_FLOAT32 ? 0 : 1;
  const double bytes = vals * (d ? 2 : 4), gb = 1e9;
  const double st = fmax(bytes / (rbw * gb), ar_rate[d][0] > 0 ? vals / ar_rate[d][0] : 0);
  const double br = fmax(2 * bytes / (rbw * gb), ar_rate[d][1] > 0 ? vals / ar_rate[d][1] : 0);
  return st + br + 5 * bytes / (bw * gb);
}
static double attain(const result *r, double bw, double rbw) {
  return (r->torch_fwd_ms + r->torch_bwd_ms) * 1e-3 / floor_s(r, bw, rbw);
}

static int time_config(result *res, char *arena, size_t arena_bytes, int use_torch) {
  const shape *s = res->s;
  const size_t tb = align64((size_t)(s->n * s->c * s->hw) * dt_bytes(res->dt)), set = 4 * tb;
  int K = (int)(arena_bytes / set);
  if (K < 2) return fprintf(stderr, "arena too small for %s\n", s->label), 1;
  if (K > 256) K = 256;
  const int D = K / 2;
  sbn_bn_options o = sbn_bn_options_default(s->c);
  sbn_bn *bn;
  if (sbn_bn_create(&bn, &o, NULL) != SBN_STATUS_OK) return 1;
  char cmd[256], reply[1 << 16];
  res->have_torch = 0;
  if (use_torch) {
    snprintf(cmd, sizeof cmd, "setup %lld %lld %lld %s %s %d %d", (long long)s->n, (long long)s->c,
             (long long)s->hw, layout_str(res->lay), dtype_str(res->dt), K, D);
    res->have_torch = peer_cmd(cmd, reply, sizeof reply) == 0 && !strncmp(reply, "ok", 2);
    peer_wait_idle();
  }
  int nof = 0, nob = 0, ntf = 0, ntb = 0;
  long step = 0;
  int m_ours = 2, m_torch = 2;
  for (int round = -1; round < opt.rounds; round++) { /* round -1: warm-up, untimed */
    const int m = round < 0 ? D + 2 : m_ours;
    double spent = now();
    for (int j = 0; j < m; j++, step++) {
      char *fs = arena + (size_t)(step % K) * set, *bs = arena + (size_t)((step + K - D) % K) * set;
      sbn_tensor x = tensor_of(s, fs, res->dt, res->lay), y = tensor_of(s, fs + tb, res->dt, res->lay);
      sbn_tensor bx = tensor_of(s, bs, res->dt, res->lay), dy = tensor_of(s, bs + 2 * tb, res->dt, res->lay),
                 dx = tensor_of(s, bs + 3 * tb, res->dt, res->lay);
      double t0 = now();
      sbn_status st = sbn_bn_forward(bn, &y, &x);
      double t1 = now();
      if (st == SBN_STATUS_OK) st = sbn_bn_backward(bn, &dx, &dy, &bx);
      double t2 = now();
      if (st != SBN_STATUS_OK) {
        fprintf(stderr, "%s: %s\n", s->label, sbn_last_error());
        sbn_bn_destroy(bn);
        return 1;
      }
      if (round >= 0 && nof < MAX_SAMPLES) of[nof++] = 1e3 * (t1 - t0), ob[nob++] = 1e3 * (t2 - t1);
    }
    spent = now() - spent;
    if (round >= 0) { /* size the next rounds to about opt.time_s each */
      int want = (int)(opt.time_s / (spent / m));
      m_ours = want < 2 ? 2 : want > 200 ? 200 : want;
    }
    if (res->have_torch && round >= 0) {
      snprintf(cmd, sizeof cmd, "run %d", m_torch);
      double t0 = now();
      if (peer_cmd(cmd, reply, sizeof reply) != 0 || reply[0] != 'r') {
        res->have_torch = 0;
        continue;
      }
      const double per = (now() - t0) / m_torch;
      parse_times(reply, tf, &ntf, tbk, &ntb);
      peer_wait_idle();
      int want = (int)(opt.time_s / per);
      m_torch = want < 1 ? 1 : want > 200 ? 200 : want;
    }
  }
  res->fwd_ms = median(of, nof), res->bwd_ms = median(ob, nob);
  if (res->have_torch) {
    res->torch_fwd_ms = median(tf, ntf), res->torch_bwd_ms = median(tbk, ntb);
    res->have_torch = ntf > 0 && ntb > 0;
    peer_cmd("free", reply, sizeof reply);
  }
  sbn_bn_destroy(bn);
  return 0;
}

/* ---- fixed cost of a call: tiny tensor, per-call microseconds ----
 * Two tensors: 2x16x4x4 (what a call costs at all) and 2x2048 (the
 * per-channel math between the passes, O(C), at the widest ResNet-50
 * layer: 4096 values, so the passes themselves are a few microseconds). */
static void fixed_cost_of(const shape *s, sbn_layout lay) {
  const int64_t nv = s->n * s->c * s->hw;
  float *buf = calloc(4 * (size_t)nv, sizeof(float));
  if (!buf) return;
  for (int64_t i = 0; i < 4 * nv; i++) buf[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
  sbn_bn_options o = sbn_bn_options_default(s->c);
  sbn_bn *bn;
  if (sbn_bn_create(&bn, &o, NULL) != SBN_STATUS_OK) {
    free(buf);
    return;
  }
  sbn_tensor x = tensor_of(s, buf, SBN_DTYPE_FLOAT32, lay), y = tensor_of(s, buf + nv, SBN_DTYPE_FLOAT32, lay),
             dy = tensor_of(s, buf + 2 * nv, SBN_DTYPE_FLOAT32, lay),
             dx = tensor_of(s, buf + 3 * nv, SBN_DTYPE_FLOAT32, lay);
  enum { CALLS = 20000 };
  static double f[CALLS], b[CALLS];
  for (int r = 0; r < CALLS; r++) { /* each call timed on its own: preemption shows only in the tail */
    const double t0 = now();
    sbn_bn_forward(bn, &y, &x);
    const double t1 = now();
    sbn_bn_backward(bn, &dx, &dy, &x);
    const double t2 = now();
    f[r] = 1e6 * (t1 - t0), b[r] = 1e6 * (t2 - t1);
  }
  sbn_bn_destroy(bn);
  free(buf);
  printf("  ours %-9s %s forward %6.2f us   backward %6.2f us\n", s->label, layout_str(lay), median(f, CALLS),
         median(b, CALLS));
}

static void fixed_cost_torch(const shape *s) {
  char cmd[128], reply[1 << 16];
  snprintf(cmd, sizeof cmd, "setup %lld %lld %lld cf float32 1 0", (long long)s->n, (long long)s->c,
           (long long)s->hw);
  if (peer_cmd(cmd, reply, sizeof reply) != 0) return;
  int nf = 0, nb = 0;
  for (int r = 0; r < 5; r++)
    if (peer_cmd("run 200", reply, sizeof reply) == 0 && reply[0] == 'r') parse_times(reply, tf, &nf, tbk, &nb);
  printf("  PyTorch %-6s cf forward %6.2f us   backward %6.2f us   (F.batch_norm + autograd, median of %d calls)\n",
         s->label, 1e3 * median(tf, nf), 1e3 * median(tbk, nb), nf);
  peer_cmd("free", reply, sizeof reply);
  peer_wait_idle();
}

static void fixed_cost(int use_torch) {
  static const shape tiny = {2, 16, 16, "2x16x4x4"}, wide = {2, 2048, 1, "2x2048"};
  printf("\nfixed cost of a call, float32, median of 20000 calls each timed: 2x16x4x4 (512 values) and\n"
         "2x2048 (4096 values: the per-channel math between the passes at C = 2048):\n");
  fixed_cost_of(&tiny, SBN_LAYOUT_CHANNELS_FIRST);
  fixed_cost_of(&tiny, SBN_LAYOUT_CHANNELS_LAST);
  fixed_cost_of(&wide, SBN_LAYOUT_CHANNELS_FIRST);
  if (use_torch) fixed_cost_torch(&tiny), fixed_cost_torch(&wide);
}

/* ---- synchronization cost: 2 thread ranks, plain and synced interleaved ---- */
typedef struct sync_arg {
  const shape *s;
  char *arena[2];
  size_t arena_bytes;
  double ms[2];  /* median step, both ranks done (barrier after): plain, synced */
  double own[2]; /* rank 0's median forward+backward alone, without that barrier */
  double paired; /* median over rounds of (synced block's median / the plain block's before it) */
} sync_arg;

static int sync_rank(sbn_group *world, void *argp) {
  sync_arg *a = argp;
  int rank = sbn_group_rank(world);
  const shape *s = a->s;
  const size_t tb = align64((size_t)(s->n * s->c * s->hw) * 4), set = 4 * tb;
  int K = (int)(a->arena_bytes / set);
  if (K > 256) K = 256;
  sbn_bn_options o = sbn_bn_options_default(s->c);
  sbn_bn *bn[2];
  if (sbn_bn_create(&bn[0], &o, NULL) != SBN_STATUS_OK) return 1;
  if (sbn_bn_create(&bn[1], &o, world) != SBN_STATUS_OK) return 1;
  /* this rank's samples: [mode] step, [2 + mode] its own forward+backward */
  double(*t)[MAX_SAMPLES] = malloc(sizeof(double[4][MAX_SAMPLES]));
  if (!t) return 1;
  int nt[2] = {0, 0}, start[2] = {0, 0}, nr = 0;
  double ratio[64];
  double m = 2; /* steps per block, rank 0 decides */
  long step = 0;
  for (int round = -1; round < 2 * opt.rounds; round++)
    for (int mode = 0; mode < 2; mode++) {
      double spent = 0;
      start[mode] = nt[mode];
      for (int j = 0; j < (int)m; j++, step++) {
        char *base = a->arena[rank] + (size_t)(step % K) * set;
        sbn_tensor x = tensor_of(s, base, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST),
                   y = tensor_of(s, base + tb, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST),
                   dy = tensor_of(s, base + 2 * tb, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST),
                   dx = tensor_of(s, base + 3 * tb, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
        sbn_group_barrier(world); /* both ranks start together, synced or not */
        double t0 = now();
        if (sbn_bn_forward(bn[mode], &y, &x) != SBN_STATUS_OK ||
            sbn_bn_backward(bn[mode], &dx, &dy, &x) != SBN_STATUS_OK) {
          fprintf(stderr, "sync rank %d: %s\n", rank, sbn_last_error());
          return 1;
        }
        const double own = now() - t0;
        /* A data-parallel step ends when its slowest rank does (the
         * gradients' all-reduce waits for it), with plain BatchNorm too. */
        sbn_group_barrier(world);
        double dt = now() - t0;
        spent += dt;
        if (round >= 0 && nt[mode] < MAX_SAMPLES) t[2 + mode][nt[mode]] = own, t[mode][nt[mode]++] = dt;
      }
      /* Each synced block against the plain block just before it: the
       * host's memory speed moves from minute to minute, so neighbours
       * compare better than the medians of all samples. */
      if (round >= 0 && mode == 1 && nt[0] > start[0] && nt[1] > start[1] && nr < (int)(sizeof ratio / sizeof *ratio))
        ratio[nr++] = median(t[1] + start[1], nt[1] - start[1]) / median(t[0] + start[0], nt[0] - start[0]);
      if (round < 0 && mode == 1) { /* after the warm-up: blocks of about opt.time_s / 4 */
        m = 0.25 * opt.time_s / (spent / m);
        m = m < 3 ? 3 : m > 100 ? 100 : m;
        sbn_group_broadcast(world, &m, sizeof m, 0);
      }
    }
  if (rank == 0) {
    for (int mode = 0; mode < 2; mode++)
      a->ms[mode] = 1e3 * median(t[mode], nt[mode]), a->own[mode] = 1e3 * median(t[2 + mode], nt[mode]);
    a->paired = nr ? median(ratio, nr) : 0;
  }
  free(t);
  sbn_bn_destroy(bn[0]), sbn_bn_destroy(bn[1]);
  return 0;
}

/* ---- main ---- */
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* progress shows when piped to a log */
  signal(SIGPIPE, SIG_IGN);          /* a dead peer is reported, not fatal */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) opt.quick = 1, opt.rounds = 3;
    else if (!strcmp(argv[i], "--no-torch")) opt.torch = 0;
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) opt.threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--out") && i + 1 < argc) opt.out = argv[++i];
    else if (!strcmp(argv[i], "--arena-mib") && i + 1 < argc) opt.arena_mib = atof(argv[++i]);
    else if (!strcmp(argv[i], "--time") && i + 1 < argc) opt.time_s = atof(argv[++i]);
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) opt.rounds = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) opt.only = argv[++i];
    else {
      fprintf(stderr,
              "usage: %s [--quick] [--threads T] [--out DIR] [--no-torch] [--arena-mib M] [--time S] [--rounds R] [--only SHAPE]\n",
              argv[0]);
      return 2;
    }
  }
  if (opt.rounds < 1) opt.rounds = 1;
  if (opt.threads > 0) sbn_set_num_threads(opt.threads);
  const int T = sbn_num_threads(1);
  char cmd[600], model[128];
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", opt.out);
  if (system(cmd) != 0) return 1;
  double load[3] = {0};
  getloadavg(load, 3);
  const size_t llc = llc_bytes();
  cpu_model(model, sizeof model);
  printf("syncbn-bench: %s, %ld online CPU(s), last-level cache %zu MiB; %d thread(s) per rank, %s kernels\n",
         model, sysconf(_SC_NPROCESSORS_ONLN), llc >> 20, T, sbn_cpu_isa_name(sbn_cpu_get_isa()));
  printf("load average at the start %.2f %.2f %.2f\n", load[0], load[1], load[2]);

  shape shapes[20];
  const int ns = make_shapes(shapes);
  size_t max_set = 0;
  for (int i = 0; i < ns; i++) {
    size_t set = 4 * align64((size_t)(shapes[i].n * shapes[i].c * shapes[i].hw) * 4);
    if (set > max_set) max_set = set;
  }
  size_t arena_bytes = opt.arena_mib > 0 ? (size_t)(opt.arena_mib * (1 << 20)) : 8 * llc;
  if (opt.arena_mib <= 0 && arena_bytes < 4 * max_set) arena_bytes = 4 * max_set;
  const size_t rotate = arena_bytes; /* what every input is guaranteed to be behind */
  if (arena_bytes < 2 * max_set) arena_bytes = 2 * max_set;
  char *arena = aligned_alloc(64, arena_bytes);
  if (!arena) return fprintf(stderr, "out of memory (%zu MiB arena)\n", arena_bytes >> 20), 1;
  memset(arena, 0, arena_bytes);
  printf("inputs rotate through >= %zu MiB (8 x LLC and 4 sets unless --arena-mib; buffer %zu MiB, at least 2 sets of\n"
         "x, y, dy, dx); forward on set i, backward on set i - D, the same for PyTorch\n",
         rotate >> 20, arena_bytes >> 20);

  /* Twice, the better one: the first measurement after the arena is
   * touched has read as low as 0.9 of the second, which would inflate every
   * efficiency (they use this value). */
  double bw_memcpy = 0, bw_stream = 0, bw_memcpy2 = 0, bw_stream2 = 0;
  double bw0 = copy_bandwidth(arena, arena_bytes, T, &bw_memcpy, &bw_stream);
  const double bw0b = copy_bandwidth(arena, arena_bytes, T, &bw_memcpy2, &bw_stream2);
  if (bw0b > bw0) bw0 = bw0b, bw_memcpy = bw_memcpy2, bw_stream = bw_stream2;
  printf("copy bandwidth: %.2f GB/s = best of memcpy %.2f and streaming-store copy %.2f GB/s\n"
         "  (%zu MiB in 4 MiB pieces on %d thread(s), bytes read + written, median piece of 3 sweeps)\n",
         bw0, bw_memcpy, bw_stream, arena_bytes / 2 >> 20, T);
  const double rbw = fmax(read_bandwidth(arena, arena_bytes, T), read_bandwidth(arena, arena_bytes, T));
  const double rr = rbw / bw0;
  printf("read bandwidth: %.2f GB/s = %.2f of the copy bandwidth (a read-only sweep, same pieces): the\n"
         "  statistics and backward-reduce passes only read, so efficiency is bounded by %.2f forward\n"
         "  and %.2f backward (the 'bound' column)\n",
         rbw, rr, bound_fwd(rr), bound_bwd(rr));

  for (int d = 0; d < 2; d++)
    for (int b = 0; b < 2; b++) ar_rate[d][b] = arith_rate(T, d, b);
  if (ar_rate[0][0] > 0)
    printf("float64 arithmetic of the reductions (widen, subtract, add, multiply, add; a plain loop on\n"
           "  L1-resident values, %d thread(s), best of 10): statistics float32 %.2f, bfloat16 %.2f;\n"
           "  backward reduce %.2f, %.2f G values/s; the read bandwidth delivers %.2f (float32) and %.2f\n"
           "  (bfloat16) G values/s to the statistics, half that to the backward reduce\n",
           T, ar_rate[0][0] / 1e9, ar_rate[1][0] / 1e9, ar_rate[0][1] / 1e9, ar_rate[1][1] / 1e9, rbw / 4, rbw / 2);
  else
    printf("float64 arithmetic of the reductions: not measured at this instruction-set level (the floor\n"
           "  column counts the bandwidths only)\n");

  const int use_torch = opt.torch && peer_start(T) == 0;
  if (opt.torch && !use_torch) printf("PyTorch peer unavailable: speedups not reported\n");
  if (use_torch) printf("peer: %s, calls interleaved with ours in rounds\n", peer.banner + 1);
  printf("\n");

  /* forward/backward over shapes x layouts x dtypes */
  static result res[20 * 4];
  int nres = 0;
  const sbn_dtype dts[2] = {SBN_DTYPE_FLOAT32, SBN_DTYPE_BFLOAT16};
  printf("%-16s %-2s %-8s %8s %6s %5s | %8s %6s %5s | %8s %8s %5s %5s | %7s %7s %6s\n", "shape", "ly", "dtype",
         "fwd ms", "GB/s", "eff", "bwd ms", "GB/s", "eff", "torch fw", "torch bw", "t.eff", "t.eff", "speedup", "ceiling",
         "attain");
  for (int d = 0; d < 2; d++) {
    fill(arena, arena_bytes, dts[d]);
    for (int i = 0; i < ns; i++)
      for (int l = 0; l < 2; l++) {
        result *r = &res[nres];
        memset(r, 0, sizeof *r);
        r->s = &shapes[i], r->dt = dts[d], r->lay = l ? SBN_LAYOUT_CHANNELS_LAST : SBN_LAYOUT_CHANNELS_FIRST;
        if (time_config(r, arena, arena_bytes, use_torch)) return 1;
        const double bytes = (double)(r->s->n * r->s->c * r->s->hw) * dt_bytes(r->dt);
        const double gf = 3 * bytes / (r->fwd_ms * 1e-3) / 1e9, gb = 5 * bytes / (r->bwd_ms * 1e-3) / 1e9;
        printf("%-16s %-2s %-8s %8.3f %6.2f %5.2f | %8.3f %6.2f %5.2f", r->s->label, layout_str(r->lay),
               dtype_str(r->dt), r->fwd_ms, gf, gf / bw0, r->bwd_ms, gb, gb / bw0);
        if (r->have_torch)
          printf(" | %8.3f %8.3f %5.2f %5.2f | %7.2f %7.2f %6.2f\n", r->torch_fwd_ms, r->torch_bwd_ms,
                 3 * bytes / (r->torch_fwd_ms * 1e-3) / 1e9 / bw0, 5 * bytes / (r->torch_bwd_ms * 1e-3) / 1e9 / bw0,
                 (r->torch_fwd_ms + r->torch_bwd_ms) / (r->fwd_ms + r->bwd_ms), ceiling(r, bw0), attain(r, bw0, rbw));
        else
          printf("\n");
        nres++;
      }
  }
  const double bw1 = copy_bandwidth(arena, arena_bytes, T, &bw_memcpy, &bw_stream);
  printf("\ncopy bandwidth at the end: %.2f GB/s (start %.2f); efficiencies use the start value\n", bw1, bw0);
  const double bw = bw0;

  /* summaries per dtype and layout */
  char path[600];
  snprintf(path, sizeof path, "%s/bench_cpu.csv", opt.out);
  FILE *csv = fopen(path, "w");
  if (!csv) return 1;
  fprintf(csv, "shape,n,c,hw,layout,dtype,pass,passes,ms,gbps,efficiency,tensor_mib,torch_ms,torch_efficiency,speedup,ceiling,attain\n");
  printf("\nsummary (speedup = PyTorch fwd+bwd time / ours; efficiency = GB/s at 3 or 5 passes / copy bandwidth;\n"
         "ceiling = the speedup efficiency 1.0 would give, PyTorch's time / 8 passes at the copy bandwidth;\n"
         "attain = PyTorch's time / the floor (reductions at the read bandwidth or the float64 arithmetic's\n"
         "rate, elementwise passes at the copy bandwidth); of floor = the floor / our time)\n");
  printf("%-8s %-2s %8s %18s %18s %18s %14s %12s %14s %14s\n", "dtype", "ly", "geomean", "slowest speedup",
         "min eff fwd/bwd", "  >8 MiB fwd/bwd", "ceiling gm/min", "bound f/b", "attain gm/min", "of floor gm/min");
  for (int d = 0; d < 2; d++)
    for (int l = 0; l < 2; l++) {
      double lsum = 0, smin = INFINITY, ef = INFINITY, eb = INFINITY, ef8 = INFINITY, eb8 = INFINITY;
      double csum = 0, cmin = INFINITY; /* ceiling: geometric mean, lowest */
      double asum = 0, amin = INFINITY, fsum = 0, fmn = INFINITY; /* attain; of floor */
      int nsp = 0;
      const char *slow = "";
      for (int i = 0; i < nres; i++) {
        result *r = &res[i];
        if (r->dt != dts[d] || (int)r->lay != l) continue;
        const double bytes = (double)(r->s->n * r->s->c * r->s->hw) * dt_bytes(r->dt);
        const double gf = 3 * bytes / (r->fwd_ms * 1e-3) / 1e9, gb = 5 * bytes / (r->bwd_ms * 1e-3) / 1e9;
        const double sp = r->have_torch ? (r->torch_fwd_ms + r->torch_bwd_ms) / (r->fwd_ms + r->bwd_ms) : 0;
        if (sp > 0) {
          const double ce = ceiling(r, bw);
          const double at = attain(r, bw, rbw);
          csum += log(ce), cmin = fmin(cmin, ce);
          asum += log(at), amin = fmin(amin, at), fsum += log(sp / at), fmn = fmin(fmn, sp / at);
          lsum += log(sp), nsp++;
          if (sp < smin) smin = sp, slow = r->s->label;
        }
        ef = fmin(ef, gf / bw), eb = fmin(eb, gb / bw);
        if (bytes > 8.0 * (1 << 20)) ef8 = fmin(ef8, gf / bw), eb8 = fmin(eb8, gb / bw);
        for (int p = 0; p < 2; p++) {
          const double tms = p ? r->torch_bwd_ms : r->torch_fwd_ms;
          fprintf(csv, "%s,%lld,%lld,%lld,%s,%s,%s,%d,%.4f,%.3f,%.4f,%.3f,%.4f,%.4f,%.3f,%.3f,%.3f\n", r->s->label,
                  (long long)r->s->n, (long long)r->s->c, (long long)r->s->hw, layout_str(r->lay),
                  dtype_str(r->dt), p ? "backward" : "forward", p ? 5 : 3, p ? r->bwd_ms : r->fwd_ms, p ? gb : gf,
                  (p ? gb : gf) / bw, bytes / (1 << 20), tms,
                  tms > 0 ? (p ? 5 : 3) * bytes / (tms * 1e-3) / 1e9 / bw : 0, sp, sp > 0 ? ceiling(r, bw) : 0,
                  sp > 0 ? attain(r, bw, rbw) : 0);
        }
      }
      char sl[64] = "-", big[32] = "       -";
      if (nsp) snprintf(sl, sizeof sl, "%.2fx %s", smin, slow);
      if (ef8 < INFINITY) snprintf(big, sizeof big, "%8.2f / %-7.2f", ef8, eb8);
      char ceil_s[32] = "-", att_s[32] = "-", of_s[32] = "-";
      if (nsp) snprintf(ceil_s, sizeof ceil_s, "%.2fx / %.2fx", exp(csum / nsp), cmin);
      if (nsp) snprintf(att_s, sizeof att_s, "%.2fx / %.2fx", exp(asum / nsp), amin);
      if (nsp) snprintf(of_s, sizeof of_s, "%.2f / %.2f", exp(fsum / nsp), fmn);
      printf("%-8s %-2s %7.2fx %18s %8.2f / %-7.2f %s %14s %5.2f / %.2f %14s %14s\n", dtype_str(dts[d]),
             l ? "cl" : "cf", nsp ? exp(lsum / nsp) : 0, sl, ef, eb, big, ceil_s, bound_fwd(rr), bound_bwd(rr), att_s,
             of_s);
    }
  fclose(csv);

  fixed_cost(use_torch);
  peer_stop();

  /* synchronization cost, float32 channels-first, N = 8 shapes per rank */
  printf("\nsynchronization: 2 thread ranks (1 thread each), forward+backward per step, float32 CF,\n"
         "plain (each rank its own BatchNorm) and synced blocks interleaved, median per step; a step\n"
         "ends when both ranks are done (a barrier, as the gradients' all-reduce in training);\n"
         "overhead: the median over rounds of each synced block against the plain block before it;\n"
         "'rank 0 alone': its plain forward+backward without that wait, and the synced step against it\n");
  printf("%-16s %9s %11s %11s %9s %13s %9s\n", "per-rank shape", "MiB/rank", "2 plain ms", "2 sync ms", "overhead",
         "rank 0 alone", "against");
  snprintf(path, sizeof path, "%s/bench_sync.csv", opt.out);
  FILE *scsv = fopen(path, "w");
  if (!scsv) return 1;
  fprintf(scsv, "shape,mib_per_rank,two_plain_ms,two_sync_ms,overhead,rank0_plain_alone_ms,overhead_against_alone\n");
  fill(arena, arena_bytes, SBN_DTYPE_FLOAT32);
  sbn_set_num_threads(1);
  for (int i = 0; i < ns; i++) {
    const shape *s = &shapes[i];
    if (s->n != 8 && s->hw != 1) continue;
    sync_arg a = {s, {arena, arena + arena_bytes / 2}, arena_bytes / 2, {0, 0}, {0, 0}, 0};
    if (a.arena_bytes < 2 * 4 * align64((size_t)(s->n * s->c * s->hw) * 4)) continue;
    if (sbn_team_run(2, sync_rank, &a) != SBN_STATUS_OK) return 1;
    const double mib = (double)(s->n * s->c * s->hw) * 4 / (1 << 20);
    printf("%-16s %9.2f %11.3f %11.3f %8.1f%% %13.3f %8.1f%%\n", s->label, mib, a.ms[0], a.ms[1],
           100 * (a.paired - 1), a.own[0], 100 * (a.ms[1] / a.own[0] - 1));
    fprintf(scsv, "%s,%.3f,%.4f,%.4f,%.4f,%.4f,%.4f\n", s->label, mib, a.ms[0], a.ms[1], a.paired - 1, a.own[0],
            a.ms[1] / a.own[0] - 1);
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
            double bytes = (double)(shapes[i].n * shapes[i].c * shapes[i].hw) * (d ? 2 : 4);
            fprintf(dat, " %.4f %.4f", 3 * bytes / (res[k].fwd_ms * 1e-3) / 1e9 / bw,
                    5 * bytes / (res[k].bwd_ms * 1e-3) / 1e9 / bw);
          }
    fprintf(dat, "\n");
  }
  fclose(dat);
  const char *dir = getenv("SYNCBN_BENCH_DIR") ? getenv("SYNCBN_BENCH_DIR") : "bench";
  snprintf(cmd, sizeof cmd, "gnuplot -e \"dat='%s/bench_eff.dat'; out='%s/bench_cpu.png'\" %s/plot_cpu.gp 2>/dev/null",
           opt.out, opt.out, dir);
  int plotted = system(cmd) == 0;
  getloadavg(load, 3);
  printf("\nwrote %s/bench_cpu.csv, %s/bench_sync.csv%s; load average at the end %.2f %.2f %.2f\n", opt.out,
         opt.out, plotted ? ", bench_cpu.png" : " (no plot: gnuplot missing)", load[0], load[1], load[2]);
  free(arena);
  return 0;
}
