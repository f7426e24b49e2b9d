/* Internal: fault injection for the wrapper's tests. Not part of the API and
 * not exported from the shared library (hidden visibility); tests reach it
 * by linking the static library. Set before the ranks start (e.g. before
 * sbn_team_run), read-only while they run. */
#ifndef SBN_DP_TESTHOOK_H
#define SBN_DP_TESTHOOK_H

#if defined(__GNUC__)
#define SBN_DP_HIDDEN __attribute__((visibility("hidden")))
#else
#define SBN_DP_HIDDEN
#endif

/* Where sbn_dp_wrap fails on purpose, on the rank (of the wrapper's group)
 * sbn_dp_test_fault_rank, as if that step had failed there alone; it fires
 * sbn_dp_test_fault_times times (counted by that rank's thread alone). */
typedef enum sbn_dp_fault {
  SBN_DP_FAULT_NONE = 0,
  SBN_DP_FAULT_PLAN = 1,   /* bucket planning (e.g. out of memory) */
  SBN_DP_FAULT_SPLIT = 2,  /* after the communication group's split */
  SBN_DP_FAULT_WORKER = 3  /* starting the communication thread */
} sbn_dp_fault;

extern SBN_DP_HIDDEN sbn_dp_fault sbn_dp_test_fault;
extern SBN_DP_HIDDEN int sbn_dp_test_fault_rank;
extern SBN_DP_HIDDEN int sbn_dp_test_fault_times;

#endif
