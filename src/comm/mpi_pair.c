/* The two-rank exchange (see mpi_pair.h); empty without MPI. */
#if SBN_WITH_MPI
#include "mpi_pair.h"

#include <stdlib.h>
#include <string.h>

enum { HDR = sizeof(sbn_mpi_pair_hdr) };

void sbn_mpi_pair_init(sbn_mpi_pair *p, MPI_Comm comm, int peer) {
  memset(p, 0, sizeof *p);
  p->comm = comm, p->peer = peer;
  sbn_mpi_preq *all[] = {&p->send[0], &p->send[1], &p->recv, &p->send2[0], &p->send2[1], &p->recv2};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) all[i]->bytes = -1, all[i]->req = MPI_REQUEST_NULL;
  for (int i = 0; i < 4; i++) p->act[i] = MPI_REQUEST_NULL;
}

static void drop(sbn_mpi_preq *r) {
  if (r->req != MPI_REQUEST_NULL) MPI_Request_free(&r->req);
  r->bytes = -1;
}

void sbn_mpi_pair_clear(sbn_mpi_pair *p) {
  drop(&p->send[0]), drop(&p->send[1]), drop(&p->recv);
  drop(&p->send2[0]), drop(&p->send2[1]), drop(&p->recv2);
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

/* A persistent request of `bytes` at `off` in its buffer, made when they
 * changed. */
static int ensure_req(sbn_mpi_pair *p, sbn_mpi_preq *r, int bytes, size_t off, int is_send, int tag,
                      const char **call) {
  if (r->bytes == bytes && r->off == off && r->req != MPI_REQUEST_NULL) return MPI_SUCCESS;
  drop(r);
  *call = is_send ? "MPI_Send_init" : "MPI_Recv_init";
  int rc = is_send ? MPI_Send_init(p->sb + off, bytes, MPI_BYTE, p->peer, tag, p->comm, &r->req)
                   : MPI_Recv_init(p->rb + off, bytes, MPI_BYTE, p->peer, tag, p->comm, &r->req);
  if (rc != MPI_SUCCESS) {
    r->req = MPI_REQUEST_NULL;
    return rc;
  }
  r->bytes = bytes, r->off = off;
  return MPI_SUCCESS;
}

/* Values in the first message of a split exchange for `expect` predicted
 * values (0: one message). Both ranks compute it from the agreed
 * prediction; each part is at most SBN_MPI_PAIR_EAGER bytes even as 8-byte
 * values (what a receive must allow). */
static size_t split_at(size_t expect) {
  const size_t a = (expect + 1) / 2;
  if (HDR + 8 * expect <= SBN_MPI_PAIR_EAGER || HDR + 8 * a > SBN_MPI_PAIR_EAGER) return 0;
  return a;
}

int sbn_mpi_pair_start(sbn_mpi_pair *p, const sbn_mpi_pair_hdr *h, const void *vals, size_t n, size_t esize,
                       size_t expect, const char **call) {
  const size_t a = split_at(expect); /* values in the first message (split exchanges) */
  const size_t sbytes = HDR + (vals ? n * esize : 0), rbytes = HDR + 8 * expect;
  if (!reserve(p, sbytes > rbytes ? sbytes : rbytes)) return SBN_MPI_PAIR_NOMEM;
  memcpy(p->sb, h, HDR);
  if (vals) memcpy(p->sb + HDR, vals, n * esize);
  sbn_mpi_preq *s = &p->send[vals ? 0 : 1];
  const size_t s1 = a && vals ? HDR + a * esize : sbytes, r1 = a ? HDR + 8 * a : rbytes;
  int rc = ensure_req(p, s, (int)s1, 0, 1, SBN_MPI_PAIR_TAG, call);
  if (rc == MPI_SUCCESS) rc = ensure_req(p, &p->recv, (int)r1, 0, 0, SBN_MPI_PAIR_TAG, call);
  if (rc != MPI_SUCCESS) return rc;
  p->act[0] = p->recv.req; /* the receives first: a message finds its receive posted */
  p->nact = 1;
  p->split = a, p->esize = esize; /* the second part lands after room for a 8-byte values */
  sbn_mpi_preq *s2 = &p->send2[vals ? 0 : 1]; /* a split's second message: the rest, or empty */
  if (a) {
    rc = ensure_req(p, s2, vals ? (int)(sbytes - s1) : 0, s1, 1, SBN_MPI_PAIR_TAG2, call);
    if (rc == MPI_SUCCESS) rc = ensure_req(p, &p->recv2, (int)(8 * (expect - a)), HDR + 8 * a, 0, SBN_MPI_PAIR_TAG2, call);
    if (rc != MPI_SUCCESS) return rc;
    p->act[p->nact++] = p->recv2.req;
  }
  p->act[p->nact++] = s->req;
  if (a) p->act[p->nact++] = s2->req;
  *call = "MPI_Startall";
  return MPI_Startall(p->nact, p->act);
}

int sbn_mpi_pair_start_values(sbn_mpi_pair *p, const void *vals, size_t bytes, const char **call) {
  if (!reserve(p, HDR + bytes)) return SBN_MPI_PAIR_NOMEM;
  memcpy(p->sb + HDR, vals, bytes); /* MPI never holds the caller's buffer (a timed-out send may stay in flight) */
  *call = "MPI_Irecv";
  p->nact = 2, p->split = 0;
  int rc = MPI_Irecv(p->rb + HDR, (int)bytes, MPI_BYTE, p->peer, SBN_MPI_PAIR_TAG, p->comm, &p->act[0]);
  if (rc != MPI_SUCCESS) return rc;
  *call = "MPI_Isend";
  return MPI_Isend(p->sb + HDR, (int)bytes, MPI_BYTE, p->peer, SBN_MPI_PAIR_TAG, p->comm, &p->act[1]);
}

const void *sbn_mpi_pair_peer_values(sbn_mpi_pair *p, size_t n) {
  if (p->split && p->esize < 8 && n > p->split) { /* join a split exchange's parts */
    unsigned char *v = p->rb + HDR;
    memmove(v + p->split * p->esize, v + p->split * 8, (n - p->split) * p->esize);
  }
  p->split = 0;
  return p->rb + HDR;
}

#else
typedef int sbn_mpi_pair_unused; /* ISO C: no empty translation unit */
#endif
