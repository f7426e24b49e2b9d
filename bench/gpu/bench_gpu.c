/* syncbn-bench-gpu: the CUDA layer against the GPU's copy bandwidth, in one
 * run (PyTorch's SyncBatchNorm kernel chain and cuDNN on the same work:
 * bench/gpu/torch_chain.py; the speedups: bench/gpu/combine.py).
 *
 *  1. copy bandwidth: cudaMemcpy device to device of a 1 GiB buffer, bytes
 *     read + written, median of 15 (at the start and again at the end);
 *  2. forward and backward through the public API (sbn_bn_create with
 *     SBN_DEVICE_CUDA, sbn_bn_set_stream, sbn_bn_forward/backward), group
 *     NULL and a one-rank NCCL group, over the ResNet-50 batch-norm shapes
 *     at N = 32 plus a 2-D (N, C) case, float32 and bfloat16, both layouts
 *     (a layer treats a one-rank group as no group, so the collective's own
 *     cost is measured apart, in 3):
 *     CUDA events around each call, the median after warm-up; GB/s at 3
 *     (forward) and 5 (backward) tensor passes; fraction of copy bandwidth;
 *     with no group, the same calls again captured in CUDA graphs (one per
 *     set and pass) and replayed: the GPU's time without the host's calls
 *     (row "graph"), as torch_chain.py times PyTorch's chain;
 *  3. the collective alone: the NCCL backend's exact all-reduce of a
 *     layer's 2C+1 doubles on the stream against a raw ncclAllReduce (sum)
 *     of the same doubles, one rank (the exact sum's fixed cost).
 *
 * Rotation: the tensors of each shape come in R sets with R * bytes at
 * least 4x the L2 (read from the device); forward runs on set i, backward
 * on set i - R/2 (as bench_cpu.c), so no call finds its inputs in L2.
 *
 * Output: a table, and one "ROW ..." line per measurement that
 * bench/gpu/combine.py reads (torch_chain.py prints the same format).
 *
 * Usage: syncbn-bench-gpu [--iters N] [--warmup W] [--only SHAPE]
 *                         [--dtype f32|bf16] [--layout cf|cl] [--no-nccl] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "syncbn.h"
#include "syncbn_nccl.h"
#include "../../src/comm/comm.h"

#define CK(call)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

static struct {
  int iters, warmup, nccl;
  const char *only, *dtype, *layout;
} opt = {30, 5, 1, NULL, NULL, NULL};

typedef struct shape {
  const char *label;
  int ndim;
  int64_t dims[4]; /* N, C, H, W */
} shape;

static const shape shapes[] = {
    {"32x64x112x112", 4, {32, 64, 112, 112}}, {"32x128x56x56", 4, {32, 128, 56, 56}},
    {"32x256x56x56", 4, {32, 256, 56, 56}},   {"32x512x28x28", 4, {32, 512, 28, 28}},
    {"32x1024x14x14", 4, {32, 1024, 14, 14}}, {"32x2048x7x7", 4, {32, 2048, 7, 7}},
    {"16384x1024", 2, {16384, 1024, 1, 1}},
};

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint16_t to_bf16(float f) { /* round to nearest even (finite inputs) */
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

/* Copy bandwidth, GB/s counting bytes read + written. */
static double copy_gbs(void) {
  const size_t bytes = (size_t)1 << 30;
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  double t[15];
  for (int i = -3; i < 15; i++) {
    CK(cudaEventRecord(e0, 0));
    CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 0) t[i] = ms;
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  cudaFree(a), cudaFree(b);
  return 2.0 * (double)bytes / (median(t, 15) * 1e-3) / 1e9;
}

static sbn_tensor dev_tensor(const shape *s, void *data, sbn_dtype dt, sbn_layout lay) {
  sbn_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.ndim = s->ndim;
  for (int i = 0; i < s->ndim; i++) t.shape[i] = s->dims[i];
  t.dtype = dt;
  t.layout = lay;
  t.device.type = SBN_DEVICE_CUDA;
  t.device.index = 0;
  return t;
}

static void fail_status(const char *what, sbn_status st) {
  fprintf(stderr, "%s: %s: %s\n", what, sbn_status_name(st), sbn_last_error());
  exit(2);
}

/* The medians of the timed iterations (events 4 it .. 4 it + 3 around a
 * forward and a backward), printed as a table line and a "ROW" line. */
static void report(const cudaEvent_t *ev, int total, double *tf, double *tb, const shape *s, sbn_dtype dt,
                   sbn_layout lay, const char *gname, size_t bytes, double copy, int R) {
  for (int it = opt.warmup; it < total; it++) {
    float a, b;
    CK(cudaEventElapsedTime(&a, ev[4 * it], ev[4 * it + 1]));
    CK(cudaEventElapsedTime(&b, ev[4 * it + 2], ev[4 * it + 3]));
    tf[it - opt.warmup] = a, tb[it - opt.warmup] = b;
  }
  const double fms = median(tf, opt.iters), bms = median(tb, opt.iters);
  const double mb = (double)bytes / 1e6;
  const double fgbs = 3.0 * (double)bytes / (fms * 1e-3) / 1e9, bgbs = 5.0 * (double)bytes / (bms * 1e-3) / 1e9;
  const char *dts = dt == SBN_DTYPE_FLOAT32 ? "f32" : "bf16", *ls = lay == SBN_LAYOUT_CHANNELS_FIRST ? "cf" : "cl";
  printf("%-15s %-4s %-2s %-6s %8.1f %9.4f %7.0f %5.2f %9.4f %7.0f %5.2f  R=%d\n", s->label, dts, ls, gname, mb, fms,
         fgbs, fgbs / copy, bms, bgbs, bgbs / copy, R);
  printf("ROW impl=syncbn-%s shape=%s dtype=%s layout=%s mb=%.3f fwd_ms=%.5f bwd_ms=%.5f fwd_gbs=%.1f bwd_gbs=%.1f "
         "fwd_frac=%.3f bwd_frac=%.3f\n",
         gname, s->label, dts, ls, mb, fms, bms, fgbs, bgbs, fgbs / copy, bgbs / copy);
  fflush(stdout);
}

/* One configuration: median forward and backward ms. */
static void run_case(const shape *s, sbn_dtype dt, sbn_layout lay, sbn_group *group, const char *gname,
                     double copy, size_t l2, cudaStream_t stream) {
  size_t numel = 1;
  for (int i = 0; i < s->ndim; i++) numel *= (size_t)s->dims[i];
  const size_t esz = dt == SBN_DTYPE_FLOAT32 ? 4 : 2, bytes = numel * esz;
  /* sets: x, y, dy, dx per set */
  int R = (int)((4 * l2 + bytes - 1) / bytes);
  if (R < 2) R = 2;
  if (R > 64) R = 64;
  size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  while (R > 2 && (size_t)R * 4 * bytes > free_b / 2) R--;
  char *arena;
  CK(cudaMalloc((void **)&arena, (size_t)R * 4 * bytes));
  /* random data (never zeros): one host pattern uploaded into every set */
  void *host = malloc(bytes);
  uint64_t z = 0x2545f4914f6cdd1dull;
  for (size_t i = 0; i < numel; i++) {
    z ^= z << 13, z ^= z >> 7, z ^= z << 17;
    const float v = (float)((double)(z >> 11) * 0x1p-53 * 4.0 - 2.0 + 0.5 * (double)(i % 7));
    if (esz == 4) ((float *)host)[i] = v;
    else ((uint16_t *)host)[i] = to_bf16(v);
  }
  for (int r = 0; r < R; r++)
    for (int k = 0; k < 4; k++) CK(cudaMemcpy(arena + ((size_t)r * 4 + k) * bytes, host, bytes, cudaMemcpyHostToDevice));
  free(host);

  sbn_bn_options o = sbn_bn_options_default(s->dims[1]);
  o.device.type = SBN_DEVICE_CUDA;
  o.device.index = 0;
  sbn_bn *bn = NULL;
  sbn_status st = sbn_bn_create(&bn, &o, group);
  if (st != SBN_STATUS_OK) fail_status("sbn_bn_create(CUDA)", st);
  st = sbn_bn_set_stream(bn, stream);
  if (st != SBN_STATUS_OK) fail_status("sbn_bn_set_stream", st);

  const int total = opt.warmup + opt.iters;
  cudaEvent_t *ev = malloc(sizeof *ev * 4 * (size_t)total);
  for (int i = 0; i < 4 * total; i++) CK(cudaEventCreate(&ev[i]));
  for (int it = 0; it < total; it++) {
    const int i = it % R, j = (it + R / 2) % R; /* backward on a set forward left R/2 steps ago */
    char *fs = arena + (size_t)i * 4 * bytes, *bs = arena + (size_t)j * 4 * bytes;
    sbn_tensor x = dev_tensor(s, fs, dt, lay), y = dev_tensor(s, fs + bytes, dt, lay);
    sbn_tensor bx = dev_tensor(s, bs, dt, lay), dy = dev_tensor(s, bs + 2 * bytes, dt, lay),
               dx = dev_tensor(s, bs + 3 * bytes, dt, lay);
    CK(cudaEventRecord(ev[4 * it], stream));
    st = sbn_bn_forward(bn, &y, &x);
    CK(cudaEventRecord(ev[4 * it + 1], stream));
    if (st != SBN_STATUS_OK) fail_status("sbn_bn_forward", st);
    CK(cudaEventRecord(ev[4 * it + 2], stream));
    st = sbn_bn_backward(bn, &dx, &dy, &bx);
    CK(cudaEventRecord(ev[4 * it + 3], stream));
    if (st != SBN_STATUS_OK) fail_status("sbn_bn_backward", st);
  }
  CK(cudaStreamSynchronize(stream));
  double *tf = malloc(sizeof *tf * (size_t)opt.iters), *tb = malloc(sizeof *tb * (size_t)opt.iters);
  report(ev, total, tf, tb, s, dt, lay, gname, bytes, copy, R);
  if (!group) { /* the same calls captured in CUDA graphs: the GPU's time alone, as torch_chain.py times */
    cudaGraphExec_t *gx = malloc(sizeof *gx * 2 * (size_t)R);
    for (int i = 0; i < R; i++)
      for (int pass = 0; pass < 2; pass++) {
        char *set = arena + (size_t)i * 4 * bytes;
        sbn_tensor x = dev_tensor(s, set, dt, lay), y = dev_tensor(s, set + bytes, dt, lay);
        sbn_tensor dy = dev_tensor(s, set + 2 * bytes, dt, lay), dx = dev_tensor(s, set + 3 * bytes, dt, lay);
        cudaGraph_t graph;
        CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        st = pass == 0 ? sbn_bn_forward(bn, &y, &x) : sbn_bn_backward(bn, &dx, &dy, &x);
        CK(cudaStreamEndCapture(stream, &graph));
        if (st != SBN_STATUS_OK) fail_status(pass == 0 ? "captured sbn_bn_forward" : "captured sbn_bn_backward", st);
        CK(cudaGraphInstantiate(&gx[2 * i + pass], graph, 0));
        CK(cudaGraphDestroy(graph));
      }
    for (int it = 0; it < total; it++) {
      const int i = it % R, j = (it + R / 2) % R;
      CK(cudaEventRecord(ev[4 * it], stream));
      CK(cudaGraphLaunch(gx[2 * i], stream));
      CK(cudaEventRecord(ev[4 * it + 1], stream));
      CK(cudaEventRecord(ev[4 * it + 2], stream));
      CK(cudaGraphLaunch(gx[2 * j + 1], stream));
      CK(cudaEventRecord(ev[4 * it + 3], stream));
    }
    CK(cudaStreamSynchronize(stream));
    report(ev, total, tf, tb, s, dt, lay, "graph", bytes, copy, R);
    for (int i = 0; i < 2 * R; i++) cudaGraphExecDestroy(gx[i]);
    free(gx);
  }
  for (int i = 0; i < 4 * total; i++) cudaEventDestroy(ev[i]);
  free(ev), free(tf), free(tb);
  sbn_bn_destroy(bn);
  cudaFree(arena);
}

/* The NCCL backend's exact all-reduce of 2C+1 doubles against a raw
 * ncclAllReduce of the same doubles, both on the stream, one rank. The exact
 * sum runs twice: on the bootstrapped group g (a blocking communicator) and
 * on a group wrapping a caller's non-blocking communicator (which NCCL 2.28
 * launches from a new host thread per call), to show what the mode costs. */
static void run_collective(sbn_group *g, cudaStream_t stream) {
  const int Cs[] = {64, 256, 1024, 2048, 4096};
  int dev = 0;
  ncclUniqueId id;
  ncclComm_t raw;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&raw, 1, id, dev) != ncclSuccess) {
    printf("collective: could not make a raw NCCL communicator\n");
    return;
  }
  sbn_group *gb = NULL; /* the exact sum over a caller's non-blocking communicator */
  ncclComm_t nb = NULL;
  {
    ncclUniqueId id2;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclGetUniqueId(&id2);
    if (r == ncclSuccess) r = ncclCommInitRankConfig(&nb, 1, id2, dev, &cfg);
    while (r == ncclInProgress) ncclCommGetAsyncError(nb, &r);
    if (r != ncclSuccess || sbn_group_create_nccl(&gb, nb, dev) != SBN_STATUS_OK) {
      printf("collective: no non-blocking communicator to compare (%s)\n", ncclGetErrorString(r));
      gb = NULL;
    }
  }
  printf("\ncollective alone, 1 rank: exact all-reduce (2 NCCL reductions + 3 kernels) vs raw ncclAllReduce(sum)\n");
  printf("(exact_us: the bootstrapped group's blocking communicator; nonblock_us: the same exact sum over a\n"
         " caller's non-blocking communicator; host_us / nhost_us: the host's time in each exact call alone; near\n"
         " the device time, the host is what the GPU waits for)\n");
  printf("%6s %10s %11s %10s %6s %10s %10s\n", "C", "exact_us", "nonblock_us", "raw_us", "ratio", "host_us",
         "nhost_us");
  for (size_t k = 0; k < sizeof Cs / sizeof Cs[0]; k++) {
    const size_t n = 2 * (size_t)Cs[k] + 1;
    double *d;
    CK(cudaMalloc((void **)&d, 8 * n));
    double *h = malloc(8 * n);
    for (size_t i = 0; i < n; i++) h[i] = 1.0 + (double)i * 0.37;
    CK(cudaMemcpy(d, h, 8 * n, cudaMemcpyHostToDevice));
    sbn_sig sig;
    memset(&sig, 0, sizeof sig);
    sig.kind = SBN_SIG_KIND_BN_FORWARD, sig.count = Cs[k], sig.dtype = SBN_DTYPE_FLOAT32;
    snprintf(sig.what, sizeof sig.what, "benchmark");
    enum { REPS = 200 };
    /* device time per method (exact, blocking, raw); host time of the two exact calls */
    double t[3][REPS], th[2][REPS];
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int pass = 0; pass < 3; pass++) {
      sbn_group *on = pass == 0 ? g : pass == 1 ? gb : NULL;
      if (pass == 1 && !gb) {
        for (int r = 0; r < REPS; r++) t[1][r] = th[1][r] = 0;
        continue;
      }
      for (int r = -20; r < REPS; r++) {
        CK(cudaEventRecord(e0, stream));
        if (on) {
          const double h0 = now_us();
          sbn_status st = on->ops->allreduce_device(on, d, n, SBN_DTYPE_FLOAT64, &sig, stream);
          if (r >= 0) th[pass][r] = now_us() - h0;
          if (st != SBN_STATUS_OK) fail_status("allreduce_device", st);
        } else if (ncclAllReduce(d, d, n, ncclFloat64, ncclSum, raw, stream) != ncclSuccess) {
          printf("raw ncclAllReduce failed\n");
          break;
        }
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0) t[pass][r] = ms * 1e3;
      }
    }
    const double me = median(t[0], REPS), mb = median(t[1], REPS), mr = median(t[2], REPS);
    const double mh = median(th[0], REPS), mbh = median(th[1], REPS);
    printf("%6d %10.2f %11.2f %10.2f %6.2f %10.2f %10.2f\n", Cs[k], me, mb, mr, me / mr, mh, mbh);
    printf("ROW impl=collective C=%d exact_us=%.3f nonblocking_us=%.3f raw_us=%.3f exact_host_us=%.3f "
           "nonblocking_host_us=%.3f\n", Cs[k], me, mb, mr, mh, mbh);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(d);
    free(h);
  }
  if (gb) sbn_group_destroy(gb); /* not owned: nb stays */
  if (nb) ncclCommAbort(nb);      /* nothing pending: the quick way to free a non-blocking one */
  ncclCommDestroy(raw);
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc) opt.iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) opt.warmup = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) opt.only = argv[++i];
    else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) opt.dtype = argv[++i];
    else if (!strcmp(argv[i], "--layout") && i + 1 < argc) opt.layout = argv[++i];
    else if (!strcmp(argv[i], "--no-nccl")) opt.nccl = 0;
    else {
      fprintf(stderr, "usage: %s [--iters N] [--warmup W] [--only SHAPE] [--dtype f32|bf16] [--layout cf|cl] "
                      "[--no-nccl]\n", argv[0]);
      return 2;
    }
  }
  if (opt.iters < 1 || opt.iters > 100000 || opt.warmup < 0) {
    fprintf(stderr, "bad --iters/--warmup\n");
    return 2;
  }
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    printf("SKIP: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 0;
  }
  CK(cudaSetDevice(0));
  struct cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  const size_t l2 = (size_t)p.l2CacheSize;
  const double copy0 = copy_gbs();
  printf("device 0: %s, %d SMs, L2 %.0f MB; copy bandwidth %.0f GB/s (read + write)\n", p.name,
         p.multiProcessorCount, (double)l2 / 1e6, copy0);
  printf("COPY gbs=%.1f\n", copy0);
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  sbn_group *nccl = NULL;
  if (opt.nccl) {
    sbn_status st = sbn_group_create_nccl_over(&nccl, NULL, 0);
    if (st != SBN_STATUS_OK) {
      printf("no NCCL group (%s: %s): group NULL only\n", sbn_status_name(st), sbn_last_error());
      nccl = NULL;
    }
  }
  printf("\n%-15s %-4s %-2s %-6s %8s %9s %7s %5s %9s %7s %5s\n", "shape", "dt", "ly", "group", "MB", "fwd_ms",
         "GB/s", "frac", "bwd_ms", "GB/s", "frac");
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    const shape *s = &shapes[si];
    if (opt.only && strncmp(s->label, opt.only, strlen(opt.only))) continue;
    for (int d = 0; d < 2; d++) {
      const sbn_dtype dt = d ? SBN_DTYPE_BFLOAT16 : SBN_DTYPE_FLOAT32;
      if (opt.dtype && strcmp(opt.dtype, d ? "bf16" : "f32")) continue;
      for (int l = 0; l < 2; l++) {
        const sbn_layout lay = l ? SBN_LAYOUT_CHANNELS_LAST : SBN_LAYOUT_CHANNELS_FIRST;
        if (opt.layout && strcmp(opt.layout, l ? "cl" : "cf")) continue;
        if (s->ndim == 2 && l) continue; /* (N, C): one layout */
        run_case(s, dt, lay, NULL, "none", copy0, l2, stream);
        if (nccl) run_case(s, dt, lay, nccl, "nccl1", copy0, l2, stream);
      }
    }
  }
  if (nccl) run_collective(nccl, stream);
  const double copy1 = copy_gbs();
  printf("\ncopy bandwidth at the end: %.0f GB/s (start %.0f)\n", copy1, copy0);
  if (nccl) sbn_group_destroy(nccl);
  cudaStreamDestroy(stream);
  return 0;
}
