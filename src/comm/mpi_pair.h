/* Internal (MPI backend): the two-rank exchange behind its sums at P = 2.
 *
 * With two ranks an exact sum needs no exact format on the wire: each rank
 * sends the other its raw terms (8 or 4 bytes per value, one message each
 * way, like the engine's own all-reduce at P = 2) and computes the pair's
 * sum itself, exactly, rounded once (sbn_xsum_pair_sum_*). That sum is
 * commutative, so both ranks get the same bits, the binned sum's.
 *
 * A message is a header (the signature's fingerprint, this rank's count,
 * status and value size), then, when the sender's count is the predicted
 * one, its values. Each rank posts a receive for the header plus the
 * predicted count of 8-byte values, so an incoming message never exceeds
 * it (a rank with another count sends its header alone). Both are
 * persistent requests, made once per size and started together; values
 * that could not go inline follow in a second exchange, in pieces of at
 * most SBN_MPI_PAIR_MAX values.
 *
 * A message a little over the transport's eager limit (Open MPI's shared
 * memory: 4 KiB with its own header) goes as two eager messages instead of
 * one rendezvous: two 2 KiB messages took 2.9-3.5 us where one of 4.1-7 KiB
 * took 4.1 us (P = 2, measured). Both ranks split alike, since the split
 * follows the predicted count (agreed), not the values sent: a rank that
 * sends its header alone sends an empty second message. Second parts have
 * their own tag, so each matches its own receive whatever order the
 * requests start in. Messages use their own tag on the group's
 * private communicator (no user traffic; the control channel has another
 * tag; collectives do not match point-to-point messages), and MPI keeps
 * messages between two ranks on one tag in order, so an exchange matches
 * the peer's exchange of the same collective. The waiting, the signature
 * check and the fault handling are the caller's (mpi.c). */
#ifndef SBN_MPI_PAIR_H
#define SBN_MPI_PAIR_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

enum {
  SBN_MPI_PAIR_TAG = 0x5b03,
  SBN_MPI_PAIR_TAG2 = 0x5b04, /* second parts (MPI_Startall starts its requests in any order) */
  SBN_MPI_PAIR_MAX = 1 << 20, /* values per message (8 MiB of float64) */
  SBN_MPI_PAIR_EAGER = 4032,  /* bytes a message may have and stay eager (Open MPI's shared-memory
                                 limit, 4096, less its fragment header) */
  SBN_MPI_PAIR_NOMEM = -1     /* returned instead of an MPI error code */
};

typedef struct sbn_mpi_pair_hdr {
  uint64_t hash;  /* the signature's fingerprint */
  int64_t count;  /* values this rank sums (0: none, or a local error) */
  int32_t status; /* this rank's local status */
  int32_t esize;  /* bytes per value: 8 (float64) or 4 (float32) */
  uint64_t magic; /* SBN_MPI_PAIR_MAGIC; pads the header to 32 bytes */
} sbn_mpi_pair_hdr;

#define SBN_MPI_PAIR_MAGIC UINT64_C(0x73796e63626e7032) /* "syncbnp2" */

typedef struct sbn_mpi_preq {
  int bytes;  /* -1: none */
  size_t off; /* where in its buffer */
  MPI_Request req;
} sbn_mpi_preq;

typedef struct sbn_mpi_pair {
  MPI_Comm comm;
  int peer;
  unsigned char *sb, *rb; /* send and receive buffers: header, then values */
  size_t cap;             /* bytes of each */
  sbn_mpi_preq send[2];   /* persistent sends: [0] header and values, [1] header alone */
  sbn_mpi_preq recv;      /* persistent receive: header and up to the predicted values */
  sbn_mpi_preq send2[2];  /* split exchanges' second messages: [0] the rest of the values, [1] empty */
  sbn_mpi_preq recv2;     /* and their receive */
  MPI_Request act[4];     /* the exchange in flight: receives, then sends */
  int nact;               /* how many of act */
  size_t split, esize;    /* a split exchange: values in the first part, bytes per value */
} sbn_mpi_pair;

void sbn_mpi_pair_init(sbn_mpi_pair *p, MPI_Comm comm, int peer);
/* Start an exchange of headers: h, then `n` values of esize bytes from
 * vals inline (vals NULL: the header alone; else n == expect); the receive
 * takes the peer's header and up to `expect` values of esize bytes (the
 * peer's are at most 8). Afterwards wait for the p->nact requests p->act. Returns MPI_SUCCESS, an MPI error code (*call
 * names the call) or SBN_MPI_PAIR_NOMEM (nothing started). */
int sbn_mpi_pair_start(sbn_mpi_pair *p, const sbn_mpi_pair_hdr *h, const void *vals, size_t n, size_t esize,
                       size_t expect, const char **call);
/* Start an exchange of `bytes` of values (both ranks the same; at most
 * 8 SBN_MPI_PAIR_MAX), after the headers agreed; then wait for p->act as
 * above. Same returns. */
int sbn_mpi_pair_start_values(sbn_mpi_pair *p, const void *vals, size_t bytes, const char **call);
/* After an exchange completed: the peer's header (header exchange only),
 * and its `n` values (once the headers agree: same count and value size;
 * this joins the parts of a split exchange). */
static inline const sbn_mpi_pair_hdr *sbn_mpi_pair_peer(const sbn_mpi_pair *p) {
  return (const sbn_mpi_pair_hdr *)(const void *)p->rb;
}
const void *sbn_mpi_pair_peer_values(sbn_mpi_pair *p, size_t n);
/* Free the persistent requests (none in flight: every exchange completed). */
void sbn_mpi_pair_clear(sbn_mpi_pair *p);
/* Free the buffers (after clear, or when MPI is finalized). */
void sbn_mpi_pair_free(sbn_mpi_pair *p);

#endif
