/* Records of forwards on the CPU layer (tests/records_case.c). */
#include <stdio.h>

#include "records_case.h"

int main(void) {
  int bad = records_run_all();
  printf(bad ? "FAIL: %d problem(s)\n" : "records of forwards: all ok\n", bad);
  return bad != 0;
}
