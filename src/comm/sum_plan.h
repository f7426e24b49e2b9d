/* Internal: what every rank of a group predicts about its next reduction,
 * as a pure function of what all ranks have agreed so far (so the
 * prediction is the same on every rank, and the engine's collective has the
 * same count and datatype everywhere).
 *
 * A training loop repeats: the collective that followed an agreed
 * signature last time usually follows it again, with the same count and
 * values of similar magnitudes. A plan, keyed by the previous agreed
 * signature, remembers that count and, per value, the top bin of the last
 * agreed sum: the window in which this rank encodes its terms as integer
 * lanes (exact_lanes.h), which the engine sums with its built-in integer
 * sum. The state machine (every transition follows from agreed data):
 *   - a count seen for the first time after its key: learn it and the
 *     windows (the binned sum's top bins), try lanes next time;
 *   - lanes, every term of every rank fit: keep the windows;
 *   - lanes, some term did not fit: the call falls back to the binned sum;
 *     learn its windows and run the next call binned, with a probe;
 *   - binned with a probe (each rank checks whether its terms fit the
 *     windows; the max rides in the control element): all fit -> lanes next
 *     time with these windows; else learn the new windows, stay binned. */
#ifndef SBN_SUM_PLAN_H
#define SBN_SUM_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "exact_sum.h"

enum { SBN_PLAN_SLOTS = 256 };

typedef struct sbn_plan {
  uint64_t key;     /* the agreed signature this plan follows */
  int64_t count;    /* the count of the collective that followed it */
  int lanes;        /* next time: integer lanes in windows `top` */
  int has_top;      /* top holds `count` windows */
  uint8_t *top;
  size_t top_cap;
} sbn_plan;

typedef struct sbn_plans { sbn_plan slot[SBN_PLAN_SLOTS]; } sbn_plans;

/* The plan for the collective after agreed signature `key` (its slot; it
 * predicts only if p->key == key: see the helpers below). */
static inline sbn_plan *sbn_plan_at(sbn_plans *t, uint64_t key) { return &t->slot[key % SBN_PLAN_SLOTS]; }
/* The predicted count (0: none). */
static inline size_t sbn_plan_count(const sbn_plan *p, uint64_t key) { return p->key == key ? (size_t)p->count : 0; }
/* Whether the first reduction carries lanes in the plan's windows. */
static inline int sbn_plan_lanes(const sbn_plan *p, uint64_t key) {
  return p->key == key && p->lanes && p->has_top && p->count > 0;
}
/* Whether a binned first reduction carries a probe of the plan's windows
 * for a payload of n values. */
static inline int sbn_plan_probe(const sbn_plan *p, uint64_t key, size_t n) {
  return p->key == key && p->has_top && (size_t)p->count == n && n > 0;
}
/* Room for n windows, before the collective (so that a failure happens
 * before any rank's engine call). Returns 0 when out of memory. */
int sbn_plan_reserve(sbn_plan *p, size_t n);

typedef enum sbn_plan_outcome {
  SBN_PLAN_LANES_FIT,    /* lanes, every term fit */
  SBN_PLAN_LANES_MISFIT, /* lanes, some term did not fit: `sums` is the binned fallback */
  SBN_PLAN_BINNED,       /* binned: probe_ok says whether every rank's terms fit the windows */
} sbn_plan_outcome;

/* Record an agreed reduction of n values after signature `key`: its
 * outcome and, when binned, its sums (NULL when the payload was not kept
 * whole, e.g. reduced in pieces: then no windows are learnt). */
void sbn_plan_learn(sbn_plan *p, uint64_t key, size_t n, sbn_plan_outcome how, int probe_ok, const sbn_xbin *sums);

void sbn_plans_free(sbn_plans *t);

#endif
