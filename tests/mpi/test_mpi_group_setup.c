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
 * Every rank's status and message are printed; exit 0 when all are as
 * expected. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
  } else {
    if (rank == 0) fprintf(stderr, "usage: test_mpi_group_setup bad_timeout|bad_timeout_one\n");
    bad = 1;
  }
  if (rank == 0) printf("%s: %s\n", mode, bad ? "FAILED" : "every rank got the expected outcome");
  MPI_Finalize();
  return bad ? 1 : 0;
}
