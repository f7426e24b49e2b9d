/* The custom (callback) process group, driven by a small engine written
 * here over plain pthreads and shared memory, as a C user would plug in
 * their own communicator:
 *  - equivalence: SyncBN layers on the custom group give the same y, dx,
 *    grad_weight/grad_bias, running statistics and num_batches_tracked as
 *    layers on the threads backend, for the same per-rank data (uneven and
 *    empty ranks, both layouts, 2-D..5-D, momentum None, several steps, eval),
 *    bitwise, although the test engine adds in its own order (the custom
 *    group sums exactly); group all-reduces are exact (1e16 + 1 - 1e16 = 1);
 *  - mismatch: a rank whose layer has a different C makes every rank fail
 *    with SBN_STATUS_MISMATCH (no hang), and the group stays usable; a local
 *    error becomes the rank's own status and PEER_FAILED elsewhere;
 *  - callback errors: SBN_STATUS_BACKEND_ERROR naming the callback, the
 *    returned code and the callback's message; the group is broken after;
 *  - rank/size that do not match the engine are detected;
 *  - split/new_group through a split callback, UNSUPPORTED without one;
 *  - argument checks of sbn_group_create_custom. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "syncbn_custom.h"
#include "testutil.h"

enum { P = 3 };

/* ---- the test's engine: P threads, a barrier and shared slots ---- */

typedef struct engine {
  pthread_barrier_t bar;
  int size;
  atomic_int refs;
  void **bufs;
  int *colors, *keys;
  struct engine **made; /* split: the engine created by each rank's color leader */
} engine;

typedef struct ectx {
  engine *e;
  int rank;
  int calls;   /* allreduce calls so far */
  int fail_at; /* > 0: the allreduce call with this number returns 7 (after completing) */
  int barriers;
} ectx;

static engine *engine_new(int size) {
  engine *e = calloc(1, sizeof *e);
  pthread_barrier_init(&e->bar, NULL, (unsigned)size);
  e->size = size;
  atomic_init(&e->refs, 0); /* one reference per ectx */
  e->bufs = calloc((size_t)size, sizeof *e->bufs);
  e->colors = calloc((size_t)size, sizeof(int));
  e->keys = calloc((size_t)size, sizeof(int));
  e->made = calloc((size_t)size, sizeof *e->made);
  return e;
}

static void engine_release(engine *e) {
  if (atomic_fetch_sub(&e->refs, 1) != 1) return;
  pthread_barrier_destroy(&e->bar);
  free(e->bufs), free(e->colors), free(e->keys), free(e->made), free(e);
}

static ectx *ctx_new(engine *e, int rank) {
  ectx *c = calloc(1, sizeof *c);
  atomic_fetch_add(&e->refs, 1);
  c->e = e, c->rank = rank;
  return c;
}

static int e_allreduce(void *ctx, void *buf, size_t count, sbn_dtype dtype, sbn_device device,
                       void *stream) {
  ectx *c = ctx;
  engine *e = c->e;
  if (device.type != SBN_DEVICE_CPU || stream) { /* (never: the library passes host buffers) */
    sbn_custom_set_error("this engine has no device buffers");
    return 2;
  }
  size_t es = dtype == SBN_DTYPE_FLOAT32 ? 4 : 8;
  char *tmp = malloc(count * es + 1);
  e->bufs[c->rank] = buf;
  pthread_barrier_wait(&e->bar);
  for (size_t i = 0; i < count; i++) {
    if (dtype == SBN_DTYPE_INT64) {
      int64_t s = 0;
      for (int q = 0; q < e->size; q++) s += ((const int64_t *)e->bufs[q])[i];
      ((int64_t *)tmp)[i] = s;
    } else {
      double s = 0; /* in an order that depends on i: an engine's order is its own */
      for (int k = 0; k < e->size; k++) {
        int q = i % 2 ? e->size - 1 - k : k;
        s += dtype == SBN_DTYPE_FLOAT64 ? ((const double *)e->bufs[q])[i] : ((const float *)e->bufs[q])[i];
      }
      if (dtype == SBN_DTYPE_FLOAT64) ((double *)tmp)[i] = s;
      else ((float *)tmp)[i] = (float)s;
    }
  }
  pthread_barrier_wait(&e->bar);
  memcpy(buf, tmp, count * es);
  free(tmp);
  if (++c->calls == c->fail_at) {
    sbn_custom_set_error("injected engine failure");
    return 7;
  }
  return 0;
}

static int e_broadcast(void *ctx, void *buf, size_t bytes, int root, sbn_device device, void *stream) {
  ectx *c = ctx;
  (void)device, (void)stream;
  c->e->bufs[c->rank] = buf;
  pthread_barrier_wait(&c->e->bar);
  if (c->rank != root) memcpy(buf, c->e->bufs[root], bytes);
  pthread_barrier_wait(&c->e->bar);
  return 0;
}

static int e_barrier(void *ctx) {
  ectx *c = ctx;
  c->barriers++;
  pthread_barrier_wait(&c->e->bar);
  return 0;
}

static int e_split(void *ctx, int color, int key, void **new_ctx, int *new_rank, int *new_size) {
  ectx *c = ctx;
  engine *e = c->e;
  e->colors[c->rank] = color, e->keys[c->rank] = key, e->made[c->rank] = NULL;
  pthread_barrier_wait(&e->bar);
  int members[64], m = 0, me = -1;
  for (int r = 0; r < e->size; r++) { /* ordered by (key, rank) */
    if (color < 0 || e->colors[r] != color) continue;
    int i = m++;
    while (i > 0 && e->keys[members[i - 1]] > e->keys[r]) members[i] = members[i - 1], i--;
    members[i] = r;
  }
  for (int i = 0; i < m; i++)
    if (members[i] == c->rank) me = i;
  if (me == 0) e->made[c->rank] = engine_new(m);
  pthread_barrier_wait(&e->bar);
  *new_ctx = NULL;
  if (me >= 0) {
    *new_ctx = ctx_new(e->made[members[0]], me);
    *new_rank = me, *new_size = m;
  }
  pthread_barrier_wait(&e->bar); /* everyone has read made[] */
  return 0;
}

static void e_destroy(void *ctx) { /* every group owns its ctx */
  ectx *c = ctx;
  engine_release(c->e);
  free(c);
}

static const sbn_custom_ops engine_ops = {SBN_CUSTOM_OPS_VERSION, "test-engine", e_allreduce,
                                          e_broadcast, e_barrier, e_split, e_destroy};

/* ---- shared test state ---- */

static engine *world_engine;
static sbn_team *team;
static atomic_int failures;
static double worst[7]; /* y, dx, gw, gb, rm, rv, nbt: max |custom - threads| (guarded by mu) */
static long bitwise_equal, compared;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

#define EXPECT(cond, ...)                                        \
  do {                                                           \
    if (!(cond)) {                                               \
      fprintf(stderr, "FAIL rank %d line %d: ", rank, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                              \
      fprintf(stderr, "\n");                                     \
      atomic_fetch_add(&failures, 1);                            \
    }                                                            \
  } while (0)

static void note(int k, const float *a, const float *b, int64_t n) {
  double m = 0;
  int same = 1;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]) / (1.0 + fabs((double)b[i]));
    if (d > m) m = d;
    if (memcmp(&a[i], &b[i], sizeof(float))) same = 0;
  }
  pthread_mutex_lock(&mu);
  if (m > worst[k]) worst[k] = m;
  bitwise_equal += same, compared++;
  pthread_mutex_unlock(&mu);
}

/* One configuration on both groups with the same data: `steps` training
 * steps (forward + backward), then one eval forward. */
static void equivalence_case(int rank, sbn_group *cg, sbn_group *tg, int cfg_id) {
  rng r = rng_seed(1000 + (uint64_t)cfg_id * 31 + (uint64_t)rank);
  rng shared = rng_seed(77 + (uint64_t)cfg_id); /* same on every rank: the configuration */
  const int ndim = 2 + cfg_id % 4;
  const int64_t C = rng_int(&shared, 1, 7);
  sbn_layout layout = cfg_id % 2 ? SBN_LAYOUT_CHANNELS_LAST : SBN_LAYOUT_CHANNELS_FIRST;
  sbn_bn_options o = sbn_bn_options_default(C);
  o.momentum = cfg_id % 3 == 2 ? SBN_MOMENTUM_CUMULATIVE : 0.1 + 0.1 * (cfg_id % 3);
  o.affine = cfg_id % 5 != 4;
  int64_t shape[SBN_MAX_DIMS] = {rng_int(&r, 0, 3), C, 0, 0, 0}; /* N = 0: an empty rank */
  if (rank == 0 && shape[0] < 2) shape[0] = 2;                    /* the global count stays > 1 */
  for (int d = 2; d < ndim; d++) shape[d] = rng_int(&shared, 1, 4);
  double mean[8], std[8];
  for (int c = 0; c < C; c++) mean[c] = 3 * rng_normal(&shared), std[c] = 0.5 + rng_uniform(&shared);
  sbn_bn *bc = NULL, *bt = NULL;
  sbn_status s1 = sbn_bn_create(&bc, &o, cg), s2 = sbn_bn_create(&bt, &o, tg);
  EXPECT(s1 == SBN_STATUS_OK && s2 == SBN_STATUS_OK, "create: %s", sbn_last_error());
  if (!bc || !bt) return;
  if (o.affine) { /* non-trivial parameters, the same on both */
    sbn_tensor wc, wt;
    sbn_bn_tensor(&wc, bc, SBN_BN_TENSOR_WEIGHT), sbn_bn_tensor(&wt, bt, SBN_BN_TENSOR_WEIGHT);
    for (int c = 0; c < C; c++) ((float *)wc.data)[c] = ((float *)wt.data)[c] = 0.5f + 0.25f * c;
  }
  rank_data dc, dt;
  rank_data_alloc(&dc, ndim, shape, layout);
  rank_data_alloc(&dt, ndim, shape, layout);
  for (int step = 0; step <= 3; step++) {
    int training = step < 3;
    rank_data_fill(&dc, &r, mean, std);
    memcpy(dt.x, dc.x, sizeof(float) * (size_t)dc.numel);
    memcpy(dt.dy, dc.dy, sizeof(float) * (size_t)dc.numel);
    sbn_bn_set_training(bc, training), sbn_bn_set_training(bt, training);
    sbn_tensor xc = rank_tensor(&dc, dc.x), yc = rank_tensor(&dc, dc.y), dyc = rank_tensor(&dc, dc.dy),
               dxc = rank_tensor(&dc, dc.dx);
    sbn_tensor xt = rank_tensor(&dt, dt.x), yt = rank_tensor(&dt, dt.y), dyt = rank_tensor(&dt, dt.dy),
               dxt = rank_tensor(&dt, dt.dx);
    s1 = sbn_bn_forward(bc, &yc, &xc);
    EXPECT(s1 == SBN_STATUS_OK, "custom forward: %s", sbn_last_error());
    s2 = sbn_bn_forward(bt, &yt, &xt);
    EXPECT(s2 == SBN_STATUS_OK, "threads forward: %s", sbn_last_error());
    note(0, dc.y, dt.y, dc.numel);
    if (training) {
      s1 = sbn_bn_backward(bc, &dxc, &dyc, &xc);
      EXPECT(s1 == SBN_STATUS_OK, "custom backward: %s", sbn_last_error());
      s2 = sbn_bn_backward(bt, &dxt, &dyt, &xt);
      EXPECT(s2 == SBN_STATUS_OK, "threads backward: %s", sbn_last_error());
      note(1, dc.dx, dt.dx, dc.numel);
    }
  }
  static const sbn_bn_tensor_id ids[4] = {SBN_BN_TENSOR_GRAD_WEIGHT, SBN_BN_TENSOR_GRAD_BIAS,
                                          SBN_BN_TENSOR_RUNNING_MEAN, SBN_BN_TENSOR_RUNNING_VAR};
  for (int k = o.affine ? 0 : 2; k < 4; k++) {
    sbn_tensor a, b;
    sbn_bn_tensor(&a, bc, ids[k]), sbn_bn_tensor(&b, bt, ids[k]);
    note(2 + k, a.data, b.data, C);
  }
  int64_t na = -1, nb = -2;
  sbn_bn_get_num_batches_tracked(bc, &na), sbn_bn_get_num_batches_tracked(bt, &nb);
  EXPECT(na == 3 && nb == 3, "num_batches_tracked custom %lld threads %lld (expected 3)", (long long)na,
         (long long)nb);
  rank_data_free(&dc), rank_data_free(&dt);
  sbn_bn_destroy(bc), sbn_bn_destroy(bt);
}

static void print_rank0(int rank, const char *what, sbn_status st) {
  if (rank == 0) printf("  %s: %s: %s\n", what, sbn_status_name(st), sbn_last_error());
}

static void *rank_main(void *arg) {
  const int rank = (int)(intptr_t)arg;
  ectx *cc = ctx_new(world_engine, rank), *c = NULL;
  sbn_group *cg = NULL, *tg = NULL;
  sbn_status st = sbn_group_create_custom(&cg, rank, P, &engine_ops, cc);
  EXPECT(st == SBN_STATUS_OK, "create: %s", sbn_last_error());
  st = sbn_team_join(&tg, team, rank);
  EXPECT(st == SBN_STATUS_OK, "join: %s", sbn_last_error());
  if (!cg || !tg) return NULL;
  EXPECT(strcmp(sbn_group_backend(cg), "custom") == 0 && sbn_group_size(cg) == P && sbn_group_rank(cg) == rank,
         "queries: backend %s size %d rank %d", sbn_group_backend(cg), sbn_group_size(cg), sbn_group_rank(cg));

  /* 1. equivalence with the threads backend */
  for (int cfg = 0; cfg < 24; cfg++) equivalence_case(rank, cg, tg, cfg);

  /* 2. group collectives: all-reduce of float32/float64, broadcast, barrier */
  double d[3] = {rank + 0.5, 2.0 * rank, -1.0};
  float f[2] = {(float)rank, 1.0f};
  int64_t bc[2] = {rank == 1 ? 42 : 0, rank == 1 ? -7 : 0};
  int b0 = cc->barriers;
  st = sbn_group_allreduce(cg, d, 3, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
  EXPECT(st == SBN_STATUS_OK && d[0] == 0.5 * P + P * (P - 1) / 2.0 && d[1] == P * (P - 1) && d[2] == -P,
         "allreduce f64 %s: %g %g %g", sbn_last_error(), d[0], d[1], d[2]);
  /* exact and order-independent: 1e16 + 1 - 1e16 is 1 (a float64 sum in
   * either rank order gives 0), as on the threads backend */
  double e1[2] = {rank == 0 ? 1e16 : rank == 1 ? 1.0 : -1e16, rank == 1 ? 1e-300 : 0.1};
  double e2[2] = {e1[0], e1[1]};
  st = sbn_group_allreduce(cg, e1, 2, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
  sbn_status st2 = sbn_group_allreduce(tg, e2, 2, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
  if (rank == 0) printf("  1e16 + 1 - 1e16 over 3 ranks: custom %g, threads %g\n", e1[0], e2[0]);
  EXPECT(st == SBN_STATUS_OK && st2 == SBN_STATUS_OK && e1[0] == 1.0 && !memcmp(e1, e2, sizeof e1),
         "exact sum: custom %.17g %.17g threads %.17g %.17g", e1[0], e1[1], e2[0], e2[1]);
  st = sbn_group_allreduce(cg, f, 2, SBN_DTYPE_FLOAT32, SBN_REDUCE_OP_SUM);
  EXPECT(st == SBN_STATUS_OK && f[0] == P * (P - 1) / 2 && f[1] == P, "allreduce f32: %g %g", f[0], f[1]);
  st = sbn_group_broadcast(cg, bc, sizeof bc, 1);
  EXPECT(st == SBN_STATUS_OK && bc[0] == 42 && bc[1] == -7, "broadcast: %lld %lld", (long long)bc[0],
         (long long)bc[1]);
  st = sbn_group_barrier(cg);
  EXPECT(st == SBN_STATUS_OK && cc->barriers == b0 + 1, "barrier: %s (callback ran %d times)", sbn_last_error(),
         cc->barriers - b0);
  /* a bad root on one rank: every rank fails, nobody hangs */
  st = sbn_group_broadcast(cg, bc, sizeof bc, rank == 2 ? 5 : 0);
  print_rank0(rank, "broadcast with a bad root on rank 2", st);
  EXPECT(st == (rank == 2 ? SBN_STATUS_INVALID_ARGUMENT : SBN_STATUS_PEER_FAILED), "bad root: %s",
         sbn_status_name(st));

  /* 3. mismatch: rank P-1 has C = 5, the others C = 4 */
  {
    sbn_bn_options o = sbn_bn_options_default(rank == P - 1 ? 5 : 4);
    sbn_bn *bn;
    sbn_bn_create(&bn, &o, cg);
    float x[20], y[20];
    for (int i = 0; i < 20; i++) x[i] = (float)(i * 7 % 11) + rank;
    int64_t shape[2] = {4, o.num_features};
    sbn_tensor tx = sbn_tensor_cpu(x, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    sbn_tensor ty = sbn_tensor_cpu(y, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    sbn_tensor rm;
    sbn_bn_tensor(&rm, bn, SBN_BN_TENSOR_RUNNING_MEAN);
    st = sbn_bn_forward(bn, &ty, &tx);
    print_rank0(rank, "different C on rank 2", st);
    EXPECT(st == SBN_STATUS_MISMATCH && strstr(sbn_last_error(), "C=5") && strstr(sbn_last_error(), "C=4"),
           "mismatch: %s: %s", sbn_status_name(st), sbn_last_error());
    int64_t nbt = -1;
    sbn_bn_get_num_batches_tracked(bn, &nbt);
    EXPECT(nbt == 0 && ((float *)rm.data)[0] == 0.0f, "state changed by a failed forward");
    sbn_bn_destroy(bn);
    /* the group is still usable: a matching layer and a local error */
    o = sbn_bn_options_default(4);
    sbn_bn_create(&bn, &o, cg);
    shape[1] = 4;
    tx = sbn_tensor_cpu(x, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    ty = sbn_tensor_cpu(y, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    st = sbn_bn_forward(bn, &ty, &tx);
    EXPECT(st == SBN_STATUS_OK, "forward after a mismatch: %s", sbn_last_error());
    int64_t bad_shape[2] = {4, 3};
    sbn_tensor tbad = sbn_tensor_cpu(x, 2, bad_shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    st = sbn_bn_forward(bn, rank == 0 ? &tbad : &ty, rank == 0 ? &tbad : &tx);
    print_rank0(rank, "bad input on rank 0", st);
    if (rank == 1) printf("  bad input on rank 0, seen on rank 1: %s: %s\n", sbn_status_name(st), sbn_last_error());
    EXPECT(st == (rank == 0 ? SBN_STATUS_INVALID_ARGUMENT : SBN_STATUS_PEER_FAILED), "local error: %s",
           sbn_status_name(st));
    sbn_bn_destroy(bn);
  }

  /* 4. split and new_group through the split callback */
  {
    sbn_group *half = NULL, *pair = NULL;
    st = sbn_group_split(&half, cg, rank % 2, -rank);
    EXPECT(st == SBN_STATUS_OK && half, "split: %s", sbn_last_error());
    if (half) {
      double v[1] = {rank + 1.0};
      st = sbn_group_allreduce(half, v, 1, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
      double expect = rank % 2 ? 2.0 : 1.0 + 3.0; /* {1} or {0, 2} (P = 3) */
      EXPECT(st == SBN_STATUS_OK && v[0] == expect, "split allreduce %g (expected %g)", v[0], expect);
      EXPECT(sbn_group_contains(cg, half) && !sbn_group_contains(half, cg), "lineage of the split");
      EXPECT(sbn_group_rank(half) == (rank == 2 ? 0 : rank == 0 ? 1 : 0), "split order by key: rank %d",
             sbn_group_rank(half));
      sbn_group_destroy(half);
    }
    int ranks[2] = {2, 0};
    st = sbn_group_new(&pair, cg, 2, ranks);
    if (rank == 1) EXPECT(st == SBN_STATUS_NOT_MEMBER && !pair, "new_group non-member: %s", sbn_status_name(st));
    else EXPECT(st == SBN_STATUS_OK && pair && sbn_group_rank(pair) == (rank == 2 ? 0 : 1), "new_group: %s",
                sbn_last_error());
    if (pair) {
      sbn_bn_options o = sbn_bn_options_default(2);
      sbn_bn *bn;
      float x[4] = {1.0f * rank, 2.0f, 3.0f + rank, -1.0f}, y[4];
      int64_t shape[2] = {2, 2};
      sbn_tensor tx = sbn_tensor_cpu(x, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
      sbn_tensor ty = sbn_tensor_cpu(y, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
      sbn_bn_create(&bn, &o, pair);
      st = sbn_bn_forward(bn, &ty, &tx);
      sbn_tensor rm;
      sbn_bn_tensor(&rm, bn, SBN_BN_TENSOR_RUNNING_MEAN);
      /* channel 0 over ranks {0, 2}: values 0, 3, 2, 5 -> mean 2.5; running 0.25 */
      EXPECT(st == SBN_STATUS_OK && fabsf(((float *)rm.data)[0] - 0.25f) < 1e-6f, "layer on new_group: %s %g",
             sbn_last_error(), ((float *)rm.data)[0]);
      sbn_bn_destroy(bn);
      sbn_group_destroy(pair);
    }
  }

  /* 5. no split callback: UNSUPPORTED on every rank, without communication */
  {
    sbn_custom_ops ops = engine_ops;
    ops.split = NULL, ops.barrier = NULL;
    sbn_group *g2, *sub = NULL;
    c = ctx_new(world_engine, rank);
    sbn_group_create_custom(&g2, rank, P, &ops, c);
    st = sbn_group_split(&sub, g2, 0, rank);
    print_rank0(rank, "split without a split callback", st);
    EXPECT(st == SBN_STATUS_UNSUPPORTED && !sub && strstr(sbn_last_error(), "split callback"), "split: %s",
           sbn_status_name(st));
    st = sbn_group_barrier(g2); /* barrier = the signature reduction */
    EXPECT(st == SBN_STATUS_OK, "barrier without callback: %s", sbn_last_error());
    sbn_group_destroy(g2);
  }

  /* 6. the engine fails on every rank in the layer's payload reduction */
  {
    sbn_group *g3;
    c = ctx_new(world_engine, rank);
    sbn_group_create_custom(&g3, rank, P, &engine_ops, c);
    sbn_bn_options o = sbn_bn_options_default(2);
    sbn_bn *bn;
    sbn_bn_create(&bn, &o, g3);
    float x[4] = {1.0f + rank, 2.0f, 3.0f, 4.0f * rank}, y[4];
    int64_t shape[2] = {2, 2};
    sbn_tensor tx = sbn_tensor_cpu(x, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    sbn_tensor ty = sbn_tensor_cpu(y, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    c->fail_at = c->calls + 2; /* header passes, payload fails */
    st = sbn_bn_forward(bn, &ty, &tx);
    print_rank0(rank, "engine failure in the payload", st);
    EXPECT(st == SBN_STATUS_BACKEND_ERROR && strstr(sbn_last_error(), "allreduce callback returned 7") &&
               strstr(sbn_last_error(), "injected engine failure") && strstr(sbn_last_error(), "forward of layer"),
           "callback error: %s: %s", sbn_status_name(st), sbn_last_error());
    int64_t nbt = -1;
    sbn_bn_get_num_batches_tracked(bn, &nbt);
    EXPECT(nbt == 0, "num_batches_tracked changed by a failed forward: %lld", (long long)nbt);
    int calls = c->calls;
    st = sbn_bn_forward(bn, &ty, &tx);
    print_rank0(rank, "next call", st);
    EXPECT(st == SBN_STATUS_GROUP_BROKEN && c->calls == calls, "after failure: %s (%d engine calls)",
           sbn_status_name(st), c->calls - calls);
    c->fail_at = 0;
    sbn_bn_destroy(bn);
    sbn_group_destroy(g3);
  }

  /* 7. the engine fails on rank 1 only, in the last reduction of a call */
  {
    sbn_group *g4;
    c = ctx_new(world_engine, rank);
    sbn_group_create_custom(&g4, rank, P, &engine_ops, c);
    double v[2] = {1, 2};
    if (rank == 1) c->fail_at = c->calls + 2;
    st = sbn_group_allreduce(g4, v, 2, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
    if (rank == 1) printf("  engine failure on rank 1 only: %s: %s\n", sbn_status_name(st), sbn_last_error());
    EXPECT(st == (rank == 1 ? SBN_STATUS_BACKEND_ERROR : SBN_STATUS_OK), "one-rank failure: %s",
           sbn_status_name(st));
    if (rank == 1) {
      st = sbn_group_barrier(g4); /* fails at once, alone: no engine call */
      EXPECT(st == SBN_STATUS_GROUP_BROKEN, "broken group: %s", sbn_status_name(st));
    }
    c->fail_at = 0;
    sbn_group_destroy(g4);
  }

  /* 8. a group whose size is not the engine's */
  {
    sbn_group *g5;
    c = ctx_new(world_engine, rank);
    sbn_group_create_custom(&g5, rank, P + 1, &engine_ops, c);
    double v[1] = {1};
    st = sbn_group_allreduce(g5, v, 1, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
    print_rank0(rank, "group size 4 over a 3-rank engine", st);
    EXPECT(st == SBN_STATUS_BACKEND_ERROR && strstr(sbn_last_error(), "summed 3 contributions"),
           "size check: %s", sbn_last_error());
    sbn_group_destroy(g5);
  }

  sbn_group_destroy(cg);
  sbn_group_destroy(tg);
  return NULL;
}

static int create_checks(void) {
  const int rank = -1;
  sbn_group *g = NULL;
  sbn_custom_ops ops = engine_ops;
  ectx c = {0}; /* never used: every create below fails */
  sbn_status st = sbn_group_create_custom(&g, 0, 2, NULL, &c);
  EXPECT(st == SBN_STATUS_INVALID_ARGUMENT && !g, "NULL ops accepted");
  ops.version = 99;
  st = sbn_group_create_custom(&g, 0, 2, &ops, &c);
  printf("  version 99: %s: %s\n", sbn_status_name(st), sbn_last_error());
  EXPECT(st == SBN_STATUS_INVALID_ARGUMENT && !g, "wrong version accepted");
  ops = engine_ops;
  ops.allreduce = NULL;
  st = sbn_group_create_custom(&g, 0, 2, &ops, &c);
  EXPECT(st == SBN_STATUS_INVALID_ARGUMENT && !g && strstr(sbn_last_error(), "allreduce"), "no allreduce accepted");
  st = sbn_group_create_custom(&g, 2, 2, &engine_ops, &c);
  EXPECT(st == SBN_STATUS_INVALID_ARGUMENT && !g, "rank 2 of 2 accepted");
  st = sbn_group_create_custom(&g, 0, 0, &engine_ops, &c);
  EXPECT(st == SBN_STATUS_INVALID_ARGUMENT && !g, "size 0 accepted");
  return 0;
}

int main(void) {
  printf("argument checks:\n");
  create_checks();
  world_engine = engine_new(P);
  atomic_fetch_add(&world_engine->refs, 1); /* main's reference */
  sbn_team_create(&team, P);
  printf("%d ranks (custom engine over pthreads vs threads backend):\n", P);
  pthread_t t[P];
  for (int r = 0; r < P; r++) pthread_create(&t[r], NULL, rank_main, (void *)(intptr_t)r);
  for (int r = 0; r < P; r++) pthread_join(t[r], NULL);
  sbn_team_destroy(team);
  engine_release(world_engine); /* main's reference */
  /* The custom group sums the layer's payloads exactly (all-gather through
   * the engine's sum, then the exact merge the threads backend uses), so the
   * results must be bitwise those of the threads backend although the test
   * engine adds in a different order. */
  const double tol = 0;
  static const char *names[6] = {"y", "dx", "grad_weight", "grad_bias", "running_mean", "running_var"};
  printf("custom vs threads, 24 configurations x %d ranks (max |a-b|/(1+|b|)):\n", P);
  for (int k = 0; k < 6; k++) failures += check(names[k], worst[k], tol);
  printf("bitwise equal: %ld of %ld compared arrays\n", bitwise_equal, compared);
  if (bitwise_equal != compared) {
    printf("FAIL: not bitwise equal to the threads backend\n");
    failures++;
  }
  if (compared < 24 * P * 6) {
    printf("FAIL: only %ld arrays compared\n", compared);
    failures++;
  }
  printf("%s\n", failures ? "FAILED" : "all custom-group checks passed");
  return failures ? 1 : 0;
}
