/* Built with -fsanitize=thread (mk/sanitize-comm.mk): every rank of a group
 * fails at once (a mismatch, a timeout), so sbn_fail runs on many threads at
 * the same moment, including the first call that reads SYNCBN_DEBUG. TSan
 * exits non-zero on a data race; we also check each thread kept its own
 * message. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "../src/core/error.h"

enum { THREADS = 8, ROUNDS = 200 };
static pthread_barrier_t start;
static int wrong[THREADS];

static void *run(void *arg) {
  int id = (int)(long)arg;
  pthread_barrier_wait(&start);
  for (int i = 0; i < ROUNDS; i++) {
    sbn_fail(SBN_STATUS_TIMEOUT, "thread %d round %d", id, i);
    char want[64];
    snprintf(want, sizeof want, "thread %d round %d", id, i);
    wrong[id] += strcmp(sbn_last_error(), want) != 0;
  }
  return NULL;
}

int main(void) {
  pthread_t t[THREADS];
  pthread_barrier_init(&start, NULL, THREADS);
  for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, run, (void *)i);
  int bad = 0;
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL), bad += wrong[i];
  printf("%d threads x %d concurrent sbn_fail calls: %d messages wrong (must be 0); a race would be "
         "reported by ThreadSanitizer above\n", THREADS, ROUNDS, bad);
  return bad ? 1 : 0;
}
