/* The threads backend's collectives and sub-groups: all-reduce (float64 and
 * float32, small and large payloads) bitwise equal to the correctly rounded
 * exact sum, broadcast, barrier, split by color/key, new_group with non-members,
 * disagreeing ranks, and 8 ranks on 2 cores without burning them. Then a
 * split against each other collective on 2 and 3 ranks: a mismatch on every
 * rank, at once (not after the timeout), and the group in step afterwards. */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

enum { P = 8 };
static int errors[P];
#define FAILR(...) (fprintf(stderr, "rank %d: ", rank), fprintf(stderr, __VA_ARGS__), errors[rank]++)

/* value i of rank r's buffer: deterministic, not representable exactly in sums */
static double val(int r, size_t i) { return sin((double)(r * 7919 + (int)i)) * 1e3 + 1.0 / (r + 1); }

static void check_allreduce(sbn_group *g, int rank, size_t n, sbn_dtype dt, const int *members, int m) {
  double *d = malloc(n * 8);
  float *f = malloc(n * 4);
  int me = sbn_group_rank(g);
  for (size_t i = 0; i < n; i++) d[i] = val(members[me], i), f[i] = (float)val(members[me], i);
  sbn_status st = sbn_group_allreduce(g, dt == SBN_DTYPE_FLOAT64 ? (void *)d : (void *)f, n, dt, SBN_REDUCE_OP_SUM);
  if (st != SBN_STATUS_OK) FAILR("allreduce: %s\n", sbn_last_error());
  size_t wrong = 0;
  for (size_t i = 0; i < n; i++) {
    /* the exact sum, correctly rounded: the terms span < 2^80, so their
     * binary128 sum is exact and one conversion rounds it */
    __float128 s = 0;
    for (int q = 0; q < m; q++) s += dt == SBN_DTYPE_FLOAT64 ? val(members[q], i) : (double)(float)val(members[q], i);
    double s64 = (double)s;
    if (dt == SBN_DTYPE_FLOAT64 ? memcmp(&s64, &d[i], 8) != 0 : (float)s != f[i]) wrong++;
  }
  if (wrong) FAILR("allreduce n=%zu dtype=%d: %zu values differ bitwise from the correctly rounded exact sum\n", n, dt, wrong);
  free(d), free(f);
}

static int rank_main(sbn_group *world, void *arg) {
  (void)arg;
  sbn_status st;
  int rank = sbn_group_rank(world);
  int all[P];
  for (int i = 0; i < P; i++) all[i] = i;
  /* all-reduce: small (every rank reduces) and large (chunked) paths */
  check_allreduce(world, rank, 37, SBN_DTYPE_FLOAT64, all, P);
  check_allreduce(world, rank, 100003, SBN_DTYPE_FLOAT64, all, P);
  check_allreduce(world, rank, 4099, SBN_DTYPE_FLOAT32, all, P);
  check_allreduce(world, rank, 70001, SBN_DTYPE_FLOAT32, all, P);
  /* broadcast */
  char msg[32];
  snprintf(msg, sizeof msg, "from rank %d", rank);
  if (sbn_group_broadcast(world, msg, sizeof msg, 3) != SBN_STATUS_OK || strcmp(msg, "from rank 3"))
    FAILR("broadcast gave '%s'\n", msg);
  if (sbn_group_barrier(world) != SBN_STATUS_OK) FAILR("barrier: %s\n", sbn_last_error());

  /* split: color = parity, key = -rank (reverse order) */
  sbn_group *half = NULL;
  if (sbn_group_split(&half, world, rank % 2, -rank) != SBN_STATUS_OK) {
    FAILR("split: %s\n", sbn_last_error());
  } else {
    int members[P / 2], m = 0;
    for (int r = P - 1; r >= 0; r--)
      if (r % 2 == rank % 2) members[m++] = r;
    if (sbn_group_size(half) != P / 2 || members[sbn_group_rank(half)] != rank)
      FAILR("split: size %d rank %d\n", sbn_group_size(half), sbn_group_rank(half));
    check_allreduce(half, rank, 129, SBN_DTYPE_FLOAT64, members, m);
    check_allreduce(half, rank, 50001, SBN_DTYPE_FLOAT64, members, m);
  }
  /* a rank passing SBN_UNDEFINED gets no group */
  sbn_group *some = NULL;
  st = sbn_group_split(&some, world, rank < 5 ? 0 : SBN_UNDEFINED, 0);
  if (rank < 5 ? (st != SBN_STATUS_OK || sbn_group_size(some) != 5) : (st != SBN_STATUS_NOT_MEMBER || some))
    FAILR("split with SBN_UNDEFINED: %s %s\n", sbn_status_name(st), sbn_last_error());
  /* new_group: listed order defines the new ranks; others are not members */
  int list[3] = {6, 2, 4};
  sbn_group *trio = NULL;
  st = sbn_group_new(&trio, world, 3, list);
  int pos = rank == 6 ? 0 : rank == 2 ? 1 : rank == 4 ? 2 : -1;
  if (pos >= 0 && (st != SBN_STATUS_OK || sbn_group_rank(trio) != pos || sbn_group_size(trio) != 3))
    FAILR("new_group member: %s %s\n", sbn_status_name(st), sbn_last_error());
  if (pos < 0 && (st != SBN_STATUS_NOT_MEMBER || trio || !strstr(sbn_last_error(), "not in")))
    FAILR("new_group non-member: %s '%s'\n", sbn_status_name(st), sbn_last_error());
  if (rank == 0) printf("  non-member sees: %s: %s\n", sbn_status_name(st), sbn_last_error());
  if (trio) check_allreduce(trio, rank, 11, SBN_DTYPE_FLOAT64, list, 3);
  /* lineage: sub-groups lie within the world, not the other way round */
  if (!sbn_group_contains(world, half) || sbn_group_contains(half, world) ||
      (trio && (!sbn_group_contains(world, trio) || sbn_group_contains(trio, half))) ||
      !sbn_group_contains(world, world))
    FAILR("sbn_group_contains gives wrong answers\n");
  /* disagreeing lists: MISMATCH on every rank, and the group still works */
  int l1[2] = {0, 1}, l2[2] = {1, 0};
  sbn_group *dis = NULL;
  st = sbn_group_new(&dis, world, 2, rank == 5 ? l2 : l1);
  if (st != SBN_STATUS_MISMATCH || dis) FAILR("new_group with different lists: %s\n", sbn_status_name(st));
  if (rank == 0) printf("  different lists: %s: %s\n", sbn_status_name(st), sbn_last_error());
  /* disagreeing all-reduce counts: MISMATCH on every rank, buffers untouched */
  double buf[4] = {1, 2, 3, 4};
  st = sbn_group_allreduce(world, buf, rank == 7 ? 3 : 4, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
  if (st != SBN_STATUS_MISMATCH || buf[0] != 1 || buf[3] != 4) FAILR("count mismatch: %s\n", sbn_status_name(st));
  if (rank == 0) printf("  different counts: %s: %s\n", sbn_status_name(st), sbn_last_error());
  /* a local argument error reaches every rank */
  st = sbn_group_broadcast(world, buf, 8, rank == 2 ? 99 : 0);
  if (st == SBN_STATUS_OK) FAILR("bad root not reported\n");
  if (rank == 0) printf("  bad root on rank 2: %s: %s\n", sbn_status_name(st), sbn_last_error());
  check_allreduce(world, rank, 5, SBN_DTYPE_FLOAT64, all, P); /* still usable */

  /* many small collectives: 8 ranks on 2 cores must sleep while waiting */
  struct timespec t0, t1;
  struct rusage r0, r1;
  if (rank == 0) clock_gettime(CLOCK_MONOTONIC, &t0), getrusage(RUSAGE_SELF, &r0);
  double small[129];
  for (int it = 0; it < 500; it++) {
    for (int i = 0; i < 129; i++) small[i] = rank + i;
    if (sbn_group_allreduce(world, small, 129, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM) != SBN_STATUS_OK) {
      FAILR("loop allreduce: %s\n", sbn_last_error());
      break;
    }
  }
  sbn_group_barrier(world);
  if (rank == 0) {
    clock_gettime(CLOCK_MONOTONIC, &t1), getrusage(RUSAGE_SELF, &r1);
    double wall = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    double cpu = (r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) + 1e-6 * (r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) +
                 (r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) + 1e-6 * (r1.ru_stime.tv_usec - r0.ru_stime.tv_usec);
    printf("  500 all-reduces of 129 doubles over 8 thread ranks: %.1f us each, wall %.3f s\n", wall / 500 * 1e6, wall);
    /* bound: generous for a loaded 2-core CI machine; spinning waiters
     * would take seconds here */
    if (wall > 5.0) FAILR("collectives too slow: %.2f s\n", wall);
    (void)cpu;
  }
  sbn_group_destroy(half), sbn_group_destroy(some), sbn_group_destroy(trio);
  return 0;
}

/* ---- split against another collective ---- */

typedef enum call { CALL_SPLIT, CALL_BARRIER, CALL_NEW_GROUP, CALL_ALLREDUCE, CALL_ALLREDUCE_LARGE,
                    CALL_BROADCAST, CALL_COUNT_ } call;
static const char *const call_names[] = {"split", "barrier", "new_group", "allreduce", "allreduce(large)",
                                         "broadcast"};
enum { LARGE = 5000 };          /* doubles: over the small all-reduce path */
static const double TIMEOUT_S = 3, PROMPT_S = 1.5;

typedef struct odd_case {
  int size, odd;       /* rank `odd` calls `odd_call`, the others `rest_call` */
  call odd_call, rest_call;
} odd_case;
static odd_case cur;
static char scenario[160]; /* what runs now, for the watchdog */

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static sbn_status do_call(sbn_group *w, call c, sbn_group **out) {
  static _Thread_local double big[LARGE];
  double v[2] = {1, 2};
  char b[8] = "";
  int list[3] = {0, 1, 2};
  switch (c) {
  case CALL_SPLIT: return sbn_group_split(out, w, 0, sbn_group_rank(w));
  case CALL_BARRIER: return sbn_group_barrier(w);
  case CALL_NEW_GROUP: return sbn_group_new(out, w, sbn_group_size(w), list);
  case CALL_ALLREDUCE: return sbn_group_allreduce(w, v, 2, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
  case CALL_ALLREDUCE_LARGE: return sbn_group_allreduce(w, big, LARGE, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
  default: return sbn_group_broadcast(w, b, sizeof b, 0);
  }
}

/* After the failed call: in step for a barrier, an all-reduce and a split. */
static int still_in_step(sbn_group *w, int rank) {
  const int n = sbn_group_size(w);
  sbn_status st = sbn_group_barrier(w);
  if (st != SBN_STATUS_OK) {
    FAILR("%s: barrier afterwards: %s: %s\n", scenario, sbn_status_name(st), sbn_last_error());
    return 0;
  }
  double v = rank + 1;
  st = sbn_group_allreduce(w, &v, 1, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
  if (st != SBN_STATUS_OK || v != n * (n + 1) / 2) {
    FAILR("%s: allreduce afterwards: %s, sum %g: %s\n", scenario, sbn_status_name(st), v, sbn_last_error());
    return 0;
  }
  sbn_group *all = NULL;
  st = sbn_group_split(&all, w, 0, rank);
  const int got = sbn_group_size(all);
  if (st == SBN_STATUS_OK && got == n) st = sbn_group_barrier(all);
  sbn_group_destroy(all);
  if (st != SBN_STATUS_OK || got != n) {
    FAILR("%s: split afterwards: %s (size %d): %s\n", scenario, sbn_status_name(st), got, sbn_last_error());
    return 0;
  }
  return 1;
}

static int odd_rank_main(sbn_group *w, void *arg) {
  (void)arg;
  const int rank = sbn_group_rank(w);
  sbn_group_set_timeout(w, TIMEOUT_S);
  sbn_group *got = NULL;
  const double t0 = now_s();
  sbn_status st = do_call(w, rank == cur.odd ? cur.odd_call : cur.rest_call, &got);
  const double took = now_s() - t0;
  if (st != SBN_STATUS_MISMATCH || got || took > PROMPT_S || !strstr(sbn_last_error(), "disagree"))
    FAILR("%s: got %s after %.3f s (want SBN_STATUS_MISMATCH within %g s, no group): %s\n", scenario,
          sbn_status_name(st), took, PROMPT_S, sbn_last_error());
  sbn_group_destroy(got);
  return still_in_step(w, rank) ? 0 : 1;
}

static void watchdog(int sig) {
  (void)sig;
  static const char head[] = "FAILED: hung in ";
  if (write(2, head, sizeof head - 1) < 0 || write(2, scenario, strlen(scenario)) < 0 || write(2, "\n", 1) < 0) {
  }
  _exit(1);
}

/* Every rank position, both ways round, against every other collective. */
static int split_against_others(void) {
  int cases = 0, bad = 0;
  signal(SIGALRM, watchdog);
  for (int size = 2; size <= 3; size++)
    for (call other = CALL_BARRIER; other < CALL_COUNT_; other++)
      for (int odd = 0; odd < size; odd++)
        for (int flip = 0; flip < 2; flip++) {
          cur = (odd_case){size, odd, flip ? other : CALL_SPLIT, flip ? CALL_SPLIT : other};
          snprintf(scenario, sizeof scenario, "%d ranks: rank %d calls %s, the others %s", size, odd,
                   call_names[cur.odd_call], call_names[cur.rest_call]);
          memset(errors, 0, sizeof errors);
          alarm(20); /* a hang: far past the 3 s timeout */
          sbn_status st = sbn_team_run(size, odd_rank_main, NULL);
          alarm(0);
          int fail = st != SBN_STATUS_OK;
          for (int r = 0; r < size; r++) fail |= errors[r] != 0;
          if (fail) printf("  FAIL %s: %s %s\n", scenario, sbn_status_name(st), sbn_last_error());
          bad += fail, cases++;
        }
  printf("  split against barrier/new_group/allreduce/broadcast: %d of %d cases gave a prompt "
         "SBN_STATUS_MISMATCH on every rank and left the group in step\n", cases - bad, cases);
  return bad;
}

/* A rank function that returns at once (its world is then destroyed): the
 * others' next collective fails promptly naming it, not after the timeout. */
static sbn_status left_status[3];
static char left_msg[3][600];
static double left_took[3];
static int leave_early_main(sbn_group *w, void *arg) {
  (void)arg;
  const int rank = sbn_group_rank(w);
  if (rank == 1) {
    usleep(50000); /* rank 0 is waiting by then */
    return 0;
  }
  sbn_group_set_timeout(w, 30);
  if (rank == 2) usleep(150000); /* arrives after the departure */
  const double t0 = now_s();
  left_status[rank] = sbn_group_barrier(w);
  left_took[rank] = now_s() - t0;
  snprintf(left_msg[rank], sizeof left_msg[rank], "%s", sbn_last_error());
  return 0;
}

static int rank_leaves_early(void) {
  snprintf(scenario, sizeof scenario, "3 ranks, rank 1 returns at once");
  alarm(20);
  sbn_status st = sbn_team_run(3, leave_early_main, NULL);
  alarm(0);
  int bad = st != SBN_STATUS_OK;
  for (int r = 0; r < 3; r += 2) {
    printf("  rank 1 returned at once: rank %d's barrier -> %s after %.3f s: %s\n", r, sbn_status_name(left_status[r]),
           left_took[r], left_msg[r]);
    bad |= left_status[r] != SBN_STATUS_GROUP_BROKEN || left_took[r] > PROMPT_S || !strstr(left_msg[r], "rank 1 left");
  }
  return bad;
}

int main(void) {
  sbn_status st = sbn_team_run(P, rank_main, NULL);
  int bad = st != SBN_STATUS_OK;
  for (int r = 0; r < P; r++) bad |= errors[r] != 0;
  bad |= split_against_others() != 0;
  bad |= rank_leaves_early() != 0;
  printf(bad ? "FAILED (%s)\n" : "group checks passed (%s)\n", sbn_status_name(st));
  return bad;
}
