/* Huge timeouts mean "wait forever", and waiting sleeps: SYNCBN_TIMEOUT=1e30
 * (and inf, and sbn_group_set_timeout(g, 1e300 / INFINITY)) must neither
 * overflow into an immediate timeout nor spin a core. A team of 3 thread
 * ranks where the last arrives 0.6 s late: the others must succeed, with
 * the exact sum, using little CPU while they wait (spinning would cost about
 * 2 x 0.6 s). Invalid timeouts (0, negative, NaN) are refused, from
 * sbn_group_set_timeout and from SYNCBN_TIMEOUT (at team creation, naming
 * the value: a typo must not silently become another timeout). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "syncbn.h"

static int failures;

static double cpu_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double set_to; /* 0: keep SYNCBN_TIMEOUT */
static int wrong[3], status[3];

static int rank_fn(sbn_group *g, void *arg) {
  (void)arg;
  const int me = sbn_group_rank(g);
  if (set_to > 0 && sbn_group_set_timeout(g, set_to) != SBN_STATUS_OK) return 1;
  if (me == 2) {
    struct timespec ts = {0, 600000000L};
    nanosleep(&ts, NULL);
  }
  double v[4] = {1.0 + me, 2.0 * me, -me, 0.5};
  status[me] = sbn_group_allreduce(g, v, 4, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
  wrong[me] = v[0] != 6 || v[1] != 6 || v[2] != -3 || v[3] != 1.5;
  return 0;
}

static void run(const char *label, const char *env, double to) {
  if (env) setenv("SYNCBN_TIMEOUT", env, 1);
  set_to = to;
  double c0 = cpu_s(), w0 = (double)clock();
  (void)w0;
  sbn_status st = sbn_team_run(3, rank_fn, NULL);
  double cpu = cpu_s() - c0;
  int ok = st == SBN_STATUS_OK && cpu < 0.3;
  for (int r = 0; r < 3; r++) ok = ok && status[r] == SBN_STATUS_OK && !wrong[r];
  printf("%-4s %-36s statuses %s/%s/%s, sums %s, CPU %.3f s while 2 ranks waited 0.6 s (limit 0.3 s)\n",
         ok ? "ok" : "FAIL", label, sbn_status_name((sbn_status)status[0]), sbn_status_name((sbn_status)status[1]),
         sbn_status_name((sbn_status)status[2]), wrong[0] || wrong[1] || wrong[2] ? "WRONG" : "exact", cpu);
  failures += !ok;
}

static int bad_fn(sbn_group *g, void *arg) {
  (void)arg;
  double vals[] = {0, -1, NAN, -INFINITY};
  int bad = 0;
  for (int i = 0; i < 4; i++) bad += sbn_group_set_timeout(g, vals[i]) != SBN_STATUS_INVALID_ARGUMENT;
  return bad;
}

static int ran;
static int count_fn(sbn_group *g, void *arg) {
  (void)g, (void)arg;
  __atomic_fetch_add(&ran, 1, __ATOMIC_RELAXED);
  return 0;
}

/* SYNCBN_TIMEOUT=env: refused (SBN_STATUS_INVALID_ARGUMENT naming the value,
 * no rank runs) unless `valid`. */
static void env_value(const char *env, int valid) {
  setenv("SYNCBN_TIMEOUT", env, 1);
  ran = 0;
  sbn_status st = sbn_team_run(2, count_fn, NULL);
  char want[64];
  snprintf(want, sizeof want, "SYNCBN_TIMEOUT='%s'", env);
  int ok = valid ? st == SBN_STATUS_OK && ran == 2
                 : st == SBN_STATUS_INVALID_ARGUMENT && ran == 0 && strstr(sbn_last_error(), want);
  printf("%-4s SYNCBN_TIMEOUT='%s': %s, %d rank(s) ran%s%s\n", ok ? "ok" : "FAIL", env, sbn_status_name(st), ran,
         st != SBN_STATUS_OK ? ": " : "", st != SBN_STATUS_OK ? sbn_last_error() : "");
  failures += !ok;
}

int main(void) {
  alarm(60); /* a rank that never wakes (or a spin-wait to the end of time) fails here */
  run("SYNCBN_TIMEOUT=1e30", "1e30", 0);
  run("SYNCBN_TIMEOUT=inf", "inf", 0);
  run("SYNCBN_TIMEOUT=1e9 (the documented limit)", "1e9", 0);
  unsetenv("SYNCBN_TIMEOUT");
  run("sbn_group_set_timeout(1e300)", NULL, 1e300);
  run("sbn_group_set_timeout(INFINITY)", NULL, INFINITY);
  sbn_status st = sbn_team_run(1, bad_fn, NULL);
  printf("%-4s sbn_group_set_timeout refuses 0, -1, NaN, -inf with SBN_STATUS_INVALID_ARGUMENT\n",
         st == SBN_STATUS_OK ? "ok" : "FAIL");
  failures += st != SBN_STATUS_OK;
  const char *bad[] = {"abc", "-1", "0", "nan", "2x", "-inf", "1e-400"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) env_value(bad[i], 0);
  env_value("", 1); /* empty: unset, the default */
  env_value(" 2.5 ", 1);
  unsetenv("SYNCBN_TIMEOUT");
  printf("%s\n", failures ? "FAILED" : "huge timeouts wait forever, sleeping; invalid ones are refused: all passed");
  return failures ? 1 : 0;
}
