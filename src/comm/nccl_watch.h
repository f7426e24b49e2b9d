/* Internal: the NCCL backend's watchdog. A blocking communicator's host
 * calls (a collective's launch, which may first connect to its peers; a
 * split; the finalize) can block on a peer that is stuck or gone, and
 * nothing in the calling thread can end them. The watchdog is a thread per
 * group that aborts the communicator when a call it was told about (armed
 * with a deadline) is still running past that deadline; the blocked call
 * then returns and the group reports the timeout. Non-blocking
 * communicators never block in these calls, so the watchdog never fires for
 * them; it costs one lock and unlock per call.
 *
 * Why blocking communicators at all: a blocking one launches in the calling
 * thread, where a non-blocking one (NCCL 2.28) hands every ncclGroupEnd to
 * a new host thread. That was suspected of the collective's cost; measured
 * on an H200, both modes cost the same (the cost was the memory pool: see
 * nccl.c), so the choice is the simpler threading, not speed. */
#ifndef SBN_NCCL_WATCH_H
#define SBN_NCCL_WATCH_H

#include <pthread.h>

#include <nccl.h>

/* What sbn_nccl_watch_disarm returns when the watchdog aborted the
 * communicator during the call. */
#define SBN_NCCL_WATCH_FIRED ((ncclResult_t)-7001)

typedef struct sbn_nccl_watch {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t tid;
  int started, quit, fired, sleeping; /* sleeping: in its untimed wait */
  double deadline;   /* armed until this time (now_s clock); 0: disarmed */
  double last_armed; /* when the last call began */
  ncclComm_t *comm;  /* the group's handle slot, written by the caller's thread only */
} sbn_nccl_watch;

/* Start watching *comm (the slot the group keeps its handle in). 0, or -1
 * when the thread could not be started (then nothing is watched). */
int sbn_nccl_watch_start(sbn_nccl_watch *w, ncclComm_t *comm);
/* Around each host call that may block: arm before it, disarm with its
 * result after. disarm returns r, or SBN_NCCL_WATCH_FIRED when the watchdog
 * aborted the communicator meanwhile (*comm is NULL then: do not abort it
 * again). An infinite deadline never fires. */
void sbn_nccl_watch_arm(sbn_nccl_watch *w, double deadline);
ncclResult_t sbn_nccl_watch_disarm(sbn_nccl_watch *w, ncclResult_t r);
/* The handle, taken out of the slot (NULL if the watchdog aborted it), for
 * the caller's own abort or destroy: afterwards the watchdog has nothing to
 * abort. Call disarmed. */
ncclComm_t sbn_nccl_watch_take(sbn_nccl_watch *w);
/* Stop and join the thread (waits for an abort in progress). */
void sbn_nccl_watch_stop(sbn_nccl_watch *w);
/* The monotonic clock in seconds, the deadlines' clock. */
double sbn_nccl_now_s(void);

#endif
