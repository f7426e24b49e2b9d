/* The MPI backend: ranks are MPI processes; a group wraps a private
 * duplicate of the caller's communicator (the library never calls MPI_Init
 * and never assumes MPI_COMM_WORLD).
 *
 * PROTOCOL. Every collective (allreduce, broadcast, barrier, split) starts
 * with the same step: each rank sends every other rank an "envelope", its
 * signature (kind, layer, count, dtype, local status, ~50 bytes + the text
 * used in messages) followed, for payloads up to 64 KiB, by the payload
 * itself. Receives are pre-posted with room for the largest possible
 * envelope, so ranks that disagree on the size (a different C) cause no
 * truncation and no erroneous MPI call: every rank sees every signature,
 * runs the same verdict (sbn_sig_verdict) and returns the same error. The
 * signature therefore costs no extra round trip: it rides in the message
 * that carries the data (BENCHMARKS.md measures the cost).
 * Groups of more than 16 ranks exchange only the signatures (MPI_Iallgather
 * of fixed-size headers) and move the payload in a second step.
 *
 * REDUCTION ORDER. Results are bitwise those of the threads backend: every
 * element is summed in rank order, s = 0; for q in 0..P-1: s += v_q, in
 * float64 (float32 payloads accumulate in float64 and round once). Small
 * payloads (the layer's 2C+1 and 2C doubles): each rank receives all
 * contributions in the envelopes and sums locally (one message latency).
 * Large payloads: an ordered reduce-scatter (MPI_Ialltoallv; rank q sums
 * chunk q over the ranks in order) then MPI_Iallgatherv of the chunks.
 * MPI_Allreduce itself is not used: its order is implementation-defined.
 *
 * WAITING. All MPI operations are nonblocking and polled (spin briefly,
 * then sched_yield, then short sleeps, so oversubscribed ranks leave the
 * cores to the peers they wait for) against a deadline of the group's
 * timeout (SYNCBN_TIMEOUT, default 300 s, or sbn_group_set_timeout).
 *
 * WHAT A USER SEES IN EACH FAULT CASE
 *  - Mismatch (ranks call layers with a different C, a different layer, a
 *    different collective, or one rank fails locally, e.g. a bad tensor):
 *    every rank's call returns at once with SBN_STATUS_MISMATCH (message
 *    "group 'world' (mpi, 4 ranks): ranks disagree on the collective:
 *    [rank 0 1 2] forward of layer #0 (C=8, float32); [rank 3] forward of
 *    layer #0 (C=9, float32)") or, for a local error, the failing rank gets
 *    its own status and the others SBN_STATUS_PEER_FAILED ("rank 1 failed:
 *    <its message>"). Nothing is changed; the group stays usable.
 *  - A rank killed (SIGKILL) under plain `mpirun`: Open MPI's runtime
 *    notices the dead process and terminates the whole job within about a
 *    second; mpirun prints "mpirun noticed that process rank 1 with PID ...
 *    on node ... exited on signal 9 (Killed)." and exits non-zero. The
 *    library does not get a say (the survivors are killed by mpirun).
 *  - A rank that does not arrive (stuck, or dead under a launcher that lets
 *    the others run on): after the timeout the waiting ranks return
 *    SBN_STATUS_TIMEOUT, "group 'world' (mpi, 4 ranks): timed out after
 *    300 s in forward of layer #0 (C=8, float32) waiting for rank(s) 1",
 *    the group becomes broken (later calls: SBN_STATUS_GROUP_BROKEN), and
 *    the timed-out ranks notify the others, so a late rank fails with
 *    SBN_STATUS_GROUP_BROKEN ("rank 0 gave up: ...") at its next collective
 *    instead of waiting for ranks that are gone. A program that exits
 *    non-zero on that error ends the job under mpirun.
 *  - MPI errors on the group's communicator are returned (the duplicate
 *    uses MPI_ERRORS_RETURN) as SBN_STATUS_BACKEND_ERROR with MPI's text.
 *  Limits: sbn_group_split calls the blocking MPI_Comm_split after all
 *  ranks have agreed (MPI has no nonblocking split), so a rank dying inside
 *  that window is left to the MPI runtime. A broken group's buffers are not
 *  freed by sbn_group_destroy (MPI may still own them). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "exact_sum.h"

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

#include "syncbn_mpi.h"

enum {
  TAG_ENVELOPE = 0x5b01,
  TAG_ABORT = 0x5b02,
  DIRECT_MAX_P = 16,  /* up to this many ranks, envelopes go point-to-point */
  INLINE_MAX = 65536, /* payloads up to this ride in the envelope (C <= 4095) */
  WHAT_MAX = 256,     /* sizeof(sbn_sig.what) */
  ABORT_BYTES = 768
};

/* The signature on the wire: fixed fields, then `what` (what_len bytes,
 * NUL included, padded to 8 so a following payload of doubles is aligned),
 * then the payload when inline_payload is set. */
typedef struct wire_hdr {
  int32_t kind, layer;
  int64_t count;
  int32_t dtype, status;
  uint64_t extra;
  int32_t color, key;      /* split's contribution */
  uint32_t what_len;
  uint32_t inline_payload; /* 1: payload_bytes of payload follow */
  uint64_t payload_bytes;  /* this rank's payload size */
} wire_hdr;

#define HDR_MAX (sizeof(wire_hdr) + WHAT_MAX)
#define ENV_MAX (HDR_MAX + INLINE_MAX)

typedef struct mpi_impl {
  MPI_Comm comm;
  int direct; /* P <= DIRECT_MAX_P */
  int broken;
  sbn_status broken_status;
  char broken_msg[ABORT_BYTES - 64];
  unsigned char *send;  /* this rank's envelope, ENV_MAX */
  unsigned char *recv;  /* direct: a slot of ENV_MAX per rank; else HDR_MAX per rank */
  MPI_Request *reqs;    /* 2P */
  int *req_peer;        /* per request: the peer it waits for, -1 for a collective */
  wire_hdr *hdrs;       /* decoded, per rank */
  const unsigned char **payloads;
  sbn_sig *sigs;
  int *counts, *displs, *rcounts, *rdispls; /* reduce-scatter layout */
  void *scratch;
  size_t scratch_bytes;
  MPI_Request abort_req; /* pre-posted: a peer that gave up tells us */
  char abort_in[ABORT_BYTES], abort_out[ABORT_BYTES];
} mpi_impl;

static const sbn_comm_ops mpi_ops;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static sbn_status backend_error(sbn_group *g, int rc, const char *call, const char *what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "error %d", rc);
  return sbn_fail(SBN_STATUS_BACKEND_ERROR, "group '%s' (mpi, %d ranks): %s failed in %s: %s",
                  g->name, g->size, call, what, text);
}

/* Mark the group unusable and tell the peers (best effort, fire and forget:
 * the message is small, so MPI sends it eagerly even to a dead peer). */
static void break_group(sbn_group *g, sbn_status st, const char *msg) {
  mpi_impl *m = g->impl;
  if (m->broken) return;
  m->broken = 1;
  m->broken_status = st;
  snprintf(m->broken_msg, sizeof m->broken_msg, "%s", msg);
  snprintf(m->abort_out, sizeof m->abort_out, "%s", msg);
  for (int q = 0; q < g->size; q++) {
    if (q == g->rank) continue;
    MPI_Request r;
    if (MPI_Isend(m->abort_out, (int)strlen(m->abort_out) + 1, MPI_CHAR, q, TAG_ABORT, m->comm, &r) ==
        MPI_SUCCESS)
      MPI_Request_free(&r);
  }
}

/* Did a peer give up on this group? Then it is broken here too. */
static void poll_abort(sbn_group *g) {
  mpi_impl *m = g->impl;
  if (m->broken || m->abort_req == MPI_REQUEST_NULL) return;
  int flag = 0;
  MPI_Status status;
  if (MPI_Test(&m->abort_req, &flag, &status) != MPI_SUCCESS || !flag) return;
  m->abort_in[sizeof m->abort_in - 1] = '\0';
  m->broken = 1;
  m->broken_status = SBN_STATUS_GROUP_BROKEN;
  snprintf(m->broken_msg, sizeof m->broken_msg, "rank %d gave up: %.600s", status.MPI_SOURCE,
           m->abort_in);
}

static sbn_status broken_error(sbn_group *g, const char *what) {
  mpi_impl *m = g->impl;
  return sbn_fail(SBN_STATUS_GROUP_BROKEN, "group '%s' (mpi, %d ranks) is broken and can't be used (%s): %s",
                  g->name, g->size, what, m->broken_msg);
}

/* Pause between polls: spin first (a collective of the layer takes a few
 * microseconds), then yield, then sleep, so that ranks oversubscribing the
 * cores leave them to the ranks they wait for and a long wait costs no CPU. */
static void backoff(double waited) {
  if (waited < 50e-6) return;
  if (waited < 2e-3) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, waited < 0.1 ? 50000L : 1000000L};
  nanosleep(&ts, NULL);
}

/* Wait for n requests until the deadline. On timeout the group breaks and
 * the message names the ranks whose messages did not come. */
static sbn_status wait_all(sbn_group *g, int n, MPI_Request *reqs, const int *peer, const char *what,
                           double deadline) {
  mpi_impl *m = g->impl;
  const double start = now_s();
  for (unsigned long it = 0;; it++) {
    int flag = 0;
    int rc = MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      sbn_status st = backend_error(g, rc, "MPI_Testall", what);
      break_group(g, st, sbn_last_error());
      return st;
    }
    if (flag) return SBN_STATUS_OK;
    double t = now_s();
    if (t - start > 1e-3 && (it & 15) == 15) { /* slow: did a peer give up? */
      poll_abort(g);
      if (m->broken) return broken_error(g, what);
    }
    if (t > deadline) break;
    backoff(t - start);
  }
  /* Timed out: which peers are missing? */
  char missing[300];
  int len = 0, collective = 0;
  missing[0] = '\0';
  for (int i = 0; i < n; i++) {
    int done = 1;
    if (reqs[i] != MPI_REQUEST_NULL) MPI_Request_get_status(reqs[i], &done, MPI_STATUS_IGNORE);
    if (done) continue;
    if (peer[i] < 0) {
      collective = 1;
      continue;
    }
    int seen = 0; /* a peer may appear for its receive and its send */
    for (int j = 0; j < i; j++) seen |= peer[j] == peer[i] && reqs[j] != MPI_REQUEST_NULL;
    if (!seen && len < (int)sizeof missing - 16)
      len += snprintf(missing + len, sizeof missing - len, "%s%d", len ? ", " : "", peer[i]);
  }
  char msg[900];
  snprintf(msg, sizeof msg, "group '%s' (mpi, %d ranks): timed out after %g s in %s waiting for %s%s",
           g->name, g->size, g->timeout_s, what, len ? "rank(s) " : "",
           len ? missing : collective ? "the other ranks (MPI collective)" : "the other ranks");
  /* Receives can be cancelled; sends and collectives stay with MPI (the
   * group's memory is then never freed, see mpi_destroy). */
  for (int i = 0; i < n; i++) {
    if (reqs[i] == MPI_REQUEST_NULL || peer[i] < 0) continue;
    MPI_Cancel(&reqs[i]);
    MPI_Request_free(&reqs[i]);
  }
  break_group(g, SBN_STATUS_TIMEOUT, msg);
  return sbn_fail(SBN_STATUS_TIMEOUT, "%s", msg);
}

static size_t what_len_of(const sbn_sig *sig) {
  size_t len = strnlen(sig->what, WHAT_MAX - 1) + 1;
  return (len + 7) & ~(size_t)7;
}

/* Step 1 of every collective: every rank learns every rank's signature
 * (and, when inline, payload). Fills m->hdrs, m->sigs, m->payloads. */
static sbn_status exchange(sbn_group *g, const sbn_sig *sig, const void *payload,
                           size_t payload_bytes, int inline_payload, int color, int key,
                           double deadline) {
  mpi_impl *m = g->impl;
  const int P = g->size, me = g->rank;
  wire_hdr h;
  memset(&h, 0, sizeof h);
  h.kind = sig->kind, h.layer = sig->layer, h.count = sig->count;
  h.dtype = sig->dtype, h.status = sig->status, h.extra = sig->extra;
  h.color = color, h.key = key;
  h.what_len = (uint32_t)what_len_of(sig);
  h.inline_payload = inline_payload != 0;
  h.payload_bytes = payload_bytes;
  memset(m->send, 0, HDR_MAX);
  memcpy(m->send, &h, sizeof h);
  memcpy(m->send + sizeof h, sig->what, strnlen(sig->what, WHAT_MAX - 1));
  size_t env_bytes = sizeof h + h.what_len;
  if (inline_payload && payload_bytes) {
    memcpy(m->send + env_bytes, payload, payload_bytes);
    env_bytes += payload_bytes;
  }
  int n = 0, rc = MPI_SUCCESS;
  if (m->direct) {
    /* Receives first (room for any envelope), then sends, starting with the
     * next rank so that not everyone sends to rank 0 first. */
    for (int i = 1; i < P && rc == MPI_SUCCESS; i++) {
      int q = (me + P - i) % P;
      m->req_peer[n] = q;
      rc = MPI_Irecv(m->recv + (size_t)q * ENV_MAX, (int)ENV_MAX, MPI_BYTE, q, TAG_ENVELOPE, m->comm,
                     &m->reqs[n++]);
    }
    for (int i = 1; i < P && rc == MPI_SUCCESS; i++) {
      int q = (me + i) % P;
      m->req_peer[n] = q;
      rc = MPI_Isend(m->send, (int)env_bytes, MPI_BYTE, q, TAG_ENVELOPE, m->comm, &m->reqs[n++]);
    }
  } else {
    m->req_peer[0] = -1;
    rc = MPI_Iallgather(m->send, (int)HDR_MAX, MPI_BYTE, m->recv, (int)HDR_MAX, MPI_BYTE, m->comm,
                        &m->reqs[n++]);
  }
  if (rc != MPI_SUCCESS) { /* can't happen short of a broken MPI; don't leave half a protocol */
    sbn_status st = backend_error(g, rc, "posting the envelope", sig->what);
    break_group(g, st, sbn_last_error());
    return st;
  }
  sbn_status st = wait_all(g, n, m->reqs, m->req_peer, sig->what, deadline);
  if (st != SBN_STATUS_OK) return st;
  for (int q = 0; q < P; q++) {
    const unsigned char *base = q == me ? m->send : m->recv + (size_t)q * (m->direct ? ENV_MAX : HDR_MAX);
    wire_hdr *hq = &m->hdrs[q];
    memcpy(hq, base, sizeof *hq);
    if (hq->what_len > WHAT_MAX) hq->what_len = WHAT_MAX;
    m->payloads[q] = hq->inline_payload ? base + sizeof *hq + hq->what_len : NULL;
  }
  return SBN_STATUS_OK;
}

/* Every rank's verdict on the exchanged signatures (the same on all ranks).
 * Fast path: all agree and none failed; else build the full signatures for
 * sbn_sig_verdict's message. */
static sbn_status verdict(sbn_group *g) {
  mpi_impl *m = g->impl;
  const wire_hdr *h0 = &m->hdrs[0];
  int agree = 1;
  for (int q = 0; q < g->size && agree; q++) {
    const wire_hdr *hq = &m->hdrs[q];
    agree = hq->status == SBN_STATUS_OK && hq->kind == h0->kind && hq->layer == h0->layer &&
            hq->count == h0->count && hq->dtype == h0->dtype && hq->extra == h0->extra;
  }
  if (agree) return SBN_STATUS_OK;
  for (int q = 0; q < g->size; q++) {
    const wire_hdr *hq = &m->hdrs[q];
    const unsigned char *base = q == g->rank ? m->send : m->recv + (size_t)q * (m->direct ? ENV_MAX : HDR_MAX);
    sbn_sig *s = &m->sigs[q];
    memset(s, 0, sizeof *s);
    s->kind = hq->kind, s->layer = hq->layer, s->count = hq->count;
    s->dtype = hq->dtype, s->status = hq->status, s->extra = hq->extra;
    memcpy(s->what, base + sizeof *hq, hq->what_len);
    s->what[WHAT_MAX - 1] = '\0';
  }
  return sbn_sig_verdict(g, m->sigs, g->rank);
}

/* Common start: a broken group fails at once; a peer's abort notice breaks it. */
static sbn_status begin(sbn_group *g, const sbn_sig *sig, double *deadline) {
  mpi_impl *m = g->impl;
  poll_abort(g);
  if (m->broken) return broken_error(g, sig->what);
  *deadline = now_s() + g->timeout_s;
  return SBN_STATUS_OK;
}

/* dst[i] = exact sum over q of src[q][i], rounded once (exact_sum.c, as
 * the threads backend); dst may be one of the sources. */
static void ordered_sum(void *dst, const void *const *src, int P, size_t n, sbn_dtype dtype) {
  for (size_t i = 0; i < n; i++) {
    sbn_xbin acc = sbn_xsum_zero();
    if (dtype == SBN_DTYPE_FLOAT64) {
      for (int q = 0; q < P; q++) sbn_xsum_add(&acc, ((const double *)src[q])[i]);
      sbn_xsum_decode_f64((double *)dst + i, &acc, 1);
    } else {
      for (int q = 0; q < P; q++) sbn_xsum_add(&acc, ((const float *)src[q])[i]);
      sbn_xsum_decode_f32((float *)dst + i, &acc, 1);
    }
  }
}

static int ensure_scratch(mpi_impl *m, size_t bytes) {
  if (bytes <= m->scratch_bytes) return 1;
  void *p = realloc(m->scratch, bytes);
  if (!p) return 0;
  m->scratch = p;
  m->scratch_bytes = bytes;
  return 1;
}

/* Ordered all-reduce of a payload that is not in the envelopes: ordered
 * reduce-scatter (rank q sums chunk q, the same chunks as the threads
 * backend) then all-gather of the chunks. */
static sbn_status reduce_scatter_gather(sbn_group *g, void *buf, size_t count, sbn_dtype dtype,
                                        const sbn_sig *sig, double deadline) {
  mpi_impl *m = g->impl;
  const int P = g->size, me = g->rank;
  const size_t esize = dtype == SBN_DTYPE_FLOAT64 ? 8 : 4;
  MPI_Datatype type = dtype == SBN_DTYPE_FLOAT64 ? MPI_DOUBLE : MPI_FLOAT;
  if (count > (size_t)INT32_MAX) /* MPI counts and displacements are int */
    return sbn_fail(SBN_STATUS_UNSUPPORTED,
                    "group '%s' (mpi): allreduce of %zu values exceeds MPI's int counts (%s)", g->name,
                    count, sig->what);
  for (int q = 0; q < P; q++) {
    size_t lo = count * (size_t)q / (size_t)P, hi = count * (size_t)(q + 1) / (size_t)P;
    m->counts[q] = (int)(hi - lo);
    m->displs[q] = (int)lo;
  }
  const size_t mine = (size_t)m->counts[me];
  if (!ensure_scratch(m, esize * mine * (size_t)P + 1))
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "group '%s' (mpi): out of memory for %s", g->name, sig->what);
  for (int q = 0; q < P; q++) m->rcounts[q] = (int)mine, m->rdispls[q] = (int)mine * q;
  MPI_Request req;
  int peer = -1;
  int rc = MPI_Ialltoallv(buf, m->counts, m->displs, type, m->scratch, m->rcounts, m->rdispls, type,
                          m->comm, &req);
  if (rc != MPI_SUCCESS) return backend_error(g, rc, "MPI_Ialltoallv", sig->what);
  sbn_status st = wait_all(g, 1, &req, &peer, sig->what, deadline);
  if (st != SBN_STATUS_OK) return st;
  const void *src[DIRECT_MAX_P] = {0};
  const void **srcs = P <= DIRECT_MAX_P ? src : malloc(sizeof(void *) * (size_t)P);
  if (!srcs) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "group '%s' (mpi): out of memory", g->name);
  for (int q = 0; q < P; q++) srcs[q] = (const char *)m->scratch + esize * mine * (size_t)q;
  ordered_sum((char *)buf + esize * (size_t)m->displs[me], srcs, P, mine, dtype);
  if (srcs != src) free(srcs);
  rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, m->counts, m->displs, type, m->comm, &req);
  if (rc != MPI_SUCCESS) return backend_error(g, rc, "MPI_Iallgatherv", sig->what);
  return wait_all(g, 1, &req, &peer, sig->what, deadline);
}

static sbn_status mpi_allreduce(sbn_group *g, void *buf, size_t count, sbn_dtype dtype,
                                const sbn_sig *sig) {
  mpi_impl *m = g->impl;
  const int P = g->size;
  double deadline = 0;
  sbn_status st = begin(g, sig, &deadline);
  if (st != SBN_STATUS_OK) return st;
  const size_t esize = dtype == SBN_DTYPE_FLOAT64 ? 8 : 4;
  const size_t bytes = sig->status == SBN_STATUS_OK ? count * esize : 0;
  if (P == 1) return sbn_sig_verdict(g, sig, 0); /* nothing to sum (buf unchanged, as threads) */
  const int in_env = m->direct && bytes <= INLINE_MAX;
  st = exchange(g, sig, buf, bytes, in_env, 0, 0, deadline);
  if (st != SBN_STATUS_OK) return st;
  st = verdict(g);
  if (st != SBN_STATUS_OK) return st;
  /* Signatures agree; so must the payloads (the layer's size follows from
   * kind and C), else a bug: refuse rather than read past a buffer. */
  for (int q = 0; q < P; q++)
    if (m->hdrs[q].payload_bytes != bytes || m->hdrs[q].dtype != m->hdrs[0].dtype)
      return sbn_fail(SBN_STATUS_MISMATCH,
                      "group '%s' (mpi, %d ranks): %s: rank %d sends %llu payload bytes, rank %d %zu",
                      g->name, P, sig->what, q, (unsigned long long)m->hdrs[q].payload_bytes, g->rank,
                      bytes);
  if (!count) return SBN_STATUS_OK;
  if (in_env) {
    const void *src[DIRECT_MAX_P];
    for (int q = 0; q < P; q++) src[q] = q == g->rank ? buf : (const void *)m->payloads[q];
    ordered_sum(buf, src, P, count, dtype);
    return SBN_STATUS_OK;
  }
  if (bytes <= INLINE_MAX) { /* many ranks, small payload: all-gather and sum locally */
    if (!ensure_scratch(m, bytes * (size_t)P))
      return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "group '%s' (mpi): out of memory for %s", g->name, sig->what);
    MPI_Request req;
    int peer = -1;
    int rc = MPI_Iallgather(buf, (int)bytes, MPI_BYTE, m->scratch, (int)bytes, MPI_BYTE, m->comm, &req);
    if (rc != MPI_SUCCESS) return backend_error(g, rc, "MPI_Iallgather", sig->what);
    st = wait_all(g, 1, &req, &peer, sig->what, deadline);
    if (st != SBN_STATUS_OK) return st;
    const void **src = malloc(sizeof(void *) * (size_t)P);
    if (!src) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "group '%s' (mpi): out of memory", g->name);
    for (int q = 0; q < P; q++) src[q] = (const char *)m->scratch + bytes * (size_t)q;
    ordered_sum(buf, src, P, count, dtype);
    free(src);
    return SBN_STATUS_OK;
  }
  return reduce_scatter_gather(g, buf, count, dtype, sig, deadline);
}

static sbn_status mpi_broadcast(sbn_group *g, void *buf, size_t bytes, int root, const sbn_sig *sig) {
  mpi_impl *m = g->impl;
  double deadline = 0;
  sbn_status st = begin(g, sig, &deadline);
  if (st != SBN_STATUS_OK) return st;
  if (g->size == 1) return sbn_sig_verdict(g, sig, 0);
  const int ok = sig->status == SBN_STATUS_OK;
  const int in_env = ok && m->direct && g->rank == root && bytes <= INLINE_MAX;
  st = exchange(g, sig, buf, ok && g->rank == root ? bytes : 0, in_env, 0, 0, deadline);
  if (st != SBN_STATUS_OK) return st;
  st = verdict(g);
  if (st != SBN_STATUS_OK || !bytes) return st;
  if (m->hdrs[root].inline_payload) { /* root's data came with its envelope */
    if (g->rank != root) memcpy(buf, m->payloads[root], bytes);
    return SBN_STATUS_OK;
  }
  for (size_t off = 0; off < bytes;) { /* MPI counts are int: pieces of 1 GiB */
    size_t piece = bytes - off < ((size_t)1 << 30) ? bytes - off : (size_t)1 << 30;
    MPI_Request req;
    int peer = -1;
    int rc = MPI_Ibcast((char *)buf + off, (int)piece, MPI_BYTE, root, m->comm, &req);
    if (rc != MPI_SUCCESS) return backend_error(g, rc, "MPI_Ibcast", sig->what);
    st = wait_all(g, 1, &req, &peer, sig->what, deadline);
    if (st != SBN_STATUS_OK) return st;
    off += piece;
  }
  return SBN_STATUS_OK;
}

static sbn_status mpi_barrier(sbn_group *g, const sbn_sig *sig) {
  double deadline = 0;
  sbn_status st = begin(g, sig, &deadline);
  if (st != SBN_STATUS_OK) return st;
  if (g->size == 1) return sbn_sig_verdict(g, sig, 0);
  st = exchange(g, sig, NULL, 0, 0, 0, 0, deadline);
  if (st != SBN_STATUS_OK) return st;
  return verdict(g);
}

static void impl_free(mpi_impl *m) {
  if (!m) return;
  free(m->send), free(m->recv), free(m->reqs), free(m->req_peer), free(m->hdrs);
  free(m->payloads), free(m->sigs), free(m->counts), free(m->displs), free(m->rcounts);
  free(m->rdispls), free(m->scratch), free(m);
}

/* A group over `comm`, which becomes the group's own (freed by destroy). */
static sbn_status wrap_comm(sbn_group **out, MPI_Comm comm, const char *name) {
  int rank = 0, P = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &P);
  mpi_impl *m = calloc(1, sizeof *m);
  int direct = P <= DIRECT_MAX_P;
  if (m) {
    m->comm = comm;
    m->direct = direct;
    m->abort_req = MPI_REQUEST_NULL;
    m->send = malloc(ENV_MAX);
    m->recv = malloc((size_t)P * (direct ? ENV_MAX : HDR_MAX));
    m->reqs = malloc(sizeof *m->reqs * 2 * (size_t)P);
    m->req_peer = malloc(sizeof *m->req_peer * 2 * (size_t)P);
    m->hdrs = malloc(sizeof *m->hdrs * (size_t)P);
    m->payloads = malloc(sizeof *m->payloads * (size_t)P);
    m->sigs = malloc(sizeof *m->sigs * (size_t)P);
    m->counts = malloc(sizeof(int) * (size_t)P), m->displs = malloc(sizeof(int) * (size_t)P);
    m->rcounts = malloc(sizeof(int) * (size_t)P), m->rdispls = malloc(sizeof(int) * (size_t)P);
  }
  sbn_group *g = NULL;
  if (m && m->send && m->recv && m->reqs && m->req_peer && m->hdrs && m->payloads && m->sigs &&
      m->counts && m->displs && m->rcounts && m->rdispls)
    g = sbn_group_alloc(&mpi_ops, m, rank, P, name);
  if (!g) {
    impl_free(m);
    MPI_Comm_free(&comm);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "group '%s' (mpi): out of memory for %d ranks", name, P);
  }
  if (P > 1) {
    int rc = MPI_Irecv(m->abort_in, ABORT_BYTES, MPI_CHAR, MPI_ANY_SOURCE, TAG_ABORT, comm, &m->abort_req);
    if (rc != MPI_SUCCESS) {
      sbn_status st = backend_error(g, rc, "MPI_Irecv", "creating the group");
      sbn_group_destroy(g); /* clears the error: restore it */
      return sbn_fail(st, "group '%s' (mpi): could not post its abort receive", name);
    }
  }
  *out = g;
  return SBN_STATUS_OK;
}

static sbn_status mpi_split(sbn_group **out, sbn_group *g, int color, int key, const sbn_sig *sig) {
  mpi_impl *m = g->impl;
  *out = NULL;
  double deadline = 0;
  sbn_status st = begin(g, sig, &deadline);
  if (st != SBN_STATUS_OK) return st;
  if (g->size > 1) {
    /* Agree first (nonblocking, bounded): a disagreement or a missing rank
     * must not leave anyone inside the blocking MPI_Comm_split. */
    st = exchange(g, sig, NULL, 0, 0, color, key, deadline);
    if (st != SBN_STATUS_OK) return st;
    st = verdict(g);
  } else {
    st = sbn_sig_verdict(g, sig, 0);
  }
  if (st != SBN_STATUS_OK) return st;
  MPI_Comm nc = MPI_COMM_NULL;
  int rc = MPI_Comm_split(m->comm, color >= 0 ? color : MPI_UNDEFINED, key, &nc);
  if (rc != MPI_SUCCESS) {
    st = backend_error(g, rc, "MPI_Comm_split", sig->what);
    break_group(g, st, sbn_last_error());
    return st;
  }
  if (color < 0)
    return sbn_fail(SBN_STATUS_NOT_MEMBER, "split of group '%s': rank %d passed SBN_UNDEFINED", g->name,
                    g->rank);
  MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
  char name[128];
  snprintf(name, sizeof name, "%.100s/split(color=%d)", g->name, color);
  return wrap_comm(out, nc, name);
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
    /* Sends or collectives of the failed call may still reference the
     * buffers: MPI_Comm_free lets them finish; the memory is not reused. */
    MPI_Comm_free(&m->comm);
    return;
  }
  if (m->abort_req != MPI_REQUEST_NULL) {
    MPI_Cancel(&m->abort_req);
    MPI_Wait(&m->abort_req, MPI_STATUS_IGNORE);
  }
  MPI_Comm_free(&m->comm);
  impl_free(m);
}

static const sbn_comm_ops mpi_ops = {
    "mpi", mpi_allreduce, mpi_broadcast, mpi_barrier, mpi_split, mpi_destroy,
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
  const double timeout = sbn_default_timeout(), start = now_s();
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
  return wrap_comm(out, dup, name);
}

#endif /* SBN_WITH_MPI */
