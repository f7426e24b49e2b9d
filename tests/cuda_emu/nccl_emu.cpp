/* The CPU emulation of NCCL (include/nccl.h): one-rank communicators whose
 * collectives copy their input to their output in stream order. */
#include <nccl.h>
#include <stdio.h>
#include <string.h>

struct ncclComm {
  int device;
  char last_error[256];
};

namespace {
thread_local char no_comm_error[256];

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
/* A collective of one rank: recv = send (in place when they are equal). */
ncclResult_t copy(const void *send, void *recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                  cudaStream_t stream, const char *call) {
  if (!comm) return fail(comm, ncclInvalidArgument, "comm is NULL");
  const size_t es = type_size(type);
  if (!es) return fail(comm, ncclInvalidArgument, "unknown data type");
  const size_t bytes = count * es;
  if (bytes && (!sbn_emu::is_device(send, bytes) || !sbn_emu::is_device(recv, bytes))) {
    char m[200];
    snprintf(m, sizeof m, "%s: a buffer is not device memory (send %p, recv %p)", call, send, recv);
    return fail(comm, ncclInvalidArgument, m);
  }
  if (sbn_emu::enqueue_work(stream, [send, recv, bytes]() {
        if (send != recv && bytes) memmove(recv, send, bytes);
      }) != cudaSuccess)
    return fail(comm, ncclUnhandledCudaError, "enqueue failed");
  return ncclSuccess;
}
ncclResult_t make(ncclComm_t *comm, int nranks, int rank) {
  if (!comm) return fail(nullptr, ncclInvalidArgument, "comm is NULL");
  *comm = nullptr;
  if (nranks != 1 || rank != 0)
    return fail(nullptr, ncclInvalidUsage, "the NCCL emulation has one device: communicators of one rank only");
  ncclComm_t c = new ncclComm();
  cudaGetDevice(&c->device);
  *comm = c;
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
  snprintf(id->internal, sizeof id->internal, "cuda_emu");
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  (void)id;
  return make(comm, nranks, rank);
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
  (void)id, (void)config; /* a non-blocking init that has finished at once */
  return make(comm, nranks, rank);
}
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
  (void)key, (void)config;
  if (!comm || !newcomm) return fail(comm, ncclInvalidArgument, "comm or newcomm is NULL");
  *newcomm = nullptr;
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  return make(newcomm, 1, 0);
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  if (!comm || !count) return ncclInvalidArgument;
  *count = 1;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = 0;
  return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  if (!comm || !device) return ncclInvalidArgument;
  *device = comm->device;
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
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  (void)op;
  return copy(send, recv, count, type, comm, stream, "ncclAllReduce");
}
ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  return copy(send, recv, sendcount, type, comm, stream, "ncclAllGather");
}
ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  if (root != 0) return fail(comm, ncclInvalidArgument, "root out of range");
  return copy(send, recv, count, type, comm, stream, "ncclBroadcast");
}

} /* extern "C" */
