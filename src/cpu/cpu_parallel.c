/* Threads within a rank: a small pool of helper threads per calling thread
 * (each rank of the threads backend has its own), created on first use and
 * kept (no allocation in the steady state).
 *
 * Why not OpenMP: a parallel region ends in a barrier that every thread of
 * the team must reach, so when the cores are shared (other ranks, other
 * processes) a pass waits for a worker the scheduler has not run yet, a
 * whole tick (4 ms on this kernel) for a pass that takes 0.1 ms. Here the
 * caller claims work itself and waits only for units that a helper has
 * actually claimed: a helper that wakes late finds nothing left and touches
 * nothing.
 *
 * A job is `grabs` pieces of `grain` units, claimed one at a time by a
 * compare-and-swap on one word (generation << 32 | next piece). A claim can
 * only succeed while its job is current, so the job's description, read
 * after a successful claim, is stable. Which thread runs a unit never
 * changes a result: units write their own partial sums, and the merge adds
 * them per channel in unit order. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "cpu_kern.h"

/* A helper watches for the next job this long before sleeping: the passes
 * of a layer follow each other within microseconds, a futex wake-up costs
 * tens of them. */
enum { MAX_HELPERS = 63, SPIN_NS = 50000 };

typedef struct job {
  sbn_kfn fn;
  const sbn_kargs *k;
  int64_t n, grain, grabs; /* grabs: read atomically (a late helper may race a refill) */
  int64_t done;            /* pieces finished (atomic) */
  int helpers;             /* helpers allowed to take part (atomic) */
} job;

typedef struct pool {
  uint64_t word;  /* generation << 32 | next piece (atomic) */
  uint32_t gen;   /* futex word: the current generation (atomic) */
  int sleepers;   /* helpers asleep on gen (atomic) */
  int quit;       /* atomic */
  job jobs[2];    /* job g lives in jobs[g & 1]; refilled only after job g - 1 ... g + 1 */
  uint32_t next_gen;
  int nhelpers;
  pthread_t tid[MAX_HELPERS];
} pool;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void futex_wait(uint32_t *addr, uint32_t val) {
#ifdef __linux__
  syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
#else
  (void)addr, (void)val;
  sched_yield();
#endif
}

static void futex_wake_all(uint32_t *addr) {
#ifdef __linux__
  syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
#else
  (void)addr;
#endif
}

/* Claim and run pieces of the current job until none is left. Returns
 * without touching anything if the job was not `helper`'s to help with. */
static void work(pool *p, int helper) {
  for (;;) {
    const uint64_t w = __atomic_load_n(&p->word, __ATOMIC_ACQUIRE);
    job *j = &p->jobs[(w >> 32) & 1];
    const int64_t i = (int64_t)(uint32_t)w;
    if (i >= __atomic_load_n(&j->grabs, __ATOMIC_RELAXED)) return;
    if (helper >= __atomic_load_n(&j->helpers, __ATOMIC_RELAXED)) return;
    if (!__atomic_compare_exchange_n(&p->word, &(uint64_t){w}, w + 1, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED))
      continue;
    /* claimed: the job stays current until this piece is done */
    const int64_t u0 = i * j->grain, u1 = u0 + j->grain < j->n ? u0 + j->grain : j->n;
    j->fn(j->k, u0, u1);
    __atomic_add_fetch(&j->done, 1, __ATOMIC_RELEASE);
  }
}

typedef struct helper_arg {
  pool *p;
  int id;
} helper_arg;

static void *helper_main(void *argp) {
  helper_arg a = *(helper_arg *)argp;
  free(argp);
  pool *p = a.p;
  uint32_t seen = 0;
  for (;;) {
    uint32_t g;
    int spins = 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while ((g = __atomic_load_n(&p->gen, __ATOMIC_ACQUIRE)) == seen && !__atomic_load_n(&p->quit, __ATOMIC_ACQUIRE)) {
      cpu_relax();
      if (++spins % 64) continue;
      clock_gettime(CLOCK_MONOTONIC, &t);
      if ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < SPIN_NS) continue;
      __atomic_add_fetch(&p->sleepers, 1, __ATOMIC_SEQ_CST);
      if (__atomic_load_n(&p->gen, __ATOMIC_SEQ_CST) == seen && !__atomic_load_n(&p->quit, __ATOMIC_SEQ_CST))
        futex_wait(&p->gen, seen);
      __atomic_sub_fetch(&p->sleepers, 1, __ATOMIC_SEQ_CST);
      clock_gettime(CLOCK_MONOTONIC, &t0);
    }
    if (__atomic_load_n(&p->quit, __ATOMIC_ACQUIRE)) return NULL;
    seen = g;
    work(p, a.id);
  }
}

/* One pool per calling thread, torn down when that thread exits. */
static pthread_key_t pool_key;
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static __thread pool *my_pool;

static void pool_destroy(void *argp) {
  pool *p = argp;
  __atomic_store_n(&p->quit, 1, __ATOMIC_SEQ_CST);
  __atomic_add_fetch(&p->gen, 1, __ATOMIC_SEQ_CST);
  futex_wake_all(&p->gen);
  for (int i = 0; i < p->nhelpers; i++) pthread_join(p->tid[i], NULL);
  free(p);
}
static void pool_key_init(void) { pthread_key_create(&pool_key, pool_destroy); }

/* The calling thread's pool with at least `helpers` helpers where possible
 * (fewer if threads cannot be created; the caller then does more itself). */
static pool *get_pool(int helpers) {
  pool *p = my_pool;
  if (!p) {
    pthread_once(&pool_once, pool_key_init);
    p = calloc(1, sizeof *p);
    if (!p) return NULL;
    my_pool = p;
    pthread_setspecific(pool_key, p);
  }
  if (helpers > MAX_HELPERS) helpers = MAX_HELPERS;
  while (p->nhelpers < helpers) {
    helper_arg *a = malloc(sizeof *a);
    if (!a) break;
    *a = (helper_arg){p, p->nhelpers};
    if (pthread_create(&p->tid[p->nhelpers], NULL, helper_main, a) != 0) {
      free(a);
      break;
    }
    p->nhelpers++;
  }
  return p;
}

/* Run one job on the pool and wait for every piece. */
static void pool_run(pool *p, int helpers, sbn_kfn fn, const sbn_kargs *k, int64_t n, int64_t grain) {
  const uint32_t g = ++p->next_gen;
  job *j = &p->jobs[g & 1];
  const int64_t grabs = (n + grain - 1) / grain;
  j->fn = fn, j->k = k, j->n = n, j->grain = grain;
  __atomic_store_n(&j->done, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&j->helpers, helpers, __ATOMIC_RELAXED);
  __atomic_store_n(&j->grabs, grabs, __ATOMIC_RELAXED);
  __atomic_store_n(&p->word, (uint64_t)g << 32, __ATOMIC_RELEASE);
  __atomic_store_n(&p->gen, g, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&p->sleepers, __ATOMIC_SEQ_CST) > 0) futex_wake_all(&p->gen);
  work(p, -1);
  for (int spins = 0; __atomic_load_n(&j->done, __ATOMIC_ACQUIRE) < grabs;)
    if (++spins < 1000) cpu_relax();
    else sched_yield(); /* a helper holding a piece was preempted: let it run */
}

void sbn_cpu_parallel_for(int threads, int64_t n, int64_t grain, sbn_kfn fn, const sbn_kargs *k,
                          sbn_kfn merge, int64_t nm) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  const int64_t grabs = (n + grain - 1) / grain;
  if (threads > grabs) threads = (int)grabs;
  pool *p = threads > 1 ? get_pool(threads - 1) : NULL;
  if (!p || p->nhelpers == 0) { /* one thread: no hand-off at all */
    fn(k, 0, n);
    if (merge) merge(k, 0, nm);
    return;
  }
  const int helpers = threads - 1 < p->nhelpers ? threads - 1 : p->nhelpers;
  pool_run(p, helpers, fn, k, n, grain);
  if (merge) { /* split among the threads when there is enough to add */
    const int64_t per = k->nck ? k->nck : ((k->rows + k->rb - 1) / k->rb + k->rg - 1) / k->rg; /* partials */
    const int64_t mg = (nm + helpers) / (helpers + 1);
    if (nm * per >= 16384 && nm >= 64) pool_run(p, helpers, merge, k, nm, mg < 32 ? 32 : mg);
    else merge(k, 0, nm);
  }
}
