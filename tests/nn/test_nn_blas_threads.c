/* The library gives OpenBLAS one share of the cores per rank: a program
 * alone keeps sbn_num_threads(1) BLAS threads (all usable cores unless
 * SYNCBN_NUM_THREADS says otherwise); inside a team of P thread ranks every
 * GEMM runs with sbn_num_threads(P) (e.g. 1 for 4 ranks on 2 cores); after
 * the team ends the count comes back; sbn_set_num_threads overrides it.
 * Each GEMM's result is checked against float64 as well. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "syncbn_nn.h"

enum { P = 4, IN = 16, OUT = 8, N = 3 };

static int fails;

/* One Linear forward; returns OpenBLAS's thread count right after it and
 * checks the output against float64. */
static int linear_threads(const char *when) {
  sbn_module *lin = NULL;
  sbn_nn_entry *e = NULL;
  int count = 0, threads = -1;
  float x[N * IN];
  for (int i = 0; i < N * IN; i++) x[i] = (float)sin(0.37 * i);
  int64_t shape[2] = {N, IN};
  sbn_tensor tx = sbn_tensor_cpu(x, 2, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), ty;
  sbn_status st = sbn_nn_linear_create(&lin, IN, OUT, 1, 7);
  if (st == SBN_STATUS_OK) st = sbn_module_forward(lin, &ty, &tx);
  threads = openblas_get_num_threads();
  if (st == SBN_STATUS_OK) st = sbn_module_entries(&e, &count, lin, SBN_NN_PARAMETERS);
  double err = INFINITY;
  if (st == SBN_STATUS_OK) {
    const float *w = e[0].data, *b = e[1].data, *y = ty.data;
    err = 0;
    for (int n = 0; n < N; n++)
      for (int o = 0; o < OUT; o++) {
        double r = b[o];
        for (int k = 0; k < IN; k++) r += (double)w[o * IN + k] * x[n * IN + k];
        err = fmax(err, fabs(y[n * OUT + o] - r));
      }
  }
  if (!(err <= 1e-5)) { /* 16 float32 products: ~1e-6 */
    printf("FAIL %s: Linear forward %s, max err %.2e\n", when, sbn_last_error(), err);
    __atomic_fetch_add(&fails, 1, __ATOMIC_RELAXED);
  }
  free(e);
  sbn_module_destroy(lin);
  return threads;
}

static int seen[P];
static int rank_fn(sbn_group *world, void *arg) {
  (void)arg;
  int r = sbn_group_rank(world);
  sbn_group_barrier(world); /* every rank has joined: P ranks alive */
  seen[r] = linear_threads("in the team");
  return sbn_group_barrier(world);
}

static void expect(const char *what, int got, int want) {
  printf("%-44s OpenBLAS threads %d (expected %d)\n", what, got, want);
  if (got != want) fails++;
}

int main(void) {
  const int alone = sbn_num_threads(1), shared = sbn_num_threads(P);
  printf("this machine: sbn_num_threads(1) = %d, sbn_num_threads(%d) = %d\n", alone, P, shared);
  openblas_set_num_threads(alone > 1 ? 1 : 2); /* a stale value the library must replace */
  expect("alone, before the team:", linear_threads("alone"), alone);
  if (sbn_team_run(P, rank_fn, NULL) != SBN_STATUS_OK) {
    printf("FAIL: team: %s\n", sbn_last_error());
    fails++;
  }
  for (int r = 0; r < P; r++) {
    char what[64];
    snprintf(what, sizeof what, "rank %d of a team of %d:", r, P);
    expect(what, seen[r], shared);
  }
  expect("alone, after the team:", linear_threads("after"), alone);
  sbn_set_num_threads(3);
  expect("after sbn_set_num_threads(3):", linear_threads("set 3"), 3);
  sbn_set_num_threads(0);
  expect("after sbn_set_num_threads(0) (default):", linear_threads("default"), alone);
  if (alone == shared) printf("note: one core only, alone and shared counts coincide\n");
  printf("%s\n", fails ? "FAIL" : "OK");
  return fails ? 1 : 0;
}
