/* The threads backend under short timeouts and load: many teams at once,
 * timeouts from 10 us to 10 ms, ranks that arrive late at random, and a mix
 * of small and large all-reduces, broadcasts and splits. A timed-out
 * collective must be safe for every rank whatever the timing (no rank may
 * leave while a peer still reads its buffers or stack: built with ASan too,
 * see mk/sanitize-comm.mk), and the outcome must be consistent:
 *   - per rank: OK ... OK, then at most one failure (TIMEOUT or
 *     GROUP_BROKEN), after which the rank stops;
 *   - per collective: never OK on one rank and TIMEOUT on another (a
 *     collective either gathered everyone or broke);
 *   - a TIMEOUT message names at least one rank, and only ranks that did
 *     not arrive: each named rank got GROUP_BROKEN in that collective or
 *     never reached it (never one that got OK or TIMEOUT there);
 *   - every successful all-reduce holds the exact sum.
 * Usage: test_threads_stress [teams] (default 400). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "syncbn.h"

enum { MAXP = 6, STEPS = 24, BIG = 40000 }; /* 320 KB: malloc maps it, free unmaps it */

typedef struct team_log {
  int P;
  double timeout;
  unsigned seed;
  int st[MAXP][STEPS];      /* -1: not reached */
  char msg[MAXP][STEPS][200];
  int wrong_sum[MAXP];
} team_log;

static unsigned next_rand(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return *s >> 8;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
  nanosleep(&ts, NULL);
}

static int rank_fn(sbn_group *world, void *arg) {
  team_log *t = arg;
  const int me = sbn_group_rank(world), P = sbn_group_size(world);
  unsigned rs = t->seed * 7919u + (unsigned)me;
  sbn_group_set_timeout(world, t->timeout);
  for (int k = 0; k < STEPS; k++) {
    /* a fresh buffer per collective, unmapped right after: a peer still
     * reading it once we left would fault */
    double *buf = malloc(sizeof(double) * BIG);
    /* arrive late now and then: up to 3 timeouts, sometimes more */
    unsigned r = next_rand(&rs) % 100;
    if (r < 2) sleep_s(t->timeout * (0.5 + (double)(next_rand(&rs) % 300) / 100.0));
    sbn_status st;
    const int kind = k % 4;
    size_t n = (k % 8 == 1) ? BIG : 33;
    for (size_t i = 0; i < n; i++) buf[i] = (double)(me + 1) * (double)(i % 97) - 3.0 * me;
    if (kind == 0 || kind == 1) {
      st = sbn_group_allreduce(world, buf, n, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
      if (st == SBN_STATUS_OK)
        for (size_t i = 0; i < n; i++) {
          double want = (double)(P * (P + 1) / 2) * (double)(i % 97) - 3.0 * (P * (P - 1) / 2);
          t->wrong_sum[me] += buf[i] != want;
        }
    } else if (kind == 2) {
      st = sbn_group_broadcast(world, buf, 800, P - 1);
    } else {
      sbn_group *sub = NULL;
      st = sbn_group_split(&sub, world, me % 2, -me);
      if (st == SBN_STATUS_OK) sbn_group_destroy(sub); /* (its collectives are other tests') */
    }
    t->st[me][k] = (int)st;
    snprintf(t->msg[me][k], sizeof t->msg[me][k], "%s", st == SBN_STATUS_OK ? "" : sbn_last_error());
    free(buf);
    if (st != SBN_STATUS_OK) break;
  }
  return 0;
}

typedef struct worker { team_log *teams; int first, count; } worker;

static void *run_teams(void *p) {
  worker *w = p;
  for (int i = w->first; i < w->first + w->count; i++) sbn_team_run(w->teams[i].P, rank_fn, &w->teams[i]);
  return NULL;
}

/* Check one team's log; returns the number of violations (printed). */
static int check_team(const team_log *t, int idx, int *timeouts, int *broken) {
  int bad = 0;
  for (int r = 0; r < t->P; r++) {
    int failed = 0;
    for (int k = 0; k < STEPS; k++) {
      int st = t->st[r][k];
      if (st < 0) continue;
      if (failed) bad++, fprintf(stderr, "team %d rank %d: went on after a failure\n", idx, r);
      if (st != SBN_STATUS_OK && st != SBN_STATUS_TIMEOUT && st != SBN_STATUS_GROUP_BROKEN)
        bad++, fprintf(stderr, "team %d rank %d step %d: unexpected %s: %s\n", idx, r, k,
                       sbn_status_name((sbn_status)st), t->msg[r][k]);
      if (st != SBN_STATUS_OK) failed = 1;
      *timeouts += st == SBN_STATUS_TIMEOUT;
      *broken += st == SBN_STATUS_GROUP_BROKEN;
    }
    if (t->wrong_sum[r]) bad++, fprintf(stderr, "team %d rank %d: %d wrong sums\n", idx, r, t->wrong_sum[r]);
  }
  for (int k = 0; k < STEPS; k++) {
    int ok = 0, to = 0;
    for (int r = 0; r < t->P; r++) ok += t->st[r][k] == SBN_STATUS_OK, to += t->st[r][k] == SBN_STATUS_TIMEOUT;
    if (ok && to) bad++, fprintf(stderr, "team %d step %d: %d ranks OK and %d TIMEOUT\n", idx, k, ok, to);
    for (int r = 0; r < t->P; r++) {
      if (t->st[r][k] != SBN_STATUS_TIMEOUT) continue;
      const char *p = strstr(t->msg[r][k], "waiting for rank(s) ");
      if (!p) {
        bad++, fprintf(stderr, "team %d rank %d step %d: TIMEOUT names no rank: %s\n", idx, r, k, t->msg[r][k]);
        continue;
      }
      p += strlen("waiting for rank(s) ");
      int named = 0;
      for (char *end; *p >= '0' && *p <= '9'; p = end + (*end == ',' ? 2 : 0)) {
        long q = strtol(p, &end, 10);
        named++;
        int qs = q >= 0 && q < t->P ? t->st[q][k] : -2;
        if (qs != SBN_STATUS_GROUP_BROKEN && qs != -1)
          bad++, fprintf(stderr, "team %d rank %d step %d: names rank %ld, which got %s there: %s\n", idx, r, k, q,
                         qs >= 0 ? sbn_status_name((sbn_status)qs) : "-", t->msg[r][k]);
        if (*end != ',') break;
      }
      if (!named) bad++, fprintf(stderr, "team %d rank %d step %d: empty rank list: %s\n", idx, r, k, t->msg[r][k]);
    }
  }
  return bad;
}

int main(int argc, char **argv) {
  const int nteams = argc > 1 ? atoi(argv[1]) : 400;
  enum { WORKERS = 4 }; /* teams running at once: 4 x up to 6 ranks on the cores */
  team_log *teams = calloc((size_t)nteams, sizeof *teams);
  unsigned s = 12345;
  for (int i = 0; i < nteams; i++) {
    teams[i].P = 2 + (int)(next_rand(&s) % (MAXP - 1));
    teams[i].timeout = 1e-5 * pow(1e3, (double)(next_rand(&s) % 1000) / 999.0); /* 10 us .. 10 ms */
    teams[i].seed = next_rand(&s);
    memset(teams[i].st, 0xff, sizeof teams[i].st);
  }
  pthread_t tid[WORKERS];
  worker w[WORKERS];
  for (int i = 0; i < WORKERS; i++) {
    w[i] = (worker){teams, nteams * i / WORKERS, nteams * (i + 1) / WORKERS - nteams * i / WORKERS};
    pthread_create(&tid[i], NULL, run_teams, &w[i]);
  }
  for (int i = 0; i < WORKERS; i++) pthread_join(tid[i], NULL);
  int bad = 0, timeouts = 0, broken = 0, oks = 0;
  for (int i = 0; i < nteams; i++) {
    bad += check_team(&teams[i], i, &timeouts, &broken);
    for (int r = 0; r < teams[i].P; r++)
      for (int k = 0; k < STEPS; k++) oks += teams[i].st[r][k] == SBN_STATUS_OK;
  }
  printf("%d teams of 2-%d thread ranks, %d at a time, timeouts 10 us .. 10 ms, %d collectives each: %d OK, "
         "%d TIMEOUT, %d GROUP_BROKEN; %d violations (must be 0)\n",
         nteams, MAXP, WORKERS, STEPS, oks, timeouts, broken, bad);
  if (timeouts == 0) printf("(no timeout happened: the test did not exercise anything)\n"), bad++;
  free(teams);
  return bad ? 1 : 0;
}
