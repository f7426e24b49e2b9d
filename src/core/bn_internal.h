/* Internal: what the module layer needs of the core layer beyond the API. */
#ifndef SBN_BN_INTERNAL_H
#define SBN_BN_INTERNAL_H

#include "syncbn.h"

/* Exchange the per-channel storage (weight, bias, their gradients, running
 * mean and variance) of two layers with the same num_features, affine and
 * track_running_stats; returns 0, or -1 (nothing exchanged) if they differ.
 * convert/revert use it so the replacement layer keeps the original's
 * memory: pointers taken before (an optimizer's) stay valid, as parameters
 * keep their storage in PyTorch's convert_sync_batchnorm. */
int sbn_bn_swap_storage(sbn_bn *a, sbn_bn *b);

#endif
