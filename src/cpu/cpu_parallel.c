/* Threads within a rank: OpenMP, one contiguous range of work units per
 * thread. Each calling thread (each rank of the threads backend) gets its own
 * OpenMP team, reused from call to call (no allocation in the steady state).
 * Which thread runs a unit never changes a result: units write their own
 * partial sums and the driver merges them in unit order. */
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu_kern.h"

void sbn_cpu_parallel_for(int threads, int64_t n, sbn_kfn fn, const sbn_kargs *k) {
  if (n <= 0) return;
  if (threads > n) threads = (int)n;
  if (threads <= 1) { /* no team at all: no thread hand-off, no spinning workers */
    fn(k, 0, n);
    return;
  }
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t b = n * t / nt, e = n * (t + 1) / nt;
    if (b < e) fn(k, b, e);
  }
#else /* built without OpenMP (the TSan build, mk/sanitize.mk): one thread, same bits */
  fn(k, 0, n);
#endif
}
