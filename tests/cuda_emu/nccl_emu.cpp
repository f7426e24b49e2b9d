/* The CPU emulation of NCCL (include/nccl.h): communicators of ranks in
 * one process (threads), one emulated GPU each. A collective is a step on
 * the caller's stream that completes when every rank's matching step has
 * run (the n-th collective of each rank, in stream order), as NCCL's
 * kernels wait for their peers; the last rank to arrive computes it, in
 * rank order, for all. A rank that never arrives leaves the others' streams
 * not ready, which the caller sees through cudaStreamQuery and ends with
 * ncclCommAbort; NCCL_EMU_STALL_HOST=1 makes collective calls block in the host
 * until aborted (a blocking launch stuck on a peer). */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

enum Kind { ALLREDUCE, ALLGATHER, BROADCAST };
struct Op { /* one collective instance */
  int arrived = 0, finished = 0;
  bool done = false;
  Kind kind = ALLREDUCE;
  std::vector<const void *> send;
  std::vector<void *> recv;
};
struct Split { /* one ncclCommSplit in progress */
  int arrived = 0, taken = 0;
  std::vector<int> color, key;
  std::map<int, std::shared_ptr<struct Clique>> cliques; /* per color */
};
struct Clique {
  int nranks;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> device; /* per rank, -1 until it joined */
  std::map<uint64_t, Op> ops;
  Split split;
  uint64_t splits = 0;
  explicit Clique(int n) : nranks(n), device((size_t)n, -1) {}
};
struct State { /* one rank's, shared with its pending steps */
  std::shared_ptr<Clique> clique;
  int rank, device;
  uint64_t next_op = 0; /* collectives run so far (in stream order) */
  std::atomic<bool> aborted{false};
};

std::mutex ids_mu;
std::map<std::string, std::weak_ptr<Clique>> by_id;
uint64_t id_count = 0;
thread_local char no_comm_error[256];

} /* namespace */

struct ncclComm {
  std::shared_ptr<State> st;
  char last_error[256];
};

namespace {

ncclResult_t fail(ncclComm_t comm, ncclResult_t r, const char *what) {
  snprintf(comm ? comm->last_error : no_comm_error, sizeof no_comm_error, "%s", what);
  return r;
}
size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

template <class T> void fold(T *out, const std::vector<const void *> &in, size_t count, ncclRedOp_t op) {
  for (size_t i = 0; i < count; i++) {
    T a = ((const T *)in[0])[i];
    for (size_t r = 1; r < in.size(); r++) {
      const T b = ((const T *)in[r])[i];
      a = op == ncclSum || op == ncclAvg ? (T)(a + b) : op == ncclProd ? (T)(a * b) : op == ncclMax ? (a > b ? a : b)
                                                                                                   : (a < b ? a : b);
    }
    out[i] = a;
  }
}
/* The reduction of every rank's input, in rank order. */
bool reduce(void *out, const std::vector<const void *> &in, size_t count, ncclDataType_t t, ncclRedOp_t op) {
  switch (t) {
    case ncclInt8: fold((int8_t *)out, in, count, op); return true;
    case ncclUint8: fold((uint8_t *)out, in, count, op); return true;
    case ncclInt32: fold((int32_t *)out, in, count, op); return true;
    case ncclUint32: fold((uint32_t *)out, in, count, op); return true;
    case ncclInt64: fold((int64_t *)out, in, count, op); return true;
    case ncclUint64: fold((uint64_t *)out, in, count, op); return true;
    case ncclFloat32: fold((float *)out, in, count, op); return true;
    case ncclFloat64: fold((double *)out, in, count, op); return true;
    default: return false;
  }
}

/* Enqueue rank st's part of a collective on `stream`. */
ncclResult_t collective(ncclComm_t comm, Kind kind, const void *send, void *recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, cudaStream_t stream, const char *call) {
  if (!comm) return fail(comm, ncclInvalidArgument, "comm is NULL");
  const size_t es = type_size(type);
  if (!es || (kind == ALLREDUCE && op == ncclAvg)) return fail(comm, ncclInvalidArgument, "unsupported type or op");
  const int P = comm->st->clique->nranks;
  if (kind == BROADCAST && (root < 0 || root >= P)) return fail(comm, ncclInvalidArgument, "root out of range");
  const size_t in_bytes = count * es, out_bytes = kind == ALLGATHER ? in_bytes * (size_t)P : in_bytes;
  if ((in_bytes && (kind != BROADCAST || comm->st->rank == root) && !sbn_emu::is_device(send, in_bytes)) ||
      (out_bytes && !sbn_emu::is_device(recv, out_bytes))) {
    char m[200];
    snprintf(m, sizeof m, "%s: a buffer is not device memory (send %p, recv %p)", call, send, recv);
    return fail(comm, ncclInvalidArgument, m);
  }
  std::shared_ptr<State> st = comm->st;
  /* NCCL_EMU_STALL_HOST=1: the call blocks in the host until the
   * communicator is aborted (another thread's ncclCommAbort), as a blocking
   * communicator's launch does while it connects to a stuck peer. */
  if (const char *stall = getenv("NCCL_EMU_STALL_HOST"); stall && atoi(stall) == 1) {
    while (!st->aborted) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return ncclSystemError; /* comm is gone: no error text on it */
  }
  bool joined = false;
  uint64_t id = 0;
  /* runs in stream order, maybe several times: joins once, then waits */
  auto step = [st, kind, send, recv, count, type, op, root, in_bytes, out_bytes, joined, id]() mutable -> bool {
    if (st->aborted) return true; /* ncclCommAbort ends what was pending */
    Clique &c = *st->clique;
    std::lock_guard<std::mutex> g(c.mu);
    if (!joined) {
      joined = true;
      id = st->next_op++;
      Op &o = c.ops[id];
      if (o.send.empty()) o.send.assign((size_t)c.nranks, nullptr), o.recv.assign((size_t)c.nranks, nullptr);
      o.kind = kind;
      o.send[(size_t)st->rank] = send, o.recv[(size_t)st->rank] = recv;
      if (++o.arrived == c.nranks) { /* the last one computes it for everyone */
        std::vector<char> result(out_bytes);
        if (kind == ALLREDUCE) reduce(result.data(), o.send, count, type, op);
        else if (kind == ALLGATHER)
          for (int r = 0; r < c.nranks; r++) memcpy(result.data() + (size_t)r * in_bytes, o.send[(size_t)r], in_bytes);
        else if (in_bytes) memcpy(result.data(), o.send[(size_t)root], in_bytes);
        for (int r = 0; r < c.nranks; r++)
          if (out_bytes) memcpy(o.recv[(size_t)r], result.data(), out_bytes);
        o.done = true;
      }
    }
    Op &o = c.ops[id];
    if (!o.done) return false;
    if (++o.finished == c.nranks) c.ops.erase(id);
    return true;
  };
  if (sbn_emu::enqueue_work(stream, step) != cudaSuccess) return fail(comm, ncclUnhandledCudaError, "enqueue failed");
  return ncclSuccess;
}

/* Join clique c as `rank` on the current device. */
ncclResult_t join(ncclComm_t *comm, const std::shared_ptr<Clique> &c, int rank) {
  int dev = 0;
  cudaGetDevice(&dev);
  {
    std::lock_guard<std::mutex> g(c->mu);
    if (rank < 0 || rank >= c->nranks || c->device[(size_t)rank] != -1)
      return fail(nullptr, ncclInvalidArgument, "rank out of range or already joined");
    for (int r = 0; r < c->nranks; r++)
      if (c->device[(size_t)r] == dev) {
        char m[128];
        snprintf(m, sizeof m, "Duplicate GPU detected: rank %d and rank %d both on CUDA device %d", rank, r, dev);
        return fail(nullptr, ncclInvalidUsage, m);
      }
    c->device[(size_t)rank] = dev;
  }
  ncclComm_t k = new ncclComm();
  k->st = std::make_shared<State>();
  k->st->clique = c, k->st->rank = rank, k->st->device = dev;
  k->last_error[0] = '\0';
  *comm = k;
  return ncclSuccess;
}

} /* namespace */

extern "C" {

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}
const char *ncclGetLastError(ncclComm_t comm) { return comm ? comm->last_error : no_comm_error; }
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (!id) return ncclInvalidArgument;
  memset(id, 0, sizeof *id);
  std::lock_guard<std::mutex> g(ids_mu);
  snprintf(id->internal, sizeof id->internal, "cuda_emu-%llu", (unsigned long long)++id_count);
  return ncclSuccess;
}
/* Joins at once (a non-blocking init that has finished); ranks meet at
 * their first collective. */
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
  (void)config;
  if (!comm || nranks < 1) return fail(nullptr, ncclInvalidArgument, "comm is NULL or nranks < 1");
  *comm = nullptr;
  std::shared_ptr<Clique> c;
  {
    std::lock_guard<std::mutex> g(ids_mu);
    const std::string key(id.internal, strnlen(id.internal, sizeof id.internal));
    c = by_id[key].lock();
    if (!c) by_id[key] = c = std::make_shared<Clique>(nranks);
  }
  if (c->nranks != nranks) return fail(nullptr, ncclInvalidUsage, "ranks disagree on nranks");
  return join(comm, c, rank);
}
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}
/* Blocking: waits until every rank of comm called it. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
  (void)config;
  if (!comm || !newcomm) return fail(comm, ncclInvalidArgument, "comm or newcomm is NULL");
  *newcomm = nullptr;
  Clique &c = *comm->st->clique;
  const int me = comm->st->rank;
  std::unique_lock<std::mutex> g(c.mu);
  Split &sp = c.split;
  if (sp.arrived == 0) sp.color.assign((size_t)c.nranks, 0), sp.key = sp.color;
  sp.color[(size_t)me] = color, sp.key[(size_t)me] = key;
  const uint64_t round = c.splits;
  if (++sp.arrived == c.nranks) {
    c.splits++;
    c.cv.notify_all();
  } else {
    c.cv.wait(g, [&] { return c.splits != round; });
  }
  ncclResult_t r = ncclSuccess;
  if (color != NCCL_SPLIT_NOCOLOR) {
    /* my rank in the new clique: by key, then by old rank */
    int n = 0, newrank = 0;
    for (int q = 0; q < c.nranks; q++) {
      if (sp.color[(size_t)q] != color) continue;
      n++;
      if (sp.key[(size_t)q] < key || (sp.key[(size_t)q] == key && q < me)) newrank++;
    }
    std::shared_ptr<Clique> &nc = sp.cliques[color];
    if (!nc) nc = std::make_shared<Clique>(n);
    std::shared_ptr<Clique> keep = nc;
    g.unlock();
    r = join(newcomm, keep, newrank);
    g.lock();
  }
  if (++sp.taken == c.nranks) sp = Split(); /* the last one out resets it */
  return r;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  if (!comm || !count) return ncclInvalidArgument;
  *count = comm->st->clique->nranks;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->st->rank;
  return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  if (!comm || !device) return ncclInvalidArgument;
  *device = comm->st->device;
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error) {
  if (!comm || !async_error) return ncclInvalidArgument;
  *async_error = ncclSuccess;
  return ncclSuccess;
}
ncclResult_t ncclCommFinalize(ncclComm_t comm) { return comm ? ncclSuccess : ncclInvalidArgument; }
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm) comm->st->aborted = true;
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective(comm, ALLREDUCE, send, recv, count, type, op, 0, stream, "ncclAllReduce");
}
ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  return collective(comm, ALLGATHER, send, recv, sendcount, type, ncclSum, 0, stream, "ncclAllGather");
}
ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective(comm, BROADCAST, send, recv, count, type, ncclSum, root, stream, "ncclBroadcast");
}

} /* extern "C" */
