/* The NCCL backend's watchdog (nccl_watch.h). Built with the NCCL backend
 * only. */
#if SBN_WITH_NCCL
#include "nccl_watch.h"

#include <errno.h>
#include <math.h>
#include <time.h>

/* How often the watchdog looks at the clock: a timeout is reported at most
 * this late. It ticks while calls come (within WATCH_IDLE_S of the last
 * one) and sleeps untimed after, so that a group in use never pays a wake-up
 * (a futex call, several microseconds) per call, and an idle one costs
 * nothing. */
#define WATCH_TICK_S 0.05
#define WATCH_IDLE_S 10.0

double sbn_nccl_now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void wait_until(sbn_nccl_watch *w, double t) {
  struct timespec ts;
  ts.tv_sec = (time_t)t;
  ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  pthread_cond_timedwait(&w->cv, &w->mu, &ts);
}

static void *watch_main(void *arg) {
  sbn_nccl_watch *w = arg;
  pthread_mutex_lock(&w->mu);
  while (!w->quit) {
    const double t = sbn_nccl_now_s();
    if (w->deadline > 0 && t > w->deadline && *w->comm && !w->fired) {
      /* The call is still running: abort under the lock, so that the
       * caller, which disarms under it, sees `fired` and never touches the
       * handle again (it clears the slot itself: the slot is only written
       * by the caller's thread). NCCL's abort ends the blocked call in the
       * caller's thread. */
      w->fired = 1;
      ncclCommAbort(*w->comm);
      continue;
    }
    if (w->deadline > 0 || t - w->last_armed < WATCH_IDLE_S) {
      wait_until(w, t + WATCH_TICK_S);
    } else { /* idle: until armed or stopped */
      w->sleeping = 1;
      pthread_cond_wait(&w->cv, &w->mu);
      w->sleeping = 0;
    }
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

int sbn_nccl_watch_start(sbn_nccl_watch *w, ncclComm_t *comm) {
  w->started = w->quit = w->fired = w->sleeping = 0;
  w->deadline = 0;
  w->last_armed = -1e30;
  w->comm = comm;
  pthread_condattr_t ca;
  if (pthread_condattr_init(&ca) != 0) return -1;
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  int rc = pthread_cond_init(&w->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (rc != 0) return -1;
  if (pthread_mutex_init(&w->mu, NULL) != 0) {
    pthread_cond_destroy(&w->cv);
    return -1;
  }
  if (pthread_create(&w->tid, NULL, watch_main, w) != 0) {
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    return -1;
  }
  w->started = 1;
  return 0;
}

void sbn_nccl_watch_arm(sbn_nccl_watch *w, double deadline) {
  if (!w->started) return;
  const double t = sbn_nccl_now_s();
  pthread_mutex_lock(&w->mu);
  w->deadline = deadline > 0 ? deadline : 1e-9;
  w->last_armed = t;
  /* wake it only from its untimed sleep: while it ticks, it will look */
  if (w->sleeping) pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

ncclResult_t sbn_nccl_watch_disarm(sbn_nccl_watch *w, ncclResult_t r) {
  if (!w->started) return r;
  pthread_mutex_lock(&w->mu);
  w->deadline = 0;
  const int fired = w->fired;
  if (fired) *w->comm = NULL;
  pthread_mutex_unlock(&w->mu);
  return fired ? SBN_NCCL_WATCH_FIRED : r;
}

ncclComm_t sbn_nccl_watch_take(sbn_nccl_watch *w) {
  if (!w->started) {
    ncclComm_t c = *w->comm;
    *w->comm = NULL;
    return c;
  }
  pthread_mutex_lock(&w->mu);
  ncclComm_t c = w->fired ? NULL : *w->comm;
  *w->comm = NULL;
  pthread_mutex_unlock(&w->mu);
  return c;
}

void sbn_nccl_watch_stop(sbn_nccl_watch *w) {
  if (!w->started) return;
  pthread_mutex_lock(&w->mu);
  w->quit = 1;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->tid, NULL);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  w->started = 0;
}

#else
typedef int sbn_nccl_watch_unused; /* ISO C: not an empty translation unit */
#endif
