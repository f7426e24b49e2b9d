/* Latency of the layer's collectives over the MPI backend against raw MPI.
 *
 *   mpirun --oversubscribe -np 4 build/bench/syncbn-bench-mpi [batches] [calls]
 *
 * In one run: for the world (P ranks) and for a group of its first 2 ranks
 * (the others sleep meanwhile), and C in {64, 256, 1024, 2048}, the time per
 * call of
 *   raw     MPI_Allreduce(MPI_SUM) of the same payload (2C+1 doubles for the
 *           forward, 2C for the backward) on a duplicate communicator;
 *   lib     the layer's collective: sbn_comm_allreduce with the layer's
 *           signature (what sbn_bn_forward/backward call between passes);
 *   nosig   the library's exchange without the signature: the same
 *           point-to-point pattern carrying the payload only, then the
 *           rank-ordered sum (so lib - nosig is the cost of the signature);
 *   gather  MPI_Allgather of the payload + rank-ordered sum (the textbook
 *           deterministic alternative).
 * Each number: median over `batches` (default 200) of the mean of `calls`
 * (default 20) back-to-back calls after a barrier, on rank 0's clock; the
 * methods take turns batch by batch so load changes hit them alike. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/comm/comm.h" /* the layer's entry point into a group */
#include "syncbn_mpi.h"

enum { M_RAW, M_LIB, M_NOSIG, M_GATHER, M_COUNT };

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct bufs { double *buf, *scratch, *rbuf; MPI_Request *reqs; } bufs;

static void ordered_sum(double *dst, const double *const *src, int P, size_t n) {
  for (size_t i = 0; i < n; i++) {
    double s = 0;
    for (int q = 0; q < P; q++) s += src[q][i];
    dst[i] = s;
  }
}

static void run_op(int m, MPI_Comm comm, sbn_group *g, bufs *b, size_t n, int64_t C, int fwd) {
  int P, me;
  MPI_Comm_size(comm, &P);
  MPI_Comm_rank(comm, &me);
  const double *src[64];
  switch (m) {
    case M_RAW:
      MPI_Allreduce(MPI_IN_PLACE, b->buf, (int)n, MPI_DOUBLE, MPI_SUM, comm);
      break;
    case M_LIB: { /* exactly what bn.c's sync_sums does */
      sbn_sig sig;
      sbn_sig_init(&sig, fwd ? SBN_SIG_KIND_BN_FORWARD : SBN_SIG_KIND_BN_BACKWARD, 0, C, SBN_DTYPE_FLOAT32,
                   "%s of layer #%d (C=%lld, float32)", fwd ? "forward" : "backward", 0, (long long)C);
      sbn_comm_allreduce(g, b->buf, n, SBN_DTYPE_FLOAT64, &sig);
      break;
    }
    case M_NOSIG: {
      int k = 0;
      for (int i = 1; i < P; i++) {
        int q = (me + P - i) % P;
        MPI_Irecv(b->rbuf + (size_t)q * n, (int)n, MPI_DOUBLE, q, 7, comm, &b->reqs[k++]);
      }
      for (int i = 1; i < P; i++) MPI_Isend(b->buf, (int)n, MPI_DOUBLE, (me + i) % P, 7, comm, &b->reqs[k++]);
      MPI_Waitall(k, b->reqs, MPI_STATUSES_IGNORE);
      for (int q = 0; q < P; q++) src[q] = q == me ? b->buf : b->rbuf + (size_t)q * n;
      ordered_sum(b->buf, src, P, n);
      break;
    }
    case M_GATHER:
      MPI_Allgather(b->buf, (int)n, MPI_DOUBLE, b->scratch, (int)n, MPI_DOUBLE, comm);
      for (int q = 0; q < P; q++) src[q] = b->scratch + (size_t)q * n;
      ordered_sum(b->buf, src, P, n);
      break;
  }
}

/* Median µs per call of each method (valid on rank 0 of comm). */
static void measure(MPI_Comm comm, sbn_group *g, int64_t C, int fwd, int batches, int calls, double *out) {
  int P;
  MPI_Comm_size(comm, &P);
  const size_t n = (size_t)(fwd ? 2 * C + 1 : 2 * C);
  bufs b;
  b.buf = malloc(8 * n), b.scratch = malloc(8 * n * (size_t)P), b.rbuf = malloc(8 * n * (size_t)P);
  b.reqs = malloc(sizeof(MPI_Request) * 2 * (size_t)P);
  double *t[M_COUNT];
  for (int m = 0; m < M_COUNT; m++) t[m] = malloc(sizeof(double) * (size_t)batches);
  for (int warm = 0; warm < 50; warm++)
    for (int m = 0; m < M_COUNT; m++) run_op(m, comm, g, &b, n, C, fwd);
  for (int k = 0; k < batches; k++)
    for (int m = 0; m < M_COUNT; m++) {
      for (size_t i = 0; i < n; i++) b.buf[i] = 1e-3 * (double)(i % 97); /* small values: no overflow over repeats */
      MPI_Barrier(comm);
      double t0 = MPI_Wtime();
      for (int c = 0; c < calls; c++) run_op(m, comm, g, &b, n, C, fwd);
      t[m][k] = (MPI_Wtime() - t0) / calls * 1e6;
    }
  for (int m = 0; m < M_COUNT; m++) {
    qsort(t[m], (size_t)batches, sizeof(double), cmp_d);
    out[m] = t[m][batches / 2];
    free(t[m]);
  }
  free(b.buf), free(b.scratch), free(b.rbuf), free(b.reqs);
}

/* Ranks outside the measured group wait here without using a core. */
static void idle_wait(MPI_Comm world) {
  MPI_Request r;
  MPI_Ibarrier(world, &r);
  for (int flag = 0; !flag;) {
    MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
    struct timespec ts = {0, 1000000L};
    if (!flag) nanosleep(&ts, NULL);
  }
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, P;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const int batches = argc > 1 ? atoi(argv[1]) : 200, calls = argc > 2 ? atoi(argv[2]) : 20;
  static const int64_t Cs[] = {64, 256, 1024, 2048};
  if (rank == 0) {
    printf("syncbn MPI collective latency: %d ranks in the job, median of %d batches x %d calls, us per call\n",
           P, batches, calls);
    printf("| ranks | C | pass | payload (doubles) | raw MPI_Allreduce | syncbn | overhead | no-sig exchange | signature cost | Allgather+sum |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
  }
  int sizes[2] = {2, P}, nsizes = P > 2 ? 2 : 1;
  for (int si = 0; si < nsizes; si++) {
    const int np = sizes[si];
    MPI_Comm comm;
    MPI_Comm_split(MPI_COMM_WORLD, rank < np ? 0 : MPI_UNDEFINED, rank, &comm);
    if (rank < np) {
      MPI_Comm raw;
      MPI_Comm_dup(comm, &raw);
      sbn_group *g;
      if (sbn_group_from_mpi(&g, comm) != SBN_STATUS_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, sbn_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      for (int ci = 0; ci < 4; ci++)
        for (int fwd = 1; fwd >= 0; fwd--) {
          double us[M_COUNT];
          measure(raw, g, Cs[ci], fwd, batches, calls, us);
          if (rank == 0)
            printf("| %d | %lld | %s | %lld | %.2f | %.2f | %+.0f%% | %.2f | %+.2f | %.2f |\n", np, (long long)Cs[ci],
                   fwd ? "forward" : "backward", (long long)(fwd ? 2 * Cs[ci] + 1 : 2 * Cs[ci]), us[M_RAW], us[M_LIB],
                   100 * (us[M_LIB] / us[M_RAW] - 1), us[M_NOSIG], us[M_LIB] - us[M_NOSIG], us[M_GATHER]);
          fflush(stdout);
        }
      sbn_group_destroy(g);
      MPI_Comm_free(&raw);
      MPI_Comm_free(&comm);
    }
    idle_wait(MPI_COMM_WORLD); /* (a nonblocking barrier only matches another one) */
  }
  MPI_Finalize();
  return 0;
}
