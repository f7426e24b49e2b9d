/* A CPU emulation of the parts of CUDA that syncbn's CUDA code uses, so that
 * its kernels and the CUDA layer run, unchanged, on a machine without a GPU
 * (tests only: `make check-cuda-emu`). It stands in for cuda_runtime.h,
 * cuda_runtime_api.h, cuda_fp16.h and cuda_bf16.h (tests/cuda_emu/include).
 *
 * What it models:
 *  - device memory is host memory from the emulator's allocator, which
 *    records every allocation, so cudaPointerGetAttributes tells device,
 *    pinned host and other memory apart (and AddressSanitizer, when on,
 *    sees every out-of-bounds access a kernel makes);
 *  - a launch runs the whole grid before it returns, block after block;
 *    within a block each CUDA thread is a fiber, switched only at
 *    __syncthreads and warp shuffles, which are real barriers: a barrier
 *    that some threads never reach (divergence) is reported and fails the
 *    launch instead of hanging. Between barriers the threads run in thread
 *    order in even blocks and in reverse order in odd ones, so a read of
 *    another thread's write without a barrier between them is early in one
 *    of the two. Launches are serialized process-wide;
 *  - Streams: a stream's work (launches, async copies and sets, NCCL calls)
 *    is held until something waits for it, as late as CUDA allows:
 *    cudaStreamSynchronize/Query, cudaEventSynchronize,
 *    cudaDeviceSynchronize, cudaFree, a copy into pageable host memory, a
 *    synchronous copy into host memory. The legacy stream (NULL) and the
 *    blocking streams share one queue; cudaStreamNonBlocking streams have
 *    their own, which nothing but their own waits flushes. So a result the
 *    host reads, or a kernel consumes, without the ordering CUDA requires is
 *    not there at all: a missing wait fails every time instead of now and
 *    then. A stream being captured records its work instead, and a graph
 *    launch enqueues it (the arguments as they were at capture, as CUDA
 *    does);
 *  - four devices (sm_90 by their properties); memory belongs to the device
 *    current at its allocation, and each device has its own legacy stream.
 * What it does not model: timing, interleavings other than "as late as
 * allowed", NCCL across processes (include/nccl.h: ranks are threads), and
 * the hardware's own floating point (the kernels' explicit roundings are reproduced with
 * the host's IEEE operations, compiled without contraction).
 *
 * The `kernel<<<grid, block, shmem, stream>>>(args)` syntax is rewritten by
 * tests/cuda_emu/cu2cpp.sh into `kernel ^ sbn_emu::Cfg("kernel", ...) ^
 * sbn_emu::args(args)` before the file is compiled as C++. */
#ifndef SBN_CUDA_EMU_H
#define SBN_CUDA_EMU_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- the runtime API (C linkage: device_cuda.c is C) ---- */

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureImplicit = 906,
} cudaError_t;

typedef struct CUstream_st *cudaStream_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct CUgraphNode_st *cudaGraphNode_t;
typedef struct CUmemPoolHandle_st *cudaMemPool_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3
};
struct cudaPointerAttributes {
  enum cudaMemoryType type;
  int device;
  void *devicePointer;
  void *hostPointer;
};
/* memory pools: device memory of one device, stream-ordered */
enum cudaMemAllocationType { cudaMemAllocationTypeInvalid = 0, cudaMemAllocationTypePinned = 1 };
enum cudaMemAllocationHandleType { cudaMemHandleTypeNone = 0 };
enum cudaMemLocationType { cudaMemLocationTypeInvalid = 0, cudaMemLocationTypeDevice = 1 };
struct cudaMemLocation {
  enum cudaMemLocationType type;
  int id;
};
struct cudaMemPoolProps {
  enum cudaMemAllocationType allocType;
  enum cudaMemAllocationHandleType handleTypes;
  struct cudaMemLocation location;
  void *win32SecurityAttributes;
  size_t maxSize;
  unsigned short usage;
  unsigned char reserved[54];
};
enum cudaMemPoolAttr { cudaMemPoolAttrReleaseThreshold = 4 };
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2
};
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2
};
#define cudaStreamDefault 0x0
#define cudaStreamNonBlocking 0x1
#define cudaHostAllocDefault 0x0
#define cudaHostAllocPortable 0x1
#define cudaHostAllocMapped 0x2

typedef struct cudaDeviceProp {
  char name[256];
  int major, minor;
  int multiProcessorCount;
  int l2CacheSize;
  size_t totalGlobalMem;
  int warpSize;
  int maxThreadsPerBlock;
} cudaDeviceProp;

const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
enum cudaDeviceAttr { cudaDevAttrComputeCapabilityMajor = 75, cudaDevAttrComputeCapabilityMinor = 76 };
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaDeviceSynchronize(void);

cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const struct cudaMemPoolProps *props);
cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value);
cudaError_t cudaMallocFromPoolAsync(void **p, size_t bytes, cudaMemPool_t pool, cudaStream_t s);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned flags);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p);

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemset(void *dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s);

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

/* Events record the host's clock when the stream reaches them (at once, or
 * at graph replay): elapsed times measure the emulation, not a GPU. */
typedef struct CUevent_st *cudaEvent_t;
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamGetDevice(cudaStream_t s, int *device);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

#ifdef __cplusplus
} /* extern "C" */

/* C++ conveniences of the real headers */
template <class T> static inline cudaError_t cudaMalloc(T **p, size_t bytes) { return cudaMalloc((void **)p, bytes); }
template <class T> static inline cudaError_t cudaMallocHost(T **p, size_t bytes) { return cudaMallocHost((void **)p, bytes); }
template <class T> static inline cudaError_t cudaHostAlloc(T **p, size_t bytes, unsigned f) { return cudaHostAlloc((void **)p, bytes, f); }
template <class T> static inline cudaError_t cudaMallocAsync(T **p, size_t bytes, cudaStream_t s) { return cudaMallocAsync((void **)p, bytes, s); }
template <class T> static inline cudaError_t cudaMallocFromPoolAsync(T **p, size_t bytes, cudaMemPool_t pool, cudaStream_t s) { return cudaMallocFromPoolAsync((void **)p, bytes, pool, s); }
template <class T> static inline cudaError_t cudaHostGetDevicePointer(T **d, void *h, unsigned f) { return cudaHostGetDevicePointer((void **)d, h, f); }
static inline cudaError_t cudaStreamBeginCapture(cudaStream_t s) { return cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal); }

/* ---- device code ---- */

#include <math.h>

#include <atomic>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
/* A block's shared variables: blocks run one at a time, so one static copy
 * serves every block (its contents are undefined at block start, as on a GPU). */
#define __shared__ static

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
  unsigned x, y, z;
};

struct float2 { float x, y; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) uint2 { unsigned x, y; };
struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
struct __attribute__((aligned(16))) double2 { double x, y; };
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
static inline double2 make_double2(double x, double y) { return {x, y}; }

namespace sbn_emu {
/* The CUDA thread running now (a fiber of the block being run). */
struct Thread {
  uint3 idx;
};
extern Thread *cur;
extern uint3 block_idx;
extern dim3 block_dim, grid_dim;
void syncthreads();                       /* block barrier */
void warp_exchange(uint64_t *v, int src); /* every lane publishes *v, then reads lane src's */
} /* namespace sbn_emu */

#define threadIdx (sbn_emu::cur->idx)
#define blockIdx (sbn_emu::block_idx)
#define blockDim (sbn_emu::block_dim)
#define gridDim (sbn_emu::grid_dim)
static inline void __syncthreads() { sbn_emu::syncthreads(); }
static inline void __syncwarp(unsigned = 0xffffffffu) {}
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }

/* Shuffles: every lane of the warp must take part (a full mask), as all of
 * syncbn's do; the emulator checks that they all arrive. */
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int lanemask, int width = 32) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a value of at most 8 bytes");
  uint64_t w = 0;
  memcpy(&w, &v, sizeof v);
  const int lane = (int)(threadIdx.x % 32);
  sbn_emu::warp_exchange(&w, (lane ^ lanemask) < ((lane / width + 1) * width) ? lane ^ lanemask : lane);
  T out;
  memcpy(&out, &w, sizeof out);
  return out;
}
template <class T> static inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
  uint64_t w = 0;
  memcpy(&w, &v, sizeof v);
  const int lane = (int)(threadIdx.x % 32);
  sbn_emu::warp_exchange(&w, (lane / width) * width + src % width);
  T out;
  memcpy(&out, &w, sizeof out);
  return out;
}

/* Stores and loads with cache hints are plain accesses. */
template <class T> static inline void __stwb(T *p, T v) { *p = v; }
template <class T> static inline void __stcs(T *p, T v) { *p = v; }
template <class T> static inline T __ldg(const T *p) { return *p; }

/* Arithmetic with explicit rounding: the host's IEEE operations (this code
 * is compiled with -ffp-contract=off, so nothing fuses). */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __dsqrt_rn(double a) { return sqrt(a); }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline double __longlong_as_double(long long u) { double f; memcpy(&f, &u, 8); return f; }
static inline long long __double_as_longlong(double f) { long long u; memcpy(&u, &f, 8); return u; }

template <class T> static inline T atomicCAS(T *p, T compare, T val) {
  __atomic_compare_exchange_n(p, &compare, val, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return compare;
}
template <class T> static inline T atomicAdd(T *p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }

/* ---- 16-bit floating point (cuda_fp16.h, cuda_bf16.h) ---- */
struct __half {
  uint16_t x;
};
struct __nv_bfloat16 {
  uint16_t x;
};
static inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
static inline unsigned short __half_as_ushort(__half h) { return h.x; }
static inline float __half2float(__half h) {
  _Float16 f;
  memcpy(&f, &h.x, 2);
  return (float)f;
}
static inline __half __float2half_rn(float v) { /* GCC's _Float16: round to nearest even */
  const _Float16 f = (_Float16)v;
  __half h;
  memcpy(&h.x, &f, 2);
  return h;
}
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16{u}; }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.x; }
static inline float __bfloat162float(__nv_bfloat16 b) { return __uint_as_float((unsigned)b.x << 16); }
static inline __nv_bfloat16 __float2bfloat16_rn(float v) { /* round to nearest even; NaN stays NaN */
  const unsigned u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(uint16_t)((u >> 16) | 0x40u)};
  return __nv_bfloat16{(uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

/* ---- launches ---- */
namespace sbn_emu {
struct Cfg {
  const char *name; /* the kernel's */
  dim3 grid, block;
  size_t shmem;
  cudaStream_t stream;
  Cfg(const char *n, dim3 g, dim3 b, size_t sh = 0, cudaStream_t st = nullptr)
      : name(n), grid(g), block(b), shmem(sh), stream(st) {}
};
/* Runs (or, on a capturing stream, records) body for every thread of the
 * grid; sets the thread's last error on a bad configuration or a failure. */
void launch(const Cfg &cfg, std::function<void()> body);
/* For the NCCL emulation: work in stream order (or recorded while the
 * stream is captured), and whether [p, p + bytes) is device memory. */
cudaError_t enqueue_work(cudaStream_t s, std::function<bool()> step); /* false: not ready, run again later */
bool is_device(const void *p, size_t bytes);

template <class F> struct Bound {
  F *f;
  Cfg cfg;
};
template <class F> static inline Bound<F> operator^(F *f, const Cfg &c) { return Bound<F>{f, c}; }
template <class... A> static inline std::tuple<typename std::decay<A>::type...> args(A &&...a) {
  return std::tuple<typename std::decay<A>::type...>(std::forward<A>(a)...);
}
template <class R, class... P, class... A> static inline void operator^(Bound<R(P...)> b, std::tuple<A...> t) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
  /* the arguments converted to the parameters' types once, at launch (or capture) */
  std::tuple<typename std::decay<P>::type...> params(t);
  R (*f)(P...) = b.f;
  launch(b.cfg, [f, params]() { std::apply(f, params); });
}
} /* namespace sbn_emu */
using sbn_emu::operator^;

/* cudaLaunchKernelEx: a launch as above; the attributes (programmatic
 * dependent launch) change only when a GPU may start the kernel, never what
 * it computes, and launches here run one after another anyway. */
enum cudaLaunchAttributeID { cudaLaunchAttributeProgrammaticStreamSerialization = 6 };
union cudaLaunchAttributeValue {
  int programmaticStreamSerializationAllowed;
  char pad[64];
};
struct cudaLaunchAttribute {
  enum cudaLaunchAttributeID id;
  union cudaLaunchAttributeValue val;
};
/* CUDA's fields in CUDA's order (gridDim, blockDim, dynamicSmemBytes,
 * stream, attrs, numAttrs), initialized by position: here gridDim and
 * blockDim are the kernels' macros */
struct cudaLaunchConfig_t {
  dim3 grid, block;
  size_t dynamic_smem_bytes;
  cudaStream_t stream;
  cudaLaunchAttribute *attrs;
  unsigned num_attrs;
};
template <class... P, class... A>
static inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *c, void (*k)(P...), A &&...a) {
  k ^ sbn_emu::Cfg("kernel", c->grid, c->block, c->dynamic_smem_bytes, c->stream) ^
      sbn_emu::args(std::forward<A>(a)...);
  return cudaPeekAtLastError();
}

#endif /* __cplusplus */
#endif
