/* The two-rank exchange (see mpi_pair.h); empty without MPI. */
#if SBN_WITH_MPI
#include "mpi_pair.h"

#include <stdlib.h>
#include <string.h>

enum { HDR = sizeof(sbn_mpi_pair_hdr) };

void sbn_mpi_pair_init(sbn_mpi_pair *p, MPI_Comm comm, int peer) {
  memset(p, 0, sizeof *p);
  p->comm = comm, p->peer = peer;
  p->send[0].bytes = p->send[1].bytes = p->recv.bytes = -1;
  p->send[0].req = p->send[1].req = p->recv.req = MPI_REQUEST_NULL;
  p->act[0] = p->act[1] = MPI_REQUEST_NULL;
}

static void drop(sbn_mpi_preq *r) {
  if (r->req != MPI_REQUEST_NULL) MPI_Request_free(&r->req);
  r->bytes = -1;
}

void sbn_mpi_pair_clear(sbn_mpi_pair *p) {
  drop(&p->send[0]), drop(&p->send[1]), drop(&p->recv);
}

void sbn_mpi_pair_free(sbn_mpi_pair *p) {
  free(p->sb), free(p->rb);
  p->sb = p->rb = NULL, p->cap = 0;
}

/* Room for `bytes` in each buffer; the persistent requests name the old
 * buffers, so they go (inactive: called between exchanges only). */
static int reserve(sbn_mpi_pair *p, size_t bytes) {
  if (bytes <= p->cap) return 1;
  sbn_mpi_pair_clear(p);
  unsigned char *s = realloc(p->sb, bytes);
  if (!s) return 0;
  p->sb = s;
  unsigned char *r = realloc(p->rb, bytes);
  if (!r) return 0;
  p->rb = r, p->cap = bytes;
  return 1;
}

/* A persistent request of `bytes`, made when the size changed. */
static int ensure_req(sbn_mpi_pair *p, sbn_mpi_preq *r, int bytes, int is_send, const char **call) {
  if (r->bytes == bytes && r->req != MPI_REQUEST_NULL) return MPI_SUCCESS;
  drop(r);
  *call = is_send ? "MPI_Send_init" : "MPI_Recv_init";
  int rc = is_send ? MPI_Send_init(p->sb, bytes, MPI_BYTE, p->peer, SBN_MPI_PAIR_TAG, p->comm, &r->req)
                   : MPI_Recv_init(p->rb, bytes, MPI_BYTE, p->peer, SBN_MPI_PAIR_TAG, p->comm, &r->req);
  if (rc != MPI_SUCCESS) {
    r->req = MPI_REQUEST_NULL;
    return rc;
  }
  r->bytes = bytes;
  return MPI_SUCCESS;
}

int sbn_mpi_pair_start(sbn_mpi_pair *p, const sbn_mpi_pair_hdr *h, const void *vals, size_t n, size_t esize,
                       size_t expect, const char **call) {
  const size_t sbytes = HDR + (vals ? n * esize : 0), rbytes = HDR + 8 * expect;
  if (!reserve(p, sbytes > rbytes ? sbytes : rbytes)) return SBN_MPI_PAIR_NOMEM;
  memcpy(p->sb, h, HDR);
  if (vals) memcpy(p->sb + HDR, vals, n * esize);
  sbn_mpi_preq *s = &p->send[vals ? 0 : 1];
  int rc = ensure_req(p, s, (int)sbytes, 1, call);
  if (rc == MPI_SUCCESS) rc = ensure_req(p, &p->recv, (int)rbytes, 0, call);
  if (rc != MPI_SUCCESS) return rc;
  p->act[0] = p->recv.req, p->act[1] = s->req; /* the receive first: the message finds it posted */
  *call = "MPI_Startall";
  return MPI_Startall(2, p->act);
}

int sbn_mpi_pair_start_values(sbn_mpi_pair *p, const void *vals, size_t bytes, const char **call) {
  if (!reserve(p, HDR + bytes)) return SBN_MPI_PAIR_NOMEM;
  memcpy(p->sb + HDR, vals, bytes); /* MPI never holds the caller's buffer (a timed-out send may stay in flight) */
  *call = "MPI_Irecv";
  int rc = MPI_Irecv(p->rb + HDR, (int)bytes, MPI_BYTE, p->peer, SBN_MPI_PAIR_TAG, p->comm, &p->act[0]);
  if (rc != MPI_SUCCESS) return rc;
  *call = "MPI_Isend";
  return MPI_Isend(p->sb + HDR, (int)bytes, MPI_BYTE, p->peer, SBN_MPI_PAIR_TAG, p->comm, &p->act[1]);
}

#else
typedef int sbn_mpi_pair_unused; /* ISO C: no empty translation unit */
#endif
