/* Internal: which path the MPI backend's sums took (tests and benchmarks
 * print it as evidence of the path exercised: integer lanes, binned sums, or
 * the two-rank exchange). */
#ifndef SBN_MPI_PATHS_H
#define SBN_MPI_PATHS_H

#include <stdint.h>

#include "comm.h"

enum { SBN_MPI_PATHS = 4 };

/* out[0]: sums done in integer lanes; out[1]: lanes whose terms did not all
 * fit, redone as binned sums; out[2]: binned sums (first call of a
 * collective, probes, groups too large for lanes); out[3]: sums of two
 * ranks exchanging raw values (mpi_pair.h). All 0 for a group of another
 * backend. */
void sbn_mpi_path_counts(const sbn_group *g, uint64_t out[SBN_MPI_PATHS]);

/* Test hook: turn the two-rank path on or off for group g (on takes effect
 * only with 2 ranks); returns whether it was on. Every rank of g must call
 * it at the same point of its sequence of collectives (it sends nothing).
 * SYNCBN_MPI_PAIR=0 turns it off for every group made afterwards. */
int sbn_mpi_set_pair(sbn_group *g, int on);

#endif
