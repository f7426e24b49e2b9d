/* A rank whose forward or backward fails on its own, where no collective
 * carries the failure to its peers (a Linear before the first SyncBN layer
 * refuses the input), must not leave them waiting
 * until their timeout (60 s here): it leaves the wrapper's groups, and the
 * peers' waits fail at once with SBN_STATUS_GROUP_BROKEN naming the rank and
 * its error. A bad input to a SyncBN layer itself is carried by that layer's
 * collective: the peers get SBN_STATUS_PEER_FAILED and the group stays
 * usable (the next correct step works everywhere). With the SyncBN layers
 * on sub-groups of the wrapper's group, the peer waiting in a sub-group's
 * collective is released too. Backward's own preconditions are agreed on:
 * sbn_dp_backward before any forward on every rank is SBN_STATUS_BAD_STATE
 * everywhere, a NULL dy or a dy of the wrong shape on one rank fails there
 * and is PEER_FAILED on the others, and either way the group stays usable. Whatever failed, every
 * rank's gradients are as before the failing call (they were not zero: a
 * step ran first), and after a failed backward sbn_dp_step is refused until
 * a backward succeeds. 3 thread ranks; under mpirun (built with
 * SBN_TEST_WITH_MPI), the same over the MPI processes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "syncbn_dp.h"
#ifdef SBN_TEST_WITH_MPI
#include <mpi.h>

#include "syncbn_mpi.h"
#endif

enum { P = 3, MAXP = 8, N = 4, IN = 4, HID = 6, OUT = 3, BAD_RANK = 1 };
static const double TIMEOUT_S = 60, LIMIT_S = 5;

typedef struct outcome {
  sbn_status st;
  char msg[400];
  double seconds;
  sbn_status after; /* a correct step afterwards (where the group stays usable) */
  int warm_ok;      /* the step before the failing one succeeded */
  int grads_kept;   /* the gradients are bitwise as before the failing call */
  sbn_status step;  /* sbn_dp_step after a failed backward */
} outcome;
enum { SCENARIOS = 6 };
static outcome res[SCENARIOS][MAXP];
/* 0: Linear refuses x; 1: bad dy; 2: SyncBN refuses x; 3: as 0, the SyncBN
 * layers on sub-groups ({0, 1} and {2}); 4: backward before any forward on
 * every rank; 5: dy NULL on rank 1 */
static int scenario;

static int group_stays_usable(void) { return scenario == 1 || scenario == 2 || scenario == 4 || scenario == 5; }
static int fails_in_backward(void) { return scenario == 1 || scenario == 4 || scenario == 5; }

/* Every parameter gradient of m, concatenated (malloc'ed), or NULL. */
static float *grads_copy(sbn_module *m, int64_t *total) {
  sbn_nn_entry *e;
  int n;
  *total = 0;
  if (sbn_module_entries(&e, &n, m, SBN_NN_PARAMETERS) != SBN_STATUS_OK) return NULL;
  for (int i = 0; i < n; i++) *total += e[i].numel;
  float *g = malloc(sizeof(float) * (size_t)(*total + 1));
  int64_t at = 0;
  for (int i = 0; g && i < n; i++) memcpy(g + at, e[i].grad, sizeof(float) * (size_t)e[i].numel), at += e[i].numel;
  free(e);
  return g;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static sbn_tensor t2(float *data, int64_t n, int64_t c) {
  sbn_tensor t = {0};
  t.data = data, t.ndim = 2, t.shape[0] = n, t.shape[1] = c;
  t.dtype = SBN_DTYPE_FLOAT32, t.layout = SBN_LAYOUT_CHANNELS_FIRST;
  return t;
}

/* scenario 2 puts the SyncBN layer first, so that it sees the bad input */
static sbn_status build(sbn_module **out, sbn_group *world, sbn_group **sub) {
  sbn_module *seq = NULL, *lin1 = NULL, *bn = NULL, *lin2 = NULL;
  sbn_status st = sbn_nn_sequential_create(&seq);
  const int bn_first = scenario == 2;
  if (st == SBN_STATUS_OK) st = sbn_nn_linear_create(&lin1, IN, HID, 1, 11);
  sbn_bn_options o = sbn_bn_options_default(bn_first ? IN : HID);
  sbn_group *bn_group = world;
  if (st == SBN_STATUS_OK && scenario == 3) {
    st = sbn_group_split(sub, world, sbn_group_rank(world) < 2 ? 0 : 1, 0);
    bn_group = *sub;
  }
  if (st == SBN_STATUS_OK) st = sbn_nn_sync_batchnorm_create(&bn, &o, bn_group);
  if (st == SBN_STATUS_OK) st = sbn_nn_linear_create(&lin2, HID, OUT, 1, 12);
  if (st == SBN_STATUS_OK && bn_first) st = sbn_nn_sequential_append(seq, "bn", bn);
  if (st == SBN_STATUS_OK) st = sbn_nn_sequential_append(seq, "lin1", lin1);
  if (st == SBN_STATUS_OK && !bn_first) st = sbn_nn_sequential_append(seq, "bn", bn);
  if (st == SBN_STATUS_OK) st = sbn_nn_sequential_append(seq, "lin2", lin2);
  *out = seq;
  return st;
}

static int rank_main(sbn_group *world, void *arg) {
  (void)arg;
  const int rank = sbn_group_rank(world);
  outcome *o = &res[scenario][rank];
  memset(o, 0, sizeof *o);
  sbn_group_set_timeout(world, TIMEOUT_S);
  sbn_module *model = NULL;
  sbn_group *sub = NULL;
  if (build(&model, world, &sub) != SBN_STATUS_OK) {
    snprintf(o->msg, sizeof o->msg, "build: %s", sbn_last_error());
    return 1;
  }
  sbn_dp *dp = NULL;
  if (sbn_dp_wrap(&dp, model, NULL, 0, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, world, NULL) != SBN_STATUS_OK) {
    snprintf(o->msg, sizeof o->msg, "wrap: %s", sbn_last_error());
    return 1;
  }
  float x[N * 8], dy[N * OUT];
  for (int i = 0; i < N * 8; i++) x[i] = (float)sin(1.0 + i + 7.0 * rank);
  for (int i = 0; i < N * OUT; i++) dy[i] = (float)cos(2.0 + i);
  const int bad = rank == BAD_RANK;
  sbn_tensor tx = t2(x, N, bad && (scenario == 0 || scenario == 2 || scenario == 3) ? IN + 1 : IN), ty, tdy = t2(dy, N, OUT);
  if (scenario == 3) sbn_group_set_timeout(sub, TIMEOUT_S);
  if (bad && scenario == 1) tdy.shape[1] = OUT + 1, tdy.shape[0] = N - 1; /* same bytes, wrong shape */
  /* A correct step first, so that the gradients a failure must keep are not
   * zero (scenario 4 needs a model without a forward: it starts cold). */
  sbn_tensor good_x = t2(x, N, IN), good_dy = t2(dy, N, OUT);
  o->warm_ok = scenario == 4 || (sbn_dp_forward(dp, &ty, &good_x) == SBN_STATUS_OK &&
                                 sbn_dp_backward(dp, NULL, &good_dy) == SBN_STATUS_OK);
  int64_t ng = 0, ng_after = 0;
  float *before = grads_copy(model, &ng);
  double t0 = now();
  o->st = scenario == 4 ? SBN_STATUS_OK : sbn_dp_forward(dp, &ty, &tx);
  if (o->st == SBN_STATUS_OK) o->st = sbn_dp_backward(dp, NULL, scenario == 5 && bad ? NULL : &tdy);
  o->seconds = now() - t0;
  snprintf(o->msg, sizeof o->msg, "%s", sbn_last_error());
  float *after = grads_copy(model, &ng_after);
  o->grads_kept = before && after && ng == ng_after && !memcmp(before, after, sizeof(float) * (size_t)ng);
  free(before), free(after);
  if (fails_in_backward()) o->step = sbn_dp_step(dp);
  if (group_stays_usable()) { /* a correct step everywhere, and stepping is allowed again */
    o->after = sbn_dp_forward(dp, &ty, &good_x);
    if (o->after == SBN_STATUS_OK) o->after = sbn_dp_backward(dp, NULL, &good_dy);
    if (o->after == SBN_STATUS_OK) o->after = sbn_dp_step(dp);
  }
  sbn_dp_destroy(dp);
  sbn_module_destroy(model);
  sbn_group_destroy(sub);
  return 0;
}

static const char *const what[SCENARIOS] = {"Linear refuses x on rank 1", "bad dy on rank 1",
                                            "SyncBN refuses x on rank 1", "as the first, sub-group SyncBN",
                                            "backward before forward", "dy NULL on rank 1"};

/* The outcomes of one scenario on ranks 0..n-1: how many checks failed. */
static int judge(int n) {
  int failures = 0;
  for (int r = 0; r < n; r++) {
      const outcome *o = &res[scenario][r];
      const sbn_status want = scenario == 4          ? SBN_STATUS_BAD_STATE /* every rank's own error */
                              : r == BAD_RANK        ? SBN_STATUS_INVALID_ARGUMENT
                              : group_stays_usable() ? SBN_STATUS_PEER_FAILED
                                                     : SBN_STATUS_GROUP_BROKEN;
      int ok = o->st == want && o->seconds < LIMIT_S && o->warm_ok && o->grads_kept;
      if (r != BAD_RANK && scenario != 4) ok = ok && strstr(o->msg, "rank 1") != NULL;
      if (scenario == 4) ok = ok && strstr(o->msg, "no successful forward") != NULL;
      if (r != BAD_RANK && (scenario == 0 || scenario == 3))
        ok = ok && strstr(o->msg, "Linear") != NULL; /* the reason travels */
      if (fails_in_backward()) ok = ok && o->step == SBN_STATUS_BAD_STATE;
      if (group_stays_usable()) ok = ok && o->after == SBN_STATUS_OK;
      failures += !ok;
      printf("%-4s %-28s rank %d: %-28s in %.3f s (limit %.0f s, timeout %.0f s), gradients %s%s%s%s%s: "
             "\"%.150s\"\n",
             ok ? "ok" : "FAIL", what[scenario], r, sbn_status_name(o->st), o->seconds, LIMIT_S, TIMEOUT_S,
             o->grads_kept ? "kept" : "CHANGED", fails_in_backward() ? ", step " : "",
             fails_in_backward() ? sbn_status_name(o->step) : "", group_stays_usable() ? ", next step " : "",
             group_stays_usable() ? sbn_status_name(o->after) : "", o->msg);
  }
  return failures;
}

#ifdef SBN_TEST_WITH_MPI
/* Each scenario on a group of its own (a rank that gives up breaks it). */
static int over_mpi(int *argc, char ***argv) {
  MPI_Init(argc, argv);
  int rank = 0, n = 1, failures = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n < 2 || n > MAXP) {
    if (!rank) printf("FAIL: run with 2..%d processes\n", MAXP);
    MPI_Finalize();
    return 1;
  }
  for (scenario = 0; scenario < SCENARIOS; scenario++) {
    sbn_group *world = NULL;
    MPI_Comm comm = MPI_COMM_WORLD;
    int bad = sbn_group_from_mpi_comm(&world, &comm, sizeof comm) != SBN_STATUS_OK || rank_main(world, NULL) != 0;
    sbn_group_destroy(world);
    MPI_Gather(&res[scenario][rank], (int)sizeof(outcome), MPI_BYTE, res[scenario], (int)sizeof(outcome), MPI_BYTE,
               0, MPI_COMM_WORLD);
    int any = 0;
    MPI_Reduce(&bad, &any, 1, MPI_INT, MPI_MAX, 0, MPI_COMM_WORLD);
    if (!rank) failures += any + judge(n);
  }
  MPI_Finalize();
  if (!rank) printf(failures ? "FAILED: %d checks (MPI)\n" : "local failures reach every MPI rank at once: all checks passed\n", failures);
  return rank ? 0 : failures != 0;
}
#endif

int main(int argc, char **argv) {
#ifdef SBN_TEST_WITH_MPI
  if (getenv("OMPI_COMM_WORLD_SIZE")) return over_mpi(&argc, &argv);
#else
  (void)argc, (void)argv;
#endif
  int failures = 0;
  for (scenario = 0; scenario < SCENARIOS; scenario++) {
    if (sbn_team_run(P, rank_main, NULL) != SBN_STATUS_OK) {
      printf("FAIL %s: %s\n", what[scenario], sbn_last_error());
      failures++;
      continue;
    }
    failures += judge(P);
  }
  if (failures) {
    printf("FAILED: %d checks\n", failures);
    return 1;
  }
  printf("local failures reach every rank at once: all checks passed\n");
  return 0;
}
