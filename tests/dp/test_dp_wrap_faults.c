/* A failure on ONE rank late in sbn_dp_wrap (bucket planning, after the
 * communication group's split, starting the communication thread) reaches
 * every rank at once: the failing rank returns its own error, the others
 * SBN_STATUS_PEER_FAILED naming it, all well before the group's timeout
 * (set to 60 s here; before the agreement the others waited all of it).
 * Nothing stays wrapped and the group stays usable: a wrap right after
 * succeeds on every rank. The failure is injected with an internal test hook
 * (src/dp/dp_testhook.h, not exported). The same holds for a rank that
 * passes out = NULL (it returned at once and its peers waited out their
 * timeout). 3 thread ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../src/dp/dp_testhook.h"
#include "../../tools/train/model.h"
#include "syncbn_dp.h"

enum { P = 3 };
static const double TIMEOUT_S = 60, LIMIT_S = 5; /* agreed failures take milliseconds */

typedef struct outcome {
  sbn_status st, again;
  char msg[512];
  double seconds;
  int wrapped_after_failure;
} outcome;
static outcome res[P];
static int null_out_rank = -1; /* this rank calls sbn_dp_wrap(NULL, ...) */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int rank_main(sbn_group *world, void *arg) {
  (void)arg;
  const int rank = sbn_group_rank(world);
  outcome *o = &res[rank];
  sbn_group_set_timeout(world, TIMEOUT_S);
  sbn_module *model = NULL, *conv = NULL;
  if (build_resnet(&model, 3, 4, 10, 5) != SBN_STATUS_OK) return 1;
  if (sbn_nn_convert_sync_batchnorm(&conv, model, world) != SBN_STATUS_OK) return 1;
  sbn_nn_sgd_options so = {0.1, 0.0, 0.0, 0.0, 0};
  sbn_nn_sgd *sgd;
  if (sbn_nn_sgd_create(&sgd, model, &so) != SBN_STATUS_OK) return 1;
  sbn_dp_options opt = sbn_dp_options_default();
  opt.overlap = 1; /* the threads backend starts a communication thread */
  sbn_dp *dp = (sbn_dp *)1;
  double t0 = now();
  const int null_out = rank == null_out_rank;
  o->st = sbn_dp_wrap(null_out ? NULL : &dp, model, &sgd, 1, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, world, &opt);
  o->seconds = now() - t0;
  snprintf(o->msg, sizeof o->msg, "%s", sbn_last_error());
  o->wrapped_after_failure =
      o->st != SBN_STATUS_OK && ((!null_out && dp != NULL) || sbn_module_is_wrapped(model) != 0);
  if (o->st == SBN_STATUS_OK) sbn_dp_destroy(dp);
  /* the hook fired once: the same call now succeeds everywhere */
  dp = NULL;
  o->again = sbn_dp_wrap(&dp, model, &sgd, 1, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, world, &opt);
  if (o->again == SBN_STATUS_OK) sbn_dp_destroy(dp);
  sbn_nn_sgd_destroy(sgd);
  sbn_module_destroy(model);
  return 0;
}

int main(void) {
  static const sbn_dp_fault stages[4] = {SBN_DP_FAULT_PLAN, SBN_DP_FAULT_SPLIT, SBN_DP_FAULT_WORKER,
                                          SBN_DP_FAULT_NONE};
  static const char *const names[4] = {"bucket planning", "after the split", "communication thread",
                                       "the arguments (out = NULL)"};
  int bad = 0;
  for (int s = 0; s < 4; s++)
    for (int victim = 0; victim < P; victim += P - 1) {
      memset(res, 0, sizeof res);
      const int injected = stages[s] != SBN_DP_FAULT_NONE;
      sbn_dp_test_fault = stages[s], sbn_dp_test_fault_rank = victim, sbn_dp_test_fault_times = 1;
      null_out_rank = injected ? -1 : victim;
      sbn_status st = sbn_team_run(P, rank_main, NULL);
      sbn_dp_test_fault = SBN_DP_FAULT_NONE, null_out_rank = -1;
      printf("fault in %s on rank %d:\n", names[s], victim);
      if (st != SBN_STATUS_OK) printf("  team: %s: %s FAIL\n", sbn_status_name(st), sbn_last_error()), bad++;
      for (int r = 0; r < P; r++) {
        const outcome *o = &res[r];
        char who[32];
        snprintf(who, sizeof who, "rank %d", victim);
        int ok = r != victim ? o->st == SBN_STATUS_PEER_FAILED && strstr(o->msg, who)
                 : injected  ? o->st == SBN_STATUS_OUT_OF_MEMORY && strstr(o->msg, "injected")
                             : o->st == SBN_STATUS_INVALID_ARGUMENT && strstr(o->msg, "out is NULL");
        ok = ok && o->seconds < LIMIT_S && !o->wrapped_after_failure && o->again == SBN_STATUS_OK;
        printf("  rank %d: %-26s in %.3f s (limit %.0f s, timeout %.0f s) \"%s\"; wrap again: %s %s\n", r,
               sbn_status_name(o->st), o->seconds, LIMIT_S, TIMEOUT_S, o->msg, sbn_status_name(o->again),
               ok ? "ok" : "FAIL");
        bad += !ok;
      }
    }
  printf(bad ? "FAIL: %d problem(s)\n" : "late wrap failures reach every rank at once: ok\n", bad);
  return bad != 0;
}
