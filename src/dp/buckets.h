/* Internal: gradient buckets of the data-parallel wrapper. */
#ifndef SBN_DP_BUCKETS_H
#define SBN_DP_BUCKETS_H

#include "syncbn_dp.h"

typedef struct dp_bucket {
  int first, count;    /* range in the wrapper's reduced-parameter list */
  int64_t numel;       /* floats packed */
  int ready_after;     /* top-level child index after whose backward it is complete */
  float *buf;          /* packed gradients */
  int launched;
} dp_bucket;

/* Plan buckets over params[0..n) (already in backward order) of at most
 * bucket_bytes each (a larger parameter gets its own). *out malloc'ed. */
sbn_status sbn_buckets_plan(dp_bucket **out, int *nbuckets, const sbn_nn_entry *params,
                           const int *child_index, int n, size_t bucket_bytes);
void sbn_buckets_pack(dp_bucket *b, const sbn_nn_entry *params);
/* grad = reduced / divisor (1 for a sum, P for an average). */
void sbn_buckets_unpack(const dp_bucket *b, const sbn_nn_entry *params, float divisor);
void sbn_buckets_free(dp_bucket *b, int n);

#endif
