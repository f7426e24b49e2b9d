/* K layer collectives (the forward's 2C+1 doubles through sbn_comm_allreduce)
 * or K raw MPI_Iallreduce of the same doubles, and nothing else: run under
 * Open MPI's PML monitoring by bench/mpi_scaling.sh, which subtracts a K = 0
 * run to get the messages and bytes each rank sends per collective.
 *   mpirun -np P syncbn-bench-mpi-count lib|raw C K */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/comm/comm.h"
#include "syncbn_mpi.h"

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  const int lib = argc > 1 && strcmp(argv[1], "lib") == 0;
  const long long C = argc > 2 ? atoll(argv[2]) : 256;
  const int K = argc > 3 ? atoi(argv[3]) : 10;
  const size_t n = (size_t)(2 * C + 1);
  double *buf = calloc(n, sizeof *buf);
  sbn_group *g = NULL;
  if (lib && sbn_group_from_mpi(&g, MPI_COMM_WORLD) != SBN_STATUS_OK) {
    fprintf(stderr, "%s\n", sbn_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (int k = 0; k < K; k++) {
    for (size_t i = 0; i < n; i++) buf[i] = 1e-3 * (double)(i % 97);
    if (lib) {
      sbn_sig sig;
      sbn_sig_init(&sig, SBN_SIG_KIND_BN_FORWARD, 0, C, SBN_DTYPE_FLOAT32, "forward of layer #0 (C=%lld)", C);
      if (sbn_comm_allreduce(g, buf, n, SBN_DTYPE_FLOAT64, &sig) != SBN_STATUS_OK) MPI_Abort(MPI_COMM_WORLD, 2);
    } else {
      MPI_Request r;
      MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &r);
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    }
  }
  sbn_group_destroy(g);
  free(buf);
  MPI_Finalize();
  return 0;
}
