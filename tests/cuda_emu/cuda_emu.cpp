/* The CPU emulation of CUDA (cuda_emu.h): fibers for a block's threads, the
 * runtime API over host memory, streams that run at once or record into a
 * graph. */
#include "cuda_emu.h"

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
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
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
/* The allocation holding p, if any. */
bool find(const void *p, Alloc *out) {
  std::lock_guard<std::mutex> g(mem_mu);
  auto it = allocs.upper_bound((uintptr_t)p);
  if (it == allocs.begin()) return false;
  --it;
  if ((uintptr_t)p >= it->first + it->second.bytes) return false;
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
  std::lock_guard<std::mutex> g(streams_mu); /* no stream is destroyed meanwhile */
  for (cudaStream_t s : streams)
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

/* ---- fibers: the threads of one block ---- */

/* Switch stacks: save the callee-saved registers on the current stack and
 * its pointer in *save, continue on stack `to` (saved the same way, or
 * prepared by fiber_init). No system call, unlike swapcontext. */
extern "C" void sbn_emu_switch(void **save, void *to);
#if defined(__x86_64__)
asm(".text\n"
    ".globl sbn_emu_switch\n"
    ".type sbn_emu_switch,@function\n"
    "sbn_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size sbn_emu_switch,.-sbn_emu_switch\n");
#else
#error "tests/cuda_emu: the fiber switch is written for x86-64"
#endif

enum State { RUNNABLE, AT_BLOCK_BARRIER, AT_WARP_BARRIER, DONE };
struct Fiber {
  sbn_emu::Thread t;
  void *sp; /* its saved stack pointer while it is not running */
  State state;
  int parity; /* which slot array its next shuffle uses */
};
constexpr size_t kStack = 256 << 10;
struct Block {
  std::vector<Fiber> fibers;
  std::vector<char *> stacks;
  std::vector<uint64_t> slot; /* shuffle values: two per thread (warp_exchange) */
  void *sched_sp = nullptr;
  const std::function<void()> *body = nullptr;
  unsigned nthreads = 0;
  const void *sched_bottom = nullptr; /* AddressSanitizer's fiber bookkeeping */
  size_t sched_size = 0;
  ~Block() {
    for (char *s : stacks) free(s);
  }
};
Block blk;
std::mutex launch_mu;
unsigned long long n_launches = 0;

void switch_to_sched(Fiber *f) {
#if EMU_ASAN
  void *fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, blk.sched_bottom, blk.sched_size);
  sbn_emu_switch(&f->sp, blk.sched_sp);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  sbn_emu_switch(&f->sp, blk.sched_sp);
#endif
}

extern "C" void fiber_main() {
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &blk.sched_bottom, &blk.sched_size);
#endif
  Fiber *f = (Fiber *)sbn_emu::cur;
  (*blk.body)();
  f->state = DONE;
#if EMU_ASAN
  __sanitizer_start_switch_fiber(nullptr, blk.sched_bottom, blk.sched_size);
#endif
  void *dead;
  sbn_emu_switch(&dead, blk.sched_sp); /* never resumed */
  abort();
}

/* A fresh stack whose first switch enters fiber_main as if called: six
 * zero registers, fiber_main as the return address, and a slot for
 * fiber_main's own (never used) return address at 8 mod 16. */
void *fiber_init(char *stack) {
#if EMU_ASAN
  /* the last fiber on this stack left its frames' red zones poisoned */
  __asan_unpoison_memory_region(stack, kStack);
#endif
  uintptr_t top = ((uintptr_t)stack + kStack) & ~(uintptr_t)15;
  void **sp = (void **)top;
  *--sp = nullptr;              /* fiber_main's return address */
  *--sp = (void *)fiber_main;   /* where the switch's ret goes */
  for (int i = 0; i < 6; i++) *--sp = nullptr;
  return sp;
}

Fiber *self() { return (Fiber *)sbn_emu::cur; }

/* Runs one block; false (with a message) when its threads deadlock. */
bool run_block(const char *name) {
  const unsigned n = blk.nthreads;
  for (unsigned i = 0; i < n; i++) {
    Fiber &f = blk.fibers[i];
    f.t.idx = uint3{i % sbn_emu::block_dim.x, (i / sbn_emu::block_dim.x) % sbn_emu::block_dim.y,
                    i / (sbn_emu::block_dim.x * sbn_emu::block_dim.y)};
    f.state = RUNNABLE;
    f.sp = fiber_init(blk.stacks[i]);
    f.parity = 0;
  }
  const unsigned nwarps = (n + 31) / 32;
  /* Between barriers threads run one after another, in thread order in
   * even blocks and in reverse order in odd ones: a thread that reads what
   * another writes without a barrier between them reads it too early in one
   * of the two orders. */
  const bool reverse = (sbn_emu::block_idx.x + sbn_emu::block_idx.y + sbn_emu::block_idx.z) & 1;
  for (;;) {
    bool ran = false;
    for (unsigned k = 0; k < n; k++) {
      const unsigned i = reverse ? n - 1 - k : k;
      Fiber &f = blk.fibers[i];
      if (f.state != RUNNABLE) continue;
      sbn_emu::cur = &f.t;
#if EMU_ASAN
      void *fake = nullptr;
      __sanitizer_start_switch_fiber(&fake, blk.stacks[i], kStack);
      sbn_emu_switch(&blk.sched_sp, f.sp);
      __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
      sbn_emu_switch(&blk.sched_sp, f.sp);
#endif
      ran = true;
    }
    /* release the warps whose live lanes all arrived at a shuffle */
    bool released = false, any_live = false, all_at_block = true;
    for (unsigned w = 0; w < nwarps; w++) {
      unsigned live = 0, at = 0;
      for (unsigned i = 32 * w; i < n && i < 32 * w + 32; i++) {
        const State s = blk.fibers[i].state;
        live += s != DONE;
        at += s == AT_WARP_BARRIER;
      }
      if (at && at == live) {
        /* a full-mask shuffle needs all 32 lanes (or the block's last, partial warp) */
        const unsigned lanes = (n - 32 * w) < 32 ? n - 32 * w : 32;
        if (at != lanes) {
          fprintf(stderr, "cuda_emu: %s: block (%u,%u,%u): warp %u shuffles with %u of its %u lanes (the others exited)\n",
                  name, sbn_emu::block_idx.x, sbn_emu::block_idx.y, sbn_emu::block_idx.z, w, at, lanes);
          return false;
        }
        for (unsigned i = 32 * w; i < 32 * w + lanes; i++) blk.fibers[i].state = RUNNABLE;
        released = true;
      }
    }
    for (unsigned i = 0; i < n; i++) {
      const State s = blk.fibers[i].state;
      any_live |= s != DONE;
      if (s != DONE && s != AT_BLOCK_BARRIER) all_at_block = false;
    }
    if (!any_live) return true;
    if (all_at_block) { /* every live thread reached __syncthreads */
      unsigned done = 0;
      for (unsigned i = 0; i < n; i++) done += blk.fibers[i].state == DONE;
      if (done) { /* the same barrier for every thread, or none (CUDA's rule) */
        fprintf(stderr, "cuda_emu: %s: block (%u,%u,%u): divergent __syncthreads: %u threads wait at it, %u exited "
                "without reaching it\n", name, sbn_emu::block_idx.x, sbn_emu::block_idx.y, sbn_emu::block_idx.z,
                n - done, done);
        return false;
      }
      for (unsigned i = 0; i < n; i++)
        if (blk.fibers[i].state == AT_BLOCK_BARRIER) blk.fibers[i].state = RUNNABLE;
      continue;
    }
    if (!released && !ran) {
      unsigned at_block = 0, at_warp = 0;
      for (unsigned i = 0; i < n; i++)
        at_block += blk.fibers[i].state == AT_BLOCK_BARRIER, at_warp += blk.fibers[i].state == AT_WARP_BARRIER;
      fprintf(stderr, "cuda_emu: %s: block (%u,%u,%u) deadlocks: %u threads wait at __syncthreads, %u at a shuffle "
              "whose warp-mates went elsewhere\n", name, sbn_emu::block_idx.x, sbn_emu::block_idx.y,
              sbn_emu::block_idx.z, at_block, at_warp);
      return false;
    }
  }
}

void run_grid(const sbn_emu::Cfg &cfg, const std::function<void()> &body) {
  std::lock_guard<std::mutex> g(launch_mu);
  n_launches++;
  const unsigned n = cfg.block.x * cfg.block.y * cfg.block.z;
  if (blk.stacks.size() < n) {
    while (blk.stacks.size() < n) blk.stacks.push_back((char *)malloc(kStack));
    blk.fibers.resize(n);
  }
  blk.nthreads = n;
  blk.slot.assign(2 * (size_t)n, 0);
  blk.body = &body;
  sbn_emu::block_dim = cfg.block;
  sbn_emu::grid_dim = cfg.grid;
  for (unsigned z = 0; z < cfg.grid.z; z++)
    for (unsigned y = 0; y < cfg.grid.y; y++)
      for (unsigned x = 0; x < cfg.grid.x; x++) {
        sbn_emu::block_idx = uint3{x, y, z};
        if (!run_block(cfg.name)) {
          fail(cudaErrorLaunchFailure);
          sticky = cudaErrorLaunchFailure;
          sbn_emu::cur = nullptr;
          return;
        }
      }
  sbn_emu::cur = nullptr;
}

} /* namespace */

namespace sbn_emu {
Thread *cur = nullptr;
uint3 block_idx;
dim3 block_dim, grid_dim;

void syncthreads() {
  Fiber *f = self();
  f->state = AT_BLOCK_BARRIER;
  switch_to_sched(f);
}

/* Two slot arrays used in turn: a lane can write the next exchange's slots
 * while warp-mates still read this one's, and cannot come back to these
 * before all of them arrived at the next barrier (so have read them). */
void warp_exchange(uint64_t *v, int src) {
  Fiber *f = self();
  const unsigned i = (unsigned)(f - blk.fibers.data()), base = i / 32 * 32;
  uint64_t *slot = blk.slot.data() + (f->parity ? blk.nthreads : 0);
  f->parity ^= 1;
  slot[i] = *v;
  f->state = AT_WARP_BARRIER;
  switch_to_sched(f); /* every lane has published */
  *v = slot[base + (unsigned)src];
}

cudaError_t enqueue_work(cudaStream_t s, std::function<bool()> step) { return enqueue_step(s, std::move(step)); }
bool is_device(const void *p, size_t bytes) {
  Alloc a, b;
  return find(p, &a) && a.type == cudaMemoryTypeDevice && (!bytes || (find((const char *)p + bytes - 1, &b) &&
                                                                      b.type == cudaMemoryTypeDevice));
}

void launch(const Cfg &cfg, std::function<void()> body) {
  const unsigned long long threads = (unsigned long long)cfg.block.x * cfg.block.y * cfg.block.z;
  if (!cfg.grid.x || !cfg.grid.y || !cfg.grid.z || !threads || threads > 1024 || cfg.grid.y > 65535 ||
      cfg.grid.z > 65535 || cfg.shmem > 48 * 1024) {
    fail(cudaErrorInvalidConfiguration);
    return;
  }
  const Cfg c = cfg;
  enqueue(cfg.stream, [c, body]() { run_grid(c, body); });
}
} /* namespace sbn_emu */

/* ---- the runtime API ---- */

extern "C" {

unsigned long long sbn_emu_launches(void) { return n_launches; }

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
  if (!bytes) return true;
  Alloc a;
  if (!find(p, &a)) return false;
  Alloc b;
  return find((const char *)p + bytes - 1, &b);
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
  if (s->nonblocking) {
    std::lock_guard<std::mutex> g(streams_mu);
    for (size_t i = 0; i < streams.size(); i++)
      if (streams[i] == s) streams.erase(streams.begin() + (long)i);
  }
  delete s->graph;
  delete s;
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
