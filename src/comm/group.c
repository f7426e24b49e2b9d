/* Process groups, backend-independent part: the public sbn_group_* calls,
 * argument checks, signatures and the messages for disagreeing ranks.
 * new_group (a rank list) is built on the backend's split. */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "group_testhook.h"
#include "../core/tensor.h"

/* A timeout in seconds as the backends use it: >= SBN_TIMEOUT_FOREVER (or
 * +inf) becomes +inf, "wait forever" (no deadline arithmetic that could
 * overflow, and the waits sleep). */
static double normalize_timeout(double v) { return v >= SBN_TIMEOUT_FOREVER ? INFINITY : v; }

enum { DEFAULT_TIMEOUT_S = 300 };

/* SYNCBN_TIMEOUT's seconds: the default when unset or empty, NaN when it is
 * not a positive number, all of it ("2x" is not 2: a typo must not pass as
 * another timeout). */
static double env_timeout(const char *env) {
  if (!env || !env[0]) return DEFAULT_TIMEOUT_S;
  char *end;
  double v = strtod(env, &end);
  while (end != env && isspace((unsigned char)*end)) end++;
  if (end == env || *end || !(v > 0)) return NAN; /* NaN fails v > 0 */
  return normalize_timeout(v);
}

double sbn_default_timeout(void) {
  const char *env = getenv("SYNCBN_TIMEOUT");
  double v = env_timeout(env);
  if (isnan(v))
    sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
             "SYNCBN_TIMEOUT='%.100s' is not a positive number of seconds (inf: wait forever)", env);
  return v;
}

static uint64_t next_root_id(void) {
  static uint64_t counter;
  return __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
}

_Thread_local int sbn_group_test_alloc_failures;

sbn_group *sbn_group_alloc(const sbn_comm_ops *ops, void *impl, int rank, int size,
                           const char *name) {
  if (sbn_group_test_alloc_failures > 0) {
    sbn_group_test_alloc_failures--;
    return NULL;
  }
  sbn_group *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->world_ranks = malloc(sizeof(int) * (size_t)size);
  if (!g->world_ranks) {
    free(g);
    return NULL;
  }
  for (int i = 0; i < size; i++) g->world_ranks[i] = i; /* a root until split says otherwise */
  g->root_id = next_root_id();
  g->ops = ops;
  g->impl = impl;
  g->rank = rank;
  g->size = size;
  /* the root group's constructor refused an invalid value; set since then,
   * it must not make a sub-group wait forever */
  const double t = env_timeout(getenv("SYNCBN_TIMEOUT"));
  g->timeout_s = isnan(t) ? DEFAULT_TIMEOUT_S : t;
  snprintf(g->name, sizeof g->name, "%s", name);
  return g;
}

void sbn_sig_init_text(sbn_sig *sig, sbn_sig_kind kind, int layer, int64_t count, sbn_dtype dtype,
                       const char *what) {
  memset(sig, 0, sizeof *sig);
  sig->kind = kind;
  sig->layer = layer;
  sig->count = count;
  sig->dtype = dtype;
  sig->status = SBN_STATUS_OK;
  const size_t n = strnlen(what, sizeof sig->what - 1);
  memcpy(sig->what, what, n); /* NUL-terminated by the memset */
}

void sbn_sig_init(sbn_sig *sig, sbn_sig_kind kind, int layer, int64_t count, sbn_dtype dtype,
                  const char *fmt, ...) {
  sbn_sig_init_text(sig, kind, layer, count, dtype, "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sig->what, sizeof sig->what, fmt, ap);
  va_end(ap);
}

void sbn_sig_set_error(sbn_sig *sig, sbn_status status) {
  sig->status = status;
  snprintf(sig->what, sizeof sig->what, "%s", sbn_last_error());
}

int sbn_sig_same(const sbn_sig *a, const sbn_sig *b) {
  return a->kind == b->kind && a->layer == b->layer && a->count == b->count &&
         a->dtype == b->dtype && a->extra == b->extra;
}

sbn_status sbn_sig_verdict(const sbn_group *g, const sbn_sig *sigs, int me) {
  int first_err = -1, differ = 0;
  for (int r = 0; r < g->size; r++) {
    if (sigs[r].status != SBN_STATUS_OK && first_err < 0) first_err = r;
    if (!sbn_sig_same(&sigs[r], &sigs[0])) differ = 1;
  }
  if (first_err < 0 && !differ) return SBN_STATUS_OK;
  if (sigs[me].status != SBN_STATUS_OK) /* our own error: keep its message */
    return sbn_fail((sbn_status)sigs[me].status, "%s", sigs[me].what);
  if (first_err >= 0)
    return sbn_fail(SBN_STATUS_PEER_FAILED, "group '%s' (%s, %d ranks): rank %d failed: %s",
                    g->name, g->ops->name, g->size, first_err, sigs[first_err].what);
  /* Ranks disagree: list each distinct call with the ranks making it. */
  char msg[900];
  int len = snprintf(msg, sizeof msg, "group '%s' (%s, %d ranks): ranks disagree on the collective:",
                     g->name, g->ops->name, g->size);
  for (int r = 0; r < g->size && len < (int)sizeof msg; r++) {
    int seen = 0;
    for (int q = 0; q < r; q++) seen |= sbn_sig_same(&sigs[q], &sigs[r]);
    if (seen) continue;
    len += snprintf(msg + len, sizeof msg - len, "%s [rank", r ? ";" : "");
    for (int q = r; q < g->size && len < (int)sizeof msg; q++)
      if (sbn_sig_same(&sigs[q], &sigs[r])) len += snprintf(msg + len, sizeof msg - len, " %d", q);
    if (len < (int)sizeof msg) len += snprintf(msg + len, sizeof msg - len, "] %s", sigs[r].what);
  }
  return sbn_fail(SBN_STATUS_MISMATCH, "%s", msg);
}

/* ---- public calls ---- */

int sbn_group_rank(const sbn_group *g) { return g ? g->rank : -1; }
int sbn_group_size(const sbn_group *g) { return g ? g->size : 0; }
const char *sbn_group_backend(const sbn_group *g) { return g ? g->ops->name : ""; }
const char *sbn_group_name(const sbn_group *g) { return g ? g->name : ""; }

sbn_status sbn_group_set_timeout(sbn_group *g, double seconds) {
  sbn_clear_error();
  if (!g) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_group_set_timeout: group is NULL");
  if (!(seconds > 0))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "sbn_group_set_timeout: timeout must be a positive number of seconds, got %g",
                    seconds);
  g->timeout_s = normalize_timeout(seconds);
  return SBN_STATUS_OK;
}

/* ---- lifetime: holders and the destroyed bit ---- */

enum { DESTROYED = 1u << 31 };

static sbn_status gone(const sbn_group *g, const char *what) {
  return sbn_fail(SBN_STATUS_BAD_STATE,
                  "%s on group '%s' (rank %d of %d): the group was destroyed (sbn_group_destroy) while a layer "
                  "or data-parallel wrapper still used it; destroy those before their group",
                  what, g->name, g->rank, g->size);
}
static sbn_status gone_allreduce(sbn_group *g, void *buf, size_t count, sbn_dtype dtype, const sbn_sig *sig) {
  (void)buf, (void)count, (void)dtype;
  return gone(g, sig->what[0] ? sig->what : "a collective");
}
static sbn_status gone_broadcast(sbn_group *g, void *buf, size_t bytes, int root, const sbn_sig *sig) {
  (void)buf, (void)bytes, (void)root;
  return gone(g, sig->what[0] ? sig->what : "a broadcast");
}
static sbn_status gone_barrier(sbn_group *g, const sbn_sig *sig) {
  return gone(g, sig->what[0] ? sig->what : "a barrier");
}
static sbn_status gone_split(sbn_group **out, sbn_group *g, int color, int key, const sbn_sig *sig, int *agreed) {
  (void)color, (void)key, (void)sig;
  *out = NULL, *agreed = 0;
  return gone(g, "a split");
}
static void gone_destroy(sbn_group *g) { (void)g; }
static sbn_status gone_allreduce_device(sbn_group *g, void *buf, size_t count, sbn_dtype dtype, const sbn_sig *sig,
                                        void *stream) {
  (void)stream;
  return gone_allreduce(g, buf, count, dtype, sig);
}
static void gone_abort(sbn_group *g, const char *why) { (void)g, (void)why; }
/* The backend of a destroyed handle that holders keep alive. */
static const sbn_comm_ops gone_ops = {"destroyed",  gone_allreduce, gone_broadcast,        gone_barrier,
                                      gone_split,   gone_destroy,   gone_allreduce_device, gone_abort};

static void free_handle(sbn_group *g) {
  free(g->world_ranks);
  free(g);
}

void sbn_group_retain(sbn_group *g) { __atomic_add_fetch(&g->holds, 1, __ATOMIC_ACQ_REL); }
void sbn_group_release(sbn_group *g) {
  if (__atomic_sub_fetch(&g->holds, 1, __ATOMIC_ACQ_REL) == DESTROYED) free_handle(g);
}

sbn_status sbn_group_destroy(sbn_group *g) {
  if (!g) return SBN_STATUS_OK;
  if (__atomic_load_n(&g->holds, __ATOMIC_ACQUIRE) & DESTROYED)
    return sbn_fail(SBN_STATUS_BAD_STATE, "sbn_group_destroy: group '%s' (rank %d of %d) was already destroyed",
                    g->name, g->rank, g->size);
  g->ops->destroy(g);
  g->ops = &gone_ops, g->impl = NULL;
  /* the last holder (or this call, when none) frees the memory */
  if (__atomic_fetch_or(&g->holds, DESTROYED, __ATOMIC_ACQ_REL) == 0) free_handle(g);
  return SBN_STATUS_OK;
}

sbn_status sbn_group_allreduce(sbn_group *g, void *buf, size_t count, sbn_dtype dtype,
                               sbn_reduce_op op) {
  sbn_clear_error();
  if (!g) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_group_allreduce: group is NULL");
  sbn_sig sig;
  sbn_sig_init(&sig, SBN_SIG_KIND_ALLREDUCE, -1, (int64_t)count, dtype,
               "allreduce of %zu %s values", count, sbn_dtype_name(dtype));
  if (dtype != SBN_DTYPE_FLOAT32 && dtype != SBN_DTYPE_FLOAT64)
    sbn_sig_set_error(&sig, sbn_fail(SBN_STATUS_UNSUPPORTED,
                                     "sbn_group_allreduce: dtype %s unsupported (float32 or float64)",
                                     sbn_dtype_name(dtype)));
  else if (op != SBN_REDUCE_OP_SUM)
    sbn_sig_set_error(&sig, sbn_fail(SBN_STATUS_UNSUPPORTED,
                                     "sbn_group_allreduce: op %d unsupported (only SUM)", (int)op));
  else if (!buf && count)
    sbn_sig_set_error(&sig, sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                                     "sbn_group_allreduce: buf is NULL with count %zu", count));
  else if (count > (size_t)INT64_MAX / 8) /* its bytes (and the backends' encodings) would wrap */
    sbn_sig_set_error(&sig, sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                                     "sbn_group_allreduce: count %zu is larger than any buffer", count));
  if (sig.status != SBN_STATUS_OK) count = 0; /* still take part, carry the error */
  sbn_status st = g->ops->allreduce(g, buf, count, dtype, &sig);
  if (sig.status != SBN_STATUS_OK) sbn_failure_told();
  return st;
}

sbn_status sbn_group_broadcast(sbn_group *g, void *buf, size_t bytes, int root) {
  sbn_clear_error();
  if (!g) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_group_broadcast: group is NULL");
  sbn_sig sig;
  sbn_sig_init(&sig, SBN_SIG_KIND_BROADCAST, -1, (int64_t)bytes, SBN_DTYPE_FLOAT32,
               "broadcast of %zu bytes from rank %d", bytes, root);
  sig.extra = (uint64_t)(int64_t)root;
  if (root < 0 || root >= g->size)
    sbn_sig_set_error(&sig, sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                                     "sbn_group_broadcast: root %d is not a rank of group '%s' (size %d)",
                                     root, g->name, g->size));
  else if (!buf && bytes)
    sbn_sig_set_error(&sig, sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                                     "sbn_group_broadcast: buf is NULL with %zu bytes", bytes));
  sbn_status st = g->ops->broadcast(g, buf, bytes, root, &sig);
  if (sig.status != SBN_STATUS_OK) sbn_failure_told();
  return st;
}

void sbn_group_abort(sbn_group *g, const char *why) {
  if (g && g->size > 1 && g->ops->abort) g->ops->abort(g, why);
}

sbn_status sbn_group_barrier(sbn_group *g) {
  sbn_clear_error();
  if (!g) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_group_barrier: group is NULL");
  sbn_sig sig;
  sbn_sig_init(&sig, SBN_SIG_KIND_BARRIER, -1, 0, SBN_DTYPE_FLOAT32, "barrier");
  return g->ops->barrier(g, &sig);
}

/* A new sub-group learns its members' root ranks (one small all-reduce on
 * the new group: every member just received it, so all call this).
 * ranks: g->size doubles, allocated by the caller before the split's
 * agreement (so that failing to allocate them is part of it). */
static sbn_status inherit_lineage(sbn_group *g, const sbn_group *parent, double *ranks) {
  memset(ranks, 0, sizeof *ranks * (size_t)g->size);
  ranks[g->rank] = parent->world_ranks[parent->rank];
  sbn_sig sig;
  sbn_sig_init(&sig, SBN_SIG_KIND_SPLIT, -1, g->size, SBN_DTYPE_FLOAT64, "lineage of a new group");
  sbn_status st = g->ops->allreduce(g, ranks, (size_t)g->size, SBN_DTYPE_FLOAT64, &sig);
  for (int i = 0; st == SBN_STATUS_OK && i < g->size; i++) g->world_ranks[i] = (int)ranks[i];
  g->root_id = parent->root_id;
  return st;
}

/* The backend's split, then agreement on its outcome. Once the ranks have
 * agreed on the call, making this rank's handle can still fail here alone
 * (out of memory); its new group's members would then wait for it in
 * their first collective until the timeout. So one more collective over
 * the parent carries every rank's outcome: each rank returns at once, the
 * failing one its own error, the others SBN_STATUS_PEER_FAILED naming it,
 * and nobody keeps a group (the parent stays usable). Non-members
 * (SBN_STATUS_NOT_MEMBER) count as success. */
static sbn_status split_agreed(sbn_group **out, sbn_group *parent, int color, int key, const sbn_sig *sig) {
  sbn_group *g = NULL;
  int agreed = 0;
  sbn_status st = parent->ops->split(&g, parent, color, key, sig, &agreed);
  if (!agreed) return st; /* every rank has the same verdict, or the parent broke */
  double *ranks = NULL;
  if (st == SBN_STATUS_OK && !(ranks = malloc(sizeof *ranks * (size_t)g->size)))
    st = sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "group '%s': out of memory for its lineage", g->name);
  sbn_sig outcome;
  sbn_sig_init(&outcome, SBN_SIG_KIND_SPLIT, -1, 0, SBN_DTYPE_FLOAT32, "outcome of %.200s", sig->what);
  outcome.extra = 1; /* not the split's own signature */
  if (st != SBN_STATUS_OK && st != SBN_STATUS_NOT_MEMBER) sbn_sig_set_error(&outcome, st);
  char mine[sizeof outcome.what];
  snprintf(mine, sizeof mine, "%s", sbn_last_error());
  sbn_status verdict = parent->ops->barrier(parent, &outcome);
  if (outcome.status != SBN_STATUS_OK) { /* ours: keep it, whatever the barrier said */
    if (verdict == st) sbn_failure_told();
    sbn_restore_error(mine);
    verdict = st;
  }
  if (verdict == SBN_STATUS_OK && st == SBN_STATUS_NOT_MEMBER) {
    sbn_restore_error(mine);
    verdict = st;
  }
  if (verdict == SBN_STATUS_OK && (verdict = inherit_lineage(g, parent, ranks)) == SBN_STATUS_OK) *out = g;
  free(ranks);
  if (!*out) {
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", sbn_last_error());
    sbn_group_destroy(g);
    sbn_restore_error(keep);
  }
  return verdict;
}

int sbn_group_contains(const sbn_group *outer, const sbn_group *inner) {
  if (!outer || !inner || outer->root_id != inner->root_id) return 0;
  for (int i = 0; i < inner->size; i++) {
    int found = 0;
    for (int j = 0; j < outer->size && !found; j++) found = outer->world_ranks[j] == inner->world_ranks[i];
    if (!found) return 0;
  }
  return 1;
}

sbn_status sbn_group_split(sbn_group **out, sbn_group *parent, int color, int key) {
  sbn_clear_error();
  if (out) *out = NULL;
  if (!parent) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_group_split: parent is NULL");
  sbn_sig sig;
  sbn_sig_init(&sig, SBN_SIG_KIND_SPLIT, -1, 0, SBN_DTYPE_FLOAT32, "split(color=%d, key=%d)",
               color, key);
  if (!out)
    sbn_sig_set_error(&sig, sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_group_split: out is NULL"));
  else if (color < 0 && color != SBN_UNDEFINED)
    sbn_sig_set_error(&sig, sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                                     "sbn_group_split: color %d is negative (use SBN_UNDEFINED)", color));
  sbn_group *tmp = NULL;
  sbn_status st = split_agreed(&tmp, parent, color, key, &sig);
  if (out) *out = tmp;
  return st;
}

static uint64_t hash_ranks(int n, const int *ranks) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (int i = 0; i < n; i++) {
    h ^= (uint64_t)(uint32_t)ranks[i];
    h *= 1099511628211ull;
  }
  return h ^ (uint64_t)n;
}

sbn_status sbn_group_new(sbn_group **out, sbn_group *parent, int n, const int *ranks) {
  sbn_clear_error();
  if (out) *out = NULL;
  if (!parent) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_group_new: parent is NULL");
  /* First agree on the list (a barrier whose signature carries its hash),
   * then split: members get color 0 and their list position as key. */
  sbn_sig sig;
  char list[160];
  int len = 0;
  list[0] = '\0';
  for (int i = 0; ranks && i < n && len < (int)sizeof list - 8; i++)
    len += snprintf(list + len, sizeof list - len, "%s%d", i ? "," : "", ranks[i]);
  sbn_sig_init(&sig, SBN_SIG_KIND_NEW_GROUP, -1, n, SBN_DTYPE_FLOAT32, "new_group(ranks={%s})",
               list);
  int position = -1;
  if (!out) {
    sbn_sig_set_error(&sig, sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_group_new: out is NULL"));
  } else if (n < 1 || !ranks) {
    sbn_sig_set_error(&sig, sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                                     "sbn_group_new: need a list of at least one rank (n=%d)", n));
  } else {
    sig.extra = hash_ranks(n, ranks);
    for (int i = 0; i < n && sig.status == SBN_STATUS_OK; i++) {
      if (ranks[i] < 0 || ranks[i] >= parent->size)
        sbn_sig_set_error(&sig, sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                                         "sbn_group_new: rank %d is not in group '%s' (size %d)",
                                         ranks[i], parent->name, parent->size));
      for (int j = 0; j < i && sig.status == SBN_STATUS_OK; j++)
        if (ranks[j] == ranks[i])
          sbn_sig_set_error(&sig, sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                                           "sbn_group_new: rank %d is listed twice", ranks[i]));
      if (ranks[i] == parent->rank) position = i;
    }
  }
  sbn_status st = parent->ops->barrier(parent, &sig);
  if (st != SBN_STATUS_OK) return st;
  sbn_sig split_sig;
  sbn_sig_init(&split_sig, SBN_SIG_KIND_SPLIT, -1, 0, SBN_DTYPE_FLOAT32, "new_group(ranks={%s})",
               list);
  sbn_group *g = NULL;
  st = split_agreed(&g, parent, position >= 0 ? 0 : SBN_UNDEFINED, position, &split_sig);
  if (st == SBN_STATUS_NOT_MEMBER)
    return sbn_fail(SBN_STATUS_NOT_MEMBER, "sbn_group_new: rank %d of '%s' is not in {%s}",
                    parent->rank, parent->name, list);
  if (st != SBN_STATUS_OK) return st;
  snprintf(g->name, sizeof g->name, "%.60s/ranks{%.50s}", parent->name, list);
  *out = g;
  return SBN_STATUS_OK;
}
