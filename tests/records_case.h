/* A layer applied twice before its backward, with a record of the first
 * forward (sbn_bn_save_forward / sbn_bn_restore_forward), checked bit for
 * bit against the same two steps run separately and against the float64
 * reference; shared by the CPU test (tests/test_records.c) and the GPU test
 * (tests/cuda/test_cuda_records.cu), which points case_dev at the GPU. */
#ifndef SBN_RECORDS_CASE_H
#define SBN_RECORDS_CASE_H

/* Every scenario for 1 (no group), 2 and 3 thread ranks on case_dev's
 * device (bn_case.h; NULL: the CPU). Returns the number of problems. */
int records_run_all(void);

#endif
