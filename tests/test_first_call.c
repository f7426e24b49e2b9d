/* Many thread ranks making their first calls at the same moment: the
 * library's lazily read settings (threads per rank from the environment,
 * SYNCBN_DEBUG) must be initialized without a data race. The check is
 * ThreadSanitizer's (make check-tsan / the TSan subset of make check, which
 * stop on the first report); in the normal build the test checks that every
 * rank sees the same answers. 8 ranks, each runs a layer forward right after
 * a barrier, so the first calls overlap. First calls happen once per
 * process, so the test runs itself as 20 fresh processes.
 * Also read once: SYNCBN_NUM_THREADS, which fresh processes check to take a
 * positive integer whole and ignore anything else (the default applies;
 * "5x" was read as 5, "1e3" as 1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum { P = 8 };
static int answers[P], failures[P];

static int rank_main(sbn_group *world, void *arg) {
  (void)arg;
  const int r = sbn_group_rank(world);
  sbn_bn_options o = sbn_bn_options_default(2);
  sbn_bn *bn;
  CHECK_OK(sbn_bn_create(&bn, &o, world));
  float xs[8] = {1, 2, 3, 4, 5, 6, 7, (float)r}, ys[8];
  int64_t sh[2] = {4, 2};
  sbn_tensor x = sbn_tensor_cpu(xs, 2, sh, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_tensor y = sbn_tensor_cpu(ys, 2, sh, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  CHECK_OK(sbn_group_barrier(world));
  answers[r] = sbn_num_threads(P); /* first calls, all at once */
  CHECK_OK(sbn_bn_forward(bn, &y, &x));
  sbn_status st = sbn_bn_set_num_batches_tracked(bn, -1); /* a failure: sbn_fail on every rank at once */
  failures[r] = st != SBN_STATUS_INVALID_ARGUMENT;
  sbn_bn_destroy(bn);
  return 0;
}

/* sbn_num_threads(1) of a fresh process with SYNCBN_NUM_THREADS = value
 * (NULL: unset); -1 if it could not be read. */
static int threads_with_env(const char *self, const char *value) {
  char cmd[4096];
  if (value) snprintf(cmd, sizeof cmd, "SYNCBN_NUM_THREADS='%s' '%s' threads", value, self);
  else snprintf(cmd, sizeof cmd, "env -u SYNCBN_NUM_THREADS '%s' threads", self);
  FILE *f = popen(cmd, "r");
  int v = -1;
  if (f && fscanf(f, "%d", &v) != 1) v = -1;
  if (f) pclose(f);
  return v;
}

static int env_threads_checks(const char *self) {
  const int def = threads_with_env(self, NULL);
  int bad = def < 1;
  printf("SYNCBN_NUM_THREADS unset: %d threads per rank\n", def);
  static const struct { const char *value; int want; } cases[] = {
      {"7", 7}, {" 7 ", 7}, {"", 0}, {"abc", 0}, {"0", 0}, {"-3", 0}, {"5x", 0}, {"1e3", 0}, {"+7", 0},
      {"99999999999", 0}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const int want = cases[i].want ? cases[i].want : def, got = threads_with_env(self, cases[i].value);
    printf("SYNCBN_NUM_THREADS='%s': %d threads per rank (expected %d%s) %s\n", cases[i].value, got, want,
           cases[i].want ? "" : ": ignored, the default", got == want ? "ok" : "FAIL");
    bad += got != want;
  }
  fflush(stdout); /* before the child processes' lines */
  return bad;
}

int main(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "threads")) return printf("%d\n", sbn_num_threads(1)) < 0;
  if (argc < 2) {
    int bad = env_threads_checks(argv[0]);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' once", argv[0]);
    for (int i = 0; i < 20; i++) {
      int rc = system(cmd);
      if (rc != 0) printf("process %d: exit status %d FAIL\n", i, rc), bad++;
    }
    printf(bad ? "FAIL: %d of 20 processes\n" : "20 processes: ok\n", bad);
    return bad != 0;
  }
  sbn_status st = sbn_team_run(P, rank_main, NULL);
  int bad = st != SBN_STATUS_OK;
  for (int r = 0; r < P; r++) bad += failures[r] + (answers[r] != answers[0]);
  printf("%d ranks' first calls at once: threads per rank %d on every rank, errors recorded: %s\n", P, answers[0],
         bad ? "FAIL" : "ok");
  return bad != 0;
}
