/* Persistent all-reduce requests (see mpi_reqs.h); empty without MPI. */
#if SBN_WITH_MPI
#include "mpi_reqs.h"

#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#endif

#if MPI_VERSION >= 4
#define ALLREDUCE_INIT MPI_Allreduce_init
#elif defined(OMPI_HAVE_MPI_EXT_PCOLLREQ) && OMPI_HAVE_MPI_EXT_PCOLLREQ
#define ALLREDUCE_INIT MPIX_Allreduce_init
#endif

void sbn_mpi_reqs_init(sbn_mpi_reqs *r) {
  for (int i = 0; i < SBN_MPI_REQS_SLOTS; i++) r->slot[i].count = -1, r->slot[i].req = MPI_REQUEST_NULL;
  r->next = 0;
}

int sbn_mpi_reqs_start(sbn_mpi_reqs *r, const void *sendbuf, void *recvbuf, int count, MPI_Datatype type,
                       MPI_Op op, MPI_Comm comm, MPI_Request **req, const char **call) {
#ifdef ALLREDUCE_INIT
  for (int i = 0; i < SBN_MPI_REQS_SLOTS; i++)
    if (r->slot[i].count == count && r->slot[i].type == type && r->slot[i].req != MPI_REQUEST_NULL) {
      *req = &r->slot[i].req;
      *call = "MPI_Start";
      return MPI_Start(*req);
    }
  const int i = r->next;
  r->next = (r->next + 1) % SBN_MPI_REQS_SLOTS;
  if (r->slot[i].req != MPI_REQUEST_NULL) MPI_Request_free(&r->slot[i].req);
  r->slot[i].count = count, r->slot[i].type = type;
  *call = "MPI_Allreduce_init";
  int rc = ALLREDUCE_INIT(sendbuf, recvbuf, count, type, op, comm, MPI_INFO_NULL, &r->slot[i].req);
  if (rc != MPI_SUCCESS) {
    r->slot[i].req = MPI_REQUEST_NULL, r->slot[i].count = -1;
    return rc;
  }
  *req = &r->slot[i].req;
  *call = "MPI_Start";
  return MPI_Start(*req);
#else
  *call = "MPI_Iallreduce";
  *req = &r->plain;
  return MPI_Iallreduce(sendbuf, recvbuf, count, type, op, comm, *req);
#endif
}

void sbn_mpi_reqs_clear(sbn_mpi_reqs *r) {
  for (int i = 0; i < SBN_MPI_REQS_SLOTS; i++)
    if (r->slot[i].req != MPI_REQUEST_NULL) MPI_Request_free(&r->slot[i].req), r->slot[i].count = -1;
}

#else
typedef int sbn_mpi_reqs_unused; /* ISO C: no empty translation unit */
#endif
