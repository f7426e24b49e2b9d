/* Internal: which path the MPI backend's sums took (tests and benchmarks
 * print it as evidence that the integer-lane path is the one exercised). */
#ifndef SBN_MPI_PATHS_H
#define SBN_MPI_PATHS_H

#include <stdint.h>

#include "comm.h"

/* out[0]: sums done in integer lanes; out[1]: lanes whose terms did not all
 * fit, redone as binned sums; out[2]: binned sums (first call of a
 * collective, probes, groups too large for lanes). All 0 for a group of
 * another backend. */
void sbn_mpi_path_counts(const sbn_group *g, uint64_t out[3]);

#endif
