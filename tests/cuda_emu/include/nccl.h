/* The CPU emulation of NCCL for tests/cuda_emu (tests/cuda_emu/nccl_emu.cpp):
 * communicators of ranks that are threads of one process, one emulated GPU
 * each (two ranks on one device are refused, as NCCL does). Collectives are
 * steps on the caller's stream that complete once every rank's matching
 * step has run; ncclCommSplit is blocking; ncclCommAbort ends this rank's
 * pending collectives. The API subset syncbn uses. */
#ifndef SBN_CUDA_EMU_NCCL_H
#define SBN_CUDA_EMU_NCCL_H

#include <stddef.h>

#include "../cuda_emu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;
typedef enum {
  ncclInt8 = 0, ncclChar = 0, ncclUint8 = 1, ncclInt32 = 2, ncclInt = 2, ncclUint32 = 3, ncclInt64 = 4,
  ncclUint64 = 5, ncclFloat16 = 6, ncclHalf = 6, ncclFloat32 = 7, ncclFloat = 7, ncclFloat64 = 8,
  ncclDouble = 8, ncclBfloat16 = 9
} ncclDataType_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

typedef struct ncclComm *ncclComm_t;
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;
typedef struct {
  size_t size;
  int blocking;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER {sizeof(ncclConfig_t), 1}
#define NCCL_SPLIT_NOCOLOR -1

const char *ncclGetErrorString(ncclResult_t r);
const char *ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
