/* The CPU emulation of CUDA, kernel side (cuda_emu.h): each CUDA thread of
 * a block is a fiber on its own stack, switched only at barriers, so that
 * __syncthreads and warp shuffles are real barriers and a divergent one is
 * found instead of hanging. */
#include <stdio.h>
#include <stdlib.h>

#include <mutex>
#include <vector>

#include "emu_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

using sbn_emu::set_last_error;
using sbn_emu::set_sticky_error;

namespace {

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
          set_last_error(cudaErrorLaunchFailure);
          set_sticky_error(cudaErrorLaunchFailure);
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

void launch(const Cfg &cfg, std::function<void()> body) {
  const unsigned long long threads = (unsigned long long)cfg.block.x * cfg.block.y * cfg.block.z;
  if (!cfg.grid.x || !cfg.grid.y || !cfg.grid.z || !threads || threads > 1024 || cfg.grid.y > 65535 ||
      cfg.grid.z > 65535 || cfg.shmem > 48 * 1024) {
    set_last_error(cudaErrorInvalidConfiguration);
    return;
  }
  const Cfg c = cfg;
  enqueue_work(cfg.stream, [c, body]() {
    run_grid(c, body);
    return true;
  });
}
} /* namespace sbn_emu */

