/* Determinism: the same inputs give bitwise identical outputs (y and dx on
 * every rank, every step) across repeated runs, whatever the thread
 * scheduling: P = 2, 3, 4 and 8 ranks (and two sub-groups), 3 runs each. */
#include <stdlib.h>
#include <string.h>

#include "bn_case.h"

int main(void) {
  rng r = rng_seed(4242);
  int bad = 0;
  static const int Ps[] = {2, 3, 4, 8, 8};
  char desc[512];
  for (int k = 0; k < 5; k++) {
    case_cfg cfg;
    case_random(&cfg, &r, Ps[k], k == 4);
    float *first = NULL;
    size_t n_first = 0;
    case_err e;
    bad |= case_run(&cfg, &e, &first, &n_first);
    size_t differing = 0;
    for (int run = 1; run < 3; run++) {
      float *again = NULL;
      size_t n_again = 0;
      bad |= case_run(&cfg, &e, &again, &n_again);
      if (n_again != n_first || memcmp(first, again, n_first * sizeof(float)) != 0) differing++;
      free(again);
    }
    printf("%-4s %s: %zu values, %zu of 2 repeats differ bitwise\n", differing ? "FAIL" : "ok",
           case_describe(desc, sizeof desc, &cfg), n_first, differing);
    bad |= differing != 0 || n_first == 0;
    free(first);
  }
  printf(bad ? "FAILED\n" : "outputs bitwise identical across runs\n");
  return bad;
}
