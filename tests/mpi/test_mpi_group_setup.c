/* Making MPI groups when something is wrong (run under mpirun; see run_mpi.sh).
 *
 *   test_mpi_group_setup bad_timeout   SYNCBN_TIMEOUT is not a positive number
 *                              (run_mpi.sh passes "abc", "0", "2x"):
 *                              sbn_group_from_mpi refuses it on every rank,
 *                              at once, with SBN_STATUS_INVALID_ARGUMENT
 *                              naming the value, and no group.
 *   test_mpi_group_setup bad_timeout_one   only rank 1's SYNCBN_TIMEOUT is
 *                              invalid ("abc"; the others' 5): rank 1 gets
 *                              SBN_STATUS_INVALID_ARGUMENT naming it, every
 *                              other rank SBN_STATUS_PEER_FAILED naming rank
 *                              1, at once (not after their 5 s), no group.
 *   test_mpi_group_setup split_fault   a split or new_group that fails on
 *                              one rank alone after the ranks agreed on it
 *                              (its handle runs out of memory, injected by
 *                              src/comm/group_testhook.h), every rank
 *                              position in turn (for new_group, each
 *                              member's: the others make no handle): it gets
 *                              SBN_STATUS_OUT_OF_MEMORY, every other rank
 *                              SBN_STATUS_PEER_FAILED naming it, at once (the
 *                              timeout is 5 s), and the parent still works.
 * Every rank's status and message are printed; exit 0 when all are as
 * expected. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../src/comm/group_testhook.h"
#include "syncbn_mpi.h"

static int rank, P;
static const double PROMPT_S = 2.0;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct outcome {
  int ok; /* as expected */
  char line[600];
} outcome;

/* Rank 0 prints every rank's line; returns the number of ranks not ok. */
static int report(const char *name, const outcome *mine) {
  outcome *all = rank == 0 ? malloc(sizeof *all * (size_t)P) : NULL;
  MPI_Gather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE, 0, MPI_COMM_WORLD);
  int bad = 0;
  if (rank == 0) {
    printf("--- %s\n", name);
    for (int r = 0; r < P; r++) {
      bad += !all[r].ok;
      printf("  rank %d: %s %s\n", r, all[r].ok ? "ok  " : "FAIL", all[r].line);
    }
    free(all);
  }
  MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return bad;
}

static int mode_bad_timeout(void) {
  const char *v = getenv("SYNCBN_TIMEOUT");
  char want[128], name[160];
  snprintf(want, sizeof want, "SYNCBN_TIMEOUT='%s'", v ? v : "");
  snprintf(name, sizeof name, "SYNCBN_TIMEOUT='%s' on every rank", v ? v : "");
  sbn_group *g = (sbn_group *)&g; /* must become NULL */
  const double t0 = now_s();
  sbn_status st = sbn_group_from_mpi(&g, MPI_COMM_WORLD);
  const double took = now_s() - t0;
  outcome o;
  o.ok = st == SBN_STATUS_INVALID_ARGUMENT && !g && strstr(sbn_last_error(), want) && took < PROMPT_S;
  snprintf(o.line, sizeof o.line, "%s, %s, in %.3f s: \"%s\"", sbn_status_name(st), g ? "a group" : "no group",
           took, sbn_last_error());
  if (st == SBN_STATUS_OK) sbn_group_destroy(g);
  return report(name, &o);
}

static int mode_bad_timeout_one(void) {
  setenv("SYNCBN_TIMEOUT", rank == 1 ? "abc" : "5", 1);
  sbn_group *g = (sbn_group *)&g; /* must become NULL */
  const double t0 = now_s();
  sbn_status st = sbn_group_from_mpi(&g, MPI_COMM_WORLD);
  const double took = now_s() - t0;
  const char *want = rank == 1 ? "SYNCBN_TIMEOUT='abc'" : "rank 1 of communicator 'world' refused its SYNCBN_TIMEOUT";
  outcome o;
  o.ok = st == (rank == 1 ? SBN_STATUS_INVALID_ARGUMENT : SBN_STATUS_PEER_FAILED) && !g &&
         strstr(sbn_last_error(), want) && took < PROMPT_S;
  snprintf(o.line, sizeof o.line, "%s, %s, in %.3f s: \"%s\"", sbn_status_name(st), g ? "a group" : "no group",
           took, sbn_last_error());
  if (st == SBN_STATUS_OK) sbn_group_destroy(g);
  return report("SYNCBN_TIMEOUT='abc' on rank 1 only, 5 on the others", &o);
}

typedef enum kind { SPLIT_ALL, SPLIT_PARITY, NEW_GROUP, KIND_COUNT_ } kind;
static const char *const kind_names[] = {"split(color 0)", "split(color rank%2)", "new_group{0,last}"};

static sbn_status do_split(sbn_group **out, sbn_group *w, kind k) {
  const int pair[2] = {0, P - 1};
  switch (k) {
  case SPLIT_ALL: return sbn_group_split(out, w, 0, rank);
  case SPLIT_PARITY: return sbn_group_split(out, w, rank % 2, rank);
  default: return sbn_group_new(out, w, 2, pair);
  }
}

/* One case: `bad` runs out of memory making its handle. */
static int split_case(sbn_group *w, kind k, int bad) {
  char name[160], want[32];
  snprintf(name, sizeof name, "%s, rank %d runs out of memory making its handle", kind_names[k], bad);
  snprintf(want, sizeof want, "rank %d failed", bad);
  if (rank == bad) sbn_group_test_alloc_failures = 1;
  sbn_group *g = NULL;
  const double t0 = now_s();
  sbn_status st = do_split(&g, w, k);
  const double took = now_s() - t0;
  sbn_group_test_alloc_failures = 0;
  outcome o;
  o.ok = (rank == bad ? st == SBN_STATUS_OUT_OF_MEMORY : st == SBN_STATUS_PEER_FAILED && strstr(sbn_last_error(), want)) &&
         !g && took < PROMPT_S;
  snprintf(o.line, sizeof o.line, "%s, %s, in %.3f s: \"%s\"", sbn_status_name(st), g ? "a group" : "no group", took,
           sbn_last_error());
  sbn_group_destroy(g);
  /* the parent still works: the same split, and a sum on the new group */
  g = NULL;
  st = do_split(&g, w, k);
  const int member = k != NEW_GROUP || rank == 0 || rank == P - 1;
  double v = 1;
  if (st == SBN_STATUS_OK) st = sbn_group_allreduce(g, &v, 1, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
  if (member ? st != SBN_STATUS_OK || v != sbn_group_size(g) : st != SBN_STATUS_NOT_MEMBER) {
    o.ok = 0;
    snprintf(o.line + strlen(o.line), sizeof o.line - strlen(o.line), "; the split afterwards: %s: %s",
             sbn_status_name(st), sbn_last_error());
  }
  sbn_group_destroy(g);
  return report(name, &o);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const char *mode = argc > 1 ? argv[1] : "";
  int bad = 0;
  if (!strcmp(mode, "bad_timeout")) {
    bad = mode_bad_timeout();
  } else if (!strcmp(mode, "bad_timeout_one")) {
    bad = mode_bad_timeout_one();
  } else if (!strcmp(mode, "split_fault")) {
    setenv("SYNCBN_TIMEOUT", "5", 1); /* a wait for the failed rank: 5 s, then the case fails */
    sbn_group *w;
    sbn_status st = sbn_group_from_mpi(&w, MPI_COMM_WORLD);
    if (st != SBN_STATUS_OK) {
      fprintf(stderr, "rank %d: %s: %s\n", rank, sbn_status_name(st), sbn_last_error());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (kind k = SPLIT_ALL; k < KIND_COUNT_; k++)
      for (int b = 0; b < P; b++)
        if (k != NEW_GROUP || b == 0 || b == P - 1) bad += split_case(w, k, b);
    sbn_group_destroy(w);
  } else {
    if (rank == 0) fprintf(stderr, "usage: test_mpi_group_setup bad_timeout|bad_timeout_one|split_fault\n");
    bad = 1;
  }
  if (rank == 0) printf("%s: %s\n", mode, bad ? "FAILED" : "every rank got the expected outcome");
  MPI_Finalize();
  return bad ? 1 : 0;
}
