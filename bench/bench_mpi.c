/* Latency of the layer's collective over the MPI backend against raw MPI.
 *
 *   mpirun --oversubscribe -np P build/bench/syncbn-bench-mpi [batches] [calls]
 *   make bench-mpi            P = 2, 4, 8 in turn (see BENCHMARKS.md)
 *
 * For C in {64, 256, 1024, 4096}, the time per call of
 *   raw      MPI_Allreduce(MPI_SUM) of the forward's 2C+1 doubles on a
 *            duplicate communicator (the engine's blocking, tuned path);
 *   raw-nb   MPI_Iallreduce of the same doubles, polled with MPI_Test (the
 *            engine's nonblocking path, which a bounded wait needs);
 *   raw-p2p  (P = 2 only) MPI_Irecv + MPI_Isend of the same doubles plus
 *            the two-rank path's 32-byte header with the other rank, polled
 *            with MPI_Testall: the bytes and messages of syncbn's two-rank
 *            path without the copy, the sum and the signature check;
 *   syncbn   the layer's collective: sbn_comm_allreduce with the forward's
 *            signature, exactly what sbn_bn_forward calls between its passes
 *            (the backward's 2C doubles take the same path); at P = 2 the
 *            two-rank path (src/comm/mpi_pair.h) unless SYNCBN_MPI_PAIR=0;
 *   syncbn-off  the same with the two-rank path turned off (the same
 *            process, turned off and on around each batch): integer lanes
 *            or binned sums, as for P > 2;
 *   lanes    MPI_Allreduce(MPI_SUM) of the integer lanes syncbn sends (2
 *            int64 per value plus 10 control lanes): the bytes and the
 *            operation of syncbn's usual path through the engine's blocking
 *            call, without encoding, decoding and polling;
 *   lanes-nb the same lanes through MPI_Iallreduce polled with MPI_Test,
 *            from a separate send buffer as syncbn's: the floor of its
 *            path (its bytes and the engine's nonblocking call, which the
 *            bounded wait needs, and the same algorithm: an in-place call
 *            keeps Open MPI's libnbc on its binomial tree);
 *   binned   MPI_Allreduce of 2C+2 binned sums (24 bytes each) with the
 *            library's merge operation: the bytes syncbn's fallback path
 *            moves, the same way;
 * and which path syncbn's sums took (integer lanes / lanes redone as
 * binned sums because a term left its window / binned / two-rank). The buffer is
 * summed in place call after call and scaled by 1/P after each sum (exact
 * for P = 2, 4, 8), so every call sums the same values, as a training
 * loop's statistics stay similar from step to step; the methods that sum
 * (raw, raw-nb, syncbn, syncbn-off) all pay the scaling, n multiplies in
 * cache (under 1 us at C = 4096).
 * Each number: median over `batches` (default 200) of the mean of `calls`
 * (default 20) back-to-back calls after a barrier, on rank 0's clock; the
 * methods take turns batch by batch so load changes hit them alike. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/comm/comm.h" /* the layer's entry point into a group */
#include "../src/comm/exact_sum.h"
#include "../src/comm/mpi_paths.h"
#include "syncbn_mpi.h"

enum { M_RAW, M_RAWNB, M_P2P, M_LIB, M_LIBOFF, M_LANES, M_LANESNB, M_BINNED, M_COUNT };

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static MPI_Datatype xtype;
static MPI_Op xop;
static void xmerge(void *in, void *inout, int *len, MPI_Datatype *t) {
  (void)t;
  sbn_xsum_merge(inout, in, (size_t)*len);
}

/* Back to the values before the sum (exactly, for P a power of two). */
static void rescale(double *buf, size_t n, MPI_Comm comm) {
  int P;
  MPI_Comm_size(comm, &P);
  const double s = 1.0 / P;
  for (size_t i = 0; i < n; i++) buf[i] *= s;
}

typedef struct bufs { double *buf, *sb, *rb; sbn_xbin *x; int64_t *lanes, *lanes_s; } bufs;

static void run_op(int m, MPI_Comm comm, sbn_group *g, bufs *b, size_t n, int64_t C) {
  switch (m) {
    case M_RAW:
      MPI_Allreduce(MPI_IN_PLACE, b->buf, (int)n, MPI_DOUBLE, MPI_SUM, comm);
      rescale(b->buf, n, comm);
      break;
    case M_RAWNB: {
      MPI_Request r;
      MPI_Iallreduce(MPI_IN_PLACE, b->buf, (int)n, MPI_DOUBLE, MPI_SUM, comm, &r);
      for (int flag = 0; !flag;) MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
      rescale(b->buf, n, comm);
      break;
    }
    case M_P2P: { /* header (4 doubles) + values, one message each way */
      int P, rank;
      MPI_Comm_size(comm, &P), MPI_Comm_rank(comm, &rank);
      if (P != 2) break;
      MPI_Request r[2];
      memcpy(b->sb + 4, b->buf, 8 * n);
      MPI_Irecv(b->rb, (int)n + 4, MPI_DOUBLE, 1 - rank, 7, comm, &r[0]);
      MPI_Isend(b->sb, (int)n + 4, MPI_DOUBLE, 1 - rank, 7, comm, &r[1]);
      for (int flag = 0; !flag;) MPI_Testall(2, r, &flag, MPI_STATUSES_IGNORE);
      break;
    }
    case M_LIB:
    case M_LIBOFF: { /* exactly what bn.c's sync_sums does (its description formatted once per C) */
      static char what[80];
      static int64_t what_c = -1;
      if (what_c != C) snprintf(what, sizeof what, "forward of layer #0 (C=%lld, float32)", (long long)C), what_c = C;
      sbn_sig sig;
      sbn_sig_init_text(&sig, SBN_SIG_KIND_BN_FORWARD, 0, C, SBN_DTYPE_FLOAT32, what);
      const int was = m == M_LIBOFF ? sbn_mpi_set_pair(g, 0) : 0; /* every rank, same point: allowed */
      sbn_comm_allreduce(g, b->buf, n, SBN_DTYPE_FLOAT64, &sig);
      if (m == M_LIBOFF) sbn_mpi_set_pair(g, was);
      rescale(b->buf, n, comm);
      break;
    }
    case M_LANES:
      MPI_Allreduce(MPI_IN_PLACE, b->lanes, 2 * (int)n + 10, MPI_INT64_T, MPI_SUM, comm);
      break;
    case M_LANESNB: {
      MPI_Request r;
      MPI_Iallreduce(b->lanes_s, b->lanes, 2 * (int)n + 10, MPI_INT64_T, MPI_SUM, comm, &r);
      for (int flag = 0; !flag;) MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
      break;
    }
    case M_BINNED:
      MPI_Allreduce(MPI_IN_PLACE, b->x, (int)n + 1, xtype, xop, comm);
      break;
  }
}

/* Median µs per call of each method (valid on rank 0 of comm). */
static void measure(MPI_Comm comm, sbn_group *g, int64_t C, int batches, int calls, double *out) {
  const size_t n = (size_t)(2 * C + 1);
  bufs b;
  b.buf = malloc(8 * n);
  b.sb = calloc(n + 4, 8), b.rb = calloc(n + 4, 8);
  b.x = calloc(n + 1, sizeof *b.x);
  b.lanes = calloc(2 * n + 10, sizeof *b.lanes); /* zeros: sums stay zero over repeats */
  b.lanes_s = calloc(2 * n + 10, sizeof *b.lanes_s);
  double *t[M_COUNT];
  for (int m = 0; m < M_COUNT; m++) t[m] = malloc(sizeof(double) * (size_t)batches);
  for (size_t i = 0; i < n; i++) b.buf[i] = 1e-3 * (double)(i % 97);
  sbn_xsum_encode_f64(b.x + 1, b.buf, n);
  for (int warm = 0; warm < 50; warm++)
    for (int m = 0; m < M_COUNT; m++) run_op(m, comm, g, &b, n, C);
  for (int k = 0; k < batches; k++)
    for (int m = 0; m < M_COUNT; m++) {
      for (size_t i = 0; i < n; i++) b.buf[i] = 1e-3 * (double)(i % 97) + 1e-7 * k; /* a little change per batch */
      MPI_Barrier(comm);
      double t0 = MPI_Wtime();
      for (int c = 0; c < calls; c++) run_op(m, comm, g, &b, n, C);
      t[m][k] = (MPI_Wtime() - t0) / calls * 1e6;
    }
  for (int m = 0; m < M_COUNT; m++) {
    qsort(t[m], (size_t)batches, sizeof(double), cmp_d);
    out[m] = t[m][batches / 2];
    free(t[m]);
  }
  free(b.buf), free(b.sb), free(b.rb), free(b.x), free(b.lanes), free(b.lanes_s);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, P;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const int batches = argc > 1 ? atoi(argv[1]) : 200, calls = argc > 2 ? atoi(argv[2]) : 20;
  MPI_Type_contiguous(3, MPI_INT64_T, &xtype);
  MPI_Type_commit(&xtype);
  MPI_Op_create(xmerge, 1, &xop);
  static const int64_t Cs[] = {64, 256, 1024, 4096};
  if (rank == 0) {
    printf("syncbn MPI collective latency: %d ranks, median of %d batches x %d calls, us per call\n", P, batches, calls);
    printf("| ranks | C | payload (doubles) | raw MPI_Allreduce | raw MPI_Iallreduce | raw Isend+Irecv | syncbn | syncbn / raw "
           "| syncbn, two-rank path off | off / raw | lanes MPI_Allreduce | lanes MPI_Iallreduce | binned MPI_Allreduce | syncbn's sums: lanes / "
           "fallback / binned / two-rank |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  }
  MPI_Comm raw;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);
  sbn_group *g;
  if (sbn_group_from_mpi(&g, MPI_COMM_WORLD) != SBN_STATUS_OK) {
    fprintf(stderr, "rank %d: %s\n", rank, sbn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (int ci = 0; ci < 4; ci++) {
    double us[M_COUNT];
    uint64_t p0[SBN_MPI_PATHS], p1[SBN_MPI_PATHS];
    sbn_mpi_path_counts(g, p0);
    measure(raw, g, Cs[ci], batches, calls, us);
    sbn_mpi_path_counts(g, p1);
    if (rank == 0) {
      char p2p[32] = "-";
      if (P == 2) snprintf(p2p, sizeof p2p, "%.2f", us[M_P2P]);
      printf("| %d | %lld | %lld | %.2f | %.2f | %s | %.2f | %.2fx | %.2f | %.2fx | %.2f | %.2f | %.2f | %llu / %llu / %llu / %llu |\n",
             P, (long long)Cs[ci], (long long)(2 * Cs[ci] + 1), us[M_RAW], us[M_RAWNB], p2p, us[M_LIB], us[M_LIB] / us[M_RAW],
             us[M_LIBOFF], us[M_LIBOFF] / us[M_RAW], us[M_LANES], us[M_LANESNB], us[M_BINNED], (unsigned long long)(p1[0] - p0[0]),
             (unsigned long long)(p1[1] - p0[1]), (unsigned long long)(p1[2] - p0[2]), (unsigned long long)(p1[3] - p0[3]));
    }
    fflush(stdout);
  }
  sbn_group_destroy(g);
  MPI_Comm_free(&raw);
  MPI_Finalize();
  return 0;
}
