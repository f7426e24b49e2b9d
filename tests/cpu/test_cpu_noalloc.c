/* No heap allocation in the steady state: after the first step of a shape,
 * forward and backward allocate nothing, with 1 and 2 threads per rank
 * (OpenMP teams included), for float32 and bfloat16, a smaller shape after a
 * larger one, and 2 synchronized thread ranks.
 *
 * This binary defines malloc, calloc, realloc, free, posix_memalign,
 * aligned_alloc and memalign, which interposes them for the whole process
 * (the library and libgomp included), and counts calls while armed. They
 * forward to glibc's __libc_* entry points. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_data.h"

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static int armed;
static long n_alloc;
static void count(void) {
  if (__atomic_load_n(&armed, __ATOMIC_RELAXED)) __atomic_add_fetch(&n_alloc, 1, __ATOMIC_RELAXED);
}
void *malloc(size_t n) { count(); return __libc_malloc(n); }
void *calloc(size_t a, size_t b) { count(); return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { count(); return __libc_realloc(p, n); }
void free(void *p) { __libc_free(p); }
void *memalign(size_t al, size_t n) { count(); return __libc_memalign(al, n); }
void *aligned_alloc(size_t al, size_t n) { count(); return __libc_memalign(al, n); }
int posix_memalign(void **out, size_t al, size_t n) {
  count();
  void *p = __libc_memalign(al, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}

typedef struct arg {
  sbn_dtype dt;
  int P;
  long steady[2]; /* allocations during steps 2..5 per rank; then the smaller shape */
  long first;     /* allocations during step 1 (evidence that counting works) */
} arg;

static int step(sbn_bn *bn, int64_t n, void *buf[4], sbn_dtype dt) {
  int64_t sh[4] = {n, 32, 40, 40};
  sbn_tensor x = sbn_tensor_cpu(buf[0], 4, sh, dt, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_tensor y = sbn_tensor_cpu(buf[1], 4, sh, dt, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_tensor dy = sbn_tensor_cpu(buf[2], 4, sh, dt, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_tensor dx = sbn_tensor_cpu(buf[3], 4, sh, dt, SBN_LAYOUT_CHANNELS_FIRST);
  CHECK_OK(sbn_bn_forward(bn, &y, &x));
  CHECK_OK(sbn_bn_backward(bn, &dx, &dy, &x));
  return 0;
}

static int rank_fn(sbn_group *world, void *argp) {
  arg *a = argp;
  const int64_t N = 8, numel = N * 32 * 40 * 40; /* 409600 values: multi-threaded */
  void *buf[4];
  float *tmp = malloc((size_t)numel * 4);
  rng r = rng_seed(3 + (uint64_t)sbn_group_rank(world));
  for (int i = 0; i < 4; i++) {
    buf[i] = malloc((size_t)numel * dt_size(a->dt));
    for (int64_t j = 0; j < numel; j++) tmp[j] = (float)(1 + rng_normal(&r));
    to_storage(buf[i], tmp, numel, a->dt);
  }
  free(tmp);
  sbn_bn_options o = sbn_bn_options_default(32);
  sbn_bn *bn;
  CHECK_OK(sbn_bn_create(&bn, &o, a->P > 1 ? world : NULL));
  sbn_group_barrier(world);
  long before = __atomic_load_n(&n_alloc, __ATOMIC_RELAXED);
  if (step(bn, N, buf, a->dt)) return 1; /* first step of the shape: may allocate */
  sbn_group_barrier(world);
  long mid = __atomic_load_n(&n_alloc, __ATOMIC_RELAXED);
  for (int s = 0; s < 4; s++)
    if (step(bn, N, buf, a->dt)) return 1;
  sbn_group_barrier(world);
  long after = __atomic_load_n(&n_alloc, __ATOMIC_RELAXED);
  for (int s = 0; s < 3; s++)
    if (step(bn, N / 2, buf, a->dt)) return 1; /* smaller shape: scratch already fits */
  sbn_group_barrier(world);
  long end = __atomic_load_n(&n_alloc, __ATOMIC_RELAXED);
  if (sbn_group_rank(world) == 0) a->first = mid - before, a->steady[0] = after - mid, a->steady[1] = end - after;
  sbn_bn_destroy(bn);
  for (int i = 0; i < 4; i++) free(buf[i]);
  return 0;
}

int main(void) {
  int bad = 0;
  __atomic_store_n(&armed, 1, __ATOMIC_RELAXED);
  const sbn_dtype dts[] = {SBN_DTYPE_FLOAT32, SBN_DTYPE_BFLOAT16};
  for (int di = 0; di < 2; di++)
    for (int threads = 1; threads <= 2; threads++)
      for (int P = 1; P <= 2; P++) {
        sbn_set_num_threads(threads);
        arg a = {dts[di], P, {0, 0}, 0};
        sbn_status st = sbn_team_run(P, rank_fn, &a);
        printf("%s, %d rank(s) x %d thread(s): %ld allocation(s) in the first step (evidence), steady: %ld, smaller shape: %ld\n",
               dt_name(dts[di]), P, threads, a.first, a.steady[0], a.steady[1]);
        bad |= check("run status", st == SBN_STATUS_OK ? 0 : 1, 0);
        bad |= check("allocations in steps 2..5", (double)a.steady[0], 0);
        bad |= check("allocations with the smaller shape", (double)a.steady[1], 0);
      }
  /* the counter itself works */
  void *(*volatile alloc_fn)(size_t) = malloc; /* an opaque call the compiler cannot elide */
  long c0 = __atomic_load_n(&n_alloc, __ATOMIC_RELAXED);
  void *p = alloc_fn(16);
  long seen = __atomic_load_n(&n_alloc, __ATOMIC_RELAXED) - c0;
  free(p);
  bad |= check("counter sees a malloc (evidence: 1 - counted)", (double)(1 - seen), 0);
  printf(bad ? "\nALLOCATION CHECKS FAILED\n" : "\nno allocation in the steady state\n");
  return bad;
}
