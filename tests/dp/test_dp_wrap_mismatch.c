/* sbn_dp_wrap on ranks whose models differ (another head size, an extra
 * layer on one rank, a parameter frozen on one rank only: sizes equal, but
 * the all-reduce would mix parameters; another reduce mode on one rank)
 * fails on every rank before any state moves: the rank that differs
 * returns SBN_STATUS_MISMATCH naming its first entry (or option) that
 * differs, the others SBN_STATUS_PEER_FAILED naming it; every rank's
 * parameters and buffers are bit for bit what they were, nothing is
 * wrapped. A rank that wraps a child module instead of its root gets
 * SBN_STATUS_INVALID_ARGUMENT (its wrapper would outlive the root's
 * destruction). A wrap of equal models then succeeds. 2 thread ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../tools/train/model.h"
#include "syncbn_dp.h"

enum { P = 2 };

typedef struct outcome {
  sbn_status st, again;
  char msg[512];
  int state_kept, wrapped;
} outcome;
enum { SC_CLASSES, SC_WIDER, SC_FROZEN, SC_REDUCE, SC_CHILD, SC_EQUAL, SC_COUNT };
static outcome res[SC_COUNT][P];
static int scenario;

/* All of a model's state, copied (to compare after the failed wrap). */
static size_t state_copy(sbn_module *m, char **out) {
  sbn_nn_entry *e = NULL;
  int n = 0;
  if (sbn_module_entries(&e, &n, m, SBN_NN_STATE) != SBN_STATUS_OK) return 0;
  size_t total = 0;
  for (int i = 0; i < n; i++) total += (size_t)e[i].numel * (e[i].dtype == SBN_DTYPE_INT64 ? 8 : 4);
  char *buf = malloc(total + 1), *p = buf;
  for (int i = 0; buf && i < n; i++) {
    const size_t b = (size_t)e[i].numel * (e[i].dtype == SBN_DTYPE_INT64 ? 8 : 4);
    memcpy(p, e[i].data, b), p += b;
  }
  free(e);
  *out = buf;
  return buf ? total : 0;
}

static sbn_status build(sbn_module **model, int rank, sbn_group *world) {
  /* rank 1's head has 11 classes; or a wider stem (other sizes everywhere
   * after it); or its first parameter frozen */
  const int classes = scenario == SC_CLASSES && rank == 1 ? 11 : 10;
  const int width = scenario == SC_WIDER && rank == 1 ? 6 : 4;
  sbn_module *m = NULL, *conv = NULL;
  sbn_status st = build_resnet(&m, 3, width, classes, 7 + (uint64_t)rank); /* different values per rank */
  if (st == SBN_STATUS_OK) st = sbn_nn_convert_sync_batchnorm(&conv, m, world);
  if (st == SBN_STATUS_OK && scenario == SC_FROZEN) { /* rank 0 freezes its first parameter, rank 1 its last */
    sbn_nn_entry *e = NULL;
    int n = 0;
    st = sbn_module_entries(&e, &n, m, SBN_NN_PARAMETERS);
    if (st == SBN_STATUS_OK) st = sbn_module_set_requires_grad(m, e[rank == 0 ? 0 : n - 1].name, 0);
    free(e);
  }
  *model = m;
  return st;
}

static int rank_main(sbn_group *world, void *arg) {
  (void)arg;
  const int rank = sbn_group_rank(world);
  outcome *o = &res[scenario][rank];
  sbn_group_set_timeout(world, 60);
  sbn_module *model = NULL;
  if (build(&model, rank, world) != SBN_STATUS_OK) return 1;
  char *before = NULL, *after = NULL;
  const size_t nb = state_copy(model, &before);
  sbn_dp *dp = (sbn_dp *)1;
  sbn_dp_options opt = sbn_dp_options_default();
  if (scenario == SC_REDUCE && rank == 1) opt.reduce = SBN_DP_REDUCE_SUM;
  sbn_module *target = model;
  const char *name;
  if (scenario == SC_CHILD && rank == 1 && sbn_module_child(&target, &name, model, 0) != SBN_STATUS_OK) return 1;
  o->st = sbn_dp_wrap(&dp, target, NULL, 0, SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE, world, &opt);
  snprintf(o->msg, sizeof o->msg, "%s", sbn_last_error());
  const size_t na = state_copy(model, &after);
  o->state_kept = nb && nb == na && !memcmp(before, after, nb);
  o->wrapped = o->st == SBN_STATUS_OK ? 1 : (dp != NULL || sbn_module_is_wrapped(model) != 0);
  if (o->st == SBN_STATUS_OK) sbn_dp_destroy(dp);
  free(before), free(after);
  sbn_module_destroy(model);
  return 0;
}

int main(void) {
  static const char *const what[SC_COUNT] = {"rank 1's head has 11 classes", "rank 1's model is wider",
                                             "another parameter frozen", "rank 1 sums, rank 0 averages",
                                             "rank 1 wraps a child module", "equal models"};
  /* what the rank that differs must name */
  static const char *const names[SC_COUNT] = {"rank 0", "rank 0", "requires_grad", "reduce SUM", "child", ""};
  int failures = 0;
  for (scenario = 0; scenario < SC_COUNT; scenario++) {
    if (sbn_team_run(P, rank_main, NULL) != SBN_STATUS_OK) {
      printf("FAIL %s: the ranks did not run: %s\n", what[scenario], sbn_last_error());
      failures++;
      continue;
    }
    for (int r = 0; r < P; r++) {
      const outcome *o = &res[scenario][r];
      const int equal = scenario == SC_EQUAL;
      sbn_status want = equal ? SBN_STATUS_OK
                        : r == 0 ? SBN_STATUS_PEER_FAILED
                        : scenario == SC_CHILD ? SBN_STATUS_INVALID_ARGUMENT : SBN_STATUS_MISMATCH;
      int ok = o->st == want && (equal || (o->state_kept && !o->wrapped && o->msg[0])) && (equal ? o->wrapped : 1);
      if (!equal && r == 1) ok = ok && strstr(o->msg, names[scenario]) != NULL;
      if (!equal && r == 0) ok = ok && strstr(o->msg, "rank 1") != NULL;
      failures += !ok;
      printf("%-4s %-30s rank %d: %-24s state %s, %s: \"%.160s\"\n", ok ? "ok" : "FAIL", what[scenario], r,
             sbn_status_name(o->st), o->state_kept ? "unchanged" : "CHANGED",
             o->wrapped ? "wrapped" : "not wrapped", o->msg);
    }
  }
  if (failures) {
    printf("FAILED: %d checks\n", failures);
    return 1;
  }
  printf("all wrap-mismatch checks passed\n");
  return 0;
}
