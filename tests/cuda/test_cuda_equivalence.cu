// The equivalence invariant on the GPU: P = 1..4 thread ranks share one GPU,
// each with its own (non-blocking) stream, synchronized through the threads
// group, i.e. the host-staged path (payload copied to the host, the exact
// host all-reduce, copied back). Randomized configurations as in
// tests/test_equivalence.c: uneven and empty ranks, 2-D..5-D, both layouts,
// affine/tracking/momentum options, several steps then eval, ill-conditioned
// channels (mean 1e4 x std), two sub-groups. Each is checked against the
// float64 reference and against one CPU BatchNorm over the concatenated
// batch (bn_case.c; tolerances justified there: the kernels promise float32
// rounding of a float64 reference, as the CPU's do). Then bitwise
// repeatability: the same case three times gives the same bits.
#include "cuda_testutil.h"

int main(int argc, char **argv) {
  if (!gpu_or_skip("test_cuda_equivalence")) return 0;
  case_dev = &gpu_hooks;
  const int cases = argc > 1 ? atoi(argv[1]) : 48;
  rng r = rng_seed(20260);
  int bad = 0, n = 0;
  char desc[512];
  for (int k = 0; k < cases; k++) {
    const int P = 1 + k % 4, halves = k % 6 == 5;
    case_cfg cfg;
    case_random(&cfg, &r, P, halves);
    case_err e;
    int f = case_run(&cfg, &e, NULL, NULL);
    printf("%-4s %s\n     y %.1e dx %.1e gw %.1e gb %.1e rm %.1e rv %.1e single %.2f nbt %s\n", f ? "FAIL" : "ok",
           case_describe(desc, sizeof desc, &cfg), e.y, e.dx, e.gw, e.gb, e.rm, e.rv, e.single,
           e.nbt_bad ? "WRONG" : "ok");
    bad |= f;
    n++;
  }
  // bitwise repeatability through the host-staged path, 2..4 ranks
  for (int k = 0; k < 3; k++) {
    case_cfg cfg;
    case_random(&cfg, &r, 2 + k, k == 2);
    float *first = NULL, *again = NULL;
    size_t n1 = 0, n2 = 0;
    case_err e;
    bad |= case_run(&cfg, &e, &first, &n1);
    int differ = 0;
    for (int run = 0; run < 2; run++) {
      n2 = 0;
      bad |= case_run(&cfg, &e, &again, &n2);
      differ += n1 != n2 || memcmp(first, again, n1 * sizeof(float)) != 0;
      free(again), again = NULL;
    }
    printf("%-4s repeat %s: %zu values, %d of 2 repeats differ bitwise\n", differ ? "FAIL" : "ok",
           case_describe(desc, sizeof desc, &cfg), n1, differ);
    bad |= differ != 0 || n1 == 0;
    free(first);
  }
  printf(bad ? "FAILED\n" : "%d GPU configurations equivalent to one BatchNorm, bitwise repeatable\n", n);
  return bad;
}
