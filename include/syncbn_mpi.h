/*
 * syncbn_mpi.h — the MPI process-group backend of syncbn.
 *
 * Kept apart from syncbn.h so that programs without MPI never see mpi.h.
 * Ranks are MPI processes (launched with mpirun); the same layer code
 * synchronizes over the caller's communicator:
 *
 *   MPI_Init(&argc, &argv);              // the caller's job, never syncbn's
 *   sbn_group *world;
 *   sbn_group_from_mpi(&world, MPI_COMM_WORLD);
 *   sbn_bn_create(&bn, &opt, world);     // as with any group
 *   ...
 *   sbn_bn_destroy(bn);
 *   sbn_group_destroy(world);            // before MPI_Finalize
 *   MPI_Finalize();
 *
 * The group works on a duplicate of the communicator (MPI_Comm_dup), so its
 * traffic never mixes with the caller's. Sub-groups: sbn_group_split (color,
 * key) and sbn_group_new (rank list), as for every backend. A library built
 * without MPI answers SBN_STATUS_NOT_BUILT.
 *
 * Faults (details at the top of src/comm/mpi.c): ranks that disagree on a
 * collective get SBN_STATUS_MISMATCH / SBN_STATUS_PEER_FAILED on every rank;
 * a rank that does not arrive within the group's timeout (SYNCBN_TIMEOUT,
 * sbn_group_set_timeout) makes the others fail with SBN_STATUS_TIMEOUT naming
 * the group, the collective and the missing ranks.
 */
#ifndef SYNCBN_MPI_H
#define SYNCBN_MPI_H

#include <mpi.h>

#include "syncbn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ABI-stable entry point: *comm points to an MPI_Comm and comm_size is
 * sizeof(MPI_Comm) (checked against the MPI the library was built with).
 * Collective over the communicator: every rank calls it. The communicator is
 * duplicated; MPI must be initialized (syncbn never calls MPI_Init).
 * Use sbn_group_from_mpi below rather than calling this directly. */
SBN_API sbn_status sbn_group_from_mpi_comm(sbn_group **out, const void *comm, size_t comm_size);

/* A group over the ranks of `comm` (rank and size as in comm). Release with
 * sbn_group_destroy, before MPI_Finalize. */
static inline sbn_status sbn_group_from_mpi(sbn_group **out, MPI_Comm comm) {
  return sbn_group_from_mpi_comm(out, &comm, sizeof comm);
}

#ifdef __cplusplus
}
#endif
#endif /* SYNCBN_MPI_H */
