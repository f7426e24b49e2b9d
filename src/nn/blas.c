/* OpenBLAS threads per rank.
 *
 * OpenBLAS (Debian's pthreads build) runs every GEMM on as many threads as
 * the machine has cores. Thread ranks are already one thread per rank: P
 * ranks each starting a GEMM on all cores oversubscribe them P times, and
 * the small per-rank GEMMs of data-parallel training then run several times
 * slower than on one thread each (BENCHMARKS.md). So before each GEMM the
 * module layer gives OpenBLAS the same per-rank thread count as the CPU
 * kernels: sbn_set_num_threads / SYNCBN_NUM_THREADS when set, else the
 * usable cores divided among the thread ranks alive in this process (all
 * teams) times the MPI processes on this node (cpu_threads.c). One rank
 * alone keeps every core; four thread ranks on two cores get one each.
 *
 * openblas_set_num_threads is process-wide; it is called only when the
 * count changes (a team starts or ends), under a lock, and the ranks that
 * run at the same time all want the same count. */
#include <pthread.h>

#include "../comm/comm.h"
#include "../cpu/bn_kernels.h"
#include "blas.h"

static pthread_mutex_t blas_lock = PTHREAD_MUTEX_INITIALIZER;

int sbn_nn_blas_threads(void) { return sbn_cpu_threads(sbn_threads_ranks_in_process()); }

static void blas_prepare(void) {
  const int want = sbn_nn_blas_threads();
  if (openblas_get_num_threads() == want) return;
  pthread_mutex_lock(&blas_lock);
  if (openblas_get_num_threads() != want) openblas_set_num_threads(want);
  pthread_mutex_unlock(&blas_lock);
}

void sbn_nn_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int m, int n,
                  int k, float alpha, const float *a, int lda, const float *b, int ldb, float beta, float *c,
                  int ldc) {
  blas_prepare();
  cblas_sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
