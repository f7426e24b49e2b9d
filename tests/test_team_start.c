/* sbn_team_run when not every rank's thread can start (here: an address
 * space limit that leaves room for a few 8 MiB stacks): the ranks that did
 * start must not wait for the missing ones until their timeout (60 s here).
 * sbn_team_run returns SBN_STATUS_OUT_OF_MEMORY "could only start k of n
 * threads" within seconds, and the started ranks' barrier fails with
 * SBN_STATUS_GROUP_BROKEN carrying that message. Runs in a child process
 * (the limit is the child's), bounded by an alarm. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "syncbn.h"

enum { RANKS = 256 };
static const double TIMEOUT_S = 60, LIMIT_S = 10;
static int barrier_broken; /* ranks whose barrier said GROUP_BROKEN with the reason */

static int rank_main(sbn_group *world, void *arg) {
  (void)arg;
  sbn_group_set_timeout(world, TIMEOUT_S);
  sbn_status st = sbn_group_barrier(world);
  if (st == SBN_STATUS_GROUP_BROKEN && strstr(sbn_last_error(), "could only start"))
    __atomic_fetch_add(&barrier_broken, 1, __ATOMIC_RELAXED);
  return (int)st;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int child(void) {
  long pages = 0, page = sysconf(_SC_PAGESIZE);
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f || fscanf(f, "%ld", &pages) != 1) {
    printf("SKIP: /proc/self/statm unreadable\n");
    return 0;
  }
  fclose(f);
  struct rlimit lim = {(rlim_t)(pages * page) + (64u << 20), (rlim_t)(pages * page) + (64u << 20)};
  if (setrlimit(RLIMIT_AS, &lim) != 0) {
    printf("SKIP: setrlimit(RLIMIT_AS) failed\n");
    return 0;
  }
  const double t0 = now();
  sbn_status st = sbn_team_run(RANKS, rank_main, NULL);
  const double dt = now() - t0;
  char msg[300];
  snprintf(msg, sizeof msg, "%s", sbn_last_error());
  int ok = st == SBN_STATUS_OUT_OF_MEMORY && strstr(msg, "could only start") && dt < LIMIT_S &&
           barrier_broken > 0;
  printf("%-4s sbn_team_run(%d) under a 64 MiB address-space margin -> %s in %.2f s (limit %.0f s, timeout %.0f s), "
         "%d started ranks' barriers broken with the reason: \"%s\"\n",
         ok ? "ok" : "FAIL", RANKS, sbn_status_name(st), dt, LIMIT_S, TIMEOUT_S, barrier_broken, msg);
  return ok ? 0 : 1;
}

int main(void) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return 1;
  }
  if (pid == 0) {
    alarm(120); /* the unfixed library would wait TIMEOUT_S; never hang the suite */
    int rc = child();
    fflush(stdout);
    _exit(rc);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) {
    perror("waitpid");
    return 1;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    printf("FAIL: the child %s %d\n", WIFEXITED(status) ? "exited with" : "died of signal",
           WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    return 1;
  }
  printf("team start checks passed\n");
  return 0;
}
