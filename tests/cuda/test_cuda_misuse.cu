// Misuse of a CUDA layer is a clear error and changes nothing:
//  - a host pointer (pageable or pinned) where device memory is expected;
//  - a CPU tensor given to a CUDA layer, a CUDA tensor given to a CPU layer,
//    a tensor of another device index;
//  - a layer on a device that does not exist, a float64 layer (CPU only),
//    2^62 channels (refused) and 2^40 (out of memory, not a crash), a
//    float64 tensor given to a (float32) CUDA layer; with two GPUs, memory or a
//    stream of the other GPU, and the caller's current device kept;
//  - on 3 thread ranks sharing the GPU (host-staged group): one rank's bad
//    pointer fails every rank (that rank INVALID_ARGUMENT, the others
//    PEER_FAILED) with no state change on any, and a count of 1 over the
//    group fails every rank at once; a correct step works afterwards;
//  - a group without a device all-reduce cannot be captured in a graph: the
//    layer says so (every rank) instead of breaking the capture.
#include "cuda_testutil.h"

static int bad;

static void expect(const char *what, sbn_status got, sbn_status want, const char *needle) {
  int ok = got == want && (want == SBN_STATUS_OK || (strlen(sbn_last_error()) > 0 &&
                                                      (!needle || strstr(sbn_last_error(), needle))));
  printf("  %-4s %-46s -> %s (\"%s\")\n", ok ? "ok" : "FAIL", what, sbn_status_name(got), sbn_last_error());
  bad |= !ok;
}

typedef struct state { float p[6][4]; int64_t nbt; } state;
static void snap(sbn_bn *bn, state *s) {
  memset(s, 0, sizeof *s);
  // the layer's stream is non-blocking: cudaMemcpy alone would not wait for it
  CUDA_OK(cudaDeviceSynchronize());
  for (int id = 0; id < 6; id++) {
    sbn_tensor v;
    if (sbn_bn_tensor(&v, bn, (sbn_bn_tensor_id)id) == SBN_STATUS_OK)
      CUDA_OK(cudaMemcpy(s->p[id], v.data, sizeof s->p[id], cudaMemcpyDeviceToHost));
  }
  sbn_bn_get_num_batches_tracked(bn, &s->nbt);
}
static void expect_same(sbn_bn *bn, const state *before, const char *what) {
  state now;
  snap(bn, &now);
  int ok = memcmp(&now, before, sizeof now) == 0;
  printf("  %-4s %s: state unchanged\n", ok ? "ok" : "FAIL", what);
  bad |= !ok;
}

enum { C = 4, N = 6 };
static const int64_t shape[2] = {N, C};

static sbn_tensor tensor(void *data, int index) {
  sbn_tensor t = sbn_tensor_cpu(data, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  t.device = cuda_dev(index);
  return t;
}

static void fill_device(float *dev, int seed) {
  float h[N * C];
  rng r = rng_seed((uint64_t)seed);
  for (int i = 0; i < N * C; i++) h[i] = (float)rng_normal(&r);
  CUDA_OK(cudaMemcpy(dev, h, sizeof h, cudaMemcpyHostToDevice));
}

static void single_rank(int ngpu) {
  sbn_bn_options o = sbn_bn_options_default(C);
  o.device = cuda_dev(0);
  sbn_bn *bn, *cpu;
  if (sbn_bn_create(&bn, &o, NULL) != SBN_STATUS_OK) return (void)(printf("FAIL create\n"), bad = 1);
  float *x = (float *)hook_alloc(4 * N * C), *y = (float *)hook_alloc(4 * N * C), *dy = (float *)hook_alloc(4 * N * C);
  fill_device(x, 1), fill_device(dy, 2);
  float host[N * C] = {0}, *pinned;
  CUDA_OK(cudaMallocHost((void **)&pinned, sizeof host));
  sbn_tensor tx = tensor(x, 0), ty = tensor(y, 0), tdy = tensor(dy, 0), tdx = tensor(y, 0);
  expect("good forward", sbn_bn_forward(bn, &ty, &tx), SBN_STATUS_OK, NULL);
  expect("good backward", sbn_bn_backward(bn, &tdx, &tdy, &tx), SBN_STATUS_OK, NULL);
  state before;
  snap(bn, &before);

  sbn_tensor hx = tensor(host, 0), px = tensor(pinned, 0);
  expect("x in pageable host memory", sbn_bn_forward(bn, &ty, &hx), SBN_STATUS_INVALID_ARGUMENT, "host memory");
  expect("x in pinned host memory", sbn_bn_forward(bn, &ty, &px), SBN_STATUS_INVALID_ARGUMENT, "host memory");
  sbn_tensor hy = tensor(host, 0);
  expect("y in host memory", sbn_bn_forward(bn, &hy, &tx), SBN_STATUS_INVALID_ARGUMENT, "y->data");
  sbn_tensor hdy = tensor(host, 0);
  expect("backward dy in host memory", sbn_bn_backward(bn, &tdx, &hdy, &tx), SBN_STATUS_INVALID_ARGUMENT, "dy->data");
  sbn_tensor cx = tx, cy = ty;
  cx.device.type = cy.device.type = SBN_DEVICE_CPU, cx.device.index = cy.device.index = 0;
  expect("a CPU tensor to a CUDA layer", sbn_bn_forward(bn, &cy, &cx), SBN_STATUS_UNSUPPORTED, "is on cpu");
  sbn_tensor ix = tensor(x, 1), iy = tensor(y, 1);
  expect("a tensor that says cuda:1 to a cuda:0 layer", sbn_bn_forward(bn, &iy, &ix), SBN_STATUS_UNSUPPORTED, "cuda:1");
  expect_same(bn, &before, "after the failed calls");

  sbn_bn_options oc = sbn_bn_options_default(C);
  if (sbn_bn_create(&cpu, &oc, NULL) == SBN_STATUS_OK) {
    expect("a CUDA tensor to a CPU layer", sbn_bn_forward(cpu, &ty, &tx), SBN_STATUS_UNSUPPORTED, "is on cuda:0");
    sbn_bn_destroy(cpu);
  }
  sbn_bn_options bad_dev = o;
  bad_dev.device.index = ngpu;
  sbn_bn *none = NULL;
  expect("a layer on cuda:<count>", sbn_bn_create(&none, &bad_dev, NULL), SBN_STATUS_INVALID_ARGUMENT, "is not a device");
  sbn_bn_options f64 = o;
  f64.param_dtype = SBN_DTYPE_FLOAT64;
  expect("a float64 layer on cuda:0", sbn_bn_create(&none, &f64, NULL), SBN_STATUS_UNSUPPORTED, "CPU only");
  sbn_bn_options huge = o;
  huge.num_features = INT64_C(1) << 62; // sizes that would wrap: refused before the device sees them
  expect("2^62 channels on cuda:0", sbn_bn_create(&none, &huge, NULL), SBN_STATUS_INVALID_ARGUMENT, "at most 2^48");
  huge.num_features = INT64_C(1) << 40; // no wrap: the allocation itself fails
  expect("2^40 channels on cuda:0", sbn_bn_create(&none, &huge, NULL), SBN_STATUS_OUT_OF_MEMORY, "out of memory");
  sbn_tensor dx64 = tx, dy64 = ty;
  dx64.dtype = dy64.dtype = SBN_DTYPE_FLOAT64;
  expect("a float64 tensor to a float32 CUDA layer", sbn_bn_forward(bn, &dy64, &dx64), SBN_STATUS_INVALID_ARGUMENT,
         "float64");
  expect_same(bn, &before, "after the float64 calls");

  if (ngpu >= 2) { // another GPU's memory and stream; the caller's current device is kept
    float *x1;
    cudaStream_t s1;
    CUDA_OK(cudaSetDevice(1));
    CUDA_OK(cudaMalloc((void **)&x1, 4 * N * C));
    CUDA_OK(cudaStreamCreate(&s1));
    sbn_tensor ox = tensor(x1, 0);
    expect("x on cuda:1 memory, layer and tensor cuda:0", sbn_bn_forward(bn, &ty, &ox), SBN_STATUS_INVALID_ARGUMENT,
           "memory of cuda:1");
    expect("a stream of cuda:1", sbn_bn_set_stream(bn, s1), SBN_STATUS_INVALID_ARGUMENT, "cuda:1");
    expect("forward with cuda:1 current", sbn_bn_forward(bn, &ty, &tx), SBN_STATUS_OK, NULL);
    int cur = -1;
    CUDA_OK(cudaGetDevice(&cur));
    printf("  %-4s the caller's current device is still 1 (%d)\n", cur == 1 ? "ok" : "FAIL", cur);
    bad |= cur != 1;
    CUDA_OK(cudaStreamDestroy(s1));
    CUDA_OK(cudaFree(x1));
    CUDA_OK(cudaSetDevice(0));
  } else {
    printf("  (one GPU: the other-GPU checks need two)\n");
  }
  expect("a good backward afterwards", sbn_bn_backward(bn, &tdx, &tdy, &tx), SBN_STATUS_OK, NULL);
  sbn_bn_destroy(bn);
  CUDA_OK(cudaFreeHost(pinned));
  hook_release(x), hook_release(y), hook_release(dy);
}

// ---- 3 thread ranks on one GPU through the host-staged group ----
enum { P = 3 };
typedef struct rres { sbn_status st[4]; char msg[4][512]; int changed, after_ok; } rres;
static rres res[P];

static int rank_fn(sbn_group *world, void *arg) {
  (void)arg;
  const int rank = sbn_group_rank(world);
  rres *rr = &res[rank];
  sbn_group_set_timeout(world, 20);
  sbn_bn_options o = sbn_bn_options_default(C);
  o.device = cuda_dev(0);
  sbn_bn *bn;
  CHECK_OK(sbn_bn_create(&bn, &o, world));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK_OK(sbn_bn_set_stream(bn, s));
  float *x = (float *)hook_alloc(4 * N * C), *y = (float *)hook_alloc(4 * N * C), *dy = (float *)hook_alloc(4 * N * C);
  fill_device(x, 10 + rank), fill_device(dy, 20 + rank);
  float host[N * C] = {0};
  sbn_tensor tx = tensor(x, 0), ty = tensor(y, 0), tdy = tensor(dy, 0);
  CHECK_OK(sbn_bn_forward(bn, &ty, &tx));
  CHECK_OK(sbn_bn_backward(bn, &ty, &tdy, &tx));
  state before, now;
  snap(bn, &before);
  // 0: rank 1 passes a host pointer to forward
  sbn_tensor hx = tensor(host, 0);
  rr->st[0] = sbn_bn_forward(bn, &ty, rank == 1 ? &hx : &tx);
  snprintf(rr->msg[0], sizeof rr->msg[0], "%s", sbn_last_error());
  // 1: rank 2 passes a host dy to backward
  sbn_tensor hdy = tensor(host, 0);
  rr->st[1] = sbn_bn_backward(bn, &ty, rank == 2 ? &hdy : &tdy, &tx);
  snprintf(rr->msg[1], sizeof rr->msg[1], "%s", sbn_last_error());
  // 2: one value per channel over the group (rank 0 has 1 row, the others none)
  sbn_tensor x1 = tx, y1 = ty;
  x1.shape[0] = y1.shape[0] = rank == 0 ? 1 : 0;
  rr->st[2] = sbn_bn_forward(bn, &y1, &x1);
  snprintf(rr->msg[2], sizeof rr->msg[2], "%s", sbn_last_error());
  // 3: capture of a host-staged layer
  cudaGraph_t g = NULL;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  rr->st[3] = sbn_bn_forward(bn, &ty, &tx);
  snprintf(rr->msg[3], sizeof rr->msg[3], "%s", sbn_last_error());
  cudaError_t ce = cudaStreamEndCapture(s, &g);
  if (ce == cudaSuccess && g) cudaGraphDestroy(g);
  (void)cudaGetLastError();
  snap(bn, &now);
  rr->changed = memcmp(&now, &before, sizeof now) != 0;
  rr->after_ok = sbn_bn_forward(bn, &ty, &tx) == SBN_STATUS_OK && sbn_bn_backward(bn, &ty, &tdy, &tx) == SBN_STATUS_OK;
  snap(bn, &now);
  rr->after_ok &= now.nbt == before.nbt + 1;
  sbn_bn_destroy(bn);
  CUDA_OK(cudaStreamDestroy(s));
  hook_release(x), hook_release(y), hook_release(dy);
  return 0;
}

static void team(void) {
  sbn_status st = sbn_team_run(P, rank_fn, NULL);
  if (st != SBN_STATUS_OK) {
    printf("  FAIL team run: %s: %s\n", sbn_status_name(st), sbn_last_error());
    bad = 1;
    return;
  }
  static const char *const what[4] = {"rank 1: x in host memory", "rank 2: backward dy in host memory",
                                      "count 1 over the group", "capture with a host-staged group"};
  for (int k = 0; k < 4; k++) {
    printf("  %s:\n", what[k]);
    for (int p = 0; p < P; p++) {
      sbn_status want = k == 0 ? (p == 1 ? SBN_STATUS_INVALID_ARGUMENT : SBN_STATUS_PEER_FAILED)
                      : k == 1 ? (p == 2 ? SBN_STATUS_INVALID_ARGUMENT : SBN_STATUS_PEER_FAILED)
                      : k == 2 ? SBN_STATUS_INVALID_ARGUMENT
                               : SBN_STATUS_BACKEND_ERROR; // rank-local staging error ...
      sbn_status got = res[p].st[k];
      int ok = got == want || (k == 3 && got == SBN_STATUS_PEER_FAILED); // ... or a peer's
      printf("    %-4s rank %d: %s (\"%s\")\n", ok ? "ok" : "FAIL", p, sbn_status_name(got), res[p].msg[k]);
      bad |= !ok;
    }
  }
  for (int p = 0; p < P; p++) {
    printf("  %-4s rank %d: state %s by the failed calls; a correct step afterwards %s\n",
           !res[p].changed && res[p].after_ok ? "ok" : "FAIL", p, res[p].changed ? "CHANGED" : "unchanged",
           res[p].after_ok ? "works" : "FAILS");
    bad |= res[p].changed || !res[p].after_ok;
  }
}

int main(void) {
  if (!gpu_or_skip("test_cuda_misuse")) return 0;
  int ngpu = 0;
  CUDA_OK(cudaGetDeviceCount(&ngpu));
  printf("one layer:\n");
  single_rank(ngpu);
  printf("%d thread ranks sharing the GPU:\n", P);
  team();
  printf(bad ? "FAILED\n" : "misuse checks passed\n");
  return bad;
}
