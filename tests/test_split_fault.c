/* A split (or new_group) that fails on one rank alone, after the ranks
 * agreed on the call: making that rank's handle runs out of memory
 * (injected, src/comm/group_testhook.h). Every rank must fail at once, the
 * failing one with its own error, the others with SBN_STATUS_PEER_FAILED
 * naming it; nobody keeps a group, and the parent stays usable. Without the
 * agreement the members wait for the failing rank in the new group until
 * their timeout (SYNCBN_TIMEOUT=3 here, so a regression fails in seconds).
 * 3 and 4 thread ranks; every rank position fails in turn (for new_group
 * every member's: the others make no handle). */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../src/comm/group_testhook.h"
#include "testutil.h"

enum { MAXP = 4 };
static const double PROMPT_S = 1.5;

typedef enum kind { SPLIT_ALL, SPLIT_PARITY, NEW_GROUP, KIND_COUNT_ } kind;
static const char *const kind_names[] = {"split(color 0)", "split(color rank%2)", "new_group{0,2}"};

static struct {
  kind k;
  int bad; /* the rank whose handle fails */
} cur;
static int failures[MAXP];
static char scenario[160];

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define FAILR(...) \
  (fprintf(stderr, "FAIL %s, rank %d: ", scenario, rank), fprintf(stderr, __VA_ARGS__), failures[rank]++)

static sbn_status do_split(sbn_group **out, sbn_group *w, kind k) {
  const int rank = sbn_group_rank(w);
  static const int pair[2] = {0, 2};
  switch (k) {
  case SPLIT_ALL: return sbn_group_split(out, w, 0, rank);
  case SPLIT_PARITY: return sbn_group_split(out, w, rank % 2, rank);
  default: return sbn_group_new(out, w, 2, pair);
  }
}

static int rank_main(sbn_group *w, void *arg) {
  (void)arg;
  const int rank = sbn_group_rank(w);
  if (rank == cur.bad) sbn_group_test_alloc_failures = 1;
  sbn_group *g = NULL;
  const double t0 = now_s();
  sbn_status st = do_split(&g, w, cur.k);
  const double took = now_s() - t0;
  char want[32];
  snprintf(want, sizeof want, "rank %d failed", cur.bad);
  const char *msg = sbn_last_error();
  if (rank == 0 || rank == cur.bad)
    printf("  %s: rank %d -> %s after %.3f s: %s\n", scenario, rank, sbn_status_name(st), took, msg);
  if (rank == cur.bad ? st != SBN_STATUS_OUT_OF_MEMORY || !strstr(msg, "out of memory")
                      : st != SBN_STATUS_PEER_FAILED || !strstr(msg, want))
    FAILR("got %s: \"%s\" (want %s)\n", sbn_status_name(st), msg,
          rank == cur.bad ? "SBN_STATUS_OUT_OF_MEMORY" : "SBN_STATUS_PEER_FAILED naming the rank");
  if (g || took > PROMPT_S) FAILR("%s after %.3f s (want no group, within %g s)\n", g ? "a group" : "no group", took, PROMPT_S);
  sbn_group_destroy(g);
  sbn_group_test_alloc_failures = 0;
  /* the parent is still in step: the same split again works */
  g = NULL;
  st = do_split(&g, w, cur.k);
  const int member = cur.k != NEW_GROUP || rank == 0 || rank == 2;
  if (member ? st != SBN_STATUS_OK : st != SBN_STATUS_NOT_MEMBER)
    FAILR("split afterwards: %s: %s\n", sbn_status_name(st), sbn_last_error());
  double v = 1;
  if (g && (st = sbn_group_allreduce(g, &v, 1, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM)) != SBN_STATUS_OK)
    FAILR("allreduce on the new group: %s: %s\n", sbn_status_name(st), sbn_last_error());
  if (g && v != sbn_group_size(g)) FAILR("allreduce on the new group gave %g\n", v);
  sbn_group_destroy(g);
  if ((st = sbn_group_barrier(w)) != SBN_STATUS_OK)
    FAILR("barrier afterwards: %s: %s\n", sbn_status_name(st), sbn_last_error());
  return 0;
}

int main(void) {
  setenv("SYNCBN_TIMEOUT", "3", 1); /* new groups' timeout: a wait for the failed rank ends in 3 s */
  int cases = 0, bad = 0;
  for (int size = 3; size <= MAXP; size++)
    for (kind k = SPLIT_ALL; k < KIND_COUNT_; k++)
      for (int b = 0; b < size; b++) {
        if (k == NEW_GROUP && b != 0 && b != 2) continue;
        cur.k = k, cur.bad = b;
        snprintf(scenario, sizeof scenario, "%d ranks, %s, rank %d runs out of memory", size, kind_names[k], b);
        memset(failures, 0, sizeof failures);
        sbn_status st = sbn_team_run(size, rank_main, NULL);
        int fail = st != SBN_STATUS_OK;
        for (int r = 0; r < size; r++) fail |= failures[r] != 0;
        if (st != SBN_STATUS_OK) printf("FAIL %s: sbn_team_run: %s\n", scenario, sbn_last_error());
        bad += fail, cases++;
      }
  printf("%s: %d of %d cases failed on every rank at once, naming the rank, and left the parent usable\n",
         bad ? "FAILED" : "split faults passed", cases - bad, cases);
  return bad != 0;
}
