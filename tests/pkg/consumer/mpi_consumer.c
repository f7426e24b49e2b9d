/* An MPI program built against the INSTALLED libsyncbn_mpi + libsyncbn
 * (tests/pkg/test_install.sh runs it under mpirun): one SyncBatchNorm
 * forward over the ranks, checked against a float64 reference of the
 * concatenated batch, and an error raised inside libsyncbn_mpi (a wrong
 * sizeof(MPI_Comm)) must be readable through libsyncbn's sbn_last_error(),
 * i.e. both libraries share one last-error state. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <syncbn_mpi.h>

enum { C = 3, NMAX = 4 };

static double xval(int r, int n, int c) { return 5.0 * c + (1 + c) * cos(1.3 * r + 0.7 * n + 0.2 * c); }
static int n_of(int r) { return 1 + r % NMAX; }

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1, fails = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  sbn_group *bad = NULL, *world = NULL;
  MPI_Comm comm = MPI_COMM_WORLD;
  sbn_status st = sbn_group_from_mpi_comm(&bad, &comm, sizeof comm + 1);
  if (st != SBN_STATUS_INVALID_ARGUMENT || !strstr(sbn_last_error(), "sizeof(MPI_Comm)")) {
    printf("rank %d FAIL: wrong comm size gave %s, last error '%s'\n", rank, sbn_status_name(st), sbn_last_error());
    fails++;
  }
  st = sbn_group_from_mpi(&world, MPI_COMM_WORLD);
  if (st != SBN_STATUS_OK || strcmp(sbn_group_backend(world), "mpi") != 0) {
    printf("rank %d FAIL: sbn_group_from_mpi: %s: %s\n", rank, sbn_status_name(st), sbn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  const int n = n_of(rank);
  float x[NMAX * C], y[NMAX * C];
  for (int i = 0; i < n; i++)
    for (int c = 0; c < C; c++) x[i * C + c] = (float)xval(rank, i, c);
  int64_t shape[2] = {n, C};
  sbn_tensor tx = sbn_tensor_cpu(x, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_tensor ty = sbn_tensor_cpu(y, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_bn_options opt = sbn_bn_options_default(C);
  sbn_bn *bn = NULL;
  st = sbn_bn_create(&bn, &opt, world);
  if (st == SBN_STATUS_OK) st = sbn_bn_forward(bn, &ty, &tx);
  double err = INFINITY;
  if (st == SBN_STATUS_OK) {
    err = 0;
    for (int c = 0; c < C; c++) {
      double s = 0, s2 = 0, cnt = 0;
      for (int r = 0; r < size; r++)
        for (int i = 0; i < n_of(r); i++) s += xval(r, i, c), cnt++;
      double mean = s / cnt;
      for (int r = 0; r < size; r++)
        for (int i = 0; i < n_of(r); i++) s2 += pow(xval(r, i, c) - mean, 2);
      for (int i = 0; i < n; i++)
        err = fmax(err, fabs(y[i * C + c] - (xval(rank, i, c) - mean) / sqrt(s2 / cnt + opt.eps)));
    }
  } else {
    printf("rank %d: %s: %s\n", rank, sbn_status_name(st), sbn_last_error());
  }
  /* y is O(1); float32 storage of x (|x| <= 13) costs ~1e-6: tol 1e-4. */
  printf("rank %d of %d (N = %d): SyncBatchNorm over MPI, max |y - ref| = %.2e (tol 1e-4)\n", rank, size, n, err);
  if (!(err <= 1e-4)) fails++;
  sbn_bn_destroy(bn);
  sbn_group_destroy(world);
  int all = 0;
  MPI_Allreduce(&fails, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return all ? 1 : 0;
}
