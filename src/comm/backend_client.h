/* Internal, force-included (-include) when a backend's source is compiled
 * for its own shared library (libsyncbn_mpi.so): its calls to libsyncbn's
 * internal functions go through the table libsyncbn.so exports (see
 * backend_host.h). The declarations are read first (include guards keep
 * them from being read again), then the names become table slots. The
 * static archive compiles the same source without this header. */
#ifndef SBN_BACKEND_CLIENT_H
#define SBN_BACKEND_CLIENT_H

#include "backend_host.h"

#define sbn_fail (sbn_internal_backend_host_v1.fail)
#define sbn_clear_error (sbn_internal_backend_host_v1.clear_error)
#define sbn_restore_error (sbn_internal_backend_host_v1.restore_error)
#define sbn_default_timeout (sbn_internal_backend_host_v1.default_timeout)
#define sbn_group_alloc (sbn_internal_backend_host_v1.group_alloc)
#define sbn_sig_init (sbn_internal_backend_host_v1.sig_init)
#define sbn_sig_set_error (sbn_internal_backend_host_v1.sig_set_error)
#define sbn_sig_same (sbn_internal_backend_host_v1.sig_same)
#define sbn_sig_verdict (sbn_internal_backend_host_v1.sig_verdict)

#endif
