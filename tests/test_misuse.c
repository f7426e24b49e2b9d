/* Misuse is an error on every rank of the group, never a hang or silent
 * garbage, and a failed call changes no state (running statistics,
 * num_batches_tracked, gradients). Each scenario runs on 3 thread ranks with
 * a short timeout (so a regression that hangs fails in seconds), prints what
 * every rank saw, and checks it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"

enum { P = 3, C = 4 };

typedef enum scenario {
  SC_ONE_DIM,       /* rank 1 passes a 1-D tensor */
  SC_ZERO_C,        /* rank 2 passes C = 0 */
  SC_WRONG_C,       /* rank 0 passes C != num_features */
  SC_NULL_X,        /* rank 1 passes x = NULL */
  SC_NULL_DATA,     /* rank 2 passes x->data = NULL */
  SC_BAD_DTYPE,     /* rank 2 passes an int64 tensor */
  SC_BAD_LAYOUT,    /* rank 0 passes an unknown layout */
  SC_Y_MISMATCH,    /* rank 1 passes y with another shape */
  SC_COUNT_ONE,     /* one value per channel over all ranks */
  SC_LAYER_C,       /* rank 0's layer has num_features 5, the others 4 */
  SC_OTHER_LAYER,   /* rank 2 calls its second layer, the others their first */
  SC_BACKWARD_DY,   /* rank 1's dy has another shape */
  SC_FAIL_FORWARD,  /* rank 1's binding refuses its input: sbn_bn_fail_call, forward */
  SC_FAIL_BACKWARD, /* rank 2's binding refuses its gradient: sbn_bn_fail_call, backward */
  SC_TIMEOUT,       /* rank 2 never calls forward */
  SC_COUNT_
} scenario;

static const char *const names[] = {
    "1-D input on rank 1", "C = 0 on rank 2", "C != num_features on rank 0", "x NULL on rank 1",
    "x->data NULL on rank 2", "int64 dtype on rank 2", "unknown layout on rank 0",
    "y shape differs on rank 1", "global count 1", "layers with different C",
    "ranks call different layers", "backward dy shape on rank 1", "sbn_bn_fail_call forward on rank 1",
    "sbn_bn_fail_call backward on rank 2", "rank 2 never arrives"};
static const char fail_msg[] = "binding: a float32 input to a float16 module";

typedef struct result {
  sbn_status st;
  char msg[1024];
  int state_changed;
  int after_ok; /* a correct call afterwards works (-1: not tried) */
} result;

static result results[SC_COUNT_][P];
static scenario current;

static int rank_main(sbn_group *world, void *arg) {
  (void)arg;
  const int rank = sbn_group_rank(world);
  const scenario sc = current;
  result *res = &results[sc][rank];
  res->after_ok = -1;
  sbn_group_set_timeout(world, 0.5);
  sbn_bn_options o = sbn_bn_options_default(sc == SC_LAYER_C && rank == 0 ? 5 : C);
  sbn_bn *bn, *other;
  CHECK_OK(sbn_bn_create(&bn, &o, world));
  CHECK_OK(sbn_bn_create(&other, &o, world));
  /* a good step first, so there is state (running stats, grads) to protect */
  rng r = rng_seed(100 + rank);
  int64_t shape[4] = {2, o.num_features, 3, 3};
  rank_data d, bad;
  rank_data_alloc(&d, 4, shape, SBN_LAYOUT_CHANNELS_FIRST);
  double mean[5] = {1, 2, 3, 4, 5}, std[5] = {1, 1, 2, 2, 3};
  rank_data_fill(&d, &r, mean, std);
  sbn_tensor x = rank_tensor(&d, d.x), y = rank_tensor(&d, d.y), dy = rank_tensor(&d, d.dy), dx = rank_tensor(&d, d.dx);
  if (sc != SC_LAYER_C) {
    CHECK_OK(sbn_bn_forward(bn, &y, &x));
    CHECK_OK(sbn_bn_backward(bn, &dx, &dy, &x));
  }
  bn_snapshot before, after;
  bn_snap(bn, &before);

  /* the misuse */
  sbn_tensor bx = x, by = y;
  int64_t bshape[4] = {1, C, 1, 1};
  rank_data_alloc(&bad, 4, bshape, SBN_LAYOUT_CHANNELS_FIRST);
  bad.x[0] = 1, bad.x[1] = 2, bad.x[2] = 3, bad.x[3] = 4;
  sbn_tensor *px = &bx;
  sbn_bn *target = bn;
  switch (sc) {
    case SC_ONE_DIM: if (rank == 1) bx.ndim = by.ndim = 1; break;
    case SC_ZERO_C: if (rank == 2) bx.shape[1] = by.shape[1] = 0; break;
    case SC_WRONG_C: if (rank == 0) bx.shape[1] = by.shape[1] = 2; break;
    case SC_NULL_X: if (rank == 1) px = NULL; break;
    case SC_NULL_DATA: if (rank == 2) bx.data = NULL; break;
    case SC_BAD_DTYPE: if (rank == 2) bx.dtype = by.dtype = SBN_DTYPE_INT64; break;
    case SC_BAD_LAYOUT: if (rank == 0) bx.layout = by.layout = (sbn_layout)7; break;
    case SC_Y_MISMATCH: if (rank == 1) by.shape[2] = 1; break;
    case SC_COUNT_ONE: /* N = 1, S = 1 on rank 0, N = 0 elsewhere */
      bx = rank_tensor(&bad, bad.x), by = rank_tensor(&bad, bad.y);
      if (rank != 0) bx.shape[0] = by.shape[0] = 0;
      break;
    case SC_OTHER_LAYER: if (rank == 2) target = other; break;
    default: break;
  }
  if (sc == SC_FAIL_FORWARD || sc == SC_FAIL_BACKWARD) {
    const int backward = sc == SC_FAIL_BACKWARD, failing = backward ? 2 : 1;
    if (rank == failing) res->st = sbn_bn_fail_call(bn, backward, SBN_STATUS_UNSUPPORTED, fail_msg);
    else res->st = backward ? sbn_bn_backward(bn, &dx, &dy, &x) : sbn_bn_forward(bn, &y, &x);
  } else if (sc == SC_BACKWARD_DY) {
    sbn_tensor bdy = dy;
    if (rank == 1) bdy.shape[3] = 1;
    res->st = sbn_bn_backward(bn, &dx, &bdy, &x);
  } else if (sc == SC_TIMEOUT) {
    if (rank == 2) {
      struct timespec ts = {1, 0}; /* arrive after the others gave up */
      nanosleep(&ts, NULL);
    }
    res->st = sbn_bn_forward(bn, &y, &x);
  } else {
    res->st = sbn_bn_forward(target, &by, px);
  }
  snprintf(res->msg, sizeof res->msg, "%s", sbn_last_error());
  bn_snap(bn, &after);
  res->state_changed = memcmp(&before, &after, sizeof before) != 0;
  /* the group must still work after an agreed error (not after a timeout) */
  if (sc != SC_TIMEOUT && sc != SC_LAYER_C) {
    res->after_ok = sbn_bn_forward(bn, &y, &x) == SBN_STATUS_OK && sbn_bn_backward(bn, &dx, &dy, &x) == SBN_STATUS_OK;
  }
  rank_data_free(&d), rank_data_free(&bad);
  sbn_bn_destroy(bn), sbn_bn_destroy(other);
  return 0;
}

/* Single-rank checks that need no group. */
static int local_checks(void) {
  int bad = 0;
  sbn_bn *bn = NULL;
  sbn_bn_options o = sbn_bn_options_default(3);
  struct { const char *what; sbn_status want; sbn_status got; } cases[32];
  int n = 0;
#define CASE(what_, want_, expr_) cases[n++] = (typeof(cases[0])){what_, want_, (expr_)}
  o.eps = -1e-5;
  CASE("eps = -1e-5", SBN_STATUS_INVALID_ARGUMENT, sbn_bn_create(&bn, &o, NULL));
  o.eps = NAN;
  CASE("eps = NaN", SBN_STATUS_INVALID_ARGUMENT, sbn_bn_create(&bn, &o, NULL));
  o.eps = 0; /* PyTorch accepts it */
  CASE("eps = 0", SBN_STATUS_OK, sbn_bn_create(&bn, &o, NULL));
  sbn_bn_destroy(bn), bn = NULL;
  o = sbn_bn_options_default(3), o.momentum = 1.5;
  CASE("momentum 1.5", SBN_STATUS_INVALID_ARGUMENT, sbn_bn_create(&bn, &o, NULL));
  o = sbn_bn_options_default(INT64_C(1) << 62);
  CASE("num_features 2^62", SBN_STATUS_INVALID_ARGUMENT, sbn_bn_create(&bn, &o, NULL));
  o = sbn_bn_options_default(3), o.device.index = 3;
  CASE("CPU layer with device index 3", SBN_STATUS_INVALID_ARGUMENT, sbn_bn_create(&bn, &o, NULL));
  o = sbn_bn_options_default(3), o.device.type = SBN_DEVICE_CUDA;
  CASE("CUDA layer without CUDA", SBN_STATUS_NOT_BUILT, sbn_bn_create(&bn, &o, NULL));
  o = sbn_bn_options_default(3), o.affine = 0, o.track_running_stats = 0;
  CASE("create (affine=0, track=0)", SBN_STATUS_OK, sbn_bn_create(&bn, &o, NULL));
  sbn_tensor v;
  CASE("weight of affine=0", SBN_STATUS_INVALID_ARGUMENT, sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_WEIGHT));
  CASE("running_var without tracking", SBN_STATUS_INVALID_ARGUMENT, sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_RUNNING_VAR));
  CASE("set num_batches_tracked without tracking", SBN_STATUS_INVALID_ARGUMENT, sbn_bn_set_num_batches_tracked(bn, 3));
  float xs[6] = {1, 2, 3, 4, 5, 6}, dys[6] = {1, -1, 2, 0, 1, 1};
  int64_t sh[2] = {2, 3};
  sbn_tensor x = sbn_tensor_cpu(xs, 2, sh, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_tensor dy = sbn_tensor_cpu(dys, 2, sh, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  CASE("backward before any forward", SBN_STATUS_BAD_STATE, sbn_bn_backward(bn, NULL, &dy, &x));
  sbn_tensor xo = x;
  xo.data = xs + 1; /* y overlapping x partially */
  CASE("y partially overlapping x", SBN_STATUS_INVALID_ARGUMENT, sbn_bn_forward(bn, &xo, &x));
  CASE("NULL layer", SBN_STATUS_INVALID_ARGUMENT, sbn_bn_forward(NULL, &x, &x));
  CASE("fail_call without a group", SBN_STATUS_IO_ERROR, sbn_bn_fail_call(bn, 0, SBN_STATUS_IO_ERROR, "no file"));
  const int told = !strcmp(sbn_last_error(), "no file");
  CASE("... its message kept", SBN_STATUS_OK, told ? SBN_STATUS_OK : SBN_STATUS_INTERNAL);
  CASE("fail_call with status OK", SBN_STATUS_INVALID_ARGUMENT, sbn_bn_fail_call(bn, 1, SBN_STATUS_OK, "x"));
  CASE("fail_call with status 99", SBN_STATUS_INVALID_ARGUMENT, sbn_bn_fail_call(bn, 1, (sbn_status)99, "x"));
  CASE("fail_call of a NULL layer", SBN_STATUS_INVALID_ARGUMENT, sbn_bn_fail_call(NULL, 0, SBN_STATUS_IO_ERROR, "x"));
  sbn_bn_destroy(bn);
  sbn_team *team;
  CASE("team of 0 ranks", SBN_STATUS_INVALID_ARGUMENT, sbn_team_create(&team, 0));
  CASE("team of 2 ranks", SBN_STATUS_OK, sbn_team_create(&team, 2));
  sbn_group *g1 = NULL, *g2 = NULL;
  CASE("join rank 0", SBN_STATUS_OK, sbn_team_join(&g1, team, 0));
  CASE("join rank 0 twice", SBN_STATUS_INVALID_ARGUMENT, sbn_team_join(&g2, team, 0));
  CASE("join rank 5 of 2", SBN_STATUS_INVALID_ARGUMENT, sbn_team_join(&g2, team, 5));
  CASE("negative timeout", SBN_STATUS_INVALID_ARGUMENT, sbn_group_set_timeout(g1, -1));
#undef CASE
  sbn_group_destroy(g1), sbn_team_destroy(team);
  for (int i = 0; i < n; i++) {
    int ok = cases[i].got == cases[i].want;
    printf("  %-42s -> %-28s %s\n", cases[i].what, sbn_status_name(cases[i].got), ok ? "ok" : "FAIL");
    bad |= !ok;
  }
  return bad;
}

/* Lifetimes: a group destroyed while a layer still uses it releases its
 * backend at once but not the memory the layer points to: the layer's next
 * training forward fails with BAD_STATE saying so, eval still works (no
 * collective), and destroying the layer afterwards frees the handle (the
 * sanitizer builds check that nothing leaks and nothing freed is touched).
 * Destroyed the other way round, or with no layer, it goes at once. */
static sbn_status life_destroy[2], life_train[2], life_eval[2], life_sub[2];
static char life_msg[2][1024];

static sbn_status forward_once(sbn_bn *bn, int rank) {
  float xs[8], ys[8];
  for (int i = 0; i < 8; i++) xs[i] = (float)(i * (rank + 2) % 5) - 1.5f;
  int64_t sh[2] = {4, 2};
  sbn_tensor x = sbn_tensor_cpu(xs, 2, sh, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_tensor y = sbn_tensor_cpu(ys, 2, sh, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  return sbn_bn_forward(bn, &y, &x);
}

static int life_rank(sbn_group *world, void *arg) {
  (void)arg;
  const int rank = sbn_group_rank(world);
  sbn_group_set_timeout(world, 5);
  sbn_bn_options o = sbn_bn_options_default(2);
  sbn_group *sub, *sub2;
  CHECK_OK(sbn_group_split(&sub, world, 0, rank));
  CHECK_OK(sbn_group_split(&sub2, world, 0, rank));
  sbn_bn *bn, *bn2;
  CHECK_OK(sbn_bn_create(&bn, &o, sub));
  CHECK_OK(forward_once(bn, rank)); /* running statistics to use in eval */
  life_destroy[rank] = sbn_group_destroy(sub);
  life_train[rank] = forward_once(bn, rank);
  snprintf(life_msg[rank], sizeof life_msg[rank], "%s", sbn_last_error());
  sbn_bn_set_training(bn, 0);
  life_eval[rank] = forward_once(bn, rank);
  sbn_bn_destroy(bn); /* frees the handle */
  CHECK_OK(sbn_bn_create(&bn2, &o, sub2));
  sbn_bn_destroy(bn2);
  life_sub[rank] = sbn_group_destroy(sub2); /* the right order */
  return 0;
}

static int lifetime_checks(void) {
  int bad = 0;
  printf("group destroyed before its layer:\n");
  bad |= sbn_team_run(2, life_rank, NULL) != SBN_STATUS_OK;
  for (int r = 0; r < 2; r++) {
    const int ok = life_destroy[r] == SBN_STATUS_OK && life_train[r] == SBN_STATUS_BAD_STATE &&
                   strstr(life_msg[r], "was destroyed") && life_eval[r] == SBN_STATUS_OK &&
                   life_sub[r] == SBN_STATUS_OK;
    printf("  rank %d: destroy -> %s, training forward -> %s, eval forward -> %s, the other order -> %s  %s\n"
           "          %s\n",
           r, sbn_status_name(life_destroy[r]), sbn_status_name(life_train[r]), sbn_status_name(life_eval[r]),
           sbn_status_name(life_sub[r]), ok ? "ok" : "FAIL", life_msg[r]);
    bad |= !ok;
  }
  return bad;
}

int main(void) {
  int bad = local_checks();
  bad |= lifetime_checks();
  for (current = 0; current < SC_COUNT_; current++) {
    sbn_status st = sbn_team_run(P, rank_main, NULL);
    printf("%s:\n", names[current]);
    if (st != SBN_STATUS_OK) {
      printf("  FAIL: team run: %s\n", sbn_status_name(st));
      bad = 1;
      continue;
    }
    for (int r = 0; r < P; r++) {
      result *res = &results[current][r];
      int ok = res->st != SBN_STATUS_OK && res->msg[0] && !res->state_changed && res->after_ok != 0;
      if (current == SC_TIMEOUT)
        ok &= r == 2 ? res->st == SBN_STATUS_GROUP_BROKEN
                     : res->st == SBN_STATUS_TIMEOUT && strstr(res->msg, "rank(s) 2") != NULL;
      if (current == SC_LAYER_C || current == SC_OTHER_LAYER) ok &= res->st == SBN_STATUS_MISMATCH;
      if (current == SC_COUNT_ONE) ok &= strstr(res->msg, "more than 1 value") != NULL;
      if (current == SC_FAIL_FORWARD || current == SC_FAIL_BACKWARD) {
        const int failing = current == SC_FAIL_BACKWARD ? 2 : 1;
        ok &= r == failing ? res->st == SBN_STATUS_UNSUPPORTED && !strcmp(res->msg, fail_msg)
                           : res->st == SBN_STATUS_PEER_FAILED && strstr(res->msg, fail_msg) &&
                                 strstr(res->msg, failing == 1 ? "rank 1" : "rank 2");
      }
      printf("  rank %d: %-26s %s%s%s\n         %s\n", r, sbn_status_name(res->st),
             res->state_changed ? "STATE CHANGED " : "", res->after_ok == 0 ? "GROUP UNUSABLE " : "",
             ok ? "ok" : "FAIL", res->msg);
      bad |= !ok;
    }
  }
  printf(bad ? "\nFAILED\n" : "\nall misuse checks passed\n");
  return bad;
}
