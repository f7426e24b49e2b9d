/* The data-parallel wrapper (Bagua's with_bagua with GradientAllReduce):
 * wrap = check SyncBN groups, broadcast state from rank 0, plan buckets;
 * backward = model backward with bucketed gradient all-reduce started as
 * buckets complete; step = every optimizer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../core/tensor.h"
#include "../comm/comm.h"
#include "../nn/grads.h"
#include "buckets.h"
#include "comm_worker.h"
#include "dp_testhook.h"

struct sbn_dp {
  sbn_module *model;
  sbn_nn_sgd **optimizers;
  int num_optimizers;
  sbn_group *group;       /* the caller's: collectives of wrap and SyncBN */
  sbn_group *comm_group;  /* a duplicate for the communication thread */
  dp_worker *worker;      /* NULL: all-reduce inline */
  sbn_dp_options opt;
  sbn_nn_entry *params;   /* reduced parameters, in backward order */
  int *child_index;       /* top-level child holding each (Sequential root), else 0 */
  int nparams;
  dp_bucket *buckets;
  int nbuckets;
  int64_t steps;
  int backward_failed;    /* the last sbn_dp_backward failed: sbn_dp_step is refused */
  double *agree_flags;    /* P doubles: backward's agreement on its preconditions */
  float *earlier;         /* gradients accumulated before this backward (params order) */
  int64_t earlier_cap;    /* floats held by `earlier` (grown once, at the first accumulation) */
  unsigned char *had_earlier; /* per parameter: its gradient was not zero before this backward */
};

sbn_dp_fault sbn_dp_test_fault = SBN_DP_FAULT_NONE;
int sbn_dp_test_fault_rank = -1;
int sbn_dp_test_fault_times = 0;

static sbn_status injected(sbn_group *g, sbn_dp_fault where, const char *what) {
  if (sbn_dp_test_fault != where || sbn_group_rank(g) != sbn_dp_test_fault_rank) return SBN_STATUS_OK;
  if (sbn_dp_test_fault_times <= 0) return SBN_STATUS_OK;
  sbn_dp_test_fault_times--;
  return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "sbn_dp_wrap: %s failed (injected by a test)", what);
}

sbn_dp_options sbn_dp_options_default(void) {
  sbn_dp_options o;
  memset(&o, 0, sizeof o);
  o.bucket_bytes = 4u << 20;
  o.reduce = SBN_DP_REDUCE_AVERAGE;
  o.overlap = 1;
  return o;
}

static int ignored(const sbn_dp_options *o, const char *name) {
  for (int i = 0; i < o->num_params_to_ignore; i++)
    if (o->params_to_ignore[i] && !strcmp(o->params_to_ignore[i], name)) return 1;
  return 0;
}

/* Every SyncBatchNorm under m (path `prefix`) must synchronize within `group`. */
static sbn_status check_sync_groups(sbn_module *m, const char *prefix, sbn_group *group) {
  if (sbn_module_kind_of(m) == SBN_MODULE_KIND_SYNC_BATCHNORM) {
    sbn_bn *bn;
    sbn_status st = sbn_module_bn(&bn, m);
    if (st != SBN_STATUS_OK) return st;
    sbn_group *g = sbn_bn_get_group(bn);
    if (g && !sbn_group_contains(group, g))
      return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                      "sbn_dp_wrap: SyncBatchNorm '%s' synchronizes over group '%s', which is not within "
                      "the wrapper's group '%s'",
                      prefix[0] ? prefix : "(root)", sbn_group_name(g), sbn_group_name(group));
  }
  for (int i = 0; i < sbn_module_num_children(m); i++) {
    sbn_module *child;
    const char *name;
    sbn_status st = sbn_module_child(&child, &name, m, i);
    char path[SBN_NN_NAME_MAX];
    snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", name);
    if (st == SBN_STATUS_OK) st = check_sync_groups(child, path, group);
    if (st != SBN_STATUS_OK) return st;
  }
  return SBN_STATUS_OK;
}

/* Every name in params_to_ignore names an entry of the model: a misspelt
 * one would otherwise be averaged silently. */
static sbn_status ignore_list_known(const sbn_dp_options *o, const sbn_nn_entry *entries, int nentries,
                                    const char *call) {
  for (int i = 0; i < o->num_params_to_ignore; i++) {
    const char *name = o->params_to_ignore[i];
    if (!name) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: options.params_to_ignore[%d] is NULL", call, i);
    int found = 0;
    for (int j = 0; j < nentries && !found; j++) found = !strcmp(entries[j].name, name);
    if (!found)
      return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                      "%s: options.params_to_ignore[%d] = '%s' names no parameter or buffer of the model "
                      "(full names such as '%s')",
                      call, i, name, nentries > 0 ? entries[0].name : "");
  }
  return SBN_STATUS_OK;
}

/* Make a local verdict collective: every rank learns whether any failed.
 * Returns the local status if it failed, PEER_FAILED naming the first
 * failing rank otherwise. `scratch`: P doubles (the wrapper's own
 * for every backward, so that a step allocates nothing), or NULL. */
static sbn_status agree_in(sbn_group *g, sbn_status local, const char *what, double *scratch) {
  int P = sbn_group_size(g), me = sbn_group_rank(g);
  double *flags = scratch ? memset(scratch, 0, sizeof *scratch * (size_t)P) : calloc((size_t)P, sizeof *flags);
  if (!flags) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", what);
  char keep[1024];
  snprintf(keep, sizeof keep, "%s", sbn_last_error());
  flags[me] = local != SBN_STATUS_OK ? 1.0 + (double)local : 0.0;
  sbn_status st = sbn_group_allreduce(g, flags, (size_t)P, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
  int first = -1, nfailed = 0;
  sbn_status theirs = SBN_STATUS_OK;
  for (int r = 0; st == SBN_STATUS_OK && r < P; r++)
    if (flags[r] != 0) {
      nfailed++;
      if (first < 0) first = r, theirs = (sbn_status)(int)(flags[r] - 1.0);
    }
  if (!scratch) free(flags);
  if (local != SBN_STATUS_OK) return sbn_fail(local, "%s", keep);
  if (st != SBN_STATUS_OK) return st;
  if (first >= 0)
    return sbn_fail(SBN_STATUS_PEER_FAILED, "%s: rank %d failed with %s (%d of %d ranks failed)", what, first,
                    sbn_status_name(theirs), nfailed, P);
  return SBN_STATUS_OK;
}

static sbn_status agree(sbn_group *g, sbn_status local, const char *what) { return agree_in(g, local, what, NULL); }

/* What rank 0's broadcast of an entry assumes of the other ranks' entry. */
typedef struct {
  uint64_t name_hash;
  int64_t numel, dtype;
  int64_t reduced; /* a parameter whose gradient backward all-reduces (requires_grad) */
} entry_desc;

/* The entry of the list that stands for the options every rank must share:
 * how gradients are combined and bucketed (a rank that sums where another
 * averages, or cuts its buckets elsewhere, would hold other "reduced"
 * gradients, or mix parameters of equal size). */
static entry_desc options_desc(const sbn_dp_options *o) {
  return (entry_desc){0, (int64_t)o->reduce, (int64_t)o->bucket_bytes, 0};
}

static int reduced_entry(const sbn_dp_options *o, const sbn_nn_entry *e) {
  return e->kind == SBN_NN_ENTRY_KIND_PARAMETER && e->requires_grad && e->grad && !ignored(o, e->name);
}

static uint64_t name_hash(const char *s) { /* FNV-1a */
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* Before rank 0's state overwrites anyone's: do all ranks hold the same
 * entries (names, sizes, dtypes, which parameters are reduced) and options
 * (reduce mode, bucket size)? Rank 0's list goes to all (two broadcasts:
 * its length, then the list), each rank compares its own, and one
 * agreement lets every rank fail together, naming the first entry that
 * differs on the rank that differs, before any state has moved. The list's
 * first element is the options (options_desc). */
static sbn_status same_entries(sbn_group *g, const sbn_dp *dp, const sbn_nn_entry *entries, int nentries) {
  static const char call[] = "sbn_dp_wrap";
  int n = 1;
  for (int i = 0; i < nentries; i++) n += !ignored(&dp->opt, entries[i].name);
  entry_desc *mine = calloc((size_t)n + 1, sizeof *mine);
  if (!mine) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
  const sbn_nn_entry **which = calloc((size_t)n + 1, sizeof *which);
  int k = 1;
  mine[0] = options_desc(&dp->opt);
  for (int i = 0; which && i < nentries; i++)
    if (!ignored(&dp->opt, entries[i].name))
      which[k] = &entries[i], mine[k++] = (entry_desc){name_hash(entries[i].name), entries[i].numel,
                                                       entries[i].dtype, reduced_entry(&dp->opt, &entries[i])};
  int64_t n0 = n;
  sbn_status st = which ? sbn_group_broadcast(g, &n0, sizeof n0, 0)
                        : sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
  entry_desc *theirs = NULL;
  if (st == SBN_STATUS_OK) {
    theirs = n0 >= 0 && (uint64_t)n0 < SIZE_MAX / sizeof *theirs ? calloc((size_t)n0 + 1, sizeof *theirs) : NULL;
    if (theirs && sbn_group_rank(g) == 0) memcpy(theirs, mine, sizeof *mine * (size_t)n);
    /* a rank that cannot hold the list still takes part (it fails after) */
    entry_desc spare;
    st = sbn_group_broadcast(g, theirs ? (void *)theirs : (void *)&spare,
                             theirs ? sizeof *theirs * (size_t)n0 : 0, 0);
    if (st == SBN_STATUS_OK && !theirs) st = sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
  }
  if (st == SBN_STATUS_OK && n0 >= 1 && (mine[0].numel != theirs[0].numel || mine[0].dtype != theirs[0].dtype))
    st = sbn_fail(SBN_STATUS_MISMATCH,
                  "%s: this rank's options differ from rank 0's: reduce %s, bucket_bytes %lld here; reduce %s, "
                  "bucket_bytes %lld on rank 0",
                  call, mine[0].numel == SBN_DP_REDUCE_SUM ? "SUM" : "AVERAGE", (long long)mine[0].dtype,
                  theirs[0].numel == SBN_DP_REDUCE_SUM ? "SUM" : "AVERAGE", (long long)theirs[0].dtype);
  if (st == SBN_STATUS_OK) {
    for (int i = 1; i < n && i < n0 && st == SBN_STATUS_OK; i++)
      if (mine[i].name_hash != theirs[i].name_hash || mine[i].numel != theirs[i].numel ||
          mine[i].dtype != theirs[i].dtype)
        st = sbn_fail(SBN_STATUS_MISMATCH,
                      "%s: this rank's model differs from rank 0's at state entry #%d: '%s' holds %lld %s "
                      "values, rank 0's entry #%d %lld %s values%s",
                      call, i - 1, which[i]->name, (long long)mine[i].numel,
                      sbn_dtype_name((sbn_dtype)mine[i].dtype), i - 1, (long long)theirs[i].numel,
                      sbn_dtype_name((sbn_dtype)theirs[i].dtype),
                      mine[i].name_hash != theirs[i].name_hash ? " under another name" : "");
      else if (mine[i].reduced != theirs[i].reduced)
        st = sbn_fail(SBN_STATUS_MISMATCH,
                      "%s: parameter '%s' %s its gradient reduced on this rank but %s on rank 0 (requires_grad "
                      "must be the same on every rank)",
                      call, which[i]->name, mine[i].reduced ? "has" : "does not have",
                      theirs[i].reduced ? "has" : "not");
    if (st == SBN_STATUS_OK && n != n0)
      st = sbn_fail(SBN_STATUS_MISMATCH, "%s: this rank's model has %d state entries, rank 0's %lld%s%s%s", call,
                    n - 1, (long long)n0 - 1, n > n0 ? " (the first extra: '" : "", n > n0 ? which[n0]->name : "",
                    n > n0 ? "')" : "");
  }
  free(theirs), free(which), free(mine);
  return agree(g, st, "sbn_dp_wrap: the ranks' models");
}

static void dp_free(sbn_dp *dp) {
  if (!dp) return;
  sbn_worker_stop(dp->worker);
  sbn_group_destroy(dp->comm_group);
  sbn_buckets_free(dp->buckets, dp->nbuckets);
  free(dp->params), free(dp->child_index), free(dp->optimizers), free(dp->agree_flags);
  free(dp->earlier), free(dp->had_earlier);
  free(dp);
}

/* Which top-level child of a Sequential root holds parameter `name`. */
static int top_child_of(sbn_module *root, const char *name) {
  if (sbn_module_kind_of(root) != SBN_MODULE_KIND_SEQUENTIAL) return 0;
  for (int i = 0; i < sbn_module_num_children(root); i++) {
    sbn_module *c;
    const char *cn;
    if (sbn_module_child(&c, &cn, root, i) != SBN_STATUS_OK) continue;
    size_t len = strlen(cn);
    if (!strncmp(name, cn, len) && name[len] == '.') return i;
  }
  return 0;
}

/* The index of the first NULL optimizer, or -1. */
static int null_optimizer(sbn_nn_sgd *const *optimizers, int n) {
  for (int i = 0; i < n; i++)
    if (!optimizers[i]) return i;
  return -1;
}

sbn_status sbn_dp_wrap(sbn_dp **out, sbn_module *model, sbn_nn_sgd *const *optimizers,
                       int num_optimizers, sbn_dp_algorithm algorithm, sbn_group *group,
                       const sbn_dp_options *options) {
  static const char call[] = "sbn_dp_wrap";
  sbn_clear_error();
  if (!group) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: group is NULL", call);
  if (out) *out = NULL;
  /* Local checks, then one agreement so every rank fails together (a NULL
   * out too: the peers would otherwise wait for this rank until their
   * timeout). */
  sbn_status st = SBN_STATUS_OK;
  if (!out) st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: out is NULL", call);
  else if (!model) st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: model is NULL", call);
  else if (num_optimizers < 0 || (num_optimizers > 0 && !optimizers))
    st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: optimizers is %s with num_optimizers = %d", call,
                  optimizers ? "a list" : "NULL", num_optimizers);
  else if (null_optimizer(optimizers, num_optimizers) >= 0) /* sbn_dp_step would fail on it */
    st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: optimizers[%d] is NULL", call,
                  null_optimizer(optimizers, num_optimizers));
  else if (algorithm != SBN_DP_ALGORITHM_GRADIENT_ALLREDUCE)
    st = sbn_fail(SBN_STATUS_UNSUPPORTED, "%s: unknown algorithm %d", call, (int)algorithm);
  else if (sbn_nn_has_parent(model))
    st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: the model is a child of another module; wrap its root", call);
  else if (sbn_module_is_wrapped(model) == 1 || sbn_nn_wrapped_below(model))
    st = sbn_fail(SBN_STATUS_BAD_STATE, "%s: the model %s already wrapped", call,
                  sbn_module_is_wrapped(model) == 1 ? "is" : "holds a module");
  else if (options && options->reduce != SBN_DP_REDUCE_AVERAGE && options->reduce != SBN_DP_REDUCE_SUM)
    st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: unknown reduce mode %d", call, (int)options->reduce);
  else if (options && (options->num_params_to_ignore < 0 ||
                       (options->num_params_to_ignore > 0 && !options->params_to_ignore)))
    st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                  "%s: options.params_to_ignore is %s with num_params_to_ignore = %d (need a list of that many "
                  "names, or 0)",
                  call, options->params_to_ignore ? "a list" : "NULL", options->num_params_to_ignore);
  if (st == SBN_STATUS_OK) st = check_sync_groups(model, "", group);

  sbn_dp *dp = NULL;
  sbn_nn_entry *entries = NULL;
  int nentries = 0;
  if (st == SBN_STATUS_OK) {
    dp = calloc(1, sizeof *dp);
    if (dp) dp->optimizers = malloc(sizeof(sbn_nn_sgd *) * (size_t)(num_optimizers + 1));
    if (!dp || !dp->optimizers) st = sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
  }
  if (st == SBN_STATUS_OK) st = sbn_module_entries(&entries, &nentries, model, SBN_NN_STATE);
  if (st == SBN_STATUS_OK) {
    dp->model = model, dp->group = group, dp->num_optimizers = num_optimizers;
    for (int i = 0; i < num_optimizers; i++) dp->optimizers[i] = optimizers[i];
    dp->opt = options ? *options : sbn_dp_options_default();
    dp->params = calloc((size_t)(nentries + 1), sizeof *dp->params);
    dp->child_index = calloc((size_t)(nentries + 1), sizeof *dp->child_index);
    dp->agree_flags = calloc((size_t)sbn_group_size(group), sizeof *dp->agree_flags);
    dp->had_earlier = calloc((size_t)(nentries + 1), 1);
    if (!dp->params || !dp->child_index || !dp->agree_flags || !dp->had_earlier)
      st = sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
  }
  if (st == SBN_STATUS_OK) st = ignore_list_known(&dp->opt, entries, nentries, call);
  st = agree(group, st, call);
  if (st == SBN_STATUS_OK) st = same_entries(group, dp, entries, nentries);

  /* Every rank starts from rank 0's state. */
  for (int i = 0; st == SBN_STATUS_OK && i < nentries; i++) {
    if (ignored(&dp->opt, entries[i].name)) continue;
    size_t bytes = (size_t)entries[i].numel * (entries[i].dtype == SBN_DTYPE_INT64 ? 8 : 4);
    st = sbn_group_broadcast(group, entries[i].data, bytes, 0);
  }
  /* Reduced parameters in backward order: reverse of registration. */
  for (int i = nentries - 1; st == SBN_STATUS_OK && i >= 0; i--) {
    const sbn_nn_entry *e = &entries[i];
    if (!reduced_entry(&dp->opt, e)) continue;
    dp->child_index[dp->nparams] = top_child_of(model, e->name);
    dp->params[dp->nparams++] = *e;
  }
  if (st == SBN_STATUS_OK)
    st = sbn_buckets_plan(&dp->buckets, &dp->nbuckets, dp->params, dp->child_index, dp->nparams,
                         dp->opt.bucket_bytes);
  if (st == SBN_STATUS_OK) st = injected(group, SBN_DP_FAULT_PLAN, "bucket planning");
  /* Planning is local: agree before the next collective (the split), so a
   * rank that failed here does not leave the others waiting in it. */
  st = agree(group, st, "sbn_dp_wrap: bucket planning");
  /* The communication thread gets its own group so its collectives never
   * interleave with the SyncBN collectives of the compute thread. Only the
   * threads backend is known to allow two threads in collectives at once. */
  int use_worker = dp && dp->opt.overlap && sbn_group_size(group) > 1 &&
                   !strcmp(sbn_group_backend(group), "threads");
  if (use_worker) {
    sbn_status ok_before = st;
    if (st == SBN_STATUS_OK) st = sbn_group_split(&dp->comm_group, group, 0, sbn_group_rank(group));
    if (st == SBN_STATUS_OK) st = injected(group, SBN_DP_FAULT_SPLIT, "the communication group's split");
    if (st == SBN_STATUS_OK) st = sbn_worker_start(&dp->worker, dp->comm_group);
    if (st == SBN_STATUS_OK) st = injected(group, SBN_DP_FAULT_WORKER, "starting the communication thread");
    /* The split's local part and the thread start can fail on one rank:
     * one more agreement, so every rank returns now with the same verdict
     * (skipped when the previous agreement already failed everywhere). */
    if (ok_before == SBN_STATUS_OK) st = agree(group, st, "sbn_dp_wrap: communication thread");
  }
  if (st == SBN_STATUS_OK) st = sbn_module_set_wrapped(model, 1);
  free(entries);
  if (st != SBN_STATUS_OK) {
    dp_free(dp);
    return st;
  }
  if (group) sbn_group_retain(group); /* the group must outlive the wrapper */
  *out = dp;
  return SBN_STATUS_OK;
}

/* A failure of this rank's own that no collective carried to its peers (a
 * module before the first SyncBN layer refused the input, a bad dy): they
 * would wait for it in their next collective until the timeout. Instead
 * the rank leaves the wrapper's groups, and they fail at once naming it and
 * why (the groups are then broken). Verdicts every rank already shares, and
 * failures a SyncBN layer's collective carried (the peers returned
 * PEER_FAILED and the groups stay usable), are left as they are. */
/* Leave the groups of every SyncBatchNorm under m (sub-groups of the
 * wrapper's, where peers may be waiting too). */
static void abort_sync_groups(sbn_module *m, const char *why) {
  sbn_bn *bn;
  if (sbn_module_kind_of(m) == SBN_MODULE_KIND_SYNC_BATCHNORM && sbn_module_bn(&bn, m) == SBN_STATUS_OK)
    sbn_group_abort(sbn_bn_get_group(bn), why);
  for (int i = 0; i < sbn_module_num_children(m); i++) {
    sbn_module *child;
    const char *name;
    if (sbn_module_child(&child, &name, m, i) == SBN_STATUS_OK) abort_sync_groups(child, why);
  }
}

static sbn_status give_up_if_untold(sbn_dp *dp, sbn_status st, uint64_t told_before) {
  if (st == SBN_STATUS_OK || st == SBN_STATUS_PEER_FAILED || st == SBN_STATUS_MISMATCH ||
      st == SBN_STATUS_TIMEOUT || st == SBN_STATUS_GROUP_BROKEN || sbn_failures_told() != told_before ||
      sbn_group_size(dp->group) < 2)
    return st;
  char keep[1024];
  snprintf(keep, sizeof keep, "%s", sbn_last_error());
  sbn_group_abort(dp->group, keep);
  sbn_group_abort(dp->comm_group, keep);
  abort_sync_groups(dp->model, keep);
  return sbn_fail(st, "%s", keep);
}

sbn_status sbn_dp_forward(sbn_dp *dp, sbn_tensor *y, const sbn_tensor *x) {
  sbn_clear_error();
  if (!dp) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_dp_forward: wrapper is NULL");
  const uint64_t told = sbn_failures_told();
  return give_up_if_untold(dp, sbn_module_forward(dp->model, y, x), told);
}

/* All-reduce bucket b now (inline) or hand it to the worker. */
static sbn_status launch(sbn_dp *dp, dp_bucket *b) {
  b->launched = 1;
  sbn_buckets_pack(b, dp->params);
  if (dp->worker) return sbn_worker_submit(dp->worker, b);
  return sbn_group_allreduce(dp->group, b->buf, (size_t)b->numel, SBN_DTYPE_FLOAT32, SBN_REDUCE_OP_SUM);
}

/* Launch, in order, every bucket complete once children >= `done` ran. */
static sbn_status launch_ready(sbn_dp *dp, int done) {
  for (int k = 0; k < dp->nbuckets; k++) {
    if (dp->buckets[k].launched || dp->buckets[k].ready_after < done) continue;
    sbn_status st = launch(dp, &dp->buckets[k]);
    if (st != SBN_STATUS_OK) return st;
  }
  return SBN_STATUS_OK;
}

/* What backward needs of this rank before anything moves. Checked on every
 * rank and agreed on, so that a misuse (no forward to differentiate, no dy)
 * fails on every rank together and leaves the groups usable, whether every
 * rank made it or only some: without the agreement the ranks that made it
 * would give up on the groups (their peers could be waiting in a
 * collective), breaking them for everyone. */
static sbn_status backward_ready(sbn_dp *dp, const sbn_tensor *dy) {
  static const char call[] = "sbn_dp_backward";
  sbn_status st = SBN_STATUS_OK;
  if (!dy) st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: dy is NULL", call);
  else if (!sbn_nn_has_forward(dp->model))
    st = sbn_fail(SBN_STATUS_BAD_STATE,
                  "%s: the model has no successful forward to differentiate (call sbn_dp_forward first)", call);
  else
    st = sbn_nn_backward_prepare(dp->model, dy); /* dy's shape; dy or x in the model's own buffers */
  return sbn_group_size(dp->group) > 1 ? agree_in(dp->group, st, call, dp->agree_flags) : st;
}

/* The model's backward with buckets launched as they complete. */
static sbn_status backward_and_launch(sbn_dp *dp, sbn_tensor *grad_in, const sbn_tensor *dy) {
  const int P = sbn_group_size(dp->group);
  sbn_status st = SBN_STATUS_OK;
  *grad_in = *dy;
  if (sbn_module_kind_of(dp->model) == SBN_MODULE_KIND_SEQUENTIAL && P > 1) {
    /* Child by child, so buckets leave as soon as they are complete. */
    for (int i = sbn_module_num_children(dp->model) - 1; i >= 0 && st == SBN_STATUS_OK; i--) {
      sbn_module *child;
      const char *name;
      sbn_tensor prev;
      st = sbn_module_child(&child, &name, dp->model, i);
      if (st == SBN_STATUS_OK) st = sbn_nn_backward(child, &prev, grad_in);
      if (st == SBN_STATUS_OK) *grad_in = prev, st = launch_ready(dp, i);
    }
    return st;
  }
  st = sbn_nn_backward(dp->model, grad_in, dy);
  if (st == SBN_STATUS_OK && P > 1) st = launch_ready(dp, 0);
  return st;
}

/* Gradient accumulation (several backwards before a step): a backward
 * all-reduces only the gradients it computes; what the parameters held
 * before it (reduced by the earlier backwards, the same on every rank) is
 * set aside and added back after. Reducing the accumulated gradients would
 * count the earlier ones P times under SBN_DP_REDUCE_SUM (and round them
 * through P * g / P under AVERAGE). The store is made at the first
 * backward that finds a gradient not zero, and kept. */
static sbn_status set_earlier_aside(sbn_dp *dp) {
  int64_t need = 0;
  int any = 0;
  for (int i = 0; i < dp->nparams; i++) {
    dp->had_earlier[i] = !sbn_nn_all_zero_bits(dp->params[i].grad, dp->params[i].numel);
    any |= dp->had_earlier[i];
    need += dp->params[i].numel;
  }
  if (!any) return SBN_STATUS_OK;
  if (need > dp->earlier_cap) {
    float *p = malloc(sizeof(float) * (size_t)need);
    if (!p)
      return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "sbn_dp_backward: out of memory for the accumulated gradients");
    free(dp->earlier);
    dp->earlier = p, dp->earlier_cap = need;
  }
  float *p = dp->earlier;
  for (int i = 0; i < dp->nparams; i++) {
    const size_t bytes = sizeof(float) * (size_t)dp->params[i].numel;
    if (dp->had_earlier[i]) memcpy(p, dp->params[i].grad, bytes), memset(dp->params[i].grad, 0, bytes);
    p += dp->params[i].numel;
  }
  return SBN_STATUS_OK;
}

static void add_earlier_back(sbn_dp *dp) {
  const float *p = dp->earlier;
  for (int i = 0; i < dp->nparams; i++) {
    float *g = dp->params[i].grad;
    if (dp->had_earlier[i])
      for (int64_t j = 0; j < dp->params[i].numel; j++) g[j] = p[j] + g[j];
    p += dp->params[i].numel;
  }
}

sbn_status sbn_dp_backward(sbn_dp *dp, sbn_tensor *dx, const sbn_tensor *dy) {
  sbn_clear_error();
  if (!dp) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_dp_backward: wrapper is NULL");
  dp->backward_failed = 1; /* until it succeeds */
  sbn_status st = backward_ready(dp, dy);
  if (st != SBN_STATUS_OK) return st;
  for (int k = 0; k < dp->nbuckets; k++) dp->buckets[k].launched = 0;
  const int P = sbn_group_size(dp->group);
  const uint64_t told = sbn_failures_told();
  /* A failed call changes no gradient: the model's backward accumulates
   * into them before a later module or the all-reduce may still fail. */
  int64_t copied = 0; /* floats of gradients that were not zero: none after a zero_grad */
  st = sbn_nn_grads_save(dp->model, &copied);
  for (int i = 0; i < dp->nparams; i++) dp->had_earlier[i] = 0;
  if (st == SBN_STATUS_OK && P > 1 && copied > 0) st = set_earlier_aside(dp); /* undone by the restore below */
  if (st != SBN_STATUS_OK) {
    sbn_nn_grads_restore(dp->model);
    return give_up_if_untold(dp, st, told);
  }
  sbn_tensor grad_in;
  st = backward_and_launch(dp, &grad_in, dy);
  /* A rank that failed locally leaves the groups if its peers do not know
   * (they fail at once), then waits for what it launched. */
  st = give_up_if_untold(dp, st, told);
  if (dp->worker) {
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", sbn_last_error());
    sbn_status wst = sbn_worker_wait(dp->worker);
    st = st != SBN_STATUS_OK ? sbn_fail(st, "%s", keep) : wst;
  }
  if (st != SBN_STATUS_OK) {
    sbn_nn_grads_restore(dp->model);
    return st;
  }
  if (P > 1) {
    const float divisor = dp->opt.reduce == SBN_DP_REDUCE_AVERAGE ? (float)P : 1.0f;
    for (int k = 0; k < dp->nbuckets; k++) sbn_buckets_unpack(&dp->buckets[k], dp->params, divisor);
    add_earlier_back(dp);
  }
  if (dx) *dx = grad_in;
  dp->backward_failed = 0;
  return SBN_STATUS_OK;
}

sbn_status sbn_dp_step(sbn_dp *dp) {
  sbn_clear_error();
  if (!dp) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_dp_step: wrapper is NULL");
  /* The gradients are this rank's from before that backward, not reduced
   * over the ranks: stepping would let the replicas drift apart. */
  if (dp->backward_failed)
    return sbn_fail(SBN_STATUS_BAD_STATE,
                    "sbn_dp_step: the last sbn_dp_backward failed (its gradients were not reduced over the "
                    "ranks); run a backward that succeeds before stepping");
  for (int i = 0; i < dp->num_optimizers; i++) {
    sbn_status st = sbn_nn_sgd_step(dp->optimizers[i]);
    if (st != SBN_STATUS_OK) return st;
  }
  dp->steps++;
  return SBN_STATUS_OK;
}

sbn_status sbn_dp_zero_grad(sbn_dp *dp) {
  sbn_clear_error();
  if (!dp) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_dp_zero_grad: wrapper is NULL");
  return sbn_module_zero_grad(dp->model);
}

int64_t sbn_dp_train_step_counter(const sbn_dp *dp) { return dp ? dp->steps : -1; }

sbn_status sbn_dp_set_train_step_counter(sbn_dp *dp, int64_t steps) {
  sbn_clear_error();
  if (!dp || steps < 0)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_dp_set_train_step_counter: %s",
                    dp ? "negative count" : "wrapper is NULL");
  dp->steps = steps;
  return SBN_STATUS_OK;
}

int sbn_dp_num_buckets(const sbn_dp *dp) { return dp ? dp->nbuckets : 0; }
sbn_group *sbn_dp_group(const sbn_dp *dp) { return dp ? dp->group : NULL; }

sbn_status sbn_dp_destroy(sbn_dp *dp) {
  if (!dp) return SBN_STATUS_OK;
  char keep[1024]; /* destroy never changes the last error */
  snprintf(keep, sizeof keep, "%s", sbn_last_error());
  sbn_module_set_wrapped(dp->model, 0);
  if (dp->group) sbn_group_release(dp->group);
  dp_free(dp);
  sbn_restore_error(keep);
  return SBN_STATUS_OK;
}
