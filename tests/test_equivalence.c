/* The invariant that defines correctness: SyncBN over P thread ranks equals
 * BatchNorm over the concatenated batch (same y, dx, running statistics;
 * per-rank weight/bias gradients summing to the single-rank ones), checked
 * against the float64 reference and against plain BatchNorm, over randomized
 * configurations: P in {1,2,3,4,8}, uneven and empty ranks, 2-D..5-D, both
 * layouts, affine/tracking on and off, momentum 0.1/0.3/none, several
 * training steps then eval, and two disjoint sub-groups in the same step. */
#include <stdlib.h>

#include "bn_case.h"

int main(int argc, char **argv) {
  int per_p = argc > 1 ? atoi(argv[1]) : 12;
  static const int Ps[] = {1, 2, 3, 4, 8};
  rng r = rng_seed(20261122);
  int failures = 0, cases = 0;
  char desc[512];
  case_err worst = {0};
  for (int pi = 0; pi < 5; pi++)
    for (int k = 0; k < per_p; k++) {
      for (int halves = 0; halves <= (Ps[pi] >= 4); halves++) {
        case_cfg cfg;
        case_random(&cfg, &r, Ps[pi], halves);
        case_err e;
        int bad = case_run(&cfg, &e, NULL, NULL);
        cases++;
        failures += bad;
        if (e.y > worst.y) worst.y = e.y;
        if (e.dx > worst.dx) worst.dx = e.dx;
        if (e.gw > worst.gw) worst.gw = e.gw;
        if (e.rv > worst.rv) worst.rv = e.rv;
        if (e.single > worst.single) worst.single = e.single;
        printf("%-4s %s: y %.1e dx %.1e gw %.1e gb %.1e rm %.1e rv %.1e vs-single %.2f%s\n",
               bad ? "FAIL" : "ok", case_describe(desc, sizeof desc, &cfg), e.y, e.dx, e.gw, e.gb,
               e.rm, e.rv, e.single, e.nbt_bad ? " num_batches_tracked WRONG" : "");
      }
    }
  printf("\n%d cases, %d failed. worst: y %.2e (tol %.0e), dx %.2e (tol %.0e relative), gw %.2e, "
         "rv %.2e (tol 1e-6 relative), vs plain BN on the concatenation %.2f of tolerance\n",
         cases, failures, worst.y, TOL_Y, worst.dx, TOL_DX_REL, worst.gw, worst.rv, worst.single);
  return failures ? 1 : 0;
}
