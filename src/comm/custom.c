/* The custom backend: the collectives are callbacks supplied by the caller
 * (syncbn_custom.h has the contract). This file adds what an arbitrary
 * engine does not give: agreement on what is being called before any data
 * moves, so that ranks which disagree (a different C, another layer) get an
 * error on every rank instead of handing the engine buffers of different
 * sizes, and callback failures turned into statuses with messages.
 *
 * Every collective first all-reduces a header of 8 float64 values:
 *   [1, error flag, h1, h1^2, h2, h2^2, h3, h3^2]
 * with h1..h3 in [1, 2^16] fingerprints of the signature. The entries are
 * integers and their sums stay below 2^53 for up to 2^16 ranks, so they are
 * exact whatever order the engine sums in. Rank r's fingerprint equals all
 * the others' iff sum(h) == P*h_r and sum(h^2) == P*h_r^2 (a zero variance);
 * since the sums are the same on every rank, every rank takes the same
 * branch. Only then does the payload go to the engine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "syncbn_custom.h"
#include "comm.h"
#include "exact_sum.h"

enum { HEADER = 8, MAX_RANKS = SBN_XSUM_MAX_TERMS, EXACT_MAX_VALUES = 1 << 20 };

typedef struct custom_impl {
  sbn_custom_ops ops;
  char engine[64];
  void *ctx;
  int broken;
  char broken_msg[512];
} custom_impl;

static const sbn_comm_ops custom_ops;

/* Text a callback leaves for the error message; cleared before each call. */
static __thread char callback_msg[512];

void sbn_custom_set_error(const char *message) {
  snprintf(callback_msg, sizeof callback_msg, "%s", message ? message : "");
}

static sbn_status mark_broken(sbn_group *g, sbn_status st) {
  custom_impl *c = g->impl;
  c->broken = 1;
  snprintf(c->broken_msg, sizeof c->broken_msg, "%s", sbn_last_error());
  return st;
}

/* A callback returned rc != 0: the engine's state is unknown, so the group
 * is broken from now on. */
static sbn_status callback_failed(sbn_group *g, const char *callback, int rc, const sbn_sig *sig) {
  custom_impl *c = g->impl;
  sbn_fail(SBN_STATUS_BACKEND_ERROR,
           "group '%s' (custom engine '%s', %d ranks): the %s callback returned %d in %s%s%s",
           g->name, c->engine, g->size, callback, rc, sig->what, callback_msg[0] ? ": " : "",
           callback_msg);
  return mark_broken(g, SBN_STATUS_BACKEND_ERROR);
}

static sbn_status call_allreduce(sbn_group *g, void *buf, size_t count, sbn_dtype dtype,
                                 const sbn_sig *sig) {
  custom_impl *c = g->impl;
  sbn_device host = {SBN_DEVICE_CPU, 0};
  callback_msg[0] = '\0';
  int rc = c->ops.allreduce(c->ctx, buf, count, dtype, host, NULL);
  return rc ? callback_failed(g, "allreduce", rc, sig) : SBN_STATUS_OK;
}

/* Three 16-bit fingerprints (+1, so never 0) of the fields sbn_sig_same
 * compares: a splitmix64 chain over them. */
static void fingerprints(const sbn_sig *sig, double h[3]) {
  uint64_t v[5] = {(uint64_t)(uint32_t)sig->kind, (uint64_t)(uint32_t)sig->layer,
                   (uint64_t)sig->count, (uint64_t)(uint32_t)sig->dtype, sig->extra};
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 5; i++) {
    x ^= v[i];
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
  }
  for (int k = 0; k < 3; k++) h[k] = (double)((x >> (16 * k)) & 0xffff) + 1.0;
}

/* Disagreement or a local error somewhere: everyone sends its whole
 * signature (one byte per float64, at its rank's offset, zeros elsewhere:
 * the sum is an all-gather) and runs the same verdict. */
static sbn_status exchange_signatures(sbn_group *g, const sbn_sig *sig) {
  const size_t S = sizeof(sbn_sig), P = (size_t)g->size;
  double *all = calloc(P * S, sizeof *all);
  sbn_sig *sigs = calloc(P, S);
  if (!all || !sigs) {
    free(all), free(sigs);
    sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "group '%s': out of memory for %zu signatures", g->name, P);
    return mark_broken(g, SBN_STATUS_OUT_OF_MEMORY);
  }
  const unsigned char *mine = (const unsigned char *)sig;
  for (size_t i = 0; i < S; i++) all[(size_t)g->rank * S + i] = mine[i];
  sbn_status st = call_allreduce(g, all, P * S, SBN_DTYPE_FLOAT64, sig);
  if (st == SBN_STATUS_OK) {
    for (size_t q = 0; q < P; q++) {
      unsigned char *dst = (unsigned char *)&sigs[q];
      for (size_t i = 0; i < S; i++) dst[i] = (unsigned char)all[q * S + i];
      sigs[q].what[sizeof sigs[q].what - 1] = '\0';
    }
    st = sbn_sig_verdict(g, sigs, g->rank);
    if (st == SBN_STATUS_OK) /* the header said otherwise: the engine summed inconsistently */
      st = mark_broken(g, sbn_fail(SBN_STATUS_BACKEND_ERROR,
                                   "group '%s' (custom engine '%s'): the all-reduce callback gave "
                                   "inconsistent sums (signatures agree, fingerprints did not)",
                                   g->name, ((custom_impl *)g->impl)->engine));
  }
  free(all), free(sigs);
  return st;
}

/* The start of every collective: OK when all ranks call the same thing and
 * none failed locally; otherwise the verdict every rank shares. */
static sbn_status agree(sbn_group *g, const sbn_sig *sig) {
  custom_impl *c = g->impl;
  if (c->broken)
    return sbn_fail(SBN_STATUS_GROUP_BROKEN, "group '%s' is broken and can't be used (%s): %s",
                    g->name, sig->what, c->broken_msg);
  double f[3], h[HEADER];
  fingerprints(sig, f);
  h[0] = 1.0;
  h[1] = sig->status != SBN_STATUS_OK;
  for (int k = 0; k < 3; k++) h[2 + 2 * k] = f[k], h[3 + 2 * k] = f[k] * f[k];
  sbn_status st = call_allreduce(g, h, HEADER, SBN_DTYPE_FLOAT64, sig);
  if (st != SBN_STATUS_OK) return st;
  const double P = g->size;
  if (h[0] != P) {
    sbn_fail(SBN_STATUS_BACKEND_ERROR,
             "group '%s' (custom engine '%s'): the all-reduce callback summed %g contributions, "
             "the group has %d ranks (rank/size do not match the engine's communicator?)",
             g->name, c->engine, h[0], g->size);
    return mark_broken(g, SBN_STATUS_BACKEND_ERROR);
  }
  int same = h[1] == 0;
  for (int k = 0; k < 3 && same; k++)
    same = h[2 + 2 * k] == P * f[k] && h[3 + 2 * k] == P * f[k] * f[k];
  return same ? SBN_STATUS_OK : exchange_signatures(g, sig);
}

/* Exact sums from an engine that only adds: every rank writes its values
 * into its own slot of a zeroed P*count buffer, the engine's sum of that
 * buffer is an all-gather (x + 0 is exact, in any order), and each rank
 * merges the P contributions with the exact summation the other backends
 * use (exact_sum.c): the same bits as threads and MPI, whatever order the
 * engine adds in. Payloads up to EXACT_MAX_VALUES values in all take this
 * path (the layer's 2C+1 and 2C: 8 ranks x C = 2048 is 32768); larger ones
 * (gradient buckets) use the engine's own sum. */
static void exact_merge(void *buf, const void *all, size_t count, int P, sbn_dtype dtype) {
  for (size_t i = 0; i < count; i++) {
    sbn_xbin acc = sbn_xsum_zero();
    for (int q = 0; q < P; q++)
      sbn_xsum_add(&acc, dtype == SBN_DTYPE_FLOAT64 ? ((const double *)all)[(size_t)q * count + i]
                                                    : ((const float *)all)[(size_t)q * count + i]);
    if (dtype == SBN_DTYPE_FLOAT64) sbn_xsum_decode_f64((double *)buf + i, &acc, 1);
    else sbn_xsum_decode_f32((float *)buf + i, &acc, 1);
  }
}

static sbn_status custom_allreduce(sbn_group *g, void *buf, size_t count, sbn_dtype dtype,
                                   const sbn_sig *sig) {
  const size_t es = dtype == SBN_DTYPE_FLOAT64 ? 8 : 4;
  /* the same decision on every rank: agree() checks count and dtype first */
  const int exact = count > 0 && g->size > 1 && count <= EXACT_MAX_VALUES / (size_t)g->size;
  sbn_sig mine = *sig;
  char *all = NULL;
  if (exact && mine.status == SBN_STATUS_OK && !(all = calloc((size_t)g->size * count, es)))
    sbn_sig_set_error(&mine, sbn_fail(SBN_STATUS_OUT_OF_MEMORY,
                                      "group '%s': out of memory for an all-reduce of %zu values",
                                      g->name, count));
  sbn_status st = agree(g, &mine);
  if (st == SBN_STATUS_OK && count > 0 && !exact) st = call_allreduce(g, buf, count, dtype, sig);
  if (st == SBN_STATUS_OK && exact) {
    memcpy(all + (size_t)g->rank * count * es, buf, count * es);
    st = call_allreduce(g, all, (size_t)g->size * count, dtype, sig);
    if (st == SBN_STATUS_OK) exact_merge(buf, all, count, g->size, dtype);
  }
  free(all);
  return st;
}

static sbn_status custom_broadcast(sbn_group *g, void *buf, size_t bytes, int root,
                                   const sbn_sig *sig) {
  sbn_status st = agree(g, sig);
  if (st != SBN_STATUS_OK || bytes == 0) return st;
  custom_impl *c = g->impl;
  sbn_device host = {SBN_DEVICE_CPU, 0};
  callback_msg[0] = '\0';
  int rc = c->ops.broadcast(c->ctx, buf, bytes, root, host, NULL);
  return rc ? callback_failed(g, "broadcast", rc, sig) : SBN_STATUS_OK;
}

static sbn_status custom_barrier(sbn_group *g, const sbn_sig *sig) {
  sbn_status st = agree(g, sig);
  custom_impl *c = g->impl;
  if (st != SBN_STATUS_OK || !c->ops.barrier) return st;
  callback_msg[0] = '\0';
  int rc = c->ops.barrier(c->ctx);
  return rc ? callback_failed(g, "barrier", rc, sig) : SBN_STATUS_OK;
}

static sbn_status group_from(sbn_group **out, const sbn_custom_ops *ops, const char *engine,
                             void *ctx, int rank, int size, const char *name) {
  custom_impl *c = calloc(1, sizeof *c);
  sbn_group *g = c ? sbn_group_alloc(&custom_ops, c, rank, size, name) : NULL;
  if (!g) {
    free(c);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "custom group: out of memory");
  }
  c->ops = *ops;
  c->ctx = ctx;
  snprintf(c->engine, sizeof c->engine, "%s", engine);
  c->ops.name = c->engine;
  *out = g;
  return SBN_STATUS_OK;
}

static sbn_status custom_split(sbn_group **out, sbn_group *g, int color, int key,
                               const sbn_sig *sig, int *agreed) {
  custom_impl *c = g->impl;
  /* Decided locally, identically on every rank: no communication. */
  if (!c->ops.split)
    return sbn_fail(SBN_STATUS_UNSUPPORTED,
                    "group '%s' (custom engine '%s'): split/new_group need a split callback in "
                    "sbn_custom_ops; create a custom group from a sub-communicator of the engine "
                    "instead", g->name, c->engine);
  sbn_status st = agree(g, sig);
  if (st != SBN_STATUS_OK) return st;
  *agreed = 1;
  void *nctx = NULL;
  int nrank = -1, nsize = 0;
  callback_msg[0] = '\0';
  int rc = c->ops.split(c->ctx, color, key, &nctx, &nrank, &nsize);
  if (rc) return callback_failed(g, "split", rc, sig);
  if (color < 0) {
    if (nctx && c->ops.destroy) c->ops.destroy(nctx);
    return sbn_fail(SBN_STATUS_NOT_MEMBER, "split of group '%s': rank %d passed SBN_UNDEFINED",
                    g->name, g->rank);
  }
  if (nsize < 1 || nsize > MAX_RANKS || nrank < 0 || nrank >= nsize) {
    if (nctx && c->ops.destroy) c->ops.destroy(nctx);
    sbn_fail(SBN_STATUS_BACKEND_ERROR,
             "group '%s' (custom engine '%s'): the split callback gave rank %d of size %d",
             g->name, c->engine, nrank, nsize);
    return mark_broken(g, SBN_STATUS_BACKEND_ERROR);
  }
  char name[128];
  snprintf(name, sizeof name, "%.100s/split(color=%d)", g->name, color);
  st = group_from(out, &c->ops, c->engine, nctx, nrank, nsize, name);
  if (st != SBN_STATUS_OK && nctx && c->ops.destroy) c->ops.destroy(nctx);
  return st;
}

static void custom_destroy(sbn_group *g) {
  custom_impl *c = g->impl;
  if (c->ops.destroy) c->ops.destroy(c->ctx);
  free(c);
}

static const sbn_comm_ops custom_ops = {
    "custom", custom_allreduce, custom_broadcast, custom_barrier, custom_split, custom_destroy, NULL,
    NULL, /* no abort: the caller's engine has no way to tell the peers */
};

sbn_status sbn_group_create_custom(sbn_group **out, int rank, int size, const sbn_custom_ops *ops,
                                   void *ctx) {
  static const char call[] = "sbn_group_create_custom";
  sbn_clear_error();
  if (!out || !ops)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", call, out ? "ops" : "out");
  *out = NULL;
  if (ops->version != SBN_CUSTOM_OPS_VERSION)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "%s: ops->version is %d, this library speaks SBN_CUSTOM_OPS_VERSION %d", call,
                    ops->version, SBN_CUSTOM_OPS_VERSION);
  if (!ops->allreduce || !ops->broadcast)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: the %s callback is required", call,
                    ops->allreduce ? "broadcast" : "allreduce");
  if (size < 1 || size > MAX_RANKS)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: size must be in [1, %d], got %d", call,
                    MAX_RANKS, size);
  if (rank < 0 || rank >= size)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: rank %d out of range [0, %d)", call, rank, size);
  const char *engine = ops->name && ops->name[0] ? ops->name : "custom";
  return group_from(out, ops, engine, ctx, rank, size, engine);
}
