/* Predicted counts and windows (see sum_plan.h). */
#include "sum_plan.h"

#include <stdlib.h>

#include "exact_lanes.h"

int sbn_plan_reserve(sbn_plan *p, size_t n) {
  if (n <= p->top_cap) return 1;
  uint8_t *t = realloc(p->top, n);
  if (!t) return 0;
  p->top = t, p->top_cap = n;
  return 1;
}

void sbn_plan_learn(sbn_plan *p, uint64_t key, size_t n, sbn_plan_outcome how, int probe_ok, const sbn_xbin *sums) {
  const int same = p->key == key && (size_t)p->count == n && p->has_top;
  if (how == SBN_PLAN_LANES_FIT) return; /* the windows worked: keep them */
  if (how == SBN_PLAN_BINNED && same && probe_ok) { /* they would have worked: use them next time */
    p->lanes = 1;
    return;
  }
  p->key = key;
  p->count = (int64_t)n;
  p->has_top = sums != NULL && n > 0 && n <= p->top_cap;
  if (p->has_top) sbn_xlanes_tops(p->top, sums, n);
  /* new: optimistic; after a misfit or a failed probe: probe first */
  p->lanes = !same;
}

void sbn_plans_free(sbn_plans *t) {
  for (int i = 0; i < SBN_PLAN_SLOTS; i++) free(t->slot[i].top), t->slot[i].top = NULL, t->slot[i].top_cap = 0;
}
