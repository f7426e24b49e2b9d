/* Built only when the library has no MPI: the MPI constructor must exist
 * (programs link) and answer SBN_STATUS_NOT_BUILT with a message. No mpi.h
 * here, so the ABI entry point is declared by hand. */
#include <stdio.h>
#include <string.h>

#include "syncbn.h"

sbn_status sbn_group_from_mpi_comm(sbn_group **out, const void *comm, size_t comm_size);

int main(void) {
  sbn_group *g = (sbn_group *)&g; /* must be reset to NULL */
  long fake_comm = 0;
  sbn_status st = sbn_group_from_mpi_comm(&g, &fake_comm, sizeof fake_comm);
  int ok = st == SBN_STATUS_NOT_BUILT && g == NULL && strlen(sbn_last_error()) > 0;
  printf("library built without MPI: sbn_group_from_mpi -> %s (\"%s\"), group %s: %s\n", sbn_status_name(st),
         sbn_last_error(), g ? "not NULL" : "NULL", ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}
