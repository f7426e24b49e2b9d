/* The NCCL backend: ranks are GPUs; a group wraps an NCCL communicator (the
 * caller's, or one bootstrapped over another group) and sums device buffers
 * on a CUDA stream. Built into libsyncbn_nccl (syncbn_nccl.h).
 *
 * EXACT SUMS WITHOUT A CUSTOM OPERATION. NCCL reduces only with its built-in
 * operations, so the binned sum of exact_sum.c (which needs a merge that is
 * neither a sum nor a max) is done in two NCCL reductions whose results do
 * not depend on NCCL's order or algorithm (src/comm/exact_sum_fixed.h has
 * the proof that the result is exact_sum.c's, bit for bit):
 *   1. MAX over one byte per value: the value's top bin (+1), so every rank
 *      learns the common top; the same reduction carries the signature
 *      check (control bytes, src/cuda/nccl/nccl_xsum.h);
 *   2. SUM over 4 int64 per value: each rank's digits in the three bins
 *      under the common top, and a count of inf/NaN terms. Integer sums are
 *      exact in any order and far from overflow (|bin| < 65536 * 2^38).
 * Kernels before, between and after the reductions encode and decode on the
 * device (src/cuda/nccl/nccl_xsum.cu). So results are bitwise identical on every
 * rank, run after run, equal to the threads and MPI backends' sums. Cost per
 * collective of n values: two NCCL all-reduces (n + 24 bytes, then 32n
 * bytes) and three small kernels; scratch comes from the stream-ordered
 * allocator, so nothing is shared between streams and a step can be
 * captured in a CUDA graph. It is the group's own memory pool, which keeps
 * up to 64 MiB of what is freed: the device's default pool gives its
 * memory back at every synchronization (release threshold 0), and mapping
 * it again made each collective cost ~47 us of host time on an H200
 * (BENCHMARKS.md).
 *
 * DEVICE PATH (allreduce_device: the layers' statistics). Enqueued on the
 * caller's stream; nothing waits for the host. The signature check happens
 * on the device: the decode kernel compares the reduced control bytes with
 * this rank's and, on a disagreement or a peer's local error, writes no
 * result and records the verdict in the group's error word (host-mapped
 * pinned memory: [status, collective number, largest status]). A rank with a
 * local error still enqueues the same calls (zeros as its values) and
 * returns its error at once. The word is reported by the group's next
 * host-side call: that call carries it as this rank's local error into its
 * agreement step, so every rank of that call returns an error (this rank
 * SBN_STATUS_MISMATCH or PEER_FAILED with the device's verdict, the others
 * PEER_FAILED naming it) and the word is cleared. A word set after the host
 * call started is reported by the next one; synchronize the layers'
 * streams before sbn_group_barrier to have every rank report it together.
 * Counts are not checked before the data moves (that would need the host):
 * ranks must pass equal counts (documented in syncbn_nccl.h).
 *
 * HOST-SIDE CALLS (sbn_group_allreduce/broadcast on host or device buffers,
 * barrier, split) synchronize. Each first agrees on the call: a MAX of the
 * control bytes alone, read back by the host; on a disagreement every rank
 * gathers every rank's full signature (ncclAllGather of fixed-size records)
 * and returns the same verdict as the MPI backend would, before any payload
 * moves, so a count mismatch never reaches NCCL here. Then host buffers are
 * copied to device scratch, summed as above, and copied back, on the
 * group's own stream (created with default flags, so it is ordered after
 * the legacy default stream; work on other streams must be complete).
 *
 * TIMEOUTS. NCCL calls cannot be cancelled. The synchronizing calls poll the
 * stream and ncclCommGetAsyncError with backoff against the group's deadline
 * (SYNCBN_TIMEOUT, sbn_group_set_timeout). When it passes: ncclCommAbort (on
 * a caller's communicator too: nothing else frees the GPU), the group is
 * broken (later calls: SBN_STATUS_GROUP_BROKEN) and the call returns
 * SBN_STATUS_TIMEOUT. NCCL cannot tell which rank is missing, so the message
 * names the collective, not the rank. Enqueue calls that report ncclInProgress
 * (a caller's non-blocking communicator) are polled the same way; on a
 * blocking one (the bootstrapped groups': nccl_watch.h says why) a host call
 * that blocks is ended by the group's watchdog, which aborts the
 * communicator at the deadline. A stopped rank (SIGSTOP) blocks its peers'
 * NCCL kernels; their next synchronizing call times out and aborts; when
 * the stopped rank resumes, its own next synchronizing call times out too
 * (its peers are gone), and device work waiting on it ends with the abort.
 * NCCL errors become SBN_STATUS_BACKEND_ERROR with NCCL's text, and break
 * the group. */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "exact_sum.h"

#if !SBN_WITH_NCCL

SBN_API sbn_status sbn_group_create_nccl_comm(sbn_group **out, const void *comm, size_t comm_size,
                                              int device);
SBN_API sbn_status sbn_group_create_nccl_over(sbn_group **out, sbn_group *bootstrap, int device);

static sbn_status not_built(sbn_group **out, const char *fn) {
  sbn_clear_error();
  if (out) *out = NULL;
  return sbn_fail(SBN_STATUS_NOT_BUILT,
                  "%s: this libsyncbn_nccl was built without NCCL (nvcc, nccl.h and libnccl were not "
                  "found: install the CUDA toolkit and NCCL, then rebuild)",
                  fn);
}

sbn_status sbn_group_create_nccl_comm(sbn_group **out, const void *comm, size_t comm_size, int device) {
  (void)comm, (void)comm_size, (void)device;
  return not_built(out, "sbn_group_create_nccl");
}

sbn_status sbn_group_create_nccl_over(sbn_group **out, sbn_group *bootstrap, int device) {
  (void)bootstrap, (void)device;
  return not_built(out, "sbn_group_create_nccl_over");
}

#else /* SBN_WITH_NCCL */

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "syncbn_nccl.h"
#include "nccl_watch.h"
#include "../cuda/nccl/nccl_xsum.h"

enum { WHAT_MAX = 256, MSG_MAX = 700 };

typedef struct nccl_impl {
  ncclComm_t comm;       /* NULL after an abort */
  int owned, device;
  int broken;
  char broken_msg[MSG_MAX];
  cudaStream_t stream;   /* the host-side calls' stream */
  int64_t *err_host;     /* mapped pinned: [status, collective, largest status] */
  int64_t *err_dev;      /* the same, as the kernels see it */
  uint8_t *ctrl_host;    /* pinned: reduced control bytes read back */
  uint64_t seq;          /* collectives started on this handle */
  cudaMemPool_t pool;    /* the scratch's pool (NULL: the device's default pool) */
  sbn_nccl_watch watch;  /* aborts comm when a host call blocks past its deadline */
} nccl_impl;

/* An NCCL host call that may block (blocking communicators), under the
 * watchdog until `deadline`: its result, or SBN_NCCL_WATCH_FIRED. */
#define WATCHED(m, deadline, call) \
  (sbn_nccl_watch_arm(&(m)->watch, (deadline)), sbn_nccl_watch_disarm(&(m)->watch, (call)))

/* A signature on the wire (the slow path after a disagreement). */
typedef struct wire_sig {
  int32_t kind, layer;
  int64_t count;
  int32_t dtype, status;
  uint64_t extra;
  char what[WHAT_MAX];
} wire_sig;

static const sbn_comm_ops nccl_ops;

static double now_s(void) { return sbn_nccl_now_s(); }

/* Spin briefly, then yield, then sleep (as the MPI backend). */
static void backoff(double waited) {
  if (waited < 200e-6) return;
  if (waited < 2e-3) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, waited < 0.1 ? 50000L : 1000000L};
  nanosleep(&ts, NULL);
}

static void break_group(sbn_group *g, const char *msg) {
  nccl_impl *m = g->impl;
  if (m->broken) return;
  m->broken = 1;
  snprintf(m->broken_msg, sizeof m->broken_msg, "%s", msg);
}

static sbn_status fail_break(sbn_group *g, sbn_status st) {
  break_group(g, sbn_last_error());
  return st;
}

static sbn_status cuda_error(sbn_group *g, cudaError_t e, const char *call, const char *what) {
  return fail_break(g, sbn_fail(SBN_STATUS_BACKEND_ERROR, "group '%s' (nccl, %d ranks): %s failed in %s: %s",
                                g->name, g->size, call, what, cudaGetErrorString(e)));
}

static sbn_status nccl_error(sbn_group *g, ncclResult_t r, const char *call, const char *what) {
  nccl_impl *m = g->impl;
  const char *detail = m->comm ? ncclGetLastError(m->comm) : "";
  return fail_break(g, sbn_fail(SBN_STATUS_BACKEND_ERROR, "group '%s' (nccl, %d ranks): %s failed in %s: %s%s%s",
                                g->name, g->size, call, what, ncclGetErrorString(r),
                                detail && detail[0] ? ": " : "", detail ? detail : ""));
}

static void abort_comm(nccl_impl *m) {
  ncclComm_t c = sbn_nccl_watch_take(&m->watch);
  if (c) ncclCommAbort(c);
}

static sbn_status timed_out(sbn_group *g, const char *what) {
  nccl_impl *m = g->impl;
  abort_comm(m);
  return fail_break(g, sbn_fail(SBN_STATUS_TIMEOUT,
                                "group '%s' (nccl, %d ranks): timed out after %g s in %s: the NCCL "
                                "collective did not complete (a rank did not arrive or stopped; NCCL "
                                "cannot tell which); the communicator was aborted",
                                g->name, g->size, g->timeout_s, what));
}

/* An NCCL call returned rc: settle ncclInProgress (non-blocking
 * communicators) by polling until the deadline. */
static sbn_status settle(sbn_group *g, ncclResult_t rc, const char *call, const char *what, double deadline) {
  nccl_impl *m = g->impl;
  if (rc == ncclSuccess) return SBN_STATUS_OK;
  if (rc == SBN_NCCL_WATCH_FIRED) return timed_out(g, what); /* the watchdog aborted it */
  if (rc != ncclInProgress) {
    sbn_status st = nccl_error(g, rc, call, what);
    abort_comm(m);
    return st;
  }
  const double start = now_s();
  for (;;) {
    ncclResult_t a = ncclSuccess;
    ncclCommGetAsyncError(m->comm, &a);
    if (a == ncclSuccess) return SBN_STATUS_OK;
    if (a != ncclInProgress) {
      sbn_status st = nccl_error(g, a, call, what);
      abort_comm(m);
      return st;
    }
    const double t = now_s();
    if (t > deadline) return timed_out(g, what);
    backoff(t - start);
  }
}

/* Wait for the group's stream, watching NCCL's asynchronous errors and the
 * deadline. */
static sbn_status wait_stream(sbn_group *g, const char *what, double deadline) {
  nccl_impl *m = g->impl;
  const double start = now_s();
  for (;;) {
    cudaError_t e = cudaStreamQuery(m->stream);
    if (e == cudaSuccess) return SBN_STATUS_OK;
    if (e != cudaErrorNotReady) return cuda_error(g, e, "cudaStreamQuery", what);
    ncclResult_t a = ncclSuccess;
    ncclCommGetAsyncError(m->comm, &a);
    if (a != ncclSuccess && a != ncclInProgress) {
      sbn_status st = nccl_error(g, a, "an NCCL collective", what);
      abort_comm(m);
      return st;
    }
    const double t = now_s();
    if (t > deadline) return timed_out(g, what);
    backoff(t - start);
  }
}

/* The calling thread works on the group's device during a call. */
static int enter_device(const nccl_impl *m) {
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
  if (prev != m->device) cudaSetDevice(m->device);
  return prev;
}
static void leave_device(const nccl_impl *m, int prev) {
  if (prev >= 0 && prev != m->device) cudaSetDevice(prev);
}

/* Stream-ordered scratch from the group's pool (freed with cudaFreeAsync). */
static cudaError_t scratch_alloc(const nccl_impl *m, void **p, size_t bytes, cudaStream_t stream) {
  return m->pool ? cudaMallocFromPoolAsync(p, bytes, m->pool, stream) : cudaMallocAsync(p, bytes, stream);
}

/* A pool on the group's device that keeps up to KEEP_BYTES of the memory
 * freed into it across synchronizations: a layer's scratch is 33 bytes per
 * value of its 2C+1 (~135 KiB at C = 2048), so a whole network's stays,
 * while the scratch of a large one-off sbn_group_allreduce (33 bytes per
 * value too) is given back. NULL where pools are not supported. */
enum { KEEP_BYTES = 64 << 20 };
static cudaMemPool_t make_pool(int device) {
  struct cudaMemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = NULL;
  if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) {
    cudaGetLastError();
    return NULL;
  }
  uint64_t keep = KEEP_BYTES;
  if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess) {
    cudaGetLastError();
    cudaMemPoolDestroy(pool);
    return NULL;
  }
  return pool;
}

static uint64_t sig_hash(const sbn_sig *s) {
  uint64_t v[5] = {(uint64_t)(uint32_t)s->kind, (uint64_t)(uint32_t)s->layer, (uint64_t)s->count,
                   (uint64_t)(uint32_t)s->dtype, s->extra};
  uint64_t h = 1469598103934665603ull; /* FNV-1a over the fields' bytes */
  const unsigned char *p = (const unsigned char *)v;
  for (size_t i = 0; i < sizeof v; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

static const char *status_text(int64_t st) {
  return st >= 0 && st < SBN_STATUS_COUNT_ ? sbn_status_name((sbn_status)st) : "an unknown status";
}

/* The error word, if a device-side check set it: the message, and clear. */
static sbn_status take_device_error(sbn_group *g) {
  nccl_impl *m = g->impl;
  volatile int64_t *e = m->err_host;
  const int64_t st = e[0];
  if (!st) return SBN_STATUS_OK;
  __sync_synchronize();
  const unsigned long long seq = (unsigned long long)e[1];
  const int64_t maxst = e[2];
  e[1] = e[2] = 0;
  __sync_synchronize();
  e[0] = 0;
  if (st == SBN_STATUS_PEER_FAILED)
    return sbn_fail(SBN_STATUS_PEER_FAILED,
                    "group '%s' (nccl, %d ranks): a rank failed (%s) in device-side collective #%llu "
                    "(a layer step enqueued earlier on a stream): its sums were not applied on this "
                    "rank, whose statistics for that step were its own",
                    g->name, g->size, status_text(maxst), seq);
  return sbn_fail(SBN_STATUS_MISMATCH,
                  "group '%s' (nccl, %d ranks): ranks disagreed on device-side collective #%llu (a "
                  "layer step enqueued earlier on a stream: different layers, dtypes or "
                  "collectives): its sums were not applied, this rank's statistics for that step "
                  "were its own",
                  g->name, g->size, seq);
}

/* Enqueue the exact sum of n values at x (device memory; NULL: zeros) on
 * `stream`: the two reductions and three kernels. */
static sbn_status enqueue_sum(sbn_group *g, void *x, size_t n, int is_f32, uint64_t hash, int status,
                              cudaStream_t stream, const char *what, double deadline) {
  nccl_impl *m = g->impl;
  uint8_t *tags = NULL;
  int64_t *bins = NULL;
  cudaError_t e = scratch_alloc(m, (void **)&tags, SBN_NX_CTRL + n, stream);
  if (e == cudaSuccess && n) e = scratch_alloc(m, (void **)&bins, sizeof *bins * SBN_NX_WORDS * n, stream);
  if (e != cudaSuccess) {
    if (tags) cudaFreeAsync(tags, stream);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "group '%s' (nccl): out of device memory for %s (%s)",
                    g->name, what, cudaGetErrorString(e));
  }
  sbn_status st = SBN_STATUS_OK;
  int rc = sbn_nx_prepare(stream, tags, x, n, is_f32, hash, status);
  if (rc) st = cuda_error(g, (cudaError_t)rc, "the prepare kernel", what);
  if (st == SBN_STATUS_OK)
    st = settle(g,
                WATCHED(m, deadline, ncclAllReduce(tags, tags, SBN_NX_CTRL + n, ncclUint8, ncclMax, m->comm, stream)),
                "ncclAllReduce(max)", what, deadline);
  if (st == SBN_STATUS_OK && n) {
    rc = sbn_nx_encode(stream, bins, x, n, is_f32, tags);
    if (rc) st = cuda_error(g, (cudaError_t)rc, "the encode kernel", what);
    if (st == SBN_STATUS_OK)
      st = settle(g,
                  WATCHED(m, deadline,
                          ncclAllReduce(bins, bins, SBN_NX_WORDS * n, ncclInt64, ncclSum, m->comm, stream)),
                  "ncclAllReduce(sum)", what, deadline);
  }
  if (st == SBN_STATUS_OK) {
    rc = sbn_nx_decode(stream, x, x ? n : 0, is_f32, bins, tags, hash, status, m->seq, m->err_dev);
    if (rc) st = cuda_error(g, (cudaError_t)rc, "the decode kernel", what);
  }
  if (bins) cudaFreeAsync(bins, stream);
  cudaFreeAsync(tags, stream);
  return st;
}

/* Every rank's full signature, then the common verdict. */
static sbn_status slow_verdict(sbn_group *g, const sbn_sig *sig, double deadline) {
  nccl_impl *m = g->impl;
  const int P = g->size;
  wire_sig mine;
  memset(&mine, 0, sizeof mine);
  mine.kind = sig->kind, mine.layer = sig->layer, mine.count = sig->count;
  mine.dtype = sig->dtype, mine.status = sig->status, mine.extra = sig->extra;
  memcpy(mine.what, sig->what, WHAT_MAX);
  wire_sig *host = malloc(sizeof *host * (size_t)P);
  sbn_sig *sigs = malloc(sizeof *sigs * (size_t)P);
  char *dev = NULL;
  sbn_status st = SBN_STATUS_OK;
  if (!host || !sigs || cudaMalloc((void **)&dev, sizeof mine * (size_t)(P + 1)) != cudaSuccess) {
    st = sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "group '%s' (nccl): out of memory for %s", g->name, sig->what);
    goto done;
  }
  cudaError_t e = cudaMemcpyAsync(dev + sizeof mine * (size_t)P, &mine, sizeof mine, cudaMemcpyHostToDevice,
                                  m->stream);
  if (e != cudaSuccess) {
    st = cuda_error(g, e, "cudaMemcpyAsync", sig->what);
    goto done;
  }
  st = settle(g,
              WATCHED(m, deadline,
                      ncclAllGather(dev + sizeof mine * (size_t)P, dev, sizeof mine, ncclUint8, m->comm, m->stream)),
              "ncclAllGather", sig->what, deadline);
  if (st == SBN_STATUS_OK) {
    e = cudaMemcpyAsync(host, dev, sizeof mine * (size_t)P, cudaMemcpyDeviceToHost, m->stream);
    st = e == cudaSuccess ? wait_stream(g, sig->what, deadline) : cuda_error(g, e, "cudaMemcpyAsync", sig->what);
  }
  if (st != SBN_STATUS_OK) goto done;
  for (int q = 0; q < P; q++) {
    const wire_sig *w = &host[q];
    sbn_sig *s = &sigs[q];
    memset(s, 0, sizeof *s);
    s->kind = w->kind, s->layer = w->layer, s->count = w->count;
    s->dtype = w->dtype, s->status = w->status, s->extra = w->extra;
    memcpy(s->what, w->what, WHAT_MAX);
    s->what[WHAT_MAX - 1] = '\0';
  }
  st = sbn_sig_verdict(g, sigs, g->rank);
  if (st == SBN_STATUS_OK)
    st = sbn_fail(SBN_STATUS_INTERNAL, "group '%s' (nccl): signature fingerprints differ but the signatures "
                  "agree (%s)", g->name, sig->what);
done:
  if (dev) {
    cudaStreamSynchronize(m->stream); /* the gather finished or the comm was aborted */
    cudaFree(dev);
  }
  free(host);
  free(sigs);
  return st;
}

/* The agreement step of every host-side call: the control bytes alone, read
 * back. OK when all ranks called the same collective and none failed. */
static sbn_status agree(sbn_group *g, const sbn_sig *sig, double deadline) {
  nccl_impl *m = g->impl;
  const uint64_t hash = sig_hash(sig);
  uint8_t *ctrl = NULL;
  cudaError_t e = scratch_alloc(m, (void **)&ctrl, SBN_NX_CTRL, m->stream);
  if (e != cudaSuccess)
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "group '%s' (nccl): out of device memory for %s (%s)", g->name,
                    sig->what, cudaGetErrorString(e));
  sbn_status st = SBN_STATUS_OK;
  int rc = sbn_nx_prepare(m->stream, ctrl, NULL, 0, 0, hash, sig->status);
  if (rc) st = cuda_error(g, (cudaError_t)rc, "the prepare kernel", sig->what);
  if (st == SBN_STATUS_OK)
    st = settle(g, WATCHED(m, deadline, ncclAllReduce(ctrl, ctrl, SBN_NX_CTRL, ncclUint8, ncclMax, m->comm, m->stream)),
                "ncclAllReduce(max)", sig->what, deadline);
  if (st == SBN_STATUS_OK) {
    e = cudaMemcpyAsync(m->ctrl_host, ctrl, SBN_NX_CTRL, cudaMemcpyDeviceToHost, m->stream);
    if (e != cudaSuccess) st = cuda_error(g, e, "cudaMemcpyAsync", sig->what);
  }
  cudaFreeAsync(ctrl, m->stream);
  if (st == SBN_STATUS_OK) st = wait_stream(g, sig->what, deadline);
  if (st != SBN_STATUS_OK) return st;
  int agree_all = m->ctrl_host[16] == 0;
  for (int k = 0; k < 8; k++) {
    agree_all &= m->ctrl_host[k] == (uint8_t)(hash >> (8 * k));
    agree_all &= m->ctrl_host[8 + k] == (uint8_t)(~hash >> (8 * k));
  }
  return agree_all ? SBN_STATUS_OK : slow_verdict(g, sig, deadline);
}

/* Where a host-side call's buffer lives: 0 host, 1 device memory of this
 * group's device; else an error recorded. */
static int classify(sbn_group *g, const void *buf, const char *fn, sbn_status *st) {
  nccl_impl *m = g->impl;
  struct cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  cudaError_t e = cudaPointerGetAttributes(&a, buf);
  if (e != cudaSuccess) {
    cudaGetLastError(); /* not sticky */
    return 0;
  }
  if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) {
    if (a.device != m->device) {
      *st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                     "%s: buffer is memory of CUDA device %d, but group '%s' runs on device %d", fn, a.device,
                     g->name, m->device);
      return -1;
    }
    return 1;
  }
  return 0;
}

/* Common start of a host-side call: the device's verdicts become this
 * rank's local error; then agree. */
static sbn_status begin(sbn_group *g, sbn_sig *sig, double *deadline) {
  nccl_impl *m = g->impl;
  if (m->broken)
    return sbn_fail(SBN_STATUS_GROUP_BROKEN, "group '%s' (nccl, %d ranks) is broken and can't be used (%s): %s",
                    g->name, g->size, sig->what, m->broken_msg);
  m->seq++;
  if (sig->status == SBN_STATUS_OK) {
    sbn_status dst = take_device_error(g);
    if (dst != SBN_STATUS_OK) sbn_sig_set_error(sig, dst);
  }
  *deadline = now_s() + g->timeout_s; /* inf: wait forever */
  return agree(g, sig, *deadline);
}

static const char *fp_name(sbn_dtype d) { return d == SBN_DTYPE_FLOAT32 ? "float32" : "float64"; }

static sbn_status nccl_allreduce(sbn_group *g, void *buf, size_t count, sbn_dtype dtype, const sbn_sig *sig_in) {
  nccl_impl *m = g->impl;
  sbn_sig sig = *sig_in;
  const int prev = enter_device(m);
  sbn_status st = SBN_STATUS_OK;
  int where = 0;
  if (sig.status == SBN_STATUS_OK && count) {
    where = classify(g, buf, "sbn_group_allreduce", &st);
    if (where < 0) sbn_sig_set_error(&sig, st), count = 0;
  }
  double deadline;
  st = begin(g, &sig, &deadline);
  if (st != SBN_STATUS_OK || !count) goto out;
  const size_t bytes = count * (dtype == SBN_DTYPE_FLOAT32 ? 4 : 8);
  void *d = buf;
  if (!where) {
    cudaError_t e = scratch_alloc(m, &d, bytes, m->stream);
    if (e != cudaSuccess) {
      st = sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "group '%s' (nccl): out of device memory staging %zu %s values",
                    g->name, count, fp_name(dtype));
      goto out;
    }
    e = cudaMemcpyAsync(d, buf, bytes, cudaMemcpyHostToDevice, m->stream);
    if (e != cudaSuccess) st = cuda_error(g, e, "cudaMemcpyAsync", sig.what);
  }
  if (st == SBN_STATUS_OK)
    st = enqueue_sum(g, d, count, dtype == SBN_DTYPE_FLOAT32, sig_hash(&sig), 0, m->stream, sig.what, deadline);
  if (st == SBN_STATUS_OK && !where) {
    cudaError_t e = cudaMemcpyAsync(buf, d, bytes, cudaMemcpyDeviceToHost, m->stream);
    if (e != cudaSuccess) st = cuda_error(g, e, "cudaMemcpyAsync", sig.what);
  }
  if (!where) cudaFreeAsync(d, m->stream);
  if (st == SBN_STATUS_OK) st = wait_stream(g, sig.what, deadline);
out:
  leave_device(m, prev);
  return st;
}

static sbn_status nccl_allreduce_device(sbn_group *g, void *buf, size_t count, sbn_dtype dtype,
                                        const sbn_sig *sig, void *stream) {
  nccl_impl *m = g->impl;
  if (m->broken)
    return sbn_fail(SBN_STATUS_GROUP_BROKEN, "group '%s' (nccl, %d ranks) is broken and can't be used (%s): %s",
                    g->name, g->size, sig->what, m->broken_msg);
  if (dtype != SBN_DTYPE_FLOAT64 && dtype != SBN_DTYPE_FLOAT32)
    return sbn_fail(SBN_STATUS_INTERNAL, "group '%s' (nccl): device all-reduce of dtype %d", g->name, (int)dtype);
  m->seq++;
  const int prev = enter_device(m);
  const double deadline = now_s() + g->timeout_s;
  /* A rank with a local error takes part with zeros and its status. */
  const int local = sig->status != SBN_STATUS_OK;
  sbn_status st = enqueue_sum(g, local ? NULL : buf, count, dtype == SBN_DTYPE_FLOAT32, sig_hash(sig),
                              sig->status, (cudaStream_t)stream, sig->what, deadline);
  leave_device(m, prev);
  if (st == SBN_STATUS_OK && local) return sbn_fail((sbn_status)sig->status, "%s", sig->what);
  return st;
}

static sbn_status nccl_broadcast(sbn_group *g, void *buf, size_t bytes, int root, const sbn_sig *sig_in) {
  nccl_impl *m = g->impl;
  sbn_sig sig = *sig_in;
  const int prev = enter_device(m);
  sbn_status st = SBN_STATUS_OK;
  int where = 0;
  if (sig.status == SBN_STATUS_OK && bytes) {
    where = classify(g, buf, "sbn_group_broadcast", &st);
    if (where < 0) sbn_sig_set_error(&sig, st);
  }
  double deadline;
  st = begin(g, &sig, &deadline);
  if (st != SBN_STATUS_OK || !bytes) goto out;
  void *d = buf;
  if (!where) {
    cudaError_t e = scratch_alloc(m, &d, bytes, m->stream);
    if (e != cudaSuccess) {
      st = sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "group '%s' (nccl): out of device memory staging %zu bytes",
                    g->name, bytes);
      goto out;
    }
    if (g->rank == root) {
      e = cudaMemcpyAsync(d, buf, bytes, cudaMemcpyHostToDevice, m->stream);
      if (e != cudaSuccess) st = cuda_error(g, e, "cudaMemcpyAsync", sig.what);
    }
  }
  if (st == SBN_STATUS_OK)
    st = settle(g, WATCHED(m, deadline, ncclBroadcast(d, d, bytes, ncclUint8, root, m->comm, m->stream)),
                "ncclBroadcast", sig.what, deadline);
  if (st == SBN_STATUS_OK && !where && g->rank != root) {
    cudaError_t e = cudaMemcpyAsync(buf, d, bytes, cudaMemcpyDeviceToHost, m->stream);
    if (e != cudaSuccess) st = cuda_error(g, e, "cudaMemcpyAsync", sig.what);
  }
  if (!where) cudaFreeAsync(d, m->stream);
  if (st == SBN_STATUS_OK) st = wait_stream(g, sig.what, deadline);
out:
  leave_device(m, prev);
  return st;
}

static sbn_status nccl_barrier(sbn_group *g, const sbn_sig *sig_in) {
  nccl_impl *m = g->impl;
  sbn_sig sig = *sig_in;
  const int prev = enter_device(m);
  double deadline;
  sbn_status st = begin(g, &sig, &deadline);
  leave_device(m, prev);
  return st;
}

static void impl_free(nccl_impl *m) {
  if (!m) return;
  sbn_nccl_watch_stop(&m->watch);
  if (m->stream) cudaStreamDestroy(m->stream);
  if (m->err_host) cudaFreeHost(m->err_host);
  if (m->ctrl_host) cudaFreeHost(m->ctrl_host);
  if (m->pool) cudaMemPoolDestroy(m->pool); /* released once graphs and streams free what they hold */
  free(m);
}

/* A group over `comm` on `device`; owned: destroyed with the group (also
 * on failure here). */
static sbn_status wrap(sbn_group **out, ncclComm_t comm, int owned, int device, const char *name) {
  int P = 0, rank = 0, cudev = -1;
  ncclResult_t r = ncclCommCount(comm, &P);
  if (r == ncclSuccess) r = ncclCommUserRank(comm, &rank);
  if (r == ncclSuccess) r = ncclCommCuDevice(comm, &cudev);
  sbn_status st = SBN_STATUS_OK;
  if (r != ncclSuccess)
    st = sbn_fail(SBN_STATUS_BACKEND_ERROR, "group '%s' (nccl): could not query the communicator: %s", name,
                  ncclGetErrorString(r));
  else if (cudev != device)
    st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                  "sbn_group_create_nccl: the communicator is on CUDA device %d, not on device %d", cudev, device);
  else if (P > SBN_XSUM_MAX_TERMS)
    st = sbn_fail(SBN_STATUS_UNSUPPORTED, "group '%s' (nccl): %d ranks; at most %d per group (the exact sums' "
                  "headroom)", name, P, SBN_XSUM_MAX_TERMS);
  nccl_impl *m = NULL;
  if (st == SBN_STATUS_OK) {
    m = calloc(1, sizeof *m);
    if (!m) st = sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "group '%s' (nccl): out of memory", name);
  }
  if (st == SBN_STATUS_OK) {
    m->comm = comm, m->owned = owned, m->device = device;
    const int prev = enter_device(m);
    cudaError_t e = cudaStreamCreate(&m->stream);
    if (e == cudaSuccess) e = cudaHostAlloc((void **)&m->err_host, 3 * sizeof(int64_t), cudaHostAllocMapped);
    if (e == cudaSuccess) e = cudaHostGetDevicePointer((void **)&m->err_dev, m->err_host, 0);
    if (e == cudaSuccess) e = cudaHostAlloc((void **)&m->ctrl_host, SBN_NX_CTRL, cudaHostAllocDefault);
    if (e == cudaSuccess) m->pool = make_pool(device);
    leave_device(m, prev);
    if (e != cudaSuccess)
      st = sbn_fail(SBN_STATUS_BACKEND_ERROR, "group '%s' (nccl): could not set up on CUDA device %d: %s", name,
                    device, cudaGetErrorString(e));
    else
      memset(m->err_host, 0, 3 * sizeof(int64_t));
  }
  if (st == SBN_STATUS_OK && sbn_nccl_watch_start(&m->watch, &m->comm) != 0)
    st = sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "group '%s' (nccl): could not start the watchdog thread that bounds "
                  "its NCCL calls by the timeout", name);
  sbn_group *g = NULL;
  if (st == SBN_STATUS_OK) {
    g = sbn_group_alloc(&nccl_ops, m, rank, P, name);
    if (!g) st = sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "group '%s' (nccl): out of memory", name);
  }
  if (st != SBN_STATUS_OK) {
    if (m) m->comm = NULL;
    impl_free(m);
    if (owned) ncclCommAbort(comm);
    return st;
  }
  *out = g;
  return SBN_STATUS_OK;
}

/* Wait for a non-blocking communicator's pending operation (init, split). */
static ncclResult_t comm_ready(ncclComm_t comm, ncclResult_t rc, double deadline, int *timed_out_) {
  *timed_out_ = 0;
  const double start = now_s();
  while (rc == ncclInProgress) {
    ncclResult_t a = ncclInProgress;
    if (ncclCommGetAsyncError(comm, &a) != ncclSuccess) return ncclInternalError;
    rc = a;
    if (rc != ncclInProgress) break;
    const double t = now_s();
    if (t > deadline) {
      *timed_out_ = 1;
      return ncclInProgress;
    }
    backoff(t - start);
  }
  return rc;
}

static sbn_status nccl_split(sbn_group **out, sbn_group *g, int color, int key, const sbn_sig *sig_in,
                             int *agreed) {
  nccl_impl *m = g->impl;
  sbn_sig sig = *sig_in;
  *out = NULL;
  const int prev = enter_device(m);
  double deadline;
  sbn_status st = begin(g, &sig, &deadline);
  if (st != SBN_STATUS_OK) goto out;
  *agreed = 1;
  ncclComm_t nc = NULL;
  int late = 0;
  ncclResult_t r =
      WATCHED(m, deadline, ncclCommSplit(m->comm, color >= 0 ? color : NCCL_SPLIT_NOCOLOR, key, &nc, NULL));
  if (r == SBN_NCCL_WATCH_FIRED) { /* the parent was aborted: the child cannot be used */
    if (nc) ncclCommAbort(nc);
    st = timed_out(g, sig.what);
    goto out;
  }
  if (r == ncclInProgress && nc) r = comm_ready(nc, r, deadline, &late);
  if (late) {
    ncclCommAbort(nc);
    st = timed_out(g, sig.what);
    goto out;
  }
  if (r != ncclSuccess) {
    if (nc) ncclCommAbort(nc);
    st = nccl_error(g, r, "ncclCommSplit", sig.what);
    goto out;
  }
  if (color < 0) {
    st = sbn_fail(SBN_STATUS_NOT_MEMBER, "split of group '%s': rank %d passed SBN_UNDEFINED", g->name, g->rank);
    goto out;
  }
  char name[128];
  snprintf(name, sizeof name, "%.100s/split(color=%d)", g->name, color);
  st = wrap(out, nc, 1, m->device, name);
out:
  leave_device(m, prev);
  return st;
}

static void nccl_destroy(sbn_group *g) {
  nccl_impl *m = g->impl;
  const int prev = enter_device(m);
  if (m->comm && m->owned) {
    if (m->broken) {
      abort_comm(m);
    } else {
      /* Finish what is queued, bounded by the timeout (the watchdog for a
       * blocking finalize, polling for a non-blocking one); abort otherwise. */
      const double deadline = now_s() + g->timeout_s;
      int late = 0;
      ncclResult_t r = WATCHED(m, deadline, ncclCommFinalize(m->comm));
      if (r != SBN_NCCL_WATCH_FIRED) r = comm_ready(m->comm, r, deadline, &late);
      ncclComm_t c = sbn_nccl_watch_take(&m->watch);
      if (c && r == ncclSuccess) ncclCommDestroy(c);
      else if (c) ncclCommAbort(c);
    }
  }
  sbn_nccl_watch_stop(&m->watch);
  m->comm = NULL;
  if (m->stream) cudaStreamSynchronize(m->stream);
  const int dev = m->device;
  impl_free(m);
  if (prev >= 0 && prev != dev) cudaSetDevice(prev);
}

static const sbn_comm_ops nccl_ops = {
    "nccl", nccl_allreduce, nccl_broadcast, nccl_barrier, nccl_split, nccl_destroy, nccl_allreduce_device,
    NULL, /* no abort: peers find out by their timeout (the watchdog) */
};

static sbn_status check_device(const char *fn, int device) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return sbn_fail(SBN_STATUS_UNSUPPORTED, "%s: no usable CUDA device (%s)", fn, cudaGetErrorString(e));
  }
  if (device < 0 || device >= n)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: CUDA device %d does not exist (%d device%s)", fn, device, n,
                    n == 1 ? "" : "s");
  return SBN_STATUS_OK;
}

sbn_status sbn_group_create_nccl_comm(sbn_group **out, const void *comm_p, size_t comm_size, int device) {
  sbn_clear_error();
  if (!out) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_group_create_nccl: out is NULL");
  *out = NULL;
  if (!comm_p) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_group_create_nccl: comm is NULL");
  if (comm_size != sizeof(ncclComm_t))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "sbn_group_create_nccl: sizeof(ncclComm_t) is %zu in the caller but %zu in libsyncbn_nccl",
                    comm_size, sizeof(ncclComm_t));
  ncclComm_t comm;
  memcpy(&comm, comm_p, sizeof comm);
  if (!comm) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_group_create_nccl: the communicator is NULL");
  if (isnan(sbn_default_timeout())) return SBN_STATUS_INVALID_ARGUMENT; /* recorded, naming the value */
  sbn_status st = check_device("sbn_group_create_nccl", device);
  if (st != SBN_STATUS_OK) return st;
  return wrap(out, comm, 0, device, "nccl");
}

/* A blocking communicator's init (see nccl_watch.h for why blocking), run
 * on a helper thread so that the caller can give up at the deadline: a
 * blocking init cannot be aborted, its handle is not ours until it
 * returns. A helper given up on aborts what it gets, if it ever returns. */
typedef struct init_job {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int P, rank, device, done, abandoned;
  ncclUniqueId id;
  ncclComm_t comm;
  ncclResult_t r;
  char detail[256];
} init_job;

static void init_job_free(init_job *j) {
  pthread_mutex_destroy(&j->mu);
  pthread_cond_destroy(&j->cv);
  free(j);
}

static void *init_main(void *arg) {
  init_job *j = arg;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 1;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclUnhandledCudaError;
  if (cudaSetDevice(j->device) == cudaSuccess) r = ncclCommInitRankConfig(&comm, j->P, j->id, j->rank, &cfg);
  pthread_mutex_lock(&j->mu);
  j->comm = comm, j->r = r, j->done = 1;
  if (r != ncclSuccess && comm) snprintf(j->detail, sizeof j->detail, "%s", ncclGetLastError(comm));
  const int abandoned = j->abandoned;
  pthread_cond_signal(&j->cv);
  pthread_mutex_unlock(&j->mu);
  if (abandoned) {
    if (comm) ncclCommAbort(comm);
    init_job_free(j);
  }
  return NULL;
}

static ncclResult_t init_blocking(ncclComm_t *out, int P, ncclUniqueId id, int rank, int device, double deadline,
                                  int *late, char *detail, size_t detail_size) {
  *out = NULL, *late = 0;
  init_job *j = calloc(1, sizeof *j);
  if (!j) return ncclSystemError;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&j->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&j->mu, NULL);
  j->P = P, j->rank = rank, j->device = device, j->id = id;
  pthread_t t;
  pthread_attr_t ta;
  pthread_attr_init(&ta);
  pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
  const int rc = pthread_create(&t, &ta, init_main, j);
  pthread_attr_destroy(&ta);
  if (rc != 0) {
    init_job_free(j);
    return ncclSystemError;
  }
  pthread_mutex_lock(&j->mu);
  while (!j->done) {
    const double now = now_s();
    if (now > deadline) break;
    if (!isfinite(deadline)) {
      pthread_cond_wait(&j->cv, &j->mu);
      continue;
    }
    const double until = now + 0.05 < deadline ? now + 0.05 : deadline;
    struct timespec ts = {(time_t)until, (long)((until - (double)(time_t)until) * 1e9)};
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
  }
  if (!j->done) { /* the helper frees the job when (if) its init returns */
    j->abandoned = 1;
    pthread_mutex_unlock(&j->mu);
    *late = 1;
    return ncclInProgress;
  }
  pthread_mutex_unlock(&j->mu);
  const ncclResult_t r = j->r;
  *out = j->comm;
  snprintf(detail, detail_size, "%s", j->detail);
  init_job_free(j);
  return r;
}

/* Every rank learns whether any rank failed (one float64 sum over the
 * bootstrap group). Returns OK, this rank's own failure, or PEER_FAILED. */
static sbn_status all_ok(sbn_group *bootstrap, sbn_status mine, const char *what) {
  if (!bootstrap) return mine;
  char saved[512];
  snprintf(saved, sizeof saved, "%s", mine != SBN_STATUS_OK ? sbn_last_error() : "");
  double failed = mine != SBN_STATUS_OK;
  sbn_status st = sbn_group_allreduce(bootstrap, &failed, 1, SBN_DTYPE_FLOAT64, SBN_REDUCE_OP_SUM);
  if (st != SBN_STATUS_OK) return st;
  if (mine != SBN_STATUS_OK) return sbn_fail(mine, "%s", saved);
  if (failed > 0)
    return sbn_fail(SBN_STATUS_PEER_FAILED, "sbn_group_create_nccl_over: %g rank(s) of group '%s' failed %s",
                    failed, bootstrap->name, what);
  return SBN_STATUS_OK;
}

sbn_status sbn_group_create_nccl_over(sbn_group **out, sbn_group *bootstrap, int device) {
  sbn_clear_error();
  if (out) *out = NULL;
  const char *fn = "sbn_group_create_nccl_over";
  sbn_status mine = out ? check_device(fn, device)
                        : sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: out is NULL", fn);
  if (mine == SBN_STATUS_OK && isnan(sbn_default_timeout())) mine = SBN_STATUS_INVALID_ARGUMENT; /* recorded */
  if (mine == SBN_STATUS_OK && bootstrap && bootstrap->size > SBN_XSUM_MAX_TERMS)
    mine = sbn_fail(SBN_STATUS_UNSUPPORTED, "%s: %d ranks; at most %d per group", fn, bootstrap->size,
                    SBN_XSUM_MAX_TERMS);
  sbn_status st = all_ok(bootstrap, mine, "its local checks");
  if (st != SBN_STATUS_OK) return st;
  const int rank = bootstrap ? bootstrap->rank : 0, P = bootstrap ? bootstrap->size : 1;
  /* rank 0's id, with its status, to everyone */
  struct {
    int32_t status;
    char text[256];
    ncclUniqueId id;
  } hdr;
  memset(&hdr, 0, sizeof hdr);
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&hdr.id);
    if (r != ncclSuccess) {
      hdr.status = SBN_STATUS_BACKEND_ERROR;
      snprintf(hdr.text, sizeof hdr.text, "%s: ncclGetUniqueId failed on rank 0: %s", fn, ncclGetErrorString(r));
    }
  }
  if (bootstrap && (st = sbn_group_broadcast(bootstrap, &hdr, sizeof hdr, 0)) != SBN_STATUS_OK) return st;
  hdr.text[sizeof hdr.text - 1] = '\0';
  if (hdr.status != SBN_STATUS_OK) return sbn_fail((sbn_status)hdr.status, "%s", hdr.text);
  /* join, bounded by the bootstrap's timeout */
  const double timeout = bootstrap ? bootstrap->timeout_s : sbn_default_timeout();
  const double deadline = now_s() + timeout;
  ncclComm_t comm = NULL;
  char detail[256] = "";
  int late = 0;
  ncclResult_t r = init_blocking(&comm, P, hdr.id, rank, device, deadline, &late, detail, sizeof detail);
  if (late)
    mine = sbn_fail(SBN_STATUS_TIMEOUT, "%s: timed out after %g s joining the NCCL communicator of %d ranks "
                    "(not every rank called it, or one is stuck)", fn, timeout, P);
  else if (r != ncclSuccess)
    mine = sbn_fail(SBN_STATUS_BACKEND_ERROR, "%s: ncclCommInitRank failed on rank %d (device %d): %s%s%s", fn,
                    rank, device, ncclGetErrorString(r), detail[0] ? ": " : "", detail);
  st = all_ok(bootstrap, mine, "to join the NCCL communicator");
  if (st != SBN_STATUS_OK) {
    if (comm) ncclCommAbort(comm);
    return st;
  }
  char name[128];
  snprintf(name, sizeof name, "%.100s%snccl", bootstrap ? bootstrap->name : "", bootstrap ? "/" : "");
  sbn_group *g = NULL;
  mine = wrap(&g, comm, 1, device, name);
  st = all_ok(bootstrap, mine, "to set up the group");
  if (st != SBN_STATUS_OK) {
    if (g) sbn_group_destroy(g);
    return st;
  }
  *out = g;
  return SBN_STATUS_OK;
}

#endif /* SBN_WITH_NCCL */
