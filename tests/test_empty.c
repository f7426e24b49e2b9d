/* Every rank empty (global count 0, the tail of a sharded dataset): the
 * training forward succeeds with an empty output, running statistics and
 * num_batches_tracked stay exactly as they were, and backward gives an empty
 * dx and adds nothing to the gradients. A global count of exactly 1 stays an
 * error on every rank. Run for P = 1 (no group), 2 and 3 thread ranks, after
 * a real training step so that the state being protected is not trivial.
 * An empty batch whose other dimensions are huge ([0, C, 2^30, 2^30], which
 * the size rules accept) needs no memory either: it succeeds in both layouts. */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum { C = 3 };

typedef struct shared {
  int failures[4];
  sbn_status count_one[4];
  char count_one_msg[4][512];
} shared;

static int rank_main(sbn_group *world, void *arg) {
  shared *sh = arg;
  const int rank = sbn_group_rank(world), P = sbn_group_size(world);
  int *fail = &sh->failures[rank];
  sbn_group_set_timeout(world, 10);
  for (int momentum_kind = 0; momentum_kind < 2; momentum_kind++) {
    sbn_bn_options o = sbn_bn_options_default(C);
    o.momentum = momentum_kind ? SBN_MOMENTUM_CUMULATIVE : 0.1;
    sbn_bn *bn;
    CHECK_OK(sbn_bn_create(&bn, &o, P > 1 ? world : NULL));
    /* one real step: running statistics move away from (0, 1), grads fill */
    rng r = rng_seed(7 + (uint64_t)rank);
    int64_t shape[4] = {2, C, 3, 2};
    rank_data d;
    rank_data_alloc(&d, 4, shape, SBN_LAYOUT_CHANNELS_FIRST);
    double mean[C] = {1.5, -2, 4}, std[C] = {0.5, 2, 3};
    rank_data_fill(&d, &r, mean, std);
    sbn_tensor x = rank_tensor(&d, d.x), y = rank_tensor(&d, d.y), dy = rank_tensor(&d, d.dy),
               dx = rank_tensor(&d, d.dx);
    CHECK_OK(sbn_bn_forward(bn, &y, &x));
    CHECK_OK(sbn_bn_backward(bn, &dx, &dy, &x));
    bn_snapshot before, after;
    bn_snap(bn, &before);

    /* every rank empty; data pointers NULL as an empty tensor may have */
    int64_t eshape[4] = {0, C, 3, 2};
    sbn_tensor ex = sbn_tensor_cpu(NULL, 4, eshape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
    sbn_tensor ey = ex, edy = ex, edx = ex;
    sbn_status st = sbn_bn_forward(bn, &ey, &ex);
    if (st != SBN_STATUS_OK) {
      printf("rank %d: empty forward: %s: %s (expected OK)\n", rank, sbn_status_name(st), sbn_last_error());
      ++*fail;
    }
    st = sbn_bn_backward(bn, &edx, &edy, &ex);
    if (st != SBN_STATUS_OK) {
      printf("rank %d: empty backward: %s: %s (expected OK)\n", rank, sbn_status_name(st), sbn_last_error());
      ++*fail;
    }
    bn_snap(bn, &after);
    if (memcmp(&before, &after, sizeof before)) {
      printf("rank %d: state changed by an empty batch: nbt %lld -> %lld, rm[0] %g -> %g, rv[0] %g -> %g, "
             "gw[0] %g -> %g\n",
             rank, (long long)before.nbt, (long long)after.nbt, before.rm[0], after.rm[0], before.rv[0],
             after.rv[0], before.gw[0], after.gw[0]);
      ++*fail;
    } else if (rank == 0 && momentum_kind == 0) {
      printf("P=%d: empty step: OK, state bitwise unchanged (nbt %lld, rm[0] %.6f, rv[0] %.6f, gw[0] %.6f)\n", P,
             (long long)after.nbt, after.rm[0], after.rv[0], after.gw[0]);
    }
    /* a normal step afterwards still trains */
    CHECK_OK(sbn_bn_forward(bn, &y, &x));
    bn_snap(bn, &after);
    if (after.nbt != before.nbt + 1) {
      printf("rank %d: nbt %lld after the next real step (expected %lld)\n", rank, (long long)after.nbt,
             (long long)before.nbt + 1);
      ++*fail;
    }
    /* global count exactly 1: still an error, on every rank */
    if (momentum_kind == 0) {
      int64_t one[2] = {rank == 0 ? 1 : 0, C};
      float v1[C] = {1, 2, 3}, o1[C];
      sbn_tensor x1 = sbn_tensor_cpu(v1, 2, one, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
      sbn_tensor y1 = sbn_tensor_cpu(o1, 2, one, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
      bn_snap(bn, &before);
      sh->count_one[rank] = sbn_bn_forward(bn, &y1, &x1);
      snprintf(sh->count_one_msg[rank], sizeof sh->count_one_msg[rank], "%s", sbn_last_error());
      bn_snap(bn, &after);
      if (memcmp(&before, &after, sizeof before)) {
        printf("rank %d: state changed by a failed count-1 forward\n", rank);
        ++*fail;
      }
    }
    rank_data_free(&d);
    sbn_bn_destroy(bn);
  }
  return 0;
}

/* Empty shapes indexed by huge dimensions: no pass runs, so no scratch may
 * be sized by them (an allocation of 2^48 bytes failed such a forward with
 * SBN_STATUS_OUT_OF_MEMORY). */
static int huge_empty(void) {
  const int64_t shapes[3][4] = {
      {0, C, INT64_C(1) << 30, INT64_C(1) << 30}, {0, C, INT64_C(1) << 58}, {4, C, 0, INT64_C(1) << 58}};
  const int ndims[3] = {4, 3, 4};
  int bad = 0;
  for (int s = 0; s < 3; s++)
    for (int layout = 0; layout < 2; layout++) {
      sbn_bn_options o = sbn_bn_options_default(C);
      sbn_bn *bn;
      CHECK_OK(sbn_bn_create(&bn, &o, NULL));
      float dummy[1];
      sbn_tensor x = sbn_tensor_cpu(dummy, ndims[s], shapes[s], SBN_DTYPE_FLOAT32, (sbn_layout)layout);
      bn_snapshot before, after;
      bn_snap(bn, &before);
      sbn_status fst = sbn_bn_forward(bn, &x, &x);
      char fmsg[256];
      snprintf(fmsg, sizeof fmsg, "%s", sbn_last_error());
      sbn_status bst = fst == SBN_STATUS_OK ? sbn_bn_backward(bn, &x, &x, &x) : fst;
      bn_snap(bn, &after);
      const int ok = fst == SBN_STATUS_OK && bst == SBN_STATUS_OK && !memcmp(&before, &after, sizeof before);
      char shape[96];
      int len = snprintf(shape, sizeof shape, "[");
      for (int i = 0; i < ndims[s]; i++)
        len += snprintf(shape + len, sizeof shape - (size_t)len, "%s%lld", i ? ", " : "", (long long)x.shape[i]);
      snprintf(shape + len, sizeof shape - (size_t)len, "]");
      printf("empty %s %s: forward %s%s%s, backward %s, state %s: %s\n", shape,
             layout ? "channels-last" : "channels-first", sbn_status_name(fst), fst ? " " : "", fst ? fmsg : "",
             sbn_status_name(bst), memcmp(&before, &after, sizeof before) ? "CHANGED" : "unchanged",
             ok ? "ok" : "FAIL");
      bad += !ok;
      sbn_bn_destroy(bn);
    }
  return bad;
}

int main(void) {
  int bad = huge_empty();
  for (int P = 1; P <= 3; P++) {
    shared sh;
    memset(&sh, 0, sizeof sh);
    sbn_status st = sbn_team_run(P, rank_main, &sh);
    if (st != SBN_STATUS_OK) {
      printf("P=%d: team failed: %s: %s\n", P, sbn_status_name(st), sbn_last_error());
      bad++;
    }
    for (int r = 0; r < P; r++) {
      bad += sh.failures[r];
      int ok = sh.count_one[r] == SBN_STATUS_INVALID_ARGUMENT && strstr(sh.count_one_msg[r], "more than 1 value");
      printf("P=%d rank %d: global count 1 -> %s \"%s\" (expected SBN_STATUS_INVALID_ARGUMENT) %s\n", P, r,
             sbn_status_name(sh.count_one[r]), sh.count_one_msg[r], ok ? "ok" : "FAIL");
      bad += !ok;
    }
  }
  printf(bad ? "FAIL: %d problem(s)\n" : "empty batches: all ok\n", bad);
  return bad != 0;
}
