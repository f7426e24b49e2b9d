/* Threads per rank for the CPU kernels.
 *
 * Ranks of the threads backend are themselves threads, and MPI may place
 * several processes on one machine; each rank spawning one thread per core
 * would oversubscribe the cores several times over. The default is
 * therefore the usable cores divided among the ranks sharing them:
 * max(1, cores / (ranks in this process x MPI processes on this node)),
 * cores being the CPUs this process may run on (sched_getaffinity). */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../core/error.h"
#include "bn_kernels.h"

static int threads_set; /* sbn_set_num_threads; 0: default */

sbn_status sbn_set_num_threads(int threads) {
  sbn_clear_error();
  if (threads < 0)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "sbn_set_num_threads: threads must be >= 0 (0: default), got %d", threads);
  __atomic_store_n(&threads_set, threads, __ATOMIC_RELAXED);
  return SBN_STATUS_OK;
}

static int env_int(const char *name) {
  const char *e = getenv(name);
  return e ? atoi(e) : 0;
}

static int usable_cores(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* SYNCBN_NUM_THREADS: a positive integer, all of it (spaces around it
 * aside), as SYNCBN_TIMEOUT; anything else ("abc", "0", "2x", "1e3") is
 * ignored rather than half-read ("2x" is not 2), with a note under
 * SYNCBN_DEBUG=1. 0: unset or ignored. The kernels can only be told at
 * their first call, where no status reaches the caller, hence no error. */
static int env_num_threads(void) {
  const char *e = getenv("SYNCBN_NUM_THREADS");
  if (!e) return 0;
  const char *p = e;
  while (isspace((unsigned char)*p)) p++;
  if (!*p) return 0; /* empty: unset */
  char *end;
  errno = 0;
  const long v = isdigit((unsigned char)*p) ? strtol(p, &end, 10) : 0;
  if (v > 0) {
    while (isspace((unsigned char)*end)) end++;
    if (!*end && errno == 0 && v <= INT_MAX) return (int)v;
  }
  if (sbn_debug_enabled())
    fprintf(stderr, "syncbn: SYNCBN_NUM_THREADS='%.100s' is not a positive integer; ignored\n", e);
  return 0;
}

/* Read once, by whichever rank comes first (pthread_once: the others wait,
 * then read the values race-free; the steady state stays one check). */
static int env_threads, cores, procs;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static void read_env(void) {
  cores = usable_cores();
  procs = env_int("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (procs < 1) procs = env_int("MPI_LOCALNRANKS");
  if (procs < 1) procs = 1;
  env_threads = env_num_threads();
}

int sbn_cpu_threads(int ranks_in_process) {
  int t = __atomic_load_n(&threads_set, __ATOMIC_RELAXED);
  if (t > 0) return t;
  pthread_once(&env_once, read_env);
  if (env_threads > 0) return env_threads;
  int share = (ranks_in_process > 0 ? ranks_in_process : 1) * procs;
  return cores / share > 1 ? cores / share : 1;
}

int sbn_num_threads(int ranks_in_process) { return sbn_cpu_threads(ranks_in_process); }
