/* The CPU emulation of CUDA, runtime side (cuda_emu.h): memory recorded per
 * device, streams whose work runs as late as CUDA allows or is recorded
 * into a graph, events, and the runtime API over them. Kernels run in
 * emu_kernels.cpp. */
#include "emu_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
/* A GPU's allocator answers an allocation it cannot make with an error; the
 * emulator's memory comes from malloc, which under AddressSanitizer aborts
 * on a size it deems too big unless told to return NULL (the misuse test
 * asks for 2^40 channels). */
extern "C" const char *__asan_default_options() { return "allocator_may_return_null=1"; }
#endif

namespace {

/* ---- errors ---- */

thread_local cudaError_t last_error = cudaSuccess;
cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

/* ---- memory: every allocation recorded with its kind ---- */

struct Alloc {
  size_t bytes;
  cudaMemoryType type;
  int device; /* current at allocation */
};
constexpr int kDevices = 4; /* emulated GPUs: enough for NCCL ranks of one GPU each */
thread_local int current_device = 0;
std::mutex mem_mu;
std::map<uintptr_t, Alloc> allocs;

cudaError_t alloc(void **p, size_t bytes, cudaMemoryType type) {
  if (!p) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  void *q = nullptr;
  /* 256-byte alignment, as cudaMalloc's; at least one byte */
  if (posix_memalign(&q, 256, bytes ? bytes : 1) != 0) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> g(mem_mu);
  allocs[(uintptr_t)q] = Alloc{bytes ? bytes : 1, type, current_device};
  *p = q;
  return cudaSuccess;
}
cudaError_t release(void *p, cudaMemoryType type) {
  if (!p) return cudaSuccess;
  std::lock_guard<std::mutex> g(mem_mu);
  auto it = allocs.find((uintptr_t)p);
  if (it == allocs.end() || it->second.type != type) return fail(cudaErrorInvalidValue);
  allocs.erase(it);
  free(p);
  return cudaSuccess;
}
/* The allocation holding all of [p, p + bytes) (at least p), if any. */
bool find(const void *p, Alloc *out, size_t bytes = 1) {
  std::lock_guard<std::mutex> g(mem_mu);
  auto it = allocs.upper_bound((uintptr_t)p);
  if (it == allocs.begin()) return false;
  --it;
  const uintptr_t off = (uintptr_t)p - it->first;
  if (off >= it->second.bytes || (bytes && bytes > it->second.bytes - off)) return false;
  *out = it->second;
  return true;
}

/* ---- streams and graphs ---- */

typedef std::function<void()> Work;
/* A unit of a stream's work; false: not ready yet (an NCCL collective
 * waiting for other ranks), to be run again later. */
typedef std::function<bool()> Step;
cudaError_t release(void *p, cudaMemoryType type);
/* Memory a graph allocated during capture, freed with the graph's last copy. */
struct GraphMemory {
  std::vector<void *> ptrs;
  ~GraphMemory() {
    for (void *p : ptrs) release(p, cudaMemoryTypeDevice);
  }
};
struct Graph {
  std::vector<Step> work;
  std::shared_ptr<GraphMemory> memory = std::make_shared<GraphMemory>();
};
} /* namespace */

/* A stream's work waits in `pending` until something waits for it (see
 * "Streams" in cuda_emu.h); `exec` keeps one flush at a time, in order. */
struct CUstream_st {
  int device = 0;
  bool nonblocking = false;
  bool capturing = false;
  Graph *graph = nullptr;
  std::mutex mu, exec;
  std::deque<Step> pending;
};
struct CUevent_st {
  std::chrono::steady_clock::time_point t;
  bool recorded = false;
  cudaStream_t stream = nullptr; /* of its last record */
  int device = 0;
};
struct CUgraph_st {
  Graph g;
};
struct CUgraphExec_st {
  Graph g;
};

namespace {
std::mutex streams_mu;
std::vector<cudaStream_t> streams; /* every non-blocking stream created and not destroyed */
/* Destroyed non-blocking streams, kept until exit: flush_all may still hold
 * one it listed (it flushes without the lock, as a wait on one device must
 * not stop other threads' stream calls). */
struct Retired {
  std::vector<cudaStream_t> list;
  ~Retired() {
    for (cudaStream_t s : list) delete s;
  }
} retired;
std::atomic<int> sticky{cudaSuccess}; /* a launch failure, reported by every later wait */
/* Per device, its legacy stream and its blocking streams share one queue:
 * each waits for the others' earlier work (an order stricter than CUDA's
 * among blocking streams, and CUDA's between them and the legacy stream). */
CUstream_st legacy[kDevices];
const struct LegacyDevices {
  LegacyDevices() {
    for (int d = 0; d < kDevices; d++) legacy[d].device = d;
  }
} legacy_devices;
cudaStream_t queue_of(cudaStream_t s) {
  if (!s) return &legacy[current_device];
  return s->nonblocking ? s : &legacy[s->device];
}

/* Run what the queue of s holds, in order, up to a step that is not ready;
 * true when it is empty. */
bool flush_once(cudaStream_t s) {
  s = queue_of(s);
  std::lock_guard<std::mutex> ex(s->exec);
  for (;;) {
    Step *step; /* run in place: a step that is not ready keeps its state */
    {
      std::lock_guard<std::mutex> g(s->mu);
      if (s->pending.empty()) return true;
      step = &s->pending.front(); /* stays valid: others only push at the back */
    }
    if (!(*step)()) return false;
    std::lock_guard<std::mutex> g(s->mu);
    s->pending.pop_front();
  }
}
/* Wait until the queue of s is empty. */
void flush(cudaStream_t s) {
  while (!flush_once(s)) std::this_thread::yield();
}
/* The current device's legacy queue, and its non-blocking streams too when
 * asked. */
void flush_all(bool nonblocking_too) {
  flush(nullptr);
  if (!nonblocking_too) return;
  std::vector<cudaStream_t> now;
  {
    std::lock_guard<std::mutex> g(streams_mu);
    now = streams;
  }
  for (cudaStream_t s : now)
    if (s->device == current_device) flush(s);
}
cudaError_t waited() {
  const int e = sticky.load();
  return e == cudaSuccess ? cudaSuccess : (cudaError_t)e;
}

/* Work in stream order: recorded while s is captured, else kept in its
 * queue until something waits for it. */
cudaError_t enqueue_step(cudaStream_t s, Step st) {
  if (s && s->capturing) {
    s->graph->work.push_back(std::move(st));
    return cudaSuccess;
  }
  s = queue_of(s);
  std::lock_guard<std::mutex> g(s->mu);
  s->pending.push_back(std::move(st));
  return cudaSuccess;
}
cudaError_t enqueue(cudaStream_t s, Work w) {
  return enqueue_step(s, [w]() {
    w();
    return true;
  });
}
bool capturing(cudaStream_t s) { return s && s->capturing; }

} /* namespace */

namespace sbn_emu {
cudaError_t set_last_error(cudaError_t e) { return fail(e); }
void set_sticky_error(cudaError_t e) { sticky = e; }
cudaError_t enqueue_work(cudaStream_t s, std::function<bool()> step) { return enqueue_step(s, std::move(step)); }
bool is_device(const void *p, size_t bytes) {
  Alloc a;
  return find(p, &a, bytes) && a.type == cudaMemoryTypeDevice;
}
} /* namespace sbn_emu */

/* ---- the runtime API ---- */

extern "C" {


const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    default: return "cudaErrorUnknown";
  }
}
const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorLaunchFailure: return "unspecified launch failure (emulated: see the message above)";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    default: return cudaGetErrorName(e);
  }
}
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }

cudaError_t cudaGetDeviceCount(int *count) {
  if (!count) return fail(cudaErrorInvalidValue);
  *count = kDevices;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device) {
  if (!p) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= kDevices) return fail(cudaErrorInvalidDevice);
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "CUDA emulated on the CPU (tests/cuda_emu)");
  p->major = 9, p->minor = 0, p->multiProcessorCount = 4, p->totalGlobalMem = (size_t)1 << 32;
  p->l2CacheSize = 4 << 20;
  p->warpSize = 32, p->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  if (!value) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= kDevices) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
  }
  return fail(cudaErrorInvalidValue);
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= kDevices) return fail(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
  if (!device) return fail(cudaErrorInvalidValue);
  *device = current_device;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  flush_all(true);
  return waited();
}

cudaError_t cudaMalloc(void **p, size_t bytes) { return alloc(p, bytes, cudaMemoryTypeDevice); }
cudaError_t cudaFree(void *p) { /* waits for the whole device, as CUDA's does */
  flush_all(true);
  return release(p, cudaMemoryTypeDevice);
}
/* Stream-ordered allocation. Under capture CUDA records allocation and free
 * nodes, and the graph's memory is valid while it runs; here it is
 * allocated at capture and belongs to the graph until it is destroyed. */
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s) {
  const cudaError_t e = alloc(p, bytes, cudaMemoryTypeDevice);
  if (e == cudaSuccess && capturing(s)) s->graph->memory->ptrs.push_back(*p);
  return e;
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  if (capturing(s)) return cudaSuccess;
  Alloc a;
  if (p && (!find(p, &a) || a.type != cudaMemoryTypeDevice)) return fail(cudaErrorInvalidValue);
  return enqueue(s, [p]() { release(p, cudaMemoryTypeDevice); });
}
/* A pool is a device; its memory is allocated like cudaMallocAsync's, on
 * that device (freeing memory back to it is not modelled). */
struct CUmemPoolHandle_st {
  int device;
};
cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const struct cudaMemPoolProps *props) {
  if (!pool || !props || props->allocType != cudaMemAllocationTypePinned ||
      props->location.type != cudaMemLocationTypeDevice || props->location.id < 0 || props->location.id >= 4)
    return fail(cudaErrorInvalidValue);
  *pool = new CUmemPoolHandle_st{props->location.id};
  return cudaSuccess;
}
cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
  if (!pool) return fail(cudaErrorInvalidValue);
  delete pool;
  return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
  if (!pool || !value || attr != cudaMemPoolAttrReleaseThreshold) return fail(cudaErrorInvalidValue);
  return cudaSuccess;
}
cudaError_t cudaMallocFromPoolAsync(void **p, size_t bytes, cudaMemPool_t pool, cudaStream_t s) {
  if (!pool) return fail(cudaErrorInvalidValue);
  const int prev = current_device;
  current_device = pool->device;
  const cudaError_t e = cudaMallocAsync(p, bytes, s);
  current_device = prev;
  return e;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) { return alloc(p, bytes, cudaMemoryTypeHost); }
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags) {
  (void)flags;
  return alloc(p, bytes, cudaMemoryTypeHost);
}
cudaError_t cudaFreeHost(void *p) {
  flush_all(true);
  return release(p, cudaMemoryTypeHost);
}
cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned flags) {
  Alloc a;
  if (!dev || flags || !find(host, &a) || a.type != cudaMemoryTypeHost) return fail(cudaErrorInvalidValue);
  *dev = host;
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
  if (!a) return fail(cudaErrorInvalidValue);
  Alloc al;
  memset(a, 0, sizeof *a);
  a->device = -2;
  if (find(p, &al)) {
    a->type = al.type;
    a->device = al.device;
    a->devicePointer = (void *)p;
    a->hostPointer = al.type == cudaMemoryTypeHost ? (void *)p : nullptr;
  } else {
    a->type = cudaMemoryTypeUnregistered;
    a->hostPointer = (void *)p;
  }
  return cudaSuccess;
}

/* A copy or set checks that device-side pointers are the emulator's memory
 * (as a GPU would fault on a host pointer). */
static bool device_ok(const void *p, size_t bytes) {
  Alloc a;
  return !bytes || find(p, &a, bytes);
}
static cudaError_t copy_check(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes && (!dst || !src)) return cudaErrorInvalidValue;
  const bool dev_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool dev_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if ((dev_dst && !device_ok(dst, bytes)) || (dev_src && !device_ok(src, bytes))) return cudaErrorInvalidValue;
  return cudaSuccess;
}
/* Which copies the host waits for, as CUDA documents them: a synchronous
 * copy into host memory completes before it returns (after the legacy
 * stream's earlier work); one from pageable host memory takes the bytes at
 * the call and reaches the device later, in legacy-stream order; one from
 * pinned memory completes at once; device to device is only enqueued. The
 * asynchronous copies: from pageable memory the bytes are taken at the call,
 * into pageable memory the copy waits for its stream and completes. */
static bool pinned(const void *p) {
  Alloc a;
  return find(p, &a) && a.type == cudaMemoryTypeHost;
}
static Work copy_work(void *dst, const void *src, size_t bytes, bool snapshot) {
  if (snapshot && bytes) {
    std::shared_ptr<std::vector<char>> c = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + bytes);
    return [dst, c]() { memmove(dst, c->data(), c->size()); };
  }
  return [dst, src, bytes]() {
    if (bytes) memmove(dst, src, bytes);
  };
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
  const cudaError_t e = copy_check(dst, src, bytes, kind);
  if (e != cudaSuccess) return fail(e);
  if (kind == cudaMemcpyDeviceToDevice) return enqueue(nullptr, copy_work(dst, src, bytes, false));
  if (kind == cudaMemcpyHostToDevice && !pinned(src)) return enqueue(nullptr, copy_work(dst, src, bytes, true));
  flush(nullptr);
  if (bytes) memmove(dst, src, bytes);
  return waited();
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s) {
  const cudaError_t e = copy_check(dst, src, bytes, kind);
  if (e != cudaSuccess) return fail(e);
  if (kind == cudaMemcpyDeviceToHost && !pinned(dst) && !capturing(s)) {
    flush(s);
    if (bytes) memmove(dst, src, bytes);
    return waited();
  }
  return enqueue(s, copy_work(dst, src, bytes, kind == cudaMemcpyHostToDevice && !pinned(src)));
}
cudaError_t cudaMemset(void *dst, int value, size_t bytes) {
  if (!device_ok(dst, bytes)) return fail(cudaErrorInvalidValue);
  return enqueue(nullptr, [dst, value, bytes]() { memset(dst, value, bytes); });
}
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s) {
  if (!device_ok(dst, bytes)) return fail(cudaErrorInvalidValue);
  return enqueue(s, [dst, value, bytes]() { memset(dst, value, bytes); });
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
  if (!free_bytes || !total_bytes) return fail(cudaErrorInvalidValue);
  *total_bytes = (size_t)1 << 32, *free_bytes = (size_t)1 << 30;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) {
  if (!e) return fail(cudaErrorInvalidValue);
  *e = new CUevent_st();
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  e->stream = s, e->device = current_device;
  return enqueue(s, [e]() {
    e->t = std::chrono::steady_clock::now();
    e->recorded = true;
  });
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  flush(e->stream ? e->stream : &legacy[e->device]);
  return waited();
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms || !start || !end || !start->recorded || !end->recorded) return fail(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(end->t - start->t).count();
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  if (!s) return fail(cudaErrorInvalidValue);
  *s = new CUstream_st();
  (*s)->nonblocking = flags & cudaStreamNonBlocking;
  (*s)->device = current_device;
  if ((*s)->nonblocking) {
    std::lock_guard<std::mutex> g(streams_mu);
    streams.push_back(*s);
  }
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  flush(s); /* its work still runs, as CUDA finishes it */
  delete s->graph;
  s->graph = nullptr, s->capturing = false;
  if (!s->nonblocking) {
    delete s;
    return cudaSuccess;
  }
  std::lock_guard<std::mutex> g(streams_mu);
  for (size_t i = 0; i < streams.size(); i++)
    if (streams[i] == s) streams.erase(streams.begin() + (long)i);
  retired.list.push_back(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (capturing(s)) return fail(cudaErrorStreamCaptureUnsupported);
  flush(s);
  return waited();
}
/* Polling makes progress: the stream's work runs, then it is idle. */
cudaError_t cudaStreamQuery(cudaStream_t s) {
  if (capturing(s)) return fail(cudaErrorStreamCaptureUnsupported);
  if (!flush_once(s)) return cudaErrorNotReady; /* not an error: not recorded */
  return waited();
}
cudaError_t cudaStreamGetDevice(cudaStream_t s, int *device) {
  if (!device) return fail(cudaErrorInvalidValue);
  *device = s ? s->device : current_device;
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status) {
  if (!status) return fail(cudaErrorInvalidValue);
  *status = capturing(s) ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
  (void)mode;
  if (!s || s->capturing) return fail(cudaErrorInvalidValue); /* the legacy stream cannot be captured */
  s->capturing = true;
  s->graph = new Graph();
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
  if (!s || !s->capturing || !graph) return fail(cudaErrorInvalidValue);
  CUgraph_st *g = new CUgraph_st();
  g->g = std::move(*s->graph);
  delete s->graph;
  s->graph = nullptr;
  s->capturing = false;
  *graph = g;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
  (void)flags;
  if (!exec || !graph) return fail(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st();
  (*exec)->g = graph->g;
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (!exec) return fail(cudaErrorInvalidValue);
  for (const Step &st : exec->g.work) enqueue_step(s, st); /* fresh copies: each replay starts anew */
  return cudaSuccess;
}
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count) {
  if (!graph || !count) return fail(cudaErrorInvalidValue);
  if (nodes) return fail(cudaErrorInvalidValue); /* only the count is emulated */
  *count = graph->g.work.size();
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

} /* extern "C" */
