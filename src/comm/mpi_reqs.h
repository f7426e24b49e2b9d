/* Internal (MPI backend): persistent all-reduce requests, so that the
 * engine builds a reduction's schedule once per (count, datatype) instead
 * of on every call (MPI-4 MPI_Allreduce_init, or Open MPI's MPIX_ version
 * from mpi-ext.h; without either every call is a plain MPI_Iallreduce).
 *
 * Creating a persistent collective request is ordered like a collective
 * call (Open MPI takes the schedule's tag then), so every rank must create
 * and drop them at the same points: the cache's contents are a function of
 * the sequence of (count, datatype) requested and of sbn_mpi_reqs_clear
 * calls, which the caller makes at agreed points only. */
#ifndef SBN_MPI_REQS_H
#define SBN_MPI_REQS_H

#include <mpi.h>

enum { SBN_MPI_REQS_SLOTS = 8 };

typedef struct sbn_mpi_reqs {
  struct { int count; MPI_Datatype type; MPI_Request req; } slot[SBN_MPI_REQS_SLOTS];
  int next;          /* the slot replaced next (round robin: the same on every rank) */
  MPI_Request plain; /* without persistent collectives */
} sbn_mpi_reqs;

void sbn_mpi_reqs_init(sbn_mpi_reqs *r);
/* Start an all-reduce of sendbuf into recvbuf (the same buffers every call
 * until the next clear); *req gets the request to test: a persistent one
 * (left inactive when it completes) or a plain nonblocking one. Returns an
 * MPI error code; *call names the call that failed. */
int sbn_mpi_reqs_start(sbn_mpi_reqs *r, const void *sendbuf, void *recvbuf, int count, MPI_Datatype type,
                       MPI_Op op, MPI_Comm comm, MPI_Request **req, const char **call);
/* Free every (inactive) persistent request: the buffers move, or the
 * communicator goes. */
void sbn_mpi_reqs_clear(sbn_mpi_reqs *r);

#endif
