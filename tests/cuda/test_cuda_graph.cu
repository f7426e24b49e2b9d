// No host synchronization: forward and backward of several layers captured
// in one CUDA graph (stream capture in global mode, which refuses any call
// that would wait for the GPU), replayed with new inputs, and every replay
// checked against the float64 reference (y, dx, gradients, running
// statistics, num_batches_tracked):
//   A  no group                              (8,16,12,12) channels-first
//   B  a group of size 1 (plain BatchNorm)   (16,32,50) channels-last, momentum none
//   C  a group with a device all-reduce      (64,8)
//   D  the same, no affine                   (2,4,3,4,5) channels-last
// The device all-reduce of C and D is a test group of two ranks whose
// absent peer holds a copy of this rank's batch: the kernel doubles the
// payload on the layer's stream, and the reference is BatchNorm over the
// batch concatenated with itself. The count then lives only on the device.
// Then the count rules on the device: with a peer that holds nothing, a
// count of 1 is reported by the layer's next call and changes nothing, a
// count of 0 succeeds and changes nothing.
// Tolerances: as bn_case.c (float32 rounding of the float64 reference).
#include <math.h>

#include "cuda_testutil.h"
extern "C" {
#include "../../src/comm/comm.h"
}

// ---- a test group whose all-reduce runs on the device ----
typedef struct mirror { double factor; } mirror; // 2: the peer mirrors this rank; 1: the peer is empty

__global__ void scale(double *b, size_t n, double f) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) b[i] *= f;
}
static sbn_status mirror_allreduce_device(sbn_group *g, void *buf, size_t count, sbn_dtype dtype,
                                          const sbn_sig *sig, void *stream) {
  (void)dtype, (void)sig;
  double f = ((mirror *)g->impl)->factor;
  scale<<<(unsigned)((count + 255) / 256), 256, 0, (cudaStream_t)stream>>>((double *)buf, count, f);
  return cudaGetLastError() == cudaSuccess ? SBN_STATUS_OK : SBN_STATUS_BACKEND_ERROR;
}
static sbn_status mirror_allreduce(sbn_group *g, void *buf, size_t count, sbn_dtype dtype, const sbn_sig *sig) {
  (void)sig;
  for (size_t i = 0; i < count; i++)
    if (dtype == SBN_DTYPE_FLOAT64) ((double *)buf)[i] *= ((mirror *)g->impl)->factor;
  return SBN_STATUS_OK;
}
static sbn_status no_broadcast(sbn_group *, void *, size_t, int, const sbn_sig *) { return SBN_STATUS_UNSUPPORTED; }
static sbn_status no_barrier(sbn_group *, const sbn_sig *) { return SBN_STATUS_UNSUPPORTED; }
static sbn_status no_split(sbn_group **, sbn_group *, int, int, const sbn_sig *, int *) { return SBN_STATUS_UNSUPPORTED; }
static void mirror_destroy(sbn_group *) {}
static const sbn_comm_ops mirror_ops = {"mirror",   mirror_allreduce, no_broadcast, no_barrier,
                                        no_split,   mirror_destroy,   mirror_allreduce_device};

// ---- layers and their data ----
enum { NL = 4, REPLAYS = 4 };
typedef struct layer {
  sbn_bn *bn;
  sbn_bn_options opt;
  int ndim, mirrored;
  int64_t shape[SBN_MAX_DIMS];
  sbn_layout layout;
  rank_data d;               // host data of the current step
  float *x, *dy, *y, *dx;    // device buffers (fixed: the graph reads them)
  ref_bn ref;
  double *mean, *std;
  float *w, *b;
} layer;

static void fill(layer *L, rng *r) {
  rank_data_fill(&L->d, r, L->mean, L->std);
  size_t bytes = 4 * (size_t)L->d.numel;
  CUDA_OK(cudaMemcpy(L->x, L->d.x, bytes, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(L->dy, L->d.dy, bytes, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(L->y, 0xff, bytes));
  CUDA_OK(cudaMemset(L->dx, 0xff, bytes));
  CUDA_OK(cudaDeviceSynchronize());
}

static int enqueue_step(layer *L) {
  sbn_tensor x = sbn_tensor_cpu(L->x, L->ndim, L->shape, SBN_DTYPE_FLOAT32, L->layout);
  sbn_tensor y = x, dy = x, dx = x;
  y.data = L->y, dy.data = L->dy, dx.data = L->dx;
  x.device = y.device = dy.device = dx.device = cuda_dev(0);
  CHECK_OK(sbn_bn_zero_grad(L->bn));
  CHECK_OK(sbn_bn_forward(L->bn, &y, &x));
  CHECK_OK(sbn_bn_backward(L->bn, &dx, &dy, &x));
  return 0;
}

static void fetch(float *dst, sbn_bn *bn, sbn_bn_tensor_id id, int64_t C) {
  sbn_tensor v;
  if (sbn_bn_tensor(&v, bn, id) == SBN_STATUS_OK) CUDA_OK(cudaMemcpy(dst, v.data, 4 * (size_t)C, cudaMemcpyDeviceToHost));
}

// Compare the layer's results of the step just run with the reference's.
static int check_step(layer *L, int training, const char *what) {
  const int64_t C = L->opt.num_features, n = L->d.numel;
  rank_data ranks[2] = {L->d, L->d};
  ref_out out[2];
  const int P = L->mirrored ? 2 : 1;
  for (int p = 0; p < P; p++) ref_out_alloc(&out[p], &L->d, C);
  ref_step(&L->ref, training, ranks, P, out);
  CUDA_OK(cudaMemcpy(L->d.y, L->y, 4 * (size_t)n, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(L->d.dx, L->dx, 4 * (size_t)n, cudaMemcpyDeviceToHost));
  float *gw = (float *)calloc((size_t)C, 4), *gb = (float *)calloc((size_t)C, 4);
  float *rm = (float *)calloc((size_t)C, 4), *rv = (float *)calloc((size_t)C, 4);
  fetch(gw, L->bn, SBN_BN_TENSOR_GRAD_WEIGHT, C), fetch(gb, L->bn, SBN_BN_TENSOR_GRAD_BIAS, C);
  fetch(rm, L->bn, SBN_BN_TENSOR_RUNNING_MEAN, C), fetch(rv, L->bn, SBN_BN_TENSOR_RUNNING_VAR, C);
  int64_t nbt = -1;
  if (L->opt.track_running_stats) CHECK_OK(sbn_bn_get_num_batches_tracked(L->bn, &nbt));
  double ey = y_err(L->d.y, out[0].y, n);
  double edx = max_abs_diff(L->d.dx, out[0].dx, n) / (max_abs(out[0].dx, n) + 1e-30);
  double egw = L->opt.affine ? fmax(rel_err_f(gw, out[0].gw, C), rel_err_f(gb, out[0].gb, C)) : 0;
  double erun = L->opt.track_running_stats ? fmax(rel_err_f(rm, L->ref.rm, C), rel_err_f(rv, L->ref.rv, C)) : 0;
  int nbt_bad = L->opt.track_running_stats && nbt != L->ref.nbt;
  int bad = !(ey <= TOL_Y) || !(edx <= TOL_DX_REL) || !(egw <= 1e-6) || !(erun <= 1e-6) || nbt_bad;
  printf("  %-4s %-34s y %.1e dx %.1e grads %.1e running %.1e nbt %lld/%lld\n", bad ? "FAIL" : "ok", what, ey,
         edx, egw, erun, (long long)nbt, (long long)L->ref.nbt);
  for (int p = 0; p < P; p++) ref_out_free(&out[p]);
  free(gw), free(gb), free(rm), free(rv);
  return bad;
}

static int graph_test(void) {
  int bad = 0;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  mirror twice = {2.0};
  sbn_group *mg = sbn_group_alloc(&mirror_ops, &twice, 0, 2, "mirror");
  sbn_team *team;
  sbn_group *one;
  CHECK_OK(sbn_team_create(&team, 1));
  CHECK_OK(sbn_team_join(&one, team, 0));
  static layer Ls[NL];
  static const int64_t shapes[NL][5] = {{8, 16, 12, 12}, {16, 32, 50}, {64, 8}, {2, 4, 3, 4, 5}};
  static const int ndims[NL] = {4, 3, 2, 5};
  rng r = rng_seed(77);
  for (int i = 0; i < NL; i++) {
    layer *L = &Ls[i];
    L->ndim = ndims[i];
    memcpy(L->shape, shapes[i], sizeof L->shape);
    L->layout = i % 2 ? SBN_LAYOUT_CHANNELS_LAST : SBN_LAYOUT_CHANNELS_FIRST;
    L->mirrored = i >= 2;
    L->opt = sbn_bn_options_default(shapes[i][1]);
    L->opt.device = cuda_dev(0);
    if (i == 1) L->opt.momentum = SBN_MOMENTUM_CUMULATIVE;
    if (i == 3) L->opt.affine = 0;
    CHECK_OK(sbn_bn_create(&L->bn, &L->opt, i == 1 ? one : L->mirrored ? mg : NULL));
    CHECK_OK(sbn_bn_set_stream(L->bn, s));
    const int64_t C = shapes[i][1];
    L->mean = (double *)malloc(8 * (size_t)C), L->std = (double *)malloc(8 * (size_t)C);
    L->w = (float *)malloc(4 * (size_t)C), L->b = (float *)malloc(4 * (size_t)C);
    for (int64_t c = 0; c < C; c++) {
      L->std[c] = 0.3 + rng_uniform(&r), L->mean[c] = (rng_uniform(&r) - 0.5) * 4;
      L->w[c] = (float)(0.5 + rng_uniform(&r)), L->b[c] = (float)(rng_uniform(&r) - 0.5);
    }
    if (L->opt.affine) {
      sbn_tensor v;
      CHECK_OK(sbn_bn_tensor(&v, L->bn, SBN_BN_TENSOR_WEIGHT));
      CUDA_OK(cudaMemcpy(v.data, L->w, 4 * (size_t)C, cudaMemcpyHostToDevice));
      CHECK_OK(sbn_bn_tensor(&v, L->bn, SBN_BN_TENSOR_BIAS));
      CUDA_OK(cudaMemcpy(v.data, L->b, 4 * (size_t)C, cudaMemcpyHostToDevice));
    }
    ref_init(&L->ref, &L->opt, L->w, L->b);
    rank_data_alloc(&L->d, L->ndim, L->shape, L->layout);
    size_t bytes = 4 * (size_t)L->d.numel;
    L->x = (float *)hook_alloc(bytes), L->dy = (float *)hook_alloc(bytes);
    L->y = (float *)hook_alloc(bytes), L->dx = (float *)hook_alloc(bytes);
  }
  printf("layers A (no group), B (group of 1), C, D (device all-reduce):\n");
  // step 0 eagerly: reserves the scratch (nothing may allocate during capture)
  for (int i = 0; i < NL; i++) fill(&Ls[i], &r);
  for (int i = 0; i < NL; i++) if (enqueue_step(&Ls[i])) return 1;
  CUDA_OK(cudaStreamSynchronize(s));
  for (int i = 0; i < NL; i++) bad |= check_step(&Ls[i], 1, "eager step");

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  int enq = 0;
  for (int i = 0; i < NL; i++) enq |= enqueue_step(&Ls[i]);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  if (enq) return printf("FAIL: a layer call failed during capture: %s\n", sbn_last_error()), 1;
  size_t nodes = 0;
  CUDA_OK(cudaGraphGetNodes(graph, NULL, &nodes));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  printf("captured forward+backward of %d layers: %zu graph nodes\n", NL, nodes);
  for (int k = 1; k <= REPLAYS; k++) {
    for (int i = 0; i < NL; i++) fill(&Ls[i], &r);
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    char what[64];
    snprintf(what, sizeof what, "replay %d", k);
    for (int i = 0; i < NL; i++) bad |= check_step(&Ls[i], 1, what);
  }
  // eval, eagerly, after the replays: the running statistics the graph updated
  for (int i = 0; i < NL; i++) {
    layer *L = &Ls[i];
    fill(L, &r);
    CHECK_OK(sbn_bn_set_training(L->bn, 0));
    if (enqueue_step(L)) return 1;
    CUDA_OK(cudaStreamSynchronize(s));
    bad |= check_step(L, 0, "eval after the replays");
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  for (int i = 0; i < NL; i++) {
    layer *L = &Ls[i];
    sbn_bn_destroy(L->bn);
    hook_release(L->x), hook_release(L->dy), hook_release(L->y), hook_release(L->dx);
    rank_data_free(&L->d), ref_free(&L->ref);
    free(L->mean), free(L->std), free(L->w), free(L->b);
  }
  sbn_group_destroy(mg);
  sbn_group_destroy(one);
  sbn_team_destroy(team);
  CUDA_OK(cudaStreamDestroy(s));
  return bad;
}

// ---- the count rules when only the device knows the count ----
typedef struct state { float rm[3], rv[3], gw[3], gb[3]; int64_t nbt; } state;
static void snap(sbn_bn *bn, state *st) {
  fetch(st->rm, bn, SBN_BN_TENSOR_RUNNING_MEAN, 3), fetch(st->rv, bn, SBN_BN_TENSOR_RUNNING_VAR, 3);
  fetch(st->gw, bn, SBN_BN_TENSOR_GRAD_WEIGHT, 3), fetch(st->gb, bn, SBN_BN_TENSOR_GRAD_BIAS, 3);
  sbn_bn_get_num_batches_tracked(bn, &st->nbt);
}

static int count_test(void) {
  int bad = 0;
  mirror alone = {1.0};
  sbn_group *g = sbn_group_alloc(&mirror_ops, &alone, 0, 2, "alone");
  sbn_bn_options o = sbn_bn_options_default(3);
  o.device = cuda_dev(0);
  sbn_bn *bn;
  CHECK_OK(sbn_bn_create(&bn, &o, g));
  float hx[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13}, *dx4 = (float *)hook_alloc(48), *dy4 = (float *)hook_alloc(48);
  float *dev = (float *)hook_alloc(sizeof hx), *out = (float *)hook_alloc(sizeof hx);
  CUDA_OK(cudaMemcpy(dev, hx, sizeof hx, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dy4, hx, sizeof hx, cudaMemcpyHostToDevice));
  int64_t s4[2] = {4, 3};
  sbn_tensor x4 = sbn_tensor_cpu(dev, 2, s4, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), y4 = x4, d4 = x4, g4 = x4;
  y4.data = out, d4.data = dx4, g4.data = dy4;
  x4.device = y4.device = d4.device = g4.device = cuda_dev(0);
  sbn_tensor x1 = x4, y1 = y4, x0 = x4, y0 = y4, dy0 = x4, dx0 = x4;
  x1.shape[0] = y1.shape[0] = 1;
  x0.shape[0] = y0.shape[0] = dy0.shape[0] = dx0.shape[0] = 0;
  CHECK_OK(sbn_bn_forward(bn, &y4, &x4));
  CHECK_OK(sbn_bn_backward(bn, &d4, &g4, &x4));
  state before, after;
  snap(bn, &before);
  // count 1, known only on the device: the call returns, the next reports
  sbn_status st = sbn_bn_forward(bn, &y1, &x1);
  CUDA_OK(cudaDeviceSynchronize());
  sbn_status st2 = sbn_bn_forward(bn, &y4, &x4);
  int ok = st == SBN_STATUS_OK && st2 == SBN_STATUS_INVALID_ARGUMENT && strstr(sbn_last_error(), "more than 1 value");
  printf("  %-4s count 1 via the device all-reduce: forward -> %s, next forward -> %s (\"%s\")\n", ok ? "ok" : "FAIL",
         sbn_status_name(st), sbn_status_name(st2), sbn_last_error());
  bad |= !ok;
  snap(bn, &after);
  ok = memcmp(&before, &after, sizeof before) == 0;
  printf("  %-4s ... running statistics, num_batches_tracked and gradients unchanged (nbt %lld)\n", ok ? "ok" : "FAIL",
         (long long)after.nbt);
  bad |= !ok;
  st = sbn_bn_forward(bn, &y4, &x4);
  snap(bn, &after);
  ok = st == SBN_STATUS_OK && after.nbt == before.nbt + 1;
  printf("  %-4s then a good forward -> %s, nbt %lld\n", ok ? "ok" : "FAIL", sbn_status_name(st), (long long)after.nbt);
  bad |= !ok;
  // count 0: success, nothing changes, backward adds nothing
  snap(bn, &before);
  st = sbn_bn_forward(bn, &y0, &x0);
  st2 = st == SBN_STATUS_OK ? sbn_bn_backward(bn, &dx0, &dy0, &x0) : st;
  snap(bn, &after);
  ok = st == SBN_STATUS_OK && st2 == SBN_STATUS_OK && memcmp(&before, &after, sizeof before) == 0;
  printf("  %-4s count 0 via the device all-reduce: forward %s, backward %s, state unchanged\n", ok ? "ok" : "FAIL",
         sbn_status_name(st), sbn_status_name(st2));
  bad |= !ok;
  sbn_bn_destroy(bn);
  sbn_group_destroy(g);
  hook_release(dev), hook_release(out), hook_release(dx4), hook_release(dy4);
  return bad;
}

// ---- a captured graph after a larger shape ran eagerly ----
// The layer's scratch (partial sums) grows on the first call with a larger
// shape. A graph captured before keeps using the scratch it recorded, so
// growing must not free it: replaying the graph after an eager forward of a
// larger batch must still match the reference, and must write no memory
// but the layer's: what a freed scratch becomes is allocated again here
// (filled with 0xff), and the replays must leave it alone.
static int grow_test(void) {
  int bad = 0;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  static layer L;
  L.ndim = 3;
  const int64_t shape[3] = {8, 4, 4096}; // several tiles per channel: the partials go through the scratch
  memcpy(L.shape, shape, sizeof shape);
  L.layout = SBN_LAYOUT_CHANNELS_FIRST;
  const int64_t C = shape[1];
  L.opt = sbn_bn_options_default(C);
  L.opt.device = cuda_dev(0);
  CHECK_OK(sbn_bn_create(&L.bn, &L.opt, NULL));
  CHECK_OK(sbn_bn_set_stream(L.bn, s));
  rng r = rng_seed(91);
  L.mean = (double *)malloc(8 * (size_t)C), L.std = (double *)malloc(8 * (size_t)C);
  L.w = (float *)malloc(4 * (size_t)C), L.b = (float *)malloc(4 * (size_t)C);
  for (int64_t c = 0; c < C; c++) L.std[c] = 0.5 + rng_uniform(&r), L.mean[c] = rng_uniform(&r) - 0.5, L.w[c] = 1, L.b[c] = 0;
  ref_init(&L.ref, &L.opt, L.w, L.b);
  rank_data_alloc(&L.d, L.ndim, L.shape, L.layout);
  const size_t bytes = 4 * (size_t)L.d.numel;
  L.x = (float *)hook_alloc(bytes), L.dy = (float *)hook_alloc(bytes);
  L.y = (float *)hook_alloc(bytes), L.dx = (float *)hook_alloc(bytes);
  fill(&L, &r);
  if (enqueue_step(&L)) return 1;
  CUDA_OK(cudaStreamSynchronize(s));
  bad |= check_step(&L, 1, "eager step");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  const int enq = enqueue_step(&L);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  if (enq) return printf("FAIL: a layer call failed during capture: %s\n", sbn_last_error()), 1;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  // an eval forward of 16 times the batch (no state changes): the scratch grows
  int64_t big_shape[3] = {16 * shape[0], shape[1], shape[2]};
  float *bx = (float *)hook_alloc(16 * bytes), *by = (float *)hook_alloc(16 * bytes);
  CUDA_OK(cudaMemset(bx, 0, 16 * bytes));
  CUDA_OK(cudaDeviceSynchronize());
  sbn_tensor tbx = sbn_tensor_cpu(bx, 3, big_shape, SBN_DTYPE_FLOAT32, L.layout), tby = tbx;
  tby.data = by;
  tbx.device = tby.device = cuda_dev(0);
  CHECK_OK(sbn_bn_set_training(L.bn, 0));
  CHECK_OK(sbn_bn_forward(L.bn, &tby, &tbx));
  CHECK_OK(sbn_bn_set_training(L.bn, 1));
  CUDA_OK(cudaStreamSynchronize(s));
  enum { FILLERS = 16 };
  void *filler[FILLERS];
  for (int i = 0; i < FILLERS; i++) { // take back what was freed (the old scratch: 2 C x 4 tiles doubles), and spoil it
    CUDA_OK(cudaMalloc(&filler[i], (size_t)(2 * C * 8 * 4) << (i % 4)));
    CUDA_OK(cudaMemset(filler[i], 0xff, (size_t)(2 * C * 8 * 4) << (i % 4)));
  }
  CUDA_OK(cudaDeviceSynchronize());
  for (int k = 1; k <= 2; k++) {
    fill(&L, &r);
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    char what[64];
    snprintf(what, sizeof what, "replay %d after a larger batch", k);
    bad |= check_step(&L, 1, what);
  }
  int spoiled = 0; // bytes of the fillers that the replays wrote: they wrote through a freed pointer
  for (int i = 0; i < FILLERS; i++) {
    const size_t fb = (size_t)(2 * C * 8 * 4) << (i % 4);
    unsigned char *h = (unsigned char *)malloc(fb);
    CUDA_OK(cudaMemcpy(h, filler[i], fb, cudaMemcpyDeviceToHost));
    for (size_t j = 0; j < fb; j++) spoiled += h[j] != 0xff;
    free(h);
    CUDA_OK(cudaFree(filler[i]));
  }
  printf("  %-4s memory allocated after the scratch grew: %d bytes written by the replays (want 0)\n",
         spoiled ? "FAIL" : "ok", spoiled);
  bad |= spoiled != 0;
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  sbn_bn_destroy(L.bn);
  hook_release(L.x), hook_release(L.dy), hook_release(L.y), hook_release(L.dx), hook_release(bx), hook_release(by);
  rank_data_free(&L.d), ref_free(&L.ref);
  free(L.mean), free(L.std), free(L.w), free(L.b);
  CUDA_OK(cudaStreamDestroy(s));
  return bad;
}

int main(void) {
  if (!gpu_or_skip("test_cuda_graph")) return 0;
  int bad = graph_test();
  printf("a graph replayed after the scratch grew:\n");
  bad |= grow_test();
  printf("count rules on the device:\n");
  bad |= count_test();
  printf(bad ? "FAILED\n" : "graph replays match the reference; device count rules hold\n");
  return bad;
}
