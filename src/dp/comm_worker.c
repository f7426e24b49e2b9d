/* The communication thread of the data-parallel wrapper. */
#include "comm_worker.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "../core/error.h"

enum { QUEUE_MAX = 4096 };

struct dp_worker {
  pthread_t tid;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  sbn_group *group;
  dp_bucket *queue[QUEUE_MAX];
  int submitted, done, stop;
  sbn_status first_error;
  char message[1024];
};

static void *worker_main(void *arg) {
  dp_worker *w = arg;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (w->done == w->submitted && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
    if (w->done == w->submitted && w->stop) break;
    dp_bucket *b = w->queue[w->done % QUEUE_MAX];
    int failed = w->first_error != SBN_STATUS_OK;
    pthread_mutex_unlock(&w->mu);
    /* after a failure the rest are skipped: every rank fails the same step */
    sbn_status st = failed ? SBN_STATUS_OK
                           : sbn_group_allreduce(w->group, b->buf, (size_t)b->numel, SBN_DTYPE_FLOAT32,
                                                 SBN_REDUCE_OP_SUM);
    pthread_mutex_lock(&w->mu);
    if (st != SBN_STATUS_OK && w->first_error == SBN_STATUS_OK) {
      w->first_error = st;
      snprintf(w->message, sizeof w->message, "%s", sbn_last_error());
    }
    w->done++;
    pthread_cond_broadcast(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

sbn_status sbn_worker_start(dp_worker **out, sbn_group *group) {
  dp_worker *w = calloc(1, sizeof *w);
  if (!w) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "data-parallel: out of memory");
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  w->group = group;
  if (pthread_create(&w->tid, NULL, worker_main, w) != 0) {
    free(w);
    return sbn_fail(SBN_STATUS_BACKEND_ERROR, "data-parallel: cannot start the communication thread");
  }
  *out = w;
  return SBN_STATUS_OK;
}

sbn_status sbn_worker_submit(dp_worker *w, dp_bucket *b) {
  pthread_mutex_lock(&w->mu);
  /* A model can have more buckets than the queue holds (bucket_bytes 0:
   * one per parameter): wait for the thread to free a slot. It always
   * does: its all-reduces pair with the peers' threads, which get the same
   * buckets in the same order. */
  while (w->submitted - w->done >= QUEUE_MAX) pthread_cond_wait(&w->cv, &w->mu);
  w->queue[w->submitted++ % QUEUE_MAX] = b;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  return SBN_STATUS_OK;
}

sbn_status sbn_worker_wait(dp_worker *w) {
  pthread_mutex_lock(&w->mu);
  while (w->done < w->submitted) pthread_cond_wait(&w->cv, &w->mu);
  sbn_status st = w->first_error;
  w->first_error = SBN_STATUS_OK;
  if (st != SBN_STATUS_OK) sbn_fail(st, "%s", w->message);
  pthread_mutex_unlock(&w->mu);
  return st;
}

void sbn_worker_stop(dp_worker *w) {
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  w->stop = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->tid, NULL);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
}
