/* Internal: a communication thread that all-reduces queued buckets in order
 * on its own group (a duplicate of the wrapper's), so that backward can go
 * on computing while gradients travel. */
#ifndef SBN_DP_COMM_WORKER_H
#define SBN_DP_COMM_WORKER_H

#include "buckets.h"

typedef struct dp_worker dp_worker;

/* Start a worker over `group` (used by the worker thread alone from now on). */
sbn_status sbn_worker_start(dp_worker **out, sbn_group *group);
/* Queue bucket b for an in-place float32 sum all-reduce. */
sbn_status sbn_worker_submit(dp_worker *w, dp_bucket *b);
/* Wait until every submitted bucket is reduced; returns the first failure
 * (its message recorded on the calling thread). */
sbn_status sbn_worker_wait(dp_worker *w);
/* Stop the thread and free (the group is not destroyed). */
void sbn_worker_stop(dp_worker *w);

#endif
