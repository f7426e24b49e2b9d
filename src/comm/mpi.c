/* The MPI backend: ranks are MPI processes; a group wraps a private
 * duplicate of the caller's communicator (the library never calls MPI_Init
 * and never assumes MPI_COMM_WORLD).
 *
 * ONE ENGINE ALL-REDUCE PER COLLECTIVE. Every collective is one
 * MPI_Iallreduce, so it costs what the engine's own algorithms cost
 * (O(log P) latency, O(count) bytes per rank), whatever P. What makes that
 * deterministic is the sum, not the order: values travel as exact sums
 * whose merge is exactly associative and commutative, so any reduction
 * tree gives the same bits on every rank, run after run, for every
 * algorithm the engine picks, equal to the threads backend. Two forms of
 * the same sum (the same bits, exact_lanes.h):
 *  - integer lanes (16 bytes per value, the engine's built-in MPI_SUM on
 *    int64): each value encoded in a window predicted from the previous
 *    call of the same collective (sum_plan.h); used when every rank's
 *    terms fit their windows, in groups of up to 63 ranks;
 *  - binned sums (exact_sum.c, 24 bytes per value, a commutative user
 *    MPI_Op): the first call of a collective, a call whose terms left
 *    their windows (redone this way), larger groups.
 *
 * TWO RANKS: NO REDUCTION. With P = 2 an exact format buys nothing: each
 * rank can compute the pair's exact sum itself from both raw terms
 * (sbn_xsum_pair_sum_*, commutative, the binned sum's bits). So sums go
 * as raw values point to point, 8 bytes per double, one message each way
 * with a header carrying what the control element carries, plus the
 * counts (pair_collective, mpi_pair.h); the signature check, the
 * predicted counts, the waiting and the fault handling below are the
 * same. SYNCBN_MPI_PAIR=0 (on any rank) turns it off.
 *
 * SIGNATURE IN THE SAME REDUCTION. Element 0 of every binned reduction is
 * a control element carrying min and max of a 64-bit hash of this rank's
 * signature (kind, layer, count, dtype, extra) and the max of the ranks'
 * local statuses; min == max and status OK: everyone called the same
 * collective, the payload is valid. Lane reductions carry the hash as
 * sums of 16-bit pieces and of their squares (equal on all ranks iff
 * P sum(h^2) == (sum h)^2) and the number of failed ranks. Otherwise
 * (rare) a slower exchange (MPI_Iallgather of fixed-size signatures) gives
 * every rank today's detailed verdict: who called what, which rank failed
 * and why.
 *
 * COUNTS MUST MATCH BEFORE THEY ARE KNOWN TO. An MPI collective with
 * different counts on different ranks is erroneous, and a rank may call
 * with a different C by mistake. So the count of the first reduction is not
 * this rank's count but a prediction every rank computes from what all have
 * agreed so far (the count that followed the previous agreed signature last
 * time; a training loop repeats, so after the first step it is right). A
 * rank whose count is not the prediction sends only its control element
 * (padding empty); when all agree, the payload follows in a second
 * reduction of the now agreed count. The layout (lanes or binned) is
 * predicted the same way (sum_plan.h). Broadcast, barrier and split use the
 * same first reduction (payload 0), then MPI_Ibcast / MPI_Comm_split.
 *
 * WAITING. Requests are polled (spin briefly, then sched_yield, then short
 * sleeps, so oversubscribed ranks leave the cores to the peers they wait
 * for) against the group's deadline (SYNCBN_TIMEOUT, sbn_group_set_timeout;
 * >= SBN_TIMEOUT_FOREVER waits forever, sleeping). Each rank keeps a
 * control receive posted; while it waits in collective n it answers
 * "where are you?" queries with n.
 *
 * A RANK THAT DOES NOT ARRIVE. An all-reduce cannot tell who is missing, so
 * a rank whose deadline passes takes a roll call: it asks every peer which
 * collective it is in and waits a short grace period (min(timeout, 0.5 s),
 * at least 50 ms) for answers, still testing its request (if the reduction
 * completes meanwhile, the call succeeds). Missing = the ranks that did not
 * answer, or answered with an earlier collective: a rank that arrived
 * answers until it leaves, and it leaves only by completing (then the
 * reduction completes everywhere) or by giving up itself, after sending
 * its verdict, which counts as an answer. So no rank that arrived is
 * named. The rank then breaks the group and sends every peer its verdict
 * ("gave up", with the message). Statuses do not depend on timing: every
 * rank waiting in that collective returns SBN_STATUS_TIMEOUT with the
 * message naming the missing ranks (its own roll call's, or the first
 * verdict it receives); a named rank, when it arrives, and every later
 * call get SBN_STATUS_GROUP_BROKEN ("rank 0 gave up: ...").
 *
 * WHAT A USER SEES IN EACH FAULT CASE
 *  - Mismatch (a different C, a different layer, a different collective, or
 *    one rank fails locally, e.g. a bad tensor): every rank returns at once
 *    with SBN_STATUS_MISMATCH ("group 'world' (mpi, 4 ranks): ranks
 *    disagree on the collective: [rank 0 1 2] forward of layer #0 (C=8,
 *    float32); [rank 3] forward of layer #0 (C=9, float32)") or, for a local
 *    error, the failing rank its own status and the others
 *    SBN_STATUS_PEER_FAILED ("rank 1 failed: <its message>"). Nothing is
 *    changed; the group stays usable.
 *  - A rank killed (SIGKILL) under plain `mpirun`: Open MPI ends the job
 *    within about a second ("mpirun noticed that process rank 1 ... exited
 *    on signal 9"), non-zero exit.
 *  - A rank that does not arrive (stuck, stopped, or dead under a launcher
 *    that lets the others run on): after the timeout (+ the roll call) the
 *    waiting ranks return SBN_STATUS_TIMEOUT, "group 'world' (mpi, 4 ranks):
 *    timed out after 300 s in forward of layer #0 (C=8, float32) waiting
 *    for rank(s) 1"; the group is broken (SBN_STATUS_GROUP_BROKEN after).
 *    A program that calls MPI_Abort (or exits non-zero) on that ends the job.
 *  - MPI errors are returned (the duplicate uses MPI_ERRORS_RETURN) as
 *    SBN_STATUS_BACKEND_ERROR with MPI's text.
 *  Limits: sbn_group_split calls the blocking MPI_Comm_split after all ranks
 *  agreed (MPI has no nonblocking split); a broken group's buffers are not
 *  freed by sbn_group_destroy (the engine may still own them). */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "mpi_paths.h"
#include "exact_lanes.h"
#include "exact_sum.h"
#include "sum_plan.h"

#if !SBN_WITH_MPI

SBN_API sbn_status sbn_group_from_mpi_comm(sbn_group **out, const void *comm, size_t comm_size);

sbn_status sbn_group_from_mpi_comm(sbn_group **out, const void *comm, size_t comm_size) {
  sbn_clear_error();
  (void)comm, (void)comm_size;
  if (out) *out = NULL;
  return sbn_fail(SBN_STATUS_NOT_BUILT,
                  "sbn_group_from_mpi: this libsyncbn was built without MPI (install "
                  "libopenmpi-dev so that mpicc is found, then rebuild)");
}

#else /* SBN_WITH_MPI */

#include <mpi.h>
#include <sched.h>
#include <time.h>

#include "mpi_pair.h"
#include "mpi_reqs.h"
#include "../core/leak.h"
#include "syncbn_mpi.h"

enum {
  TAG_CTRL = 0x5b02,
  WHAT_MAX = 256,        /* sizeof(sbn_sig.what) */
  TEXT_MAX = 720,
  NCTRL_LANES = 10,      /* the control lanes of an integer-lane reduction */
  CHUNK = 1 << 20,       /* values per reduction (24 MiB of binned sums) */
  CTRL_QUERY = 1, CTRL_REPLY, CTRL_GAVEUP
};

/* Control messages (point to point, tag TAG_CTRL, outside the collectives). */
typedef struct ctrl_msg {
  int32_t type;
  int32_t named;  /* GAVEUP: the receiver is among the missing ranks */
  uint64_t seq;   /* QUERY/GAVEUP: the collective concerned; REPLY: the sender's */
  char text[TEXT_MAX];
} ctrl_msg;

/* A signature on the wire (the slow path after a disagreement). */
typedef struct wire_sig {
  int32_t kind, layer;
  int64_t count;
  int32_t dtype, status;
  uint64_t extra;
  char what[WHAT_MAX];
} wire_sig;

typedef struct outbox_entry {
  MPI_Request req;
  ctrl_msg msg;
} outbox_entry;

typedef struct mpi_impl {
  MPI_Comm comm;
  int broken;
  sbn_status broken_status;
  char broken_msg[TEXT_MAX + 96];
  uint64_t seq;          /* collectives started on this group */
  /* control channel */
  MPI_Request ctrl_req;  /* posted receive */
  ctrl_msg ctrl_in;
  outbox_entry **outbox; /* sends in flight */
  int n_out, cap_out;
  /* roll call state (only while one runs) */
  signed char *answered; /* per rank: 1 arrived, -1 answered from an earlier collective */
  int gaveup_rank;       /* a peer's verdict for the current collective, -1 if none */
  int gaveup_named;
  uint64_t gaveup_seq;
  char gaveup_text[TEXT_MAX];
  /* count and window prediction (common to all ranks: a function of agreed data) */
  uint64_t prev_key;
  sbn_plans plans;
  uint64_t path_count[SBN_MPI_PATHS]; /* sums done in lanes, lanes then binned fallback, binned, pair */
  /* two ranks: raw values point to point (mpi_pair.h); agreed at creation */
  int pair_allowed;      /* SYNCBN_MPI_PAIR is not 0 on any rank (inherited by splits) */
  int pair_on;           /* pair_allowed and 2 ranks (sbn_mpi_set_pair: tests) */
  sbn_mpi_pair pair;
  /* buffers */
  sbn_mpi_reqs reqs;     /* persistent reductions over xs and x */
  sbn_xbin *xs, *x;      /* send and receive buffers (not in place: the engine may then
                          * pick a reduce-scatter + all-gather for large payloads) */
  size_t x_cap;          /* elements */
  wire_sig *sigs_wire;   /* P, the slow path */
  sbn_sig *sigs;
} mpi_impl;

static const sbn_comm_ops mpi_ops;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The binned-sum datatype and merge operation, made once per process. */
static MPI_Datatype xbin_type = MPI_DATATYPE_NULL;
static MPI_Op xbin_op = MPI_OP_NULL;
static pthread_once_t xbin_once = PTHREAD_ONCE_INIT;

static void xbin_merge_fn(void *in, void *inout, int *len, MPI_Datatype *type) {
  (void)type;
  sbn_xsum_merge(inout, in, (size_t)*len);
}

static void xbin_init(void) {
  MPI_Type_contiguous(3, MPI_INT64_T, &xbin_type);
  MPI_Type_commit(&xbin_type);
  MPI_Op_create(xbin_merge_fn, 1 /* commutative: exactly */, &xbin_op);
}

static sbn_status backend_error(sbn_group *g, int rc, const char *call, const char *what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "error %d", rc);
  return sbn_fail(SBN_STATUS_BACKEND_ERROR, "group '%s' (mpi, %d ranks): %s failed in %s: %s",
                  g->name, g->size, call, what, text);
}

static sbn_status broken_error(sbn_group *g, const char *what) {
  mpi_impl *m = g->impl;
  return sbn_fail(SBN_STATUS_GROUP_BROKEN, "group '%s' (mpi, %d ranks) is broken and can't be used (%s): %s",
                  g->name, g->size, what, m->broken_msg);
}

/* ---- control channel ---- */

/* Sends complete on their own (small, eager); their buffers live in the
 * outbox until MPI says so. */
static void outbox_reap(mpi_impl *m) {
  for (int i = 0; i < m->n_out;) {
    int done = 0;
    MPI_Test(&m->outbox[i]->req, &done, MPI_STATUS_IGNORE);
    if (done) {
      free(m->outbox[i]);
      m->outbox[i] = m->outbox[--m->n_out];
    } else {
      i++;
    }
  }
}

static void ctrl_send(sbn_group *g, int peer, int type, uint64_t seq, int named, const char *text) {
  mpi_impl *m = g->impl;
  outbox_reap(m);
  if (m->n_out == m->cap_out) {
    int cap = m->cap_out ? 2 * m->cap_out : 16;
    outbox_entry **p = realloc(m->outbox, sizeof *p * (size_t)cap);
    if (!p) return; /* best effort: a lost answer can only make a peer name us */
    m->outbox = p, m->cap_out = cap;
  }
  outbox_entry *e = calloc(1, sizeof *e);
  if (!e) return;
  e->msg.type = type, e->msg.named = named, e->msg.seq = seq;
  if (text) snprintf(e->msg.text, sizeof e->msg.text, "%s", text);
  int bytes = (int)(offsetof(ctrl_msg, text) + (text ? strlen(e->msg.text) + 1 : 0));
  if (MPI_Isend(&e->msg, bytes, MPI_BYTE, peer, TAG_CTRL, m->comm, &e->req) != MPI_SUCCESS) {
    free(e);
    return;
  }
  m->outbox[m->n_out++] = e;
}

/* Handle every control message that has arrived: answer queries with the
 * collective we are in (`at`), record replies (roll call) and verdicts. */
static void ctrl_poll(sbn_group *g, uint64_t at) {
  mpi_impl *m = g->impl;
  for (;;) {
    if (m->ctrl_req == MPI_REQUEST_NULL) return;
    int flag = 0;
    MPI_Status status;
    if (MPI_Test(&m->ctrl_req, &flag, &status) != MPI_SUCCESS || !flag) return;
    ctrl_msg msg = m->ctrl_in;
    msg.text[TEXT_MAX - 1] = '\0';
    const int src = status.MPI_SOURCE;
    if (MPI_Irecv(&m->ctrl_in, (int)sizeof m->ctrl_in, MPI_BYTE, MPI_ANY_SOURCE, TAG_CTRL, m->comm,
                  &m->ctrl_req) != MPI_SUCCESS)
      m->ctrl_req = MPI_REQUEST_NULL;
    if (msg.type == CTRL_QUERY) {
      ctrl_send(g, src, CTRL_REPLY, at, 0, NULL);
    } else if (msg.type == CTRL_REPLY) {
      if (m->answered && !m->answered[src]) m->answered[src] = msg.seq >= m->seq ? 1 : -1;
    } else if (msg.type == CTRL_GAVEUP && m->gaveup_rank < 0) {
      if (m->answered) m->answered[src] = 1; /* it was there: it gave up in this collective */
      m->gaveup_rank = src;
      m->gaveup_named = msg.named;
      m->gaveup_seq = msg.seq;
      snprintf(m->gaveup_text, sizeof m->gaveup_text, "%s", msg.text);
    }
  }
}

static void break_group(sbn_group *g, sbn_status st, const char *msg) {
  mpi_impl *m = g->impl;
  if (m->broken) return;
  m->broken = 1;
  m->broken_status = st;
  snprintf(m->broken_msg, sizeof m->broken_msg, "%s", msg);
}

/* A peer's verdict reached us: the group is broken. A rank waiting in the
 * collective the verdict is about, and not named in it, fails as the peer
 * did (SBN_STATUS_TIMEOUT, same message); everyone else: GROUP_BROKEN. */
static sbn_status adopt_verdict(sbn_group *g, const char *what, int waiting) {
  mpi_impl *m = g->impl;
  char msg[TEXT_MAX + 64];
  snprintf(msg, sizeof msg, "rank %d gave up: %s", m->gaveup_rank, m->gaveup_text);
  break_group(g, SBN_STATUS_GROUP_BROKEN, msg);
  if (waiting && !m->gaveup_named && m->gaveup_seq == m->seq) /* we were there: as if our own */
    return sbn_fail(SBN_STATUS_TIMEOUT, "%s", m->gaveup_text);
  return broken_error(g, what);
}

/* Pause between polls: spin first (a collective of the layer takes a few
 * to a few hundred microseconds; yielding early costs a time slice on a
 * loaded machine), then yield, then sleep, so that ranks oversubscribing
 * the cores leave them to the ranks they wait for and a long wait costs no
 * CPU. */
static void backoff(double waited) {
  if (waited < 200e-6) return;
  if (waited < 2e-3) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, waited < 0.1 ? 50000L : 1000000L};
  nanosleep(&ts, NULL);
}

/* The deadline passed in the current collective: roll call, verdict, break. */
static sbn_status roll_call(sbn_group *g, MPI_Request *reqs, int nreq, const char *what) {
  mpi_impl *m = g->impl;
  const int P = g->size;
  signed char answered[P];
  memset(answered, 0, sizeof answered);
  answered[g->rank] = 1;
  m->answered = answered;
  for (int q = 0; q < P; q++)
    if (q != g->rank) ctrl_send(g, q, CTRL_QUERY, m->seq, 0, NULL);
  const double grace = fmax(0.05, fmin(0.5, g->timeout_s)), start = now_s();
  int complete = 0;
  for (;;) {
    if (MPI_Testall(nreq, reqs, &complete, MPI_STATUSES_IGNORE) != MPI_SUCCESS) complete = 0;
    if (complete) break;
    ctrl_poll(g, m->seq);
    if (m->gaveup_rank >= 0) break;
    int all = 1;
    for (int q = 0; q < P && all; q++) all = answered[q] == 1;
    if (all || now_s() - start > grace) break;
    struct timespec ts = {0, 100000L};
    nanosleep(&ts, NULL);
  }
  m->answered = NULL;
  if (complete) return SBN_STATUS_OK; /* it came through after all */
  if (m->gaveup_rank >= 0) return adopt_verdict(g, what, 1);
  char missing[400];
  int len = 0;
  missing[0] = '\0';
  for (int q = 0; q < P && len < (int)sizeof missing - 16; q++)
    if (answered[q] != 1) len += snprintf(missing + len, sizeof missing - len, "%s%d", len ? ", " : "", q);
  if (len >= (int)sizeof missing - 16) snprintf(missing + len, sizeof missing - len, ", ...");
  char msg[TEXT_MAX];
  if (len)
    snprintf(msg, sizeof msg, "group '%s' (mpi, %d ranks): timed out after %g s in %s waiting for rank(s) %s",
             g->name, P, g->timeout_s, what, missing);
  else /* every rank answered, yet the reduction did not complete */
    snprintf(msg, sizeof msg,
             "group '%s' (mpi, %d ranks): timed out after %g s in %s: every rank arrived but the "
             "reduction did not complete",
             g->name, P, g->timeout_s, what);
  for (int q = 0; q < P; q++)
    if (q != g->rank) ctrl_send(g, q, CTRL_GAVEUP, m->seq, answered[q] != 1, msg);
  break_group(g, SBN_STATUS_TIMEOUT, msg);
  return sbn_fail(SBN_STATUS_TIMEOUT, "%s", msg);
}

/* Wait for the requests of the current collective until the deadline. The
 * clock is read once per SPIN tests: a small exchange completes within a
 * few tests, and a clock read costs as much as a test (about 30 ns). */
enum { SPIN = 8 };
static sbn_status wait_reqs(sbn_group *g, MPI_Request *reqs, int nreq, const char *what, double deadline) {
  mpi_impl *m = g->impl;
  double start = -1.0;
  for (unsigned spin = 1;; spin++) {
    int flag = 0;
    int rc = nreq == 1 ? MPI_Test(reqs, &flag, MPI_STATUS_IGNORE) : MPI_Testall(nreq, reqs, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      sbn_status st = backend_error(g, rc, nreq == 1 ? "MPI_Test" : "MPI_Testall", what);
      break_group(g, st, sbn_last_error());
      return st;
    }
    if (flag) return SBN_STATUS_OK;
    if (spin % SPIN) continue;
    double t = now_s();
    if (start < 0) start = t;
    if (t - start > 20e-6) { /* not immediate: serve the control channel */
      ctrl_poll(g, m->seq);
      if (m->gaveup_rank >= 0) return adopt_verdict(g, what, 1);
    }
    if (t > deadline) return roll_call(g, reqs, nreq, what);
    backoff(t - start);
  }
}

static sbn_status wait_req(sbn_group *g, MPI_Request *req, const char *what, double deadline) {
  return wait_reqs(g, req, 1, what, deadline);
}

/* ---- collectives ---- */

static uint64_t sig_hash(const sbn_sig *s) {
  uint64_t v[5] = {(uint64_t)(uint32_t)s->kind, (uint64_t)(uint32_t)s->layer, (uint64_t)s->count,
                   (uint64_t)(uint32_t)s->dtype, s->extra};
  /* Word by word (a byte-wise FNV-1a over the 40 bytes took ~40 ns of a
   * ~1 us exchange): multiply-xorshift mixing of each field, then a final
   * avalanche (the finalizer of MurmurHash3/splitmix64). */
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < 5; i++) {
    h = (h ^ v[i]) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  }
  h ^= h >> 33, h *= 0xff51afd7ed558ccdull, h ^= h >> 33, h *= 0xc4ceb9fe1a85ec53ull, h ^= h >> 33;
  return h;
}

static int ensure_x(mpi_impl *m, size_t n) {
  if (n <= m->x_cap) return 1;
  sbn_mpi_reqs_clear(&m->reqs); /* they name the old buffers (n is agreed: every rank clears here) */
  sbn_xbin *p = realloc(m->x, sizeof *p * n);
  if (!p) return 0;
  m->x = p;
  p = realloc(m->xs, sizeof *p * n);
  if (!p) return 0;
  m->xs = p, m->x_cap = n;
  return 1;
}

/* One reduction of xs into x: `count` binned sums (lanes = 0) or integer
 * lanes (lanes = 1: MPI_SUM of int64, the engine's built-in sum). */
static sbn_status start_and_wait(sbn_group *g, int count, int lanes, const char *what, double deadline) {
  mpi_impl *m = g->impl;
  MPI_Request *req = NULL;
  const char *call = "";
  int rc = lanes ? sbn_mpi_reqs_start(&m->reqs, m->xs, m->x, count, MPI_INT64_T, MPI_SUM, m->comm, &req, &call)
                 : sbn_mpi_reqs_start(&m->reqs, m->xs, m->x, count, xbin_type, xbin_op, m->comm, &req, &call);
  if (rc != MPI_SUCCESS) {
    sbn_status st = backend_error(g, rc, call, what);
    break_group(g, st, sbn_last_error());
    return st;
  }
  return wait_req(g, req, what, deadline);
}

/* The ranks disagree or one failed: every rank gets every signature (fixed
 * size, so this exchange is safe whatever they called) and the same verdict. */
static sbn_status slow_verdict(sbn_group *g, const sbn_sig *sig, double deadline) {
  mpi_impl *m = g->impl;
  const int P = g->size;
  wire_sig mine;
  memset(&mine, 0, sizeof mine);
  mine.kind = sig->kind, mine.layer = sig->layer, mine.count = sig->count;
  mine.dtype = sig->dtype, mine.status = sig->status, mine.extra = sig->extra;
  memcpy(mine.what, sig->what, WHAT_MAX);
  MPI_Request req;
  int rc = MPI_Iallgather(&mine, (int)sizeof mine, MPI_BYTE, m->sigs_wire, (int)sizeof mine, MPI_BYTE,
                          m->comm, &req);
  if (rc != MPI_SUCCESS) {
    sbn_status st = backend_error(g, rc, "MPI_Iallgather", sig->what);
    break_group(g, st, sbn_last_error());
    return st;
  }
  sbn_status st = wait_req(g, &req, sig->what, deadline);
  if (st != SBN_STATUS_OK) return st;
  for (int q = 0; q < P; q++) {
    const wire_sig *w = &m->sigs_wire[q];
    sbn_sig *s = &m->sigs[q];
    memset(s, 0, sizeof *s);
    s->kind = w->kind, s->layer = w->layer, s->count = w->count;
    s->dtype = w->dtype, s->status = w->status, s->extra = w->extra;
    memcpy(s->what, w->what, WHAT_MAX);
    s->what[WHAT_MAX - 1] = '\0';
  }
  st = sbn_sig_verdict(g, m->sigs, g->rank);
  if (st == SBN_STATUS_OK) /* a hash collision would land here; never silently */
    st = sbn_fail(SBN_STATUS_INTERNAL, "group '%s' (mpi): signature fingerprints differ but the "
                  "signatures agree (%s)", g->name, sig->what);
  return st;
}

/* Control lanes of an integer-lane reduction (MPI_SUM only, so min/max are
 * out): 16-bit pieces h_k of the signature hash and their squares, the
 * number of failed ranks, the number of ranks with a term outside its
 * window. All ranks' pieces are equal iff P sum(h_k^2) == (sum h_k)^2
 * (Cauchy-Schwarz; exact in 64 bits for P <= SBN_XLANES_MAX_TERMS), a test
 * of the reduced lanes alone, so every rank reaches the same verdict. */
static void ctrl_lanes(int64_t *l, uint64_t hash, int status, size_t misfits) {
  for (int k = 0; k < 4; k++) {
    const int64_t h = (int64_t)((hash >> (16 * k)) & 0xffff);
    l[k] = h, l[4 + k] = h * h;
  }
  l[8] = status != SBN_STATUS_OK, l[9] = misfits != 0;
}
static int ctrl_lanes_agree(const int64_t *l, int P) {
  for (int k = 0; k < 4; k++)
    if ((uint64_t)P * (uint64_t)l[4 + k] != (uint64_t)l[k] * (uint64_t)l[k]) return 0;
  return l[8] == 0;
}

/* Wait for the exchange the pair just started (rc: how starting it went). */
static sbn_status pair_wait(sbn_group *g, int rc, const char *call, const char *what, double deadline) {
  mpi_impl *m = g->impl;
  if (rc == SBN_MPI_PAIR_NOMEM)
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "group '%s' (mpi): out of memory for %s", g->name, what);
  if (rc != MPI_SUCCESS) {
    sbn_status st = backend_error(g, rc, call, what);
    break_group(g, st, sbn_last_error());
    return st;
  }
  return wait_reqs(g, m->pair.act, m->pair.nact, what, deadline);
}

static void pair_sum(void *buf, const void *peer, size_t n, size_t esize) {
  if (esize == 8) sbn_xsum_pair_sum_f64(buf, buf, peer, n);
  else sbn_xsum_pair_sum_f32(buf, buf, peer, n);
}

/* Two ranks (mpi_pair.h): each sends the other its raw values and sums the
 * pair itself. That is exact without an exact format on the wire: the
 * sum of two doubles is computed locally from both terms, exactly, and
 * rounded once (sbn_xsum_pair_sum_*), commutatively, so both ranks get the
 * same bits, the binned sum's (the other paths' and the threads
 * backend's). The headers carry what the first reduction's control element
 * carries (fingerprint, status) plus the counts; any difference goes to
 * slow_verdict, as there. A rank sends its values inline only when its
 * count is the predicted one (the plan's, agreed state) and at most
 * SBN_MPI_PAIR_MAX, which is what both posted receives allow for; else,
 * when the headers agree, the values follow in a second exchange (in
 * pieces) and the count is learnt for next time. Waiting, timeouts and
 * verdicts are those of every collective (wait_reqs). */
static sbn_status pair_collective(sbn_group *g, const sbn_sig *sig, void *buf, size_t n, sbn_dtype dtype,
                                  double deadline) {
  mpi_impl *m = g->impl;
  const size_t esize = dtype == SBN_DTYPE_FLOAT64 ? 8 : 4;
  sbn_plan *pl = sbn_plan_at(&m->plans, m->prev_key);
  const size_t first = sbn_plan_count(pl, m->prev_key);
  const size_t expect = first <= SBN_MPI_PAIR_MAX ? first : 0; /* values the receive allows inline */
  const int inline_payload = n == expect && n > 0;
  const uint64_t hash = sig_hash(sig);
  const sbn_mpi_pair_hdr mine = {hash, (int64_t)n, (int32_t)sig->status, (int32_t)esize, SBN_MPI_PAIR_MAGIC};
  const char *call = "";
  int rc = sbn_mpi_pair_start(&m->pair, &mine, inline_payload ? buf : NULL, n, esize, expect, &call);
  sbn_status st = pair_wait(g, rc, call, sig->what, deadline);
  if (st != SBN_STATUS_OK) return st;
  const sbn_mpi_pair_hdr *h = sbn_mpi_pair_peer(&m->pair);
  if (h->magic != SBN_MPI_PAIR_MAGIC || h->hash != hash || h->count != mine.count || h->status != SBN_STATUS_OK ||
      mine.status != SBN_STATUS_OK || (n && h->esize != mine.esize)) {
    m->prev_key = 0x5eed0fe77ab1e5ull; /* after a disagreement: a fixed state */
    return slow_verdict(g, sig, deadline);
  }
  if (inline_payload) {
    pair_sum(buf, sbn_mpi_pair_peer_values(&m->pair, n), n, esize);
  } else { /* both counts agree but were not the predicted one: the values follow */
    for (size_t off = 0; off < n; off += SBN_MPI_PAIR_MAX) {
      const size_t k = n - off < SBN_MPI_PAIR_MAX ? n - off : SBN_MPI_PAIR_MAX;
      char *piece = (char *)buf + off * esize;
      rc = sbn_mpi_pair_start_values(&m->pair, piece, k * esize, &call);
      st = pair_wait(g, rc, call, sig->what, deadline);
      if (st != SBN_STATUS_OK) return st;
      pair_sum(piece, sbn_mpi_pair_peer_values(&m->pair, k), k, esize);
    }
    sbn_plan_learn(pl, m->prev_key, n <= CHUNK ? n : 0, SBN_PLAN_BINNED, 0, NULL);
  }
  if (n) m->path_count[3]++;
  m->prev_key = hash;
  return SBN_STATUS_OK;
}

/* The common part of every collective: agree on the signature and, for a
 * sum, reduce `n` values of buf (n = 0 otherwise).
 *
 * The first reduction's layout is predicted (sum_plan.h: the same on every
 * rank): integer lanes (NCTRL_LANES control lanes, then 2 per value, MPI_SUM)
 * when the plan has windows that worked, else binned sums (the control
 * element, then the values; a commutative user MPI_Op). A rank whose count
 * is not the predicted one sends padding (zeros: empty sums that fit any
 * window). When some rank's term does not fit its window, the values go
 * again as binned sums (the result is the same bits either way, see
 * exact_lanes.h; only the time differs). */
static sbn_status collective(sbn_group *g, const sbn_sig *sig, void *buf, size_t n, sbn_dtype dtype) {
  mpi_impl *m = g->impl;
  if (m->broken) return broken_error(g, sig->what);
  m->seq++; /* arrived: queries are answered with this collective */
  ctrl_poll(g, m->seq); /* and a verdict that came while we were away breaks the group */
  if (m->gaveup_rank >= 0) return adopt_verdict(g, sig->what, 0);
  const double deadline = now_s() + g->timeout_s; /* inf: wait forever */
  if (g->size == 1) return sbn_sig_verdict(g, sig, 0); /* nothing to sum (buf unchanged, as threads) */
  if (sig->status != SBN_STATUS_OK) n = 0;
  if (m->pair_on) return pair_collective(g, sig, buf, n, dtype, deadline);
  const int f64 = dtype == SBN_DTYPE_FLOAT64;
  sbn_plan *pl = sbn_plan_at(&m->plans, m->prev_key);
  const size_t first = sbn_plan_count(pl, m->prev_key);
  const int lanes = g->size <= SBN_XLANES_MAX_TERMS && sbn_plan_lanes(pl, m->prev_key);
  const int inline_payload = n == first && n > 0;
  if (!ensure_x(m, 4 + first) || !sbn_plan_reserve(pl, n <= CHUNK ? n : 0))
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "group '%s' (mpi): out of memory for %s", g->name, sig->what);
  const uint64_t hash = sig_hash(sig);
  sbn_plan_outcome how = SBN_PLAN_BINNED;
  int probe_ok = 0;
  sbn_status st;
  if (lanes) {
    int64_t *l = (int64_t *)m->xs, *r = (int64_t *)m->x;
    size_t mis = 0;
    if (inline_payload) mis = f64 ? sbn_xlanes_encode_f64(l + NCTRL_LANES, buf, pl->top, n)
                                  : sbn_xlanes_encode_f32(l + NCTRL_LANES, buf, pl->top, n);
    else memset(l + NCTRL_LANES, 0, 2 * sizeof *l * first);
    ctrl_lanes(l, hash, sig->status, mis);
    st = start_and_wait(g, (int)(NCTRL_LANES + 2 * first), 1, sig->what, deadline);
    if (st != SBN_STATUS_OK) return st;
    if (!ctrl_lanes_agree(r, g->size)) {
      m->prev_key = 0x5eed0fe77ab1e5ull; /* after a disagreement: a fixed state */
      return slow_verdict(g, sig, deadline);
    }
    if (inline_payload && r[9] == 0) {
      if (f64) sbn_xlanes_decode_f64(buf, r + NCTRL_LANES, pl->top, n);
      else sbn_xlanes_decode_f32(buf, r + NCTRL_LANES, pl->top, n);
      sbn_plan_learn(pl, m->prev_key, n, SBN_PLAN_LANES_FIT, 0, NULL);
      m->path_count[0]++;
      m->prev_key = hash;
      return SBN_STATUS_OK;
    }
    if (inline_payload) how = SBN_PLAN_LANES_MISFIT;
  } else {
    /* probe: do this rank's terms fit the plan's windows? (the max over
     * ranks rides in the control element's status field, below the status) */
    const int probe = sbn_plan_probe(pl, m->prev_key, n) && inline_payload;
    const int mis = probe ? (f64 ? sbn_xlanes_misfits_f64(buf, pl->top, n) : sbn_xlanes_misfits_f32(buf, pl->top, n)) != 0 : 1;
    m->xs[0] = sbn_xsum_ctrl(hash, 2 * (int)sig->status + mis);
    if (inline_payload) {
      if (f64) sbn_xsum_encode_f64(m->xs + 1, buf, n);
      else sbn_xsum_encode_f32(m->xs + 1, buf, n);
    } else if (first) {
      memset(m->xs + 1, 0, sizeof *m->xs * first);
    }
    st = start_and_wait(g, (int)(1 + first), 0, sig->what, deadline);
    if (st != SBN_STATUS_OK) return st;
    int maxst = 0;
    if (!sbn_xsum_ctrl_read(&m->x[0], &maxst) || maxst >> 1 != SBN_STATUS_OK) {
      m->prev_key = 0x5eed0fe77ab1e5ull; /* after a disagreement: a fixed state */
      return slow_verdict(g, sig, deadline);
    }
    if (inline_payload) {
      if (f64) sbn_xsum_decode_f64(buf, m->x + 1, n);
      else sbn_xsum_decode_f32(buf, m->x + 1, n);
      sbn_plan_learn(pl, m->prev_key, n, SBN_PLAN_BINNED, !(maxst & 1), m->x + 1);
      m->path_count[2]++;
      m->prev_key = hash;
      return SBN_STATUS_OK;
    }
  }
  /* Everyone agreed, and the values still have to go: binned sums of the
   * agreed count, in pieces. */
  for (size_t off = 0; off < n; off += CHUNK) {
    const size_t k = n - off < CHUNK ? n - off : CHUNK;
    if (!ensure_x(m, k))
      return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "group '%s' (mpi): out of memory for %s", g->name, sig->what);
    if (f64) sbn_xsum_encode_f64(m->xs, (double *)buf + off, k);
    else sbn_xsum_encode_f32(m->xs, (float *)buf + off, k);
    st = start_and_wait(g, (int)k, 0, sig->what, deadline);
    if (st != SBN_STATUS_OK) return st;
    if (f64) sbn_xsum_decode_f64((double *)buf + off, m->x, k);
    else sbn_xsum_decode_f32((float *)buf + off, m->x, k);
  }
  sbn_plan_learn(pl, m->prev_key, n <= CHUNK ? n : 0, how, probe_ok, n <= CHUNK ? m->x : NULL);
  if (n) m->path_count[how == SBN_PLAN_LANES_MISFIT ? 1 : 2]++;
  m->prev_key = hash;
  return SBN_STATUS_OK;
}

void sbn_mpi_path_counts(const sbn_group *g, uint64_t out[SBN_MPI_PATHS]) {
  const mpi_impl *m = g->ops == &mpi_ops ? g->impl : NULL;
  for (int i = 0; i < SBN_MPI_PATHS; i++) out[i] = m ? m->path_count[i] : 0;
}

int sbn_mpi_set_pair(sbn_group *g, int on) {
  mpi_impl *m = g->ops == &mpi_ops ? g->impl : NULL;
  if (!m) return 0;
  const int was = m->pair_on;
  m->pair_on = on && g->size == 2;
  return was;
}

static sbn_status mpi_allreduce(sbn_group *g, void *buf, size_t count, sbn_dtype dtype, const sbn_sig *sig) {
  return collective(g, sig, buf, count, dtype);
}

static sbn_status mpi_broadcast(sbn_group *g, void *buf, size_t bytes, int root, const sbn_sig *sig) {
  mpi_impl *m = g->impl;
  sbn_status st = collective(g, sig, NULL, 0, SBN_DTYPE_FLOAT64);
  if (st != SBN_STATUS_OK || g->size == 1 || !bytes) return st;
  const double deadline = now_s() + g->timeout_s;
  for (size_t off = 0; off < bytes;) { /* MPI counts are int: pieces of 1 GiB */
    size_t piece = bytes - off < ((size_t)1 << 30) ? bytes - off : (size_t)1 << 30;
    MPI_Request req;
    int rc = MPI_Ibcast((char *)buf + off, (int)piece, MPI_BYTE, root, m->comm, &req);
    if (rc != MPI_SUCCESS) {
      st = backend_error(g, rc, "MPI_Ibcast", sig->what);
      break_group(g, st, sbn_last_error());
      return st;
    }
    st = wait_req(g, &req, sig->what, deadline);
    if (st != SBN_STATUS_OK) return st;
    off += piece;
  }
  return SBN_STATUS_OK;
}

static sbn_status mpi_barrier(sbn_group *g, const sbn_sig *sig) {
  return collective(g, sig, NULL, 0, SBN_DTYPE_FLOAT64);
}

static void impl_free(mpi_impl *m) {
  if (!m) return;
  for (int i = 0; i < m->n_out; i++) free(m->outbox[i]);
  sbn_plans_free(&m->plans);
  sbn_mpi_pair_free(&m->pair);
  free(m->outbox), free(m->x), free(m->xs), free(m->sigs_wire), free(m->sigs), free(m);
}

/* A group over `comm`, which becomes the group's own (freed by destroy);
 * pair: whether every rank allows the two-rank path (agreed by the caller). */
static sbn_status wrap_comm(sbn_group **out, MPI_Comm comm, const char *name, int pair) {
  int rank = 0, P = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &P);
  if (P > SBN_XSUM_MAX_TERMS) {
    MPI_Comm_free(&comm);
    return sbn_fail(SBN_STATUS_UNSUPPORTED,
                    "group '%s' (mpi): %d ranks; at most %d per group (the exact sums' headroom)", name,
                    P, SBN_XSUM_MAX_TERMS);
  }
  pthread_once(&xbin_once, xbin_init);
  mpi_impl *m = calloc(1, sizeof *m);
  if (m) {
    m->comm = comm;
    m->ctrl_req = MPI_REQUEST_NULL;
    sbn_mpi_reqs_init(&m->reqs);
    m->gaveup_rank = -1;
    m->prev_key = 0x57a27ull;
    m->pair_allowed = pair;
    m->pair_on = pair && P == 2;
    sbn_mpi_pair_init(&m->pair, comm, 1 - rank);
    m->sigs_wire = malloc(sizeof *m->sigs_wire * (size_t)P);
    m->sigs = malloc(sizeof *m->sigs * (size_t)P);
  }
  sbn_group *g = NULL;
  if (m && m->sigs_wire && m->sigs && ensure_x(m, 1)) g = sbn_group_alloc(&mpi_ops, m, rank, P, name);
  if (!g) {
    impl_free(m);
    MPI_Comm_free(&comm);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "group '%s' (mpi): out of memory for %d ranks", name, P);
  }
  if (P > 1) {
    int rc = MPI_Irecv(&m->ctrl_in, (int)sizeof m->ctrl_in, MPI_BYTE, MPI_ANY_SOURCE, TAG_CTRL, comm,
                       &m->ctrl_req);
    if (rc != MPI_SUCCESS) {
      sbn_status st = backend_error(g, rc, "MPI_Irecv", "creating the group");
      sbn_group_destroy(g); /* clears the error: restore it */
      return sbn_fail(st, "group '%s' (mpi): could not post its control receive", name);
    }
  }
  *out = g;
  return SBN_STATUS_OK;
}

static void mpi_abort(sbn_group *g, const char *why);

static sbn_status mpi_split(sbn_group **out, sbn_group *g, int color, int key, const sbn_sig *sig,
                            int *agreed) {
  mpi_impl *m = g->impl;
  *out = NULL;
  /* Agree first (nonblocking, bounded): a disagreement or a missing rank
   * must not leave anyone inside the blocking MPI_Comm_split. */
  sbn_status st = collective(g, sig, NULL, 0, SBN_DTYPE_FLOAT64);
  if (st != SBN_STATUS_OK) return st;
  *agreed = 1;
  MPI_Comm nc = MPI_COMM_NULL;
  int rc = MPI_Comm_split(m->comm, color >= 0 ? color : MPI_UNDEFINED, key, &nc);
  if (rc != MPI_SUCCESS) { /* the parent's state is unknown: leave it, telling the peers */
    st = backend_error(g, rc, "MPI_Comm_split", sig->what);
    mpi_abort(g, sbn_last_error());
    return st;
  }
  if (color < 0)
    return sbn_fail(SBN_STATUS_NOT_MEMBER, "split of group '%s': rank %d passed SBN_UNDEFINED", g->name,
                    g->rank);
  MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
  char name[128];
  snprintf(name, sizeof name, "%.100s/split(color=%d)", g->name, color);
  return wrap_comm(out, nc, name, m->pair_allowed);
}

static void mpi_destroy(sbn_group *g) {
  mpi_impl *m = g->impl;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) { /* too late for MPI calls: just the memory */
    impl_free(m);
    return;
  }
  if (m->broken) {
    /* The failed call's reduction may still reference the buffers:
     * MPI_Comm_free lets it finish; the memory is not reused. */
    MPI_Comm_free(&m->comm);
    sbn_keep_on_purpose(m);
    return;
  }
  if (m->ctrl_req != MPI_REQUEST_NULL) {
    MPI_Cancel(&m->ctrl_req);
    MPI_Wait(&m->ctrl_req, MPI_STATUS_IGNORE);
  }
  for (int i = 0; i < m->n_out; i++) MPI_Wait(&m->outbox[i]->req, MPI_STATUS_IGNORE);
  sbn_mpi_reqs_clear(&m->reqs);
  sbn_mpi_pair_clear(&m->pair);
  MPI_Comm_free(&m->comm);
  impl_free(m);
}

/* The verdict goes to every peer on the control channel (collective 0, so
 * that no peer mistakes it for a timeout of its own collective). */
static void mpi_abort(sbn_group *g, const char *why) {
  mpi_impl *m = g->impl;
  if (m->broken) return;
  char msg[TEXT_MAX];
  snprintf(msg, sizeof msg, "after an error of its own: %s", why);
  for (int q = 0; q < g->size; q++)
    if (q != g->rank) ctrl_send(g, q, CTRL_GAVEUP, 0, 0, msg);
  char mine[TEXT_MAX + 64];
  snprintf(mine, sizeof mine, "rank %d (this rank) gave up %s", g->rank, msg);
  break_group(g, SBN_STATUS_GROUP_BROKEN, mine);
}

static const sbn_comm_ops mpi_ops = {
    "mpi", mpi_allreduce, mpi_broadcast, mpi_barrier, mpi_split, mpi_destroy, NULL, mpi_abort,
};

sbn_status sbn_group_from_mpi_comm(sbn_group **out, const void *comm_p, size_t comm_size) {
  sbn_clear_error();
  if (!out) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_group_from_mpi: out is NULL");
  *out = NULL;
  if (!comm_p) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_group_from_mpi: comm is NULL");
  if (comm_size != sizeof(MPI_Comm))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "sbn_group_from_mpi: sizeof(MPI_Comm) is %zu in the caller but %zu in libsyncbn: "
                    "the program and the library were built against different MPIs",
                    comm_size, sizeof(MPI_Comm));
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin)
    return sbn_fail(SBN_STATUS_BAD_STATE, "sbn_group_from_mpi: MPI is %s (syncbn never calls MPI_Init)",
                    fin ? "already finalized" : "not initialized: call MPI_Init first");
  MPI_Comm comm;
  memcpy(&comm, comm_p, sizeof comm);
  if (comm == MPI_COMM_NULL) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_group_from_mpi: comm is MPI_COMM_NULL");
  /* An invalid SYNCBN_TIMEOUT is refused after the ranks agree (below), so
   * that a rank whose launcher gave it another value than its peers' does
   * not leave them waiting in the duplication until their timeout. */
  double timeout = sbn_default_timeout();
  char refused[512] = "";
  if (isnan(timeout)) /* refused; the default bounds this call's waits */
    snprintf(refused, sizeof refused, "%s", sbn_last_error()), timeout = 300;
  int inter = 0;
  MPI_Comm_test_inter(comm, &inter);
  if (inter)
    return sbn_fail(SBN_STATUS_UNSUPPORTED, "sbn_group_from_mpi: inter-communicators are not supported");
  /* Group name for messages: "world" for (a copy of) MPI_COMM_WORLD, else
   * the communicator's own name if it has one. */
  char name[MPI_MAX_OBJECT_NAME + 1] = "";
  int cmp = MPI_UNEQUAL, len = 0;
  MPI_Comm_compare(comm, MPI_COMM_WORLD, &cmp);
  if (cmp == MPI_IDENT || cmp == MPI_CONGRUENT) snprintf(name, sizeof name, "world");
  else if (MPI_Comm_get_name(comm, name, &len) != MPI_SUCCESS || !name[0]) snprintf(name, sizeof name, "mpi");
  /* Duplicate without blocking forever: a rank that never calls us must
   * give a timeout, not a hang. */
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Request req;
  int rc = MPI_Comm_idup(comm, &dup, &req);
  if (rc != MPI_SUCCESS)
    return sbn_fail(SBN_STATUS_BACKEND_ERROR, "sbn_group_from_mpi: MPI_Comm_idup failed (error %d)", rc);
  const double start = now_s();
  for (unsigned long it = 0;; it++) {
    int flag = 0;
    rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
      return sbn_fail(SBN_STATUS_BACKEND_ERROR, "sbn_group_from_mpi: MPI_Comm_idup failed (error %d)", rc);
    if (flag) break;
    double t = now_s() - start;
    (void)it;
    if (t > timeout)
      return sbn_fail(SBN_STATUS_TIMEOUT,
                      "sbn_group_from_mpi: timed out after %g s duplicating communicator '%s': not every "
                      "rank called sbn_group_from_mpi",
                      timeout, name);
    backoff(t);
  }
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  /* The ranks agree on what each decided alone: the two-rank path unless
   * SYNCBN_MPI_PAIR=0 (every rank must take the same path: the minimum),
   * and whether some rank refused its SYNCBN_TIMEOUT (the lowest such
   * rank). Within the same timeout: a launcher that passes a variable to
   * one rank only must not make the ranks wait for each other in
   * different calls. */
  const char *env = getenv("SYNCBN_MPI_PAIR");
  int pair = !(env && env[0] == '0' && !env[1]), P = 0, me = 0;
  MPI_Comm_size(dup, &P);
  MPI_Comm_rank(dup, &me);
  int refuser = refused[0] ? me : P;
  if (P > 1) {
    int *ag = malloc(4 * sizeof *ag); /* [mine x2, agreed x2]: on the heap, a timed-out reduction may still name it */
    if (!ag) {
      MPI_Comm_free(&dup);
      return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "sbn_group_from_mpi: out of memory");
    }
    ag[0] = pair, ag[1] = refuser;
    rc = MPI_Iallreduce(&ag[0], &ag[2], 2, MPI_INT, MPI_MIN, dup, &req);
    for (int flag = 0; rc == MPI_SUCCESS && !flag;) {
      rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      double t = now_s() - start;
      if (rc == MPI_SUCCESS && !flag && t > timeout) { /* a peer dropped out between the two calls */
        sbn_keep_on_purpose(ag);
        return sbn_fail(SBN_STATUS_TIMEOUT, "sbn_group_from_mpi: timed out after %g s on communicator '%s': "
                        "not every rank finished sbn_group_from_mpi", timeout, name);
      }
      if (!flag) backoff(t);
    }
    pair = ag[2], refuser = ag[3];
    free(ag);
    if (rc != MPI_SUCCESS) {
      MPI_Comm_free(&dup);
      return sbn_fail(SBN_STATUS_BACKEND_ERROR, "sbn_group_from_mpi: MPI_Iallreduce failed (error %d)", rc);
    }
  }
  if (refuser < P) {
    MPI_Comm_free(&dup);
    if (refused[0]) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s", refused);
    return sbn_fail(SBN_STATUS_PEER_FAILED,
                    "sbn_group_from_mpi: rank %d of communicator '%s' refused its SYNCBN_TIMEOUT (not a "
                    "positive number of seconds; inf: wait forever), so no rank made the group",
                    refuser, name);
  }
  return wrap_comm(out, dup, name, pair);
}

#endif /* SBN_WITH_MPI */
