/* The NCCL backend on a GPU (prints SKIP and passes without one, after
 * checking that the constructors fail cleanly there).
 *
 *  1. The device kernels (src/cuda/nccl/nccl_xsum.cu) with P simulated ranks: the
 *     host takes the MAX of the tags and the SUM of the bins between the
 *     kernels, as NCCL would; results must equal exact_sum.c's binned sums
 *     bit for bit (float64 and float32, mixed magnitudes, cancellation,
 *     inf/NaN, subnormals), and a disagreeing control byte must leave x
 *     untouched and set the error word to MISMATCH.
 *  2. A group of one rank through the real NCCL calls: sbn_group_allreduce
 *     on device and host memory (float64 and float32), broadcast, barrier,
 *     the device path captured in a CUDA graph and replayed, a local error
 *     on the device path, bad device indices, a buffer of another device.
 *  3. With G >= 2 GPUs: G thread ranks, one GPU each, bootstrapped over a
 *     threads group: sums bitwise equal to the threads backend's, a
 *     device-side mismatch reported by the next barrier on every rank, a
 *     host-side mismatch, and a timeout (one rank skips a barrier).
 * Evidence is printed; exit 1 on any failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "syncbn.h"
#include "syncbn_nccl.h"
#include "comm/comm.h"
#include "comm/exact_sum.h"
#include "cuda/nccl/nccl_xsum.h"

static int failures;
#define CHECK(cond, ...)                       \
  do {                                         \
    if (!(cond)) {                             \
      failures++;                              \
      printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      printf(__VA_ARGS__);                     \
      printf("\n");                            \
    }                                          \
  } while (0)
#define CK(call)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) {                                                          \
      printf("FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* Value i of rank r in set `seed`: a deterministic mix of kinds. */
static double value(uint64_t seed, int r, size_t i) {
  const uint64_t h = mix(seed * 0x9e3779b97f4a7c15ull + (uint64_t)r * 0x632be59bd9b4e019ull + i);
  const double u = (double)(h >> 11) * 0x1p-53, sign = (h & 1) ? -1.0 : 1.0;
  switch ((h >> 8) % 10) {
    case 0: return sign * ldexp(1.0 + u, (int)((h >> 20) % 2046) - 1022);
    case 1: return sign * ldexp(u, -1022); /* subnormal */
    case 2: return (i % 3 == 0) ? sign * 0.0 : sign * u;
    case 3: return (r & 1) ? -value(seed, r - 1, i) : sign * u * 1e10; /* cancels a neighbour */
    case 4: return i % 97 == 5 ? (r == 0 ? INFINITY : 1.0) : sign * u;
    case 5: return i % 89 == 7 ? (r == 1 ? -INFINITY : sign) : sign * u;
    case 6: return i % 251 == 3 && r == 0 ? NAN : sign * (double)(h % 1000);
    default: return sign * u * 1e4 + 1e8; /* a large mean */
  }
}
static uint64_t bits64(double x) {
  uint64_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}
static uint32_t bits32(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

/* The reference: exact_sum.c's binned sum of the P ranks' values. */
static void reference(double *out64, float *out32, uint64_t seed, int P, size_t n, int f32_inputs) {
  for (size_t i = 0; i < n; i++) {
    sbn_xbin acc = sbn_xsum_zero();
    for (int r = 0; r < P; r++) {
      double v = value(seed, r, i);
      if (f32_inputs) v = (double)(float)v;
      sbn_xsum_add(&acc, v);
    }
    if (out64) sbn_xsum_decode_f64(&out64[i], &acc, 1);
    if (out32) sbn_xsum_decode_f32(&out32[i], &acc, 1);
  }
}

/* ---- 1. kernels with simulated ranks ---- */
static void test_kernels(void) {
  const size_t n = 4099;
  const int Ps[] = {1, 2, 3, 8, 65};
  uint8_t *d_tags, *tags = malloc(SBN_NX_CTRL + n), *tmax = malloc(SBN_NX_CTRL + n);
  int64_t *d_bins, *bins = malloc(sizeof *bins * 4 * n), *bsum = malloc(sizeof *bsum * 4 * n);
  double *x64 = malloc(sizeof *x64 * n), *ref64 = malloc(sizeof *ref64 * n), *got64 = malloc(sizeof *got64 * n);
  float *x32 = malloc(sizeof *x32 * n), *ref32 = malloc(sizeof *ref32 * n), *got32 = malloc(sizeof *got32 * n);
  void *d_x;
  int64_t *err_h, *err_d;
  CK(cudaMalloc((void **)&d_tags, SBN_NX_CTRL + n));
  CK(cudaMalloc((void **)&d_bins, sizeof *bins * 4 * n));
  CK(cudaMalloc(&d_x, sizeof(double) * n));
  CK(cudaHostAlloc((void **)&err_h, 3 * sizeof(int64_t), cudaHostAllocMapped));
  CK(cudaHostGetDevicePointer((void **)&err_d, err_h, 0));
  memset(err_h, 0, 3 * sizeof(int64_t));
  const uint64_t hash = 0x0123456789abcdefull;
  long compared = 0, bad = 0;
  for (size_t pi = 0; pi < sizeof Ps / sizeof Ps[0]; pi++) {
    const int P = Ps[pi];
    for (int f32 = 0; f32 < 2; f32++) {
      const uint64_t seed = 1000 + pi * 2 + (uint64_t)f32;
      memset(tmax, 0, SBN_NX_CTRL + n);
      for (int r = 0; r < P; r++) { /* phase 1 on "rank" r, MAX on the host */
        for (size_t i = 0; i < n; i++) {
          x64[i] = value(seed, r, i);
          x32[i] = (float)x64[i];
        }
        CK(cudaMemcpy(d_x, f32 ? (void *)x32 : (void *)x64, f32 ? 4 * n : 8 * n, cudaMemcpyHostToDevice));
        CHECK(sbn_nx_prepare(NULL, d_tags, d_x, n, f32, hash, 0) == 0, "prepare launch");
        CK(cudaMemcpy(tags, d_tags, SBN_NX_CTRL + n, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < SBN_NX_CTRL + n; i++) tmax[i] = tags[i] > tmax[i] ? tags[i] : tmax[i];
      }
      CK(cudaMemcpy(d_tags, tmax, SBN_NX_CTRL + n, cudaMemcpyHostToDevice));
      memset(bsum, 0, sizeof *bsum * 4 * n);
      for (int r = 0; r < P; r++) { /* phase 2, SUM on the host */
        for (size_t i = 0; i < n; i++) {
          x64[i] = value(seed, r, i);
          x32[i] = (float)x64[i];
        }
        CK(cudaMemcpy(d_x, f32 ? (void *)x32 : (void *)x64, f32 ? 4 * n : 8 * n, cudaMemcpyHostToDevice));
        CHECK(sbn_nx_encode(NULL, d_bins, d_x, n, f32, d_tags) == 0, "encode launch");
        CK(cudaMemcpy(bins, d_bins, sizeof *bins * 4 * n, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < 4 * n; i++) bsum[i] += bins[i];
      }
      CK(cudaMemcpy(d_bins, bsum, sizeof *bsum * 4 * n, cudaMemcpyHostToDevice));
      CHECK(sbn_nx_decode(NULL, d_x, n, f32, d_bins, d_tags, hash, 0, 1, err_d) == 0, "decode launch");
      CK(cudaDeviceSynchronize());
      reference(f32 ? NULL : ref64, f32 ? ref32 : NULL, seed, P, n, f32);
      if (f32) {
        CK(cudaMemcpy(got32, d_x, 4 * n, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++, compared++)
          if (bits32(got32[i]) != bits32(ref32[i])) {
            if (bad++ < 5) printf("  P=%d float32 [%zu]: device %a, exact_sum.c %a\n", P, i, (double)got32[i], (double)ref32[i]);
          }
      } else {
        CK(cudaMemcpy(got64, d_x, 8 * n, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++, compared++)
          if (bits64(got64[i]) != bits64(ref64[i])) {
            if (bad++ < 5) printf("  P=%d float64 [%zu]: device %a, exact_sum.c %a\n", P, i, got64[i], ref64[i]);
          }
      }
    }
  }
  CHECK(bad == 0, "%ld of %ld device sums differ from exact_sum.c", bad, compared);
  CHECK(err_h[0] == 0, "error word set on agreeing ranks (%lld)", (long long)err_h[0]);
  printf("kernels vs exact_sum.c, simulated ranks P in {1,2,3,8,65}, float64 and float32: %ld values "
         "compared bitwise, %ld differ\n", compared, bad);

  /* a disagreeing control byte: x untouched, MISMATCH recorded with the sequence number */
  for (size_t i = 0; i < n; i++) x64[i] = value(7, 0, i);
  CK(cudaMemcpy(d_x, x64, 8 * n, cudaMemcpyHostToDevice));
  tmax[3] ^= 0xff; /* another rank's hash byte was larger */
  CK(cudaMemcpy(d_tags, tmax, SBN_NX_CTRL + n, cudaMemcpyHostToDevice));
  CHECK(sbn_nx_decode(NULL, d_x, n, 0, d_bins, d_tags, hash, 0, 42, err_d) == 0, "decode launch");
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(got64, d_x, 8 * n, cudaMemcpyDeviceToHost));
  CHECK(memcmp(got64, x64, 8 * n) == 0, "x was written despite the disagreement");
  CHECK(err_h[0] == SBN_STATUS_MISMATCH && err_h[1] == 42, "error word %lld (collective %lld), expected MISMATCH (42)",
        (long long)err_h[0], (long long)err_h[1]);
  printf("disagreeing control bytes: x untouched, error word %s for collective %lld\n",
         sbn_status_name((sbn_status)err_h[0]), (long long)err_h[1]);
  cudaFree(d_tags), cudaFree(d_bins), cudaFree(d_x), cudaFreeHost(err_h);
  free(tags), free(tmax), free(bins), free(bsum), free(x64), free(ref64), free(got64), free(x32), free(ref32),
      free(got32);
}

/* ---- 2. one rank through NCCL ---- */
static void test_one_rank(void) {
  sbn_group *g = NULL;
  sbn_status st = sbn_group_create_nccl_over(&g, NULL, 0);
  CHECK(st == SBN_STATUS_OK, "create_nccl_over(NULL, 0): %s %s", sbn_status_name(st), sbn_last_error());
  if (st != SBN_STATUS_OK) return;
  CHECK(!strcmp(sbn_group_backend(g), "nccl") && sbn_group_size(g) == 1 && sbn_group_rank(g) == 0,
        "backend %s size %d rank %d", sbn_group_backend(g), sbn_group_size(g), sbn_group_rank(g));
  const size_t n = 10007;
  double *h = malloc(8 * n), *ref = malloc(8 * n), *got = malloc(8 * n);
  float *h32 = malloc(4 * n), *ref32 = malloc(4 * n), *got32 = malloc(4 * n);
  double *d;
  CK(cudaMalloc((void **)&d, 8 * n));
  for (size_t i = 0; i < n; i++) h[i] = value(11, 0, i), h32[i] = (float)h[i];
  reference(ref, NULL, 11, 1, n, 0);
  reference(NULL, ref32, 11, 1, n, 1);
  long bad = 0;
  /* device memory, float64 */
  CK(cudaMemcpy(d, h, 8 * n, cudaMemcpyHostToDevice));
  st = sbn_group_allreduce(g, d, n, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
  CHECK(st == SBN_STATUS_OK, "allreduce(device f64): %s %s", sbn_status_name(st), sbn_last_error());
  CK(cudaMemcpy(got, d, 8 * n, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) bad += bits64(got[i]) != bits64(ref[i]);
  CHECK(bad == 0, "device f64: %ld of %zu differ from the exact sum", bad, n);
  printf("1 rank, sbn_group_allreduce of %zu float64 in device memory through NCCL: %ld differ\n", n, bad);
  /* host memory, float64 and float32 */
  memcpy(got, h, 8 * n);
  st = sbn_group_allreduce(g, got, n, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
  bad = 0;
  for (size_t i = 0; i < n; i++) bad += bits64(got[i]) != bits64(ref[i]);
  CHECK(st == SBN_STATUS_OK && bad == 0, "host f64: %s, %ld differ", sbn_status_name(st), bad);
  memcpy(got32, h32, 4 * n);
  st = sbn_group_allreduce(g, got32, n, SBN_DTYPE_FLOAT32, SBN_REDUCE_OP_SUM);
  bad = 0;
  for (size_t i = 0; i < n; i++) bad += bits32(got32[i]) != bits32(ref32[i]);
  CHECK(st == SBN_STATUS_OK && bad == 0, "host f32: %s, %ld differ", sbn_status_name(st), bad);
  printf("1 rank, host memory (staged), float64 and float32: %s\n", bad ? "differ" : "bitwise equal");
  /* broadcast, barrier */
  char msg[64] = "broadcast payload", back[64];
  st = sbn_group_broadcast(g, msg, sizeof msg, 0);
  CHECK(st == SBN_STATUS_OK && !strcmp(msg, "broadcast payload"), "broadcast: %s", sbn_status_name(st));
  CK(cudaMemcpy(d, msg, sizeof msg, cudaMemcpyHostToDevice));
  st = sbn_group_broadcast(g, d, sizeof msg, 0);
  CK(cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost));
  CHECK(st == SBN_STATUS_OK && !memcmp(back, msg, sizeof msg), "device broadcast: %s", sbn_status_name(st));
  st = sbn_group_barrier(g);
  CHECK(st == SBN_STATUS_OK, "barrier: %s %s", sbn_status_name(st), sbn_last_error());
  st = sbn_group_broadcast(g, msg, sizeof msg, 1);
  CHECK(st == SBN_STATUS_INVALID_ARGUMENT, "broadcast root 1 of 1: %s", sbn_status_name(st));
  /* the device path, captured in a CUDA graph and replayed twice */
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  sbn_sig sig;
  sbn_sig_init(&sig, SBN_SIG_KIND_BN_FORWARD, 0, (int64_t)n, SBN_DTYPE_FLOAT32, "test step");
  /* on s: a non-blocking stream is not ordered after the legacy stream's copies */
  CK(cudaMemcpyAsync(d, h, 8 * n, cudaMemcpyHostToDevice, s));
  st = g->ops->allreduce_device(g, d, n, SBN_DTYPE_FLOAT64, &sig, s); /* warm-up, uncaptured */
  CHECK(st == SBN_STATUS_OK, "allreduce_device: %s %s", sbn_status_name(st), sbn_last_error());
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  st = g->ops->allreduce_device(g, d, n, SBN_DTYPE_FLOAT64, &sig, s);
  CK(cudaStreamEndCapture(s, &graph));
  CHECK(st == SBN_STATUS_OK, "allreduce_device under capture: %s %s", sbn_status_name(st), sbn_last_error());
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 2; rep++) {
    CK(cudaMemcpyAsync(d, h, 8 * n, cudaMemcpyHostToDevice, s));
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(got, d, 8 * n, cudaMemcpyDeviceToHost));
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += bits64(got[i]) != bits64(ref[i]);
    CHECK(bad == 0, "graph replay %d: %ld differ", rep, bad);
  }
  printf("1 rank, device path captured in a CUDA graph, 2 replays: %s\n", failures ? "see above" : "bitwise equal");
  cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
  /* a local error on the device path: this rank's status at once, then the group still works */
  sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "a bad tensor");
  sbn_sig_set_error(&sig, SBN_STATUS_INVALID_ARGUMENT);
  st = g->ops->allreduce_device(g, d, n, SBN_DTYPE_FLOAT64, &sig, s);
  CK(cudaStreamSynchronize(s));
  CHECK(st == SBN_STATUS_INVALID_ARGUMENT, "local error on the device path: %s", sbn_status_name(st));
  st = sbn_group_barrier(g);
  CHECK(st == SBN_STATUS_OK, "barrier after a local error: %s %s", sbn_status_name(st), sbn_last_error());
  cudaStreamDestroy(s);
  /* bad devices */
  int count = 0;
  CK(cudaGetDeviceCount(&count));
  sbn_group *bad_g = (sbn_group *)&bad_g;
  st = sbn_group_create_nccl_over(&bad_g, NULL, count);
  CHECK(st == SBN_STATUS_INVALID_ARGUMENT && bad_g == NULL, "device %d of %d: %s", count, count, sbn_status_name(st));
  printf("device index %d: %s (%s)\n", count, sbn_status_name(st), sbn_last_error());
  if (count > 1) {
    double *d1;
    CK(cudaSetDevice(1));
    CK(cudaMalloc((void **)&d1, 64));
    CK(cudaSetDevice(0));
    st = sbn_group_allreduce(g, d1, 8, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
    CHECK(st == SBN_STATUS_INVALID_ARGUMENT, "buffer of device 1 on a device-0 group: %s", sbn_status_name(st));
    printf("buffer of device 1: %s (%s)\n", sbn_status_name(st), sbn_last_error());
    cudaFree(d1);
  }
  sbn_group_destroy(g);
  cudaFree(d);
  free(h), free(ref), free(got), free(h32), free(ref32), free(got32);
}

/* ---- 3. G ranks, one GPU each ---- */
typedef struct multi_arg {
  int G;
  int fails[8];
} multi_arg;

static int multi_rank(sbn_group *world, void *argp) {
  multi_arg *a = argp;
  const int r = sbn_group_rank(world), P = sbn_group_size(world);
  int f = 0;
  CK(cudaSetDevice(r));
  sbn_group *g = NULL;
  sbn_status st = sbn_group_create_nccl_over(&g, world, r);
  if (st != SBN_STATUS_OK) {
    printf("rank %d: create: %s %s\n", r, sbn_status_name(st), sbn_last_error());
    a->fails[r] = 1;
    return 0;
  }
  const size_t n = 2049;
  double *h = malloc(8 * n), *viaThreads = malloc(8 * n), *ref = malloc(8 * n), *got = malloc(8 * n), *d;
  for (size_t i = 0; i < n; i++) h[i] = value(99, r, i);
  reference(ref, NULL, 99, P, n, 0);
  memcpy(viaThreads, h, 8 * n);
  st = sbn_group_allreduce(world, viaThreads, n, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
  f += st != SBN_STATUS_OK;
  CK(cudaMalloc((void **)&d, 8 * n));
  CK(cudaMemcpy(d, h, 8 * n, cudaMemcpyHostToDevice));
  st = sbn_group_allreduce(g, d, n, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
  CK(cudaMemcpy(got, d, 8 * n, cudaMemcpyDeviceToHost));
  long bad = 0, bad_threads = 0;
  for (size_t i = 0; i < n; i++) bad += bits64(got[i]) != bits64(ref[i]), bad_threads += bits64(got[i]) != bits64(viaThreads[i]);
  if (st != SBN_STATUS_OK || bad || bad_threads) {
    printf("rank %d: %s, %ld differ from exact_sum.c, %ld from the threads backend\n", r, sbn_status_name(st), bad, bad_threads);
    f++;
  }
  /* device-side mismatch: rank P-1 runs another layer; the next barrier reports it everywhere */
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  sbn_sig sig;
  sbn_sig_init(&sig, SBN_SIG_KIND_BN_FORWARD, r == P - 1 ? 1 : 0, (int64_t)n, SBN_DTYPE_FLOAT32, "forward of layer #%d",
               r == P - 1 ? 1 : 0);
  CK(cudaMemcpyAsync(d, h, 8 * n, cudaMemcpyHostToDevice, s)); /* on s: it is non-blocking */
  st = g->ops->allreduce_device(g, d, n, SBN_DTYPE_FLOAT64, &sig, s);
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(got, d, 8 * n, cudaMemcpyDeviceToHost));
  const int untouched = !memcmp(got, h, 8 * n);
  sbn_status bst = sbn_group_barrier(g);
  if (st != SBN_STATUS_OK || !untouched || bst != SBN_STATUS_MISMATCH) {
    printf("rank %d: device mismatch: enqueue %s, x %s, barrier %s (%s)\n", r, sbn_status_name(st),
           untouched ? "untouched" : "WRITTEN", sbn_status_name(bst), sbn_last_error());
    f++;
  } else if (r == 0) {
    printf("device-side mismatch, next barrier on rank 0: %s (%s)\n", sbn_status_name(bst), sbn_last_error());
  }
  bst = sbn_group_barrier(g);
  if (bst != SBN_STATUS_OK) printf("rank %d: barrier after the report: %s\n", r, sbn_status_name(bst)), f++;
  /* host-side mismatch: different counts, caught before the payload */
  st = sbn_group_allreduce(g, d, r == 0 ? n : n - 1, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
  if (st != SBN_STATUS_MISMATCH) printf("rank %d: host count mismatch: %s\n", r, sbn_status_name(st)), f++;
  else if (r == 0) printf("host-side count mismatch on rank 0: %s (%s)\n", sbn_status_name(st), sbn_last_error());
  /* timeout: the last rank skips a barrier */
  sbn_group_set_timeout(g, 2.0);
  if (r != P - 1) {
    st = sbn_group_barrier(g);
    if (st != SBN_STATUS_TIMEOUT) printf("rank %d: barrier without rank %d: %s\n", r, P - 1, sbn_status_name(st)), f++;
    else if (r == 0) printf("barrier without the last rank, rank 0: %s (%s)\n", sbn_status_name(st), sbn_last_error());
    st = sbn_group_barrier(g);
    if (st != SBN_STATUS_GROUP_BROKEN) printf("rank %d: after the timeout: %s\n", r, sbn_status_name(st)), f++;
  }
  sbn_group_barrier(world); /* threads group: everyone past the timeout */
  cudaStreamDestroy(s);
  sbn_group_destroy(g);
  cudaFree(d);
  free(h), free(viaThreads), free(ref), free(got);
  a->fails[r] = f;
  return 0;
}

#ifdef SBN_CUDA_EMU_NCCL_H
/* A host call that blocks (the emulator's NCCL_EMU_STALL_HOST: a blocking
 * communicator's launch stuck connecting to a peer): the watchdog aborts
 * the communicator at the deadline, the call returns TIMEOUT and the group
 * is broken; for the host-side and the device-side (layer) paths. Real NCCL
 * has no such switch, so this runs under the emulator only. */
static double wall_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void test_watchdog(void) {
  const double timeout = 0.3;
  for (int device_path = 0; device_path < 2; device_path++) {
    sbn_group *g = NULL;
    sbn_status st = sbn_group_create_nccl_over(&g, NULL, 0);
    CHECK(st == SBN_STATUS_OK, "create_nccl_over: %s %s", sbn_status_name(st), sbn_last_error());
    if (st != SBN_STATUS_OK) return;
    sbn_group_set_timeout(g, timeout);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    double *d;
    const size_t n = 129;
    CK(cudaMalloc((void **)&d, 8 * n));
    CK(cudaMemset(d, 0, 8 * n));
    sbn_sig sig;
    sbn_sig_init(&sig, SBN_SIG_KIND_BN_FORWARD, 0, 64, SBN_DTYPE_FLOAT32, "forward of the watchdog test");
    setenv("NCCL_EMU_STALL_HOST", "1", 1);
    const double t0 = wall_s();
    st = device_path ? g->ops->allreduce_device(g, d, n, SBN_DTYPE_FLOAT64, &sig, s)
                     : sbn_group_allreduce(g, d, n, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
    const double took = wall_s() - t0;
    unsetenv("NCCL_EMU_STALL_HOST");
    const char *path = device_path ? "device-side" : "host-side";
    CHECK(st == SBN_STATUS_TIMEOUT && took >= timeout && took < timeout + 2.0,
          "%s call blocked in NCCL: %s after %.3f s (timeout %g s): %s", path, sbn_status_name(st), took, timeout,
          sbn_last_error());
    printf("%s call blocked in NCCL: %s after %.3f s (timeout %g s): %s\n", path, sbn_status_name(st), took,
           timeout, sbn_last_error());
    st = sbn_group_barrier(g);
    CHECK(st == SBN_STATUS_GROUP_BROKEN, "%s: after the watchdog fired, barrier: %s", path, sbn_status_name(st));
    CK(cudaStreamSynchronize(s));
    cudaStreamDestroy(s);
    cudaFree(d);
    sbn_group_destroy(g);
  }
}
#endif

int main(void) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    /* no GPU: the constructors must fail cleanly */
    sbn_group *g = (sbn_group *)&g;
    sbn_status st = sbn_group_create_nccl_over(&g, NULL, 0);
    printf("no CUDA device (%s): sbn_group_create_nccl_over -> %s (\"%s\")\n",
           e != cudaSuccess ? cudaGetErrorString(e) : "0 devices", sbn_status_name(st), sbn_last_error());
    if (st == SBN_STATUS_OK || g != NULL || !sbn_last_error()[0]) {
      printf("FAIL: expected an error and no group\n");
      return 1;
    }
    printf("SKIP: the NCCL backend needs a GPU\n");
    return 0;
  }
  struct cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%d CUDA device(s); device 0: %s (sm_%d%d)\n", count, prop.name, prop.major, prop.minor);
  CK(cudaSetDevice(0));
  test_kernels();
  test_one_rank();
#ifdef SBN_CUDA_EMU_NCCL_H
  test_watchdog();
#endif
  if (count >= 2) {
    multi_arg a;
    memset(&a, 0, sizeof a);
    a.G = count > 8 ? 8 : count;
    sbn_status st = sbn_team_run(a.G, multi_rank, &a);
    int f = st != SBN_STATUS_OK;
    for (int r = 0; r < a.G; r++) f += a.fails[r];
    CHECK(f == 0, "%d rank(s) failed in the multi-GPU part", f);
    printf("%d ranks on %d GPUs: %s\n", a.G, a.G, f ? "FAIL" : "sums equal to exact_sum.c and the threads backend; "
           "mismatch, count mismatch and timeout reported");
  } else {
    printf("one GPU: the multi-rank part needs 2 or more (skipped)\n");
  }
  printf("%s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
