/* The in-process backend: a team of thread ranks sharing memory.
 *
 * Each group (world or sub-group) has one shared rendezvous. A collective
 * is a few phases; in each, every rank posts its slot and sleeps on a
 * condition variable until the last one arrives (sleeping, not spinning:
 * 8 ranks on 2 cores must not burn the cores). A rank that does not arrive
 * within the group's timeout breaks the group: the waiting ranks fail with
 * a message naming the missing ranks, later calls fail at once.
 *
 * Reductions are exact sums rounded once (exact_sum.c): independent of the
 * order of the ranks, so every rank gets bitwise the same result, run after
 * run, and the same bits as the MPI backend. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "exact_sum.h"

typedef struct slot {
  void *buf; /* the rank's buffer for this collective */
  void *aux; /* kind-specific (split contribution) */
} slot;

typedef struct rendezvous {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int size;
  int refs;      /* handles (and the team) still holding it */
  uint64_t gen;  /* phases completed */
  int arrived;   /* ranks arrived in the current phase */
  unsigned char *present;
  int broken;
  sbn_status broken_status;
  char broken_msg[600];
  slot *slots;
  sbn_sig *sigs;
  int is_world;  /* a team's world: its handles are the process's thread ranks */
} rendezvous;

/* Thread ranks alive in this process (joined world handles not yet
 * destroyed, over all teams): the ranks that share the cores. */
static int ranks_alive;
int sbn_threads_ranks_in_process(void) { return __atomic_load_n(&ranks_alive, __ATOMIC_RELAXED); }

static const sbn_comm_ops threads_ops;

static rendezvous *rv_create(int size, int refs) {
  rendezvous *rv = calloc(1, sizeof *rv);
  if (!rv) return NULL;
  rv->present = calloc((size_t)size, 1);
  rv->slots = calloc((size_t)size, sizeof *rv->slots);
  rv->sigs = calloc((size_t)size, sizeof *rv->sigs);
  if (!rv->present || !rv->slots || !rv->sigs) {
    free(rv->present), free(rv->slots), free(rv->sigs), free(rv);
    return NULL;
  }
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&rv->cv, &attr);
  pthread_condattr_destroy(&attr);
  pthread_mutex_init(&rv->mu, NULL);
  rv->size = size;
  rv->refs = refs;
  return rv;
}

static void rv_release(rendezvous *rv) {
  pthread_mutex_lock(&rv->mu);
  int last = --rv->refs == 0;
  pthread_mutex_unlock(&rv->mu);
  if (!last) return;
  pthread_mutex_destroy(&rv->mu);
  pthread_cond_destroy(&rv->cv);
  free(rv->present), free(rv->slots), free(rv->sigs), free(rv);
}

/* Before sleeping, a rank waits this long with the mutex released, watching
 * gen: waking a sleeper costs tens of microseconds (more on a VM), twice a
 * layer step, which showed as a 24-30% slower step on 1-3 MiB per rank.
 * Only while every thread rank has a core of its own: with more ranks than
 * cores the spinning would take the core the last rank needs. */
enum { SPIN_NS = 50000 };

static int spin_first(void) {
  static long cores_seen;
  long cores = __atomic_load_n(&cores_seen, __ATOMIC_RELAXED);
  if (!cores) __atomic_store_n(&cores_seen, cores = sysconf(_SC_NPROCESSORS_ONLN), __ATOMIC_RELAXED);
  return sbn_threads_ranks_in_process() <= cores;
}

static void spin_wait(rendezvous *rv, uint64_t my_gen) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 1;; i++) {
    if (__atomic_load_n(&rv->gen, __ATOMIC_ACQUIRE) != my_gen || __atomic_load_n(&rv->broken, __ATOMIC_ACQUIRE))
      return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if (i % 64 == 0) {
      clock_gettime(CLOCK_MONOTONIC, &t);
      if ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) > SPIN_NS) return;
    }
  }
}

/* Break the group (rv->mu held): every rank waiting to arrive in a
 * collective, and every later call, fails with `st` and the message. */
static void rv_break_locked(rendezvous *rv, sbn_status st, const char *msg) {
  if (!rv->broken) {
    snprintf(rv->broken_msg, sizeof rv->broken_msg, "%s", msg);
    rv->broken_status = st;
    __atomic_store_n(&rv->broken, 1, __ATOMIC_RELEASE); /* read unlocked by spin_wait */
  }
  pthread_cond_broadcast(&rv->cv);
}

/* The same from outside a collective. */
static void rv_break(rendezvous *rv, sbn_status st, const char *msg) {
  pthread_mutex_lock(&rv->mu);
  rv_break_locked(rv, st, msg);
  pthread_mutex_unlock(&rv->mu);
}

/* Wait until every rank of the group has reached this phase.
 *
 * Only the first phase of a collective (`arrival`) can time out: once every
 * rank has arrived, the rest is memory traffic between live threads that
 * finishes, and a rank must not leave a later phase early, because slower
 * peers may still be reading its buffer or its stack (the reduction, the
 * split's contributions). So a timed-out rank leaves only while nobody has
 * read anything of this collective yet. */
static sbn_status phase(sbn_group *g, const char *what, int arrival) {
  rendezvous *rv = g->impl;
  pthread_mutex_lock(&rv->mu);
  if (arrival && rv->broken) {
    pthread_mutex_unlock(&rv->mu);
    return sbn_fail(SBN_STATUS_GROUP_BROKEN, "group '%s' is broken and can't be used (%s): %s",
                    g->name, what, rv->broken_msg);
  }
  uint64_t my_gen = rv->gen;
  rv->present[g->rank] = 1;
  if (++rv->arrived == rv->size) {
    rv->arrived = 0;
    memset(rv->present, 0, (size_t)rv->size);
    __atomic_store_n(&rv->gen, rv->gen + 1, __ATOMIC_RELEASE); /* read unlocked by spin_wait */
    pthread_cond_broadcast(&rv->cv);
    pthread_mutex_unlock(&rv->mu);
    return SBN_STATUS_OK;
  }
  if (spin_first()) {
    pthread_mutex_unlock(&rv->mu);
    spin_wait(rv, my_gen);
    pthread_mutex_lock(&rv->mu);
  }
  const int bounded = arrival && isfinite(g->timeout_s);
  struct timespec deadline;
  if (bounded) {
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    double whole = floor(g->timeout_s); /* finite and < SBN_TIMEOUT_FOREVER: fits time_t */
    deadline.tv_sec += (time_t)whole;
    deadline.tv_nsec += (long)((g->timeout_s - whole) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
  }
  while (rv->gen == my_gen && !(arrival && rv->broken)) {
    int rc = bounded ? pthread_cond_timedwait(&rv->cv, &rv->mu, &deadline) : pthread_cond_wait(&rv->cv, &rv->mu);
    if (rc == ETIMEDOUT && rv->gen == my_gen && !rv->broken) {
      char missing[300];
      int len = 0;
      missing[0] = '\0';
      for (int r = 0; r < rv->size && len < (int)sizeof missing - 12; r++)
        if (!rv->present[r]) len += snprintf(missing + len, sizeof missing - len, "%s%d", len ? ", " : "", r);
      char msg[sizeof rv->broken_msg];
      snprintf(msg, sizeof msg, "group '%s' (threads, %d ranks): timed out after %g s in %s waiting for rank(s) %s",
               g->name, rv->size, g->timeout_s, what, missing);
      /* leave the arrival: a late rank must not complete it (it fails at the
       * broken check instead), so nobody reads what we posted */
      rv->present[g->rank] = 0;
      rv->arrived--;
      rv_break_locked(rv, SBN_STATUS_TIMEOUT, msg);
    }
  }
  if (rv->gen == my_gen) { /* the group broke while we waited to arrive */
    sbn_status st = rv->broken_status;
    if (rv->present[g->rank]) rv->present[g->rank] = 0, rv->arrived--;
    pthread_mutex_unlock(&rv->mu);
    return sbn_fail(st, "%s", rv->broken_msg);
  }
  pthread_mutex_unlock(&rv->mu);
  return SBN_STATUS_OK;
}

/* Post this rank's signature and buffer, wait for all, check agreement.
 * On a disagreement every rank gets the same verdict; *verdict holds it and
 * the caller must still run the closing phase. */
static sbn_status open_collective(sbn_group *g, const sbn_sig *sig, void *buf, void *aux,
                                  sbn_status *verdict) {
  rendezvous *rv = g->impl;
  rv->sigs[g->rank] = *sig;
  rv->slots[g->rank].buf = buf;
  rv->slots[g->rank].aux = aux;
  sbn_status st = phase(g, sig->what, 1);
  if (st != SBN_STATUS_OK) return st;
  *verdict = sbn_sig_verdict(g, rv->sigs, g->rank);
  return SBN_STATUS_OK;
}

/* Closing phase: nobody leaves while others may still read its slot. A
 * failure here (a rank vanished mid-collective) wins over the verdict. */
static sbn_status close_collective(sbn_group *g, const sbn_sig *sig, sbn_status verdict) {
  char keep[1024];
  snprintf(keep, sizeof keep, "%s", sbn_last_error());
  sbn_status st = phase(g, sig->what, 0);
  if (st != SBN_STATUS_OK) return st;
  if (verdict != SBN_STATUS_OK) sbn_fail(verdict, "%s", keep);
  return verdict;
}

/* Elements [lo, hi) of the sum over all ranks into dst, whose first element
 * is element `base`: exact summation (exact_sum.c), so the result does not
 * depend on the order of the ranks and equals the MPI backend's bit for bit. */
static void reduce_range_general(const rendezvous *rv, void *dst, size_t lo, size_t hi, size_t base,
                                 sbn_dtype dtype) {
  for (size_t i = lo; i < hi; i++) {
    sbn_xbin acc = sbn_xsum_zero();
    if (dtype == SBN_DTYPE_FLOAT64) {
      for (int q = 0; q < rv->size; q++) sbn_xsum_add(&acc, ((const double *)rv->slots[q].buf)[i]);
      sbn_xsum_decode_f64((double *)dst + (i - base), &acc, 1);
    } else {
      for (int q = 0; q < rv->size; q++) sbn_xsum_add(&acc, ((const float *)rv->slots[q].buf)[i]);
      sbn_xsum_decode_f32((float *)dst + (i - base), &acc, 1);
    }
  }
}

/* Elements [lo, hi) of the sum into dst[0 .. hi-lo). */
static void reduce_range(const rendezvous *rv, void *dst, size_t lo, size_t hi, sbn_dtype dtype) {
  if (rv->size == 2) { /* two ranks: mostly one hardware addition, the same bits */
    if (dtype == SBN_DTYPE_FLOAT64)
      sbn_xsum_pair_sum_f64(dst, (const double *)rv->slots[0].buf + lo, (const double *)rv->slots[1].buf + lo,
                            hi - lo);
    else
      sbn_xsum_pair_sum_f32(dst, (const float *)rv->slots[0].buf + lo, (const float *)rv->slots[1].buf + lo,
                            hi - lo);
    return;
  }
  reduce_range_general(rv, dst, lo, hi, lo, dtype);
}

enum { SMALL_BYTES = 16384 }; /* payloads up to this are reduced by every rank */

static sbn_status threads_allreduce(sbn_group *g, void *buf, size_t count, sbn_dtype dtype,
                                    const sbn_sig *sig) {
  rendezvous *rv = g->impl;
  sbn_status verdict;
  sbn_status st = open_collective(g, sig, buf, NULL, &verdict);
  if (st != SBN_STATUS_OK) return st;
  size_t esize = dtype == SBN_DTYPE_FLOAT64 ? 8 : 4;
  if (verdict != SBN_STATUS_OK || count == 0 || rv->size == 1)
    return close_collective(g, sig, verdict);
  if (count * esize <= SMALL_BYTES) {
    /* Small (the layer's O(C) statistics): each rank reduces everything into
     * a private copy; two phases in all. */
    double tmp[SMALL_BYTES / 4];
    reduce_range(rv, tmp, 0, count, dtype);
    st = close_collective(g, sig, SBN_STATUS_OK);
    if (st == SBN_STATUS_OK) memcpy(buf, tmp, count * esize);
    return st;
  }
  /* Large (gradients): rank r reduces chunk r in place in its own buffer,
   * then everyone copies the other chunks from their owners. */
  size_t lo = count * (size_t)g->rank / (size_t)rv->size;
  size_t hi = count * (size_t)(g->rank + 1) / (size_t)rv->size;
  char chunk_tmp[4096];
  for (size_t a = lo; a < hi;) { /* bounded temporary: chunk pieces of 512 doubles */
    size_t b = a + sizeof chunk_tmp / 8 < hi ? a + sizeof chunk_tmp / 8 : hi;
    reduce_range(rv, chunk_tmp, a, b, dtype);
    memcpy((char *)buf + a * esize, chunk_tmp, (b - a) * esize);
    a = b;
  }
  st = phase(g, sig->what, 0);
  if (st != SBN_STATUS_OK) return st;
  for (int q = 0; q < rv->size; q++) {
    if (q == g->rank) continue;
    size_t qlo = count * (size_t)q / (size_t)rv->size, qhi = count * (size_t)(q + 1) / (size_t)rv->size;
    memcpy((char *)buf + qlo * esize, (const char *)rv->slots[q].buf + qlo * esize, (qhi - qlo) * esize);
  }
  return close_collective(g, sig, SBN_STATUS_OK);
}

static sbn_status threads_broadcast(sbn_group *g, void *buf, size_t bytes, int root,
                                    const sbn_sig *sig) {
  rendezvous *rv = g->impl;
  sbn_status verdict;
  sbn_status st = open_collective(g, sig, buf, NULL, &verdict);
  if (st != SBN_STATUS_OK) return st;
  if (verdict == SBN_STATUS_OK && g->rank != root && bytes) memcpy(buf, rv->slots[root].buf, bytes);
  return close_collective(g, sig, verdict);
}

static sbn_status threads_barrier(sbn_group *g, const sbn_sig *sig) {
  sbn_status verdict;
  sbn_status st = open_collective(g, sig, NULL, NULL, &verdict);
  if (st != SBN_STATUS_OK) return st;
  return close_collective(g, sig, verdict);
}

typedef struct split_contrib {
  int color, key;
  rendezvous *created; /* set by the leader of its color */
} split_contrib;

/* Members of `color`, ordered by (key, parent rank); returns their count. */
static int split_members(const rendezvous *rv, int color, int *members) {
  int m = 0;
  for (int r = 0; r < rv->size; r++) {
    const split_contrib *c = rv->slots[r].aux;
    if (c->color != color) continue;
    int i = m++;
    while (i > 0 && ((const split_contrib *)rv->slots[members[i - 1]].aux)->key > c->key) {
      members[i] = members[i - 1];
      i--;
    }
    members[i] = r;
  }
  return m;
}

static sbn_status threads_split(sbn_group **out, sbn_group *g, int color, int key,
                                const sbn_sig *sig, int *agreed) {
  rendezvous *rv = g->impl;
  split_contrib mine = {color, key, NULL};
  sbn_status verdict;
  sbn_status st = open_collective(g, sig, NULL, &mine, &verdict);
  if (st != SBN_STATUS_OK) return st;
  /* Every rank has the same verdict; on a disagreement the peers may be in
   * another collective, which closes after one more phase: so must we. */
  if (verdict != SBN_STATUS_OK) return close_collective(g, sig, verdict);
  *agreed = 1; /* the phases below wait for ranks that have all arrived: they end */
  int *members = malloc(sizeof(int) * (size_t)rv->size);
  int m = 0, my_index = -1;
  if (members && color >= 0) {
    m = split_members(rv, color, members);
    for (int i = 0; i < m; i++)
      if (members[i] == g->rank) my_index = i;
    if (my_index == 0) mine.created = rv_create(m, m);
  }
  st = phase(g, sig->what, 0); /* leaders have published their rendezvous */
  if (st != SBN_STATUS_OK) {
    free(members);
    return st;
  }
  rendezvous *created = my_index >= 0 ? ((split_contrib *)rv->slots[members[0]].aux)->created : NULL;
  st = close_collective(g, sig, verdict);
  free(members);
  if (st != SBN_STATUS_OK) return st; /* (a leader's rendezvous is leaked only if the group broke) */
  if (color < 0)
    return sbn_fail(SBN_STATUS_NOT_MEMBER, "split of group '%s': rank %d passed SBN_UNDEFINED",
                    g->name, g->rank);
  if (!created) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "split of group '%s': out of memory", g->name);
  char name[128];
  snprintf(name, sizeof name, "%.100s/split(color=%d)", g->name, color);
  *out = sbn_group_alloc(&threads_ops, created, my_index, m, name);
  if (!*out) {
    rv_release(created);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "split of group '%s': out of memory", g->name);
  }
  return SBN_STATUS_OK;
}

static void threads_destroy(sbn_group *g) {
  rendezvous *rv = g->impl;
  if (rv->is_world) __atomic_fetch_sub(&ranks_alive, 1, __ATOMIC_RELAXED);
  /* A rank that lets go of its handle never takes part in a collective of
   * the group again: a peer waiting for it, now or later, fails at once
   * naming it, instead of after the timeout (a rank function that returned
   * early from sbn_team_run, whose world is then destroyed). Ranks that
   * destroy their handles at the end never look at the group again. */
  char msg[400];
  snprintf(msg, sizeof msg, "group '%s' (threads, %d ranks): rank %d left the group (its handle was destroyed) "
           "and takes part in no further collective", g->name, g->size, g->rank);
  rv_break(rv, SBN_STATUS_GROUP_BROKEN, msg);
  rv_release(rv);
}

static void threads_abort(sbn_group *g, const char *why) {
  char msg[600];
  snprintf(msg, sizeof msg, "group '%s' (threads, %d ranks): rank %d gave up after an error of its own: %s",
           g->name, g->size, g->rank, why);
  rv_break(g->impl, SBN_STATUS_GROUP_BROKEN, msg);
}

static const sbn_comm_ops threads_ops = {
    "threads", threads_allreduce, threads_broadcast, threads_barrier, threads_split, threads_destroy, NULL,
    threads_abort,
};

/* ---- the team ---- */

struct sbn_team {
  pthread_mutex_t mu;
  int size;
  unsigned char *joined;
  rendezvous *world;
};

sbn_status sbn_team_create(sbn_team **out, int size) {
  sbn_clear_error();
  if (!out) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_team_create: out is NULL");
  *out = NULL;
  if (size < 1)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_team_create: size must be >= 1, got %d", size);
  if (isnan(sbn_default_timeout())) return SBN_STATUS_INVALID_ARGUMENT; /* recorded, naming the value */
  sbn_team *t = calloc(1, sizeof *t);
  if (t) t->joined = calloc((size_t)size, 1);
  if (t && t->joined) t->world = rv_create(size, 1);
  if (t && t->world) t->world->is_world = 1;
  if (!t || !t->joined || !t->world) {
    if (t) free(t->joined);
    free(t);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "sbn_team_create: out of memory for %d ranks", size);
  }
  pthread_mutex_init(&t->mu, NULL);
  t->size = size;
  *out = t;
  return SBN_STATUS_OK;
}

sbn_status sbn_team_join(sbn_group **world, sbn_team *team, int rank) {
  sbn_clear_error();
  if (!world || !team)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_team_join: %s is NULL", world ? "team" : "world");
  *world = NULL;
  if (rank < 0 || rank >= team->size)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_team_join: rank %d out of range [0, %d)", rank,
                    team->size);
  pthread_mutex_lock(&team->mu);
  int taken = team->joined[rank];
  team->joined[rank] = 1;
  pthread_mutex_unlock(&team->mu);
  if (taken) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_team_join: rank %d already joined", rank);
  sbn_group *g = sbn_group_alloc(&threads_ops, team->world, rank, team->size, "world");
  if (!g) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "sbn_team_join: out of memory");
  pthread_mutex_lock(&team->world->mu);
  team->world->refs++;
  pthread_mutex_unlock(&team->world->mu);
  __atomic_fetch_add(&ranks_alive, 1, __ATOMIC_RELAXED);
  *world = g;
  return SBN_STATUS_OK;
}

sbn_status sbn_team_destroy(sbn_team *team) {
  if (!team) return SBN_STATUS_OK;
  rv_release(team->world);
  pthread_mutex_destroy(&team->mu);
  free(team->joined);
  free(team);
  return SBN_STATUS_OK;
}

typedef struct run_arg {
  sbn_team *team;
  int rank;
  sbn_rank_fn fn;
  void *arg;
  int result;
  char msg[768]; /* the rank's last error when it failed (thread-local there) */
} run_arg;

static void *run_rank(void *p) {
  run_arg *a = p;
  sbn_group *world = NULL;
  sbn_status st = sbn_team_join(&world, a->team, a->rank);
  a->result = st != SBN_STATUS_OK ? (int)st : a->fn(world, a->arg);
  if (a->result != 0) snprintf(a->msg, sizeof a->msg, "%s", sbn_last_error());
  sbn_group_destroy(world);
  return NULL;
}

sbn_status sbn_team_run(int size, sbn_rank_fn fn, void *arg) {
  sbn_clear_error();
  if (!fn) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_team_run: fn is NULL");
  sbn_team *team;
  sbn_status st = sbn_team_create(&team, size);
  if (st != SBN_STATUS_OK) return st;
  run_arg *args = calloc((size_t)size, sizeof *args);
  pthread_t *tids = calloc((size_t)size, sizeof *tids);
  if (!args || !tids) {
    free(args), free(tids), sbn_team_destroy(team);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "sbn_team_run: out of memory");
  }
  int started = 0, err = 0;
  for (; started < size; started++) {
    args[started] = (run_arg){team, started, fn, arg, 0, ""};
    if ((err = pthread_create(&tids[started], NULL, run_rank, &args[started])) != 0) break;
  }
  char why[160];
  snprintf(why, sizeof why, "sbn_team_run: could only start %d of %d threads (pthread_create: %s)", started,
           size, strerror(err));
  /* The ranks that run would wait for the others until their timeout. */
  if (started < size) rv_break(team->world, SBN_STATUS_GROUP_BROKEN, why);
  for (int r = 0; r < started; r++) pthread_join(tids[r], NULL);
  sbn_status result = SBN_STATUS_OK;
  if (started < size) result = sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s", why);
  /* The lowest failing rank's status and message, naming the rank (a
   * return value that is no status becomes INTERNAL, with the value). */
  for (int r = 0; r < started && result == SBN_STATUS_OK; r++)
    if (args[r].result != 0) {
      const int v = args[r].result;
      const int is_status = v > 0 && v < SBN_STATUS_COUNT_;
      result = is_status ? (sbn_status)v : SBN_STATUS_INTERNAL;
      sbn_fail(result, "sbn_team_run: rank %d of %d returned %d (%s)%s%s", r, size, v,
               is_status ? sbn_status_name((sbn_status)v) : "not an sbn_status", args[r].msg[0] ? ": " : "",
               args[r].msg[0] ? args[r].msg : ", with no error message recorded on that rank");
    }
  free(args), free(tids);
  sbn_team_destroy(team);
  return result;
}
