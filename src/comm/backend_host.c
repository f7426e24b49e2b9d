/* The table of internal functions libsyncbn.so lends to backends built as
 * their own shared library (see backend_host.h). */
#include "backend_host.h"

const sbn_backend_host sbn_internal_backend_host_v1 = {
    sbn_fail,     sbn_clear_error,   sbn_restore_error, sbn_default_timeout, sbn_group_alloc,
    sbn_sig_init, sbn_sig_set_error, sbn_sig_same,      sbn_sig_verdict,
};
