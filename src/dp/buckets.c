/* Gradient buckets: consecutive parameters (in the order their gradients
 * complete during backward) packed into one buffer, so that a few large
 * all-reduces replace many small ones. A bucket is ready once the earliest
 * top-level child holding one of its parameters has run its backward. */
#include "buckets.h"

#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

sbn_status sbn_buckets_plan(dp_bucket **out, int *nbuckets, const sbn_nn_entry *params,
                           const int *child_index, int n, size_t bucket_bytes) {
  dp_bucket *b = calloc((size_t)(n ? n : 1), sizeof *b);
  if (!b) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "data-parallel wrap: out of memory for buckets");
  int nb = 0;
  for (int i = 0; i < n; i++) {
    size_t bytes = (size_t)params[i].numel * sizeof(float);
    dp_bucket *cur = nb ? &b[nb - 1] : NULL;
    if (!cur || (size_t)(cur->numel * (int64_t)sizeof(float)) + bytes > bucket_bytes) {
      cur = &b[nb++];
      cur->first = i;
      cur->ready_after = child_index[i];
    }
    cur->count++;
    cur->numel += params[i].numel;
    if (child_index[i] < cur->ready_after) cur->ready_after = child_index[i];
  }
  for (int k = 0; k < nb; k++) {
    b[k].buf = malloc(sizeof(float) * (size_t)(b[k].numel ? b[k].numel : 1));
    if (!b[k].buf) {
      sbn_buckets_free(b, nb);
      return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "data-parallel wrap: out of memory for buckets");
    }
  }
  *out = b;
  *nbuckets = nb;
  return SBN_STATUS_OK;
}

void sbn_buckets_pack(dp_bucket *b, const sbn_nn_entry *params) {
  float *p = b->buf;
  for (int i = b->first; i < b->first + b->count; i++) {
    memcpy(p, params[i].grad, sizeof(float) * (size_t)params[i].numel);
    p += params[i].numel;
  }
}

void sbn_buckets_unpack(const dp_bucket *b, const sbn_nn_entry *params, float divisor) {
  const float *p = b->buf;
  for (int i = b->first; i < b->first + b->count; i++) {
    for (int64_t j = 0; j < params[i].numel; j++) params[i].grad[j] = p[j] / divisor;
    p += params[i].numel;
  }
}

void sbn_buckets_free(dp_bucket *b, int n) {
  for (int k = 0; b && k < n; k++) free(b[k].buf);
  free(b);
}
