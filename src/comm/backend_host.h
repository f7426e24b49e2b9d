/* Internal: what a backend living in its own shared library needs from
 * libsyncbn. libsyncbn_mpi.so keeps MPI out of libsyncbn.so, but its code
 * (src/comm/mpi.c, the same source as in the static archive) calls a few
 * internal functions: the per-thread last error must be libsyncbn's own,
 * and groups are allocated the way every group is. libsyncbn.so exports no internal function; it exports this one
 * table instead (the only symbol outside the public headers), and
 * backend_client.h routes the backend's calls through it.
 *
 * The name carries the layout's version: a change of the table (adding a
 * member is a change too) renames it (_v2, ...), so a libsyncbn_mpi.so built
 * against another layout fails to load with "undefined symbol" instead of
 * calling through the wrong slot. A backend that needs another internal
 * function: add it here, in backend_host.c and backend_client.h (the
 * libsyncbn_mpi.so link, -z defs, fails until then). Stateless helpers may
 * instead be compiled into the backend's library. */
#ifndef SBN_BACKEND_HOST_H
#define SBN_BACKEND_HOST_H

#include "comm.h"

typedef struct sbn_backend_host {
  sbn_status (*fail)(sbn_status status, const char *fmt, ...) SBN_PRINTF(2, 3);
  void (*clear_error)(void);
  void (*restore_error)(const char *saved);
  double (*default_timeout)(void);
  sbn_group *(*group_alloc)(const sbn_comm_ops *ops, void *impl, int rank, int size,
                            const char *name);
  void (*sig_init)(sbn_sig *sig, sbn_sig_kind kind, int layer, int64_t count, sbn_dtype dtype,
                   const char *fmt, ...) SBN_PRINTF(6, 7);
  void (*sig_set_error)(sbn_sig *sig, sbn_status status);
  int (*sig_same)(const sbn_sig *a, const sbn_sig *b);
  sbn_status (*sig_verdict)(const sbn_group *g, const sbn_sig *sigs, int me);
} sbn_backend_host;

SBN_API extern const sbn_backend_host sbn_internal_backend_host_v1;

#endif
