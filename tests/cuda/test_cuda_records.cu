// Records of forwards on the GPU layer: the scenario of tests/records_case.c
// (a layer applied twice before its backward, a record of the first
// forward restored for its backward; bit for bit the separate steps, the
// float64 reference, the misuse, the negative control) with every rank's
// tensors and layer on the GPU, each rank on its own non-blocking stream
// (one rank, and 2-3 thread ranks staged through the host).
#include "cuda_testutil.h"
extern "C" {
#include "records_case.h"
}

int main(void) {
  if (!gpu_or_skip("test_cuda_records")) return 0;
  case_dev = &gpu_hooks;
  int bad = records_run_all();
  printf(bad ? "FAIL: %d problem(s)\n" : "records of forwards on the GPU: all ok\n", bad);
  return bad != 0;
}
