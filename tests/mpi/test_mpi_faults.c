/* Misuse and faults across MPI processes (run under mpirun; see run_mpi.sh).
 *
 *   test_mpi_faults mismatch   ranks disagree (layer C, which layer, which
 *                              collective, count, a payload beyond the
 *                              envelope, a local error): every rank must get
 *                              an error at once, and the group stays usable.
 *   test_mpi_faults timeout    the last rank arrives late: the others must
 *                              get SBN_STATUS_TIMEOUT after the group's
 *                              timeout naming it, the late rank an error too.
 *   test_mpi_faults timeout_exact   two ranks missing, the waiting ranks
 *                              skewed: exact list of the missing ranks and
 *                              SBN_STATUS_TIMEOUT on every waiting rank.
 *   test_mpi_faults forever    SYNCBN_TIMEOUT=1e30: waits, sleeping.
 *   test_mpi_faults kill       rank 1 SIGKILLs itself mid-training (the
 *                              wrapper checks that the job ends quickly).
 *   test_mpi_faults stop       rank 1 SIGSTOPs itself mid-training (alive
 *                              but gone): the others time out (SYNCBN_TIMEOUT)
 *                              with a message naming rank 1 and abort.
 * Every rank's status and message are printed; exit 0 when all are as
 * expected. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../src/comm/mpi_paths.h"
#include "syncbn_mpi.h"
#include "testutil.h"

static int rank, P;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct outcome {
  int st;
  double secs;
  char msg[512];
} outcome;

/* Gather every rank's outcome at rank 0, print them, and check them:
 * expect(rank) is the status each rank must get. Returns failures (on all
 * ranks). */
static int report(const char *name, outcome *mine, sbn_status (*expect)(int r), double max_secs) {
  outcome *all = rank == 0 ? malloc(sizeof *all * (size_t)P) : NULL;
  MPI_Gather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE, 0, MPI_COMM_WORLD);
  int bad = 0;
  if (rank == 0) {
    printf("--- %s\n", name);
    for (int r = 0; r < P; r++) {
      int ok = all[r].st == (int)expect(r) && all[r].secs <= max_secs && (all[r].st == 0 || all[r].msg[0]);
      bad += !ok;
      printf("  rank %d: %-26s in %.3f s (limit %.1f s, expected %s) %s\n      \"%s\"\n", r,
             sbn_status_name((sbn_status)all[r].st), all[r].secs, max_secs, sbn_status_name(expect(r)),
             ok ? "ok" : "FAIL", all[r].msg);
    }
    free(all);
  }
  MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return bad;
}

static void record(outcome *o, sbn_status st, double t0) {
  o->st = (int)st;
  o->secs = now_s() - t0;
  snprintf(o->msg, sizeof o->msg, "%s", st == SBN_STATUS_OK ? "" : sbn_last_error());
}

static sbn_status all_mismatch(int r) { (void)r; return SBN_STATUS_MISMATCH; }
static sbn_status all_ok(int r) { (void)r; return SBN_STATUS_OK; }
static sbn_status rank1_invalid(int r) { return r == 1 ? SBN_STATUS_INVALID_ARGUMENT : SBN_STATUS_PEER_FAILED; }

/* A rank's tensors for a layer of C channels (random, non-constant). */
typedef struct io { rank_data d; sbn_tensor x, y, dy, dx; } io;
static void io_make(io *t, int64_t C, uint64_t seed) {
  int64_t shape[3] = {3, C, 5};
  rank_data_alloc(&t->d, 3, shape, SBN_LAYOUT_CHANNELS_FIRST);
  rng r = rng_seed(seed);
  double *mean = malloc(8 * (size_t)C), *std = malloc(8 * (size_t)C);
  for (int64_t c = 0; c < C; c++) mean[c] = rng_normal(&r), std[c] = 0.5 + rng_uniform(&r);
  rank_data_fill(&t->d, &r, mean, std);
  free(mean), free(std);
  t->x = rank_tensor(&t->d, t->d.x), t->y = rank_tensor(&t->d, t->d.y);
  t->dy = rank_tensor(&t->d, t->d.dy), t->dx = rank_tensor(&t->d, t->d.dx);
}

static int mode_mismatch(sbn_group *world) {
  int bad = 0;
  outcome o;
  double t0;
  sbn_group_set_timeout(world, 20); /* a hang would show as TIMEOUT (and fail), not block CI */
  sbn_bn_options o8 = sbn_bn_options_default(8);
  sbn_bn_options oc = sbn_bn_options_default(rank == P - 1 ? 9 : 8);
  sbn_bn_options big = sbn_bn_options_default(rank == 0 ? 8192 : 8);
  sbn_bn *a, *b, *c, *d;
  CHECK_OK(sbn_bn_create(&a, &o8, world));  /* layer #0 */
  CHECK_OK(sbn_bn_create(&b, &o8, world));  /* layer #1 */
  CHECK_OK(sbn_bn_create(&c, &oc, world));  /* layer #2: C differs on the last rank */
  CHECK_OK(sbn_bn_create(&d, &big, world)); /* layer #3: C = 8192 on rank 0 (beyond the envelope) */
  io t8, t9, tbig, twrong;
  io_make(&t8, 8, 10 + rank), io_make(&t9, oc.num_features, 20 + rank);
  io_make(&tbig, big.num_features, 30 + rank), io_make(&twrong, 7, 40 + rank);

  t0 = now_s();
  record(&o, sbn_bn_forward(a, &t8.y, &t8.x) == SBN_STATUS_OK ? sbn_bn_backward(a, &t8.dx, &t8.dy, &t8.x) : SBN_STATUS_INTERNAL, t0);
  bad += report("a correct step first", &o, all_ok, 5);

  t0 = now_s();
  record(&o, sbn_bn_forward(c, &t9.y, &t9.x), t0);
  bad += report("layers with different C (last rank C=9, others C=8)", &o, all_mismatch, 5);

  t0 = now_s();
  record(&o, sbn_bn_forward(rank == 0 ? b : a, &t8.y, &t8.x), t0);
  bad += report("ranks call different layers (rank 0 layer #1, others layer #0)", &o, all_mismatch, 5);

  t0 = now_s();
  record(&o, sbn_bn_forward(d, &tbig.y, &tbig.x), t0);
  bad += report("payload beyond the envelope on rank 0 only (C=8192 vs 8)", &o, all_mismatch, 5);

  t0 = now_s();
  record(&o, sbn_bn_forward(a, rank == 1 ? &twrong.y : &t8.y, rank == 1 ? &twrong.x : &t8.x), t0);
  bad += report("bad input on rank 1 (C=7 for a C=8 layer)", &o, rank1_invalid, 5);

  double buf[100];
  for (int i = 0; i < 100; i++) buf[i] = i + rank;
  t0 = now_s();
  record(&o, rank == 0 ? sbn_group_barrier(world) : sbn_group_allreduce(world, buf, 10, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM), t0);
  bad += report("different collectives (rank 0 barrier, others allreduce)", &o, all_mismatch, 5);

  t0 = now_s();
  record(&o, sbn_group_allreduce(world, buf, rank == 1 ? 100 : 10, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM), t0);
  bad += report("allreduce counts differ (rank 1: 100, others 10)", &o, all_mismatch, 5);

  t0 = now_s();
  record(&o, sbn_bn_forward(rank == 0 ? a : b, &t8.y, &t8.x), t0); /* b's ordinal vs a's */
  bad += report("ranks call different layers again (rank 0 layer #0, others layer #1)", &o, all_mismatch, 5);

  t0 = now_s();
  sbn_status st = sbn_bn_forward(a, &t8.y, &t8.x);
  if (st == SBN_STATUS_OK) st = sbn_bn_backward(a, &t8.dx, &t8.dy, &t8.x);
  record(&o, st, t0);
  bad += report("the group is still usable: a correct step", &o, all_ok, 5);

  uint64_t paths[SBN_MPI_PATHS];
  sbn_mpi_path_counts(world, paths);
  if (rank == 0) /* evidence of the path the agreement took (run_mpi.sh leaves this line out of its diff) */
    printf("paths: sums in integer lanes %llu, lanes then binned %llu, binned %llu, two-rank %llu\n",
           (unsigned long long)paths[0], (unsigned long long)paths[1], (unsigned long long)paths[2],
           (unsigned long long)paths[3]);
  sbn_bn_destroy(a), sbn_bn_destroy(b), sbn_bn_destroy(c), sbn_bn_destroy(d);
  rank_data_free(&t8.d), rank_data_free(&t9.d), rank_data_free(&tbig.d), rank_data_free(&twrong.d);
  return bad;
}

static int late_rank;
static sbn_status timeout_expect(int r) { return r == late_rank ? SBN_STATUS_GROUP_BROKEN : SBN_STATUS_TIMEOUT; }
static sbn_status broken_expect(int r) { (void)r; return SBN_STATUS_GROUP_BROKEN; }

static int mode_timeout(sbn_group *world) {
  const double timeout = 1.5;
  late_rank = P - 1;
  sbn_group_set_timeout(world, timeout);
  sbn_bn_options opt = sbn_bn_options_default(8);
  sbn_bn *a;
  CHECK_OK(sbn_bn_create(&a, &opt, world));
  io t;
  io_make(&t, 8, 50 + rank);
  CHECK_OK(sbn_bn_forward(a, &t.y, &t.x));
  CHECK_OK(sbn_bn_backward(a, &t.dx, &t.dy, &t.x));
  outcome o;
  if (rank == late_rank) sleep(4); /* arrives after the others gave up */
  double t0 = now_s();
  sbn_status st = sbn_bn_forward(a, &t.y, &t.x);
  /* The late rank: told by the notice of the ranks that gave up (or, had it
   * not arrived yet, its own timeout in the backward). */
  if (rank == late_rank && st == SBN_STATUS_OK) st = sbn_bn_backward(a, &t.dx, &t.dy, &t.x);
  record(&o, st, t0);
  int bad = 0;
  if (rank != late_rank) {
    char want[64];
    snprintf(want, sizeof want, "waiting for rank(s) %d", late_rank);
    if (!strstr(o.msg, want) || !strstr(o.msg, "forward of layer #0") || o.secs < timeout - 0.05) {
      fprintf(stderr, "rank %d: message or timing wrong (want \"%s\", >= %.1f s)\n", rank, want, timeout);
      o.st = -1;
    }
  }
  bad += report("last rank arrives 4 s late, timeout 1.5 s", &o, timeout_expect, timeout + 1.5);
  t0 = now_s();
  record(&o, sbn_bn_forward(a, &t.y, &t.x), t0);
  bad += report("afterwards the group is broken on every rank (fails at once)", &o, broken_expect, 0.5);
  sbn_bn_destroy(a);
  rank_data_free(&t.d);
  return bad;
}

/* Two ranks missing, and the waiting ranks arrive at different times (rank
 * 0 0.7 s after rank 2): the message must name exactly the missing ranks
 * ("1, 3": not a subset, not an innocent one), and the status must not
 * depend on who gave up first: rank 0 hears rank 2's verdict before its own
 * deadline and must still return SBN_STATUS_TIMEOUT like rank 2. */
static sbn_status exact_expect(int r) { return r % 2 ? SBN_STATUS_GROUP_BROKEN : SBN_STATUS_TIMEOUT; }

static int mode_timeout_exact(sbn_group *world) {
  const double timeout = 1.5;
  sbn_group_set_timeout(world, timeout);
  sbn_bn_options opt = sbn_bn_options_default(8);
  sbn_bn *a;
  CHECK_OK(sbn_bn_create(&a, &opt, world));
  io t;
  io_make(&t, 8, 70 + rank);
  CHECK_OK(sbn_bn_forward(a, &t.y, &t.x));
  outcome o;
  double t0 = now_s();
  if (rank % 2) sleep(4);                         /* ranks 1 and 3 never arrive in time */
  if (rank == 0) usleep(700000);                  /* rank 0 arrives late, but in time */
  sbn_status st = sbn_bn_backward(a, &t.dx, &t.dy, &t.x);
  record(&o, st, t0);
  if (rank % 2 == 0) {
    const char *want = P == 4 ? "waiting for rank(s) 1, 3" : "waiting for rank(s) 1";
    const char *p = strstr(o.msg, "waiting for rank(s) ");
    if (!p || strcmp(p, want) != 0 || !strstr(o.msg, "backward of layer #0")) {
      fprintf(stderr, "rank %d: message names the wrong ranks (want exactly \"%s\")\n", rank, want);
      o.st = -1;
    }
  }
  int bad = report("ranks 1 and 3 missing, rank 0 arrives 0.7 s after rank 2 (timeout 1.5 s)", &o, exact_expect,
                   timeout + 3.5);
  sbn_bn_destroy(a);
  rank_data_free(&t.d);
  return bad;
}

/* SYNCBN_TIMEOUT=1e30 (set by run_mpi.sh): wait forever, and sleep while
 * waiting. Rank 1 arrives 1.5 s late; the others must succeed having used
 * little CPU meanwhile. */
static int mode_forever(sbn_group *world) {
  double v[3] = {1.0 * rank, 2.0, -0.5 * rank};
  if (rank == 1) sleep(1);
  usleep(500000);
  struct timespec c0, c1;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
  double t0 = now_s();
  if (rank == 1) usleep(1000);
  sbn_status st = sbn_group_allreduce(world, v, 3, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
  double cpu = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
  outcome o;
  record(&o, st, t0);
  double want0 = P * (P - 1) / 2.0;
  if (st == SBN_STATUS_OK && (v[0] != want0 || v[1] != 2.0 * P || v[2] != -0.5 * want0)) o.st = -1;
  if (cpu > 0.5) {
    fprintf(stderr, "rank %d: used %.2f s of CPU waiting %.2f s (must sleep)\n", rank, cpu, o.secs);
    o.st = -1;
  }
  if (rank == 0) printf("rank 0 waited %.2f s using %.3f s of CPU\n", o.secs, cpu);
  return report("SYNCBN_TIMEOUT=1e30: rank 1 arrives 1 s late, the others wait (sleeping)", &o, all_ok, 3);
}

/* Training until rank 1 kills or stops itself at step 3; the others go on
 * and must not hang (kill: mpirun ends the job; stop: the group times out,
 * we print the error and MPI_Abort like a user program would). */
static int mode_die(sbn_group *world, int sig) {
  sbn_bn_options opt = sbn_bn_options_default(16);
  sbn_bn *a;
  CHECK_OK(sbn_bn_create(&a, &opt, world));
  io t;
  io_make(&t, 16, 60 + rank);
  for (int step = 0; step < 1000; step++) {
    if (rank == 1 && step == 3) {
      printf("rank 1: raising signal %d (%s) at step %d\n", sig, sig == SIGKILL ? "SIGKILL" : "SIGSTOP", step);
      fflush(stdout);
      raise(sig);
    }
    double t0 = now_s();
    sbn_status st = sbn_bn_forward(a, &t.y, &t.x);
    if (st == SBN_STATUS_OK) st = sbn_bn_backward(a, &t.dx, &t.dy, &t.x);
    if (st != SBN_STATUS_OK) {
      printf("rank %d: step %d failed after %.2f s: %s: %s\n", rank, step, now_s() - t0, sbn_status_name(st),
             sbn_last_error());
      fflush(stdout);
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
    if (rank == 0) printf("step %d ok\n", step), fflush(stdout);
    usleep(20000);
  }
  printf("rank %d: training finished although rank 1 is gone\n", rank);
  return 1;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const char *mode = argc > 1 ? argv[1] : "mismatch";
  if (P < 2) {
    if (rank == 0) fprintf(stderr, "test_mpi_faults needs at least 2 ranks\n");
    MPI_Finalize();
    return 1;
  }
  sbn_group *world;
  sbn_status st = sbn_group_from_mpi(&world, MPI_COMM_WORLD);
  if (st != SBN_STATUS_OK) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, sbn_status_name(st), sbn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int bad;
  if (!strcmp(mode, "mismatch")) bad = mode_mismatch(world);
  else if (!strcmp(mode, "timeout")) bad = mode_timeout(world);
  else if (!strcmp(mode, "timeout_exact")) bad = mode_timeout_exact(world);
  else if (!strcmp(mode, "forever")) bad = mode_forever(world);
  else if (!strcmp(mode, "kill")) bad = mode_die(world, SIGKILL);
  else if (!strcmp(mode, "stop")) bad = mode_die(world, SIGSTOP);
  else {
    fprintf(stderr, "unknown mode %s\n", mode);
    bad = 1;
  }
  if (rank == 0) printf("%s: %s\n", mode, bad ? "FAILED" : "all ranks got the expected errors");
  sbn_group_destroy(world);
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  return bad ? 1 : 0;
}
