/* Driver for tests/torch_peer.py: runs the scenario described in DIR on P
 * thread ranks and writes every output back to DIR for comparison with
 * PyTorch.
 *   DIR/config.txt: "P C ndim layout affine track momentum eps steps", then
 *                   one line of ndim dims per rank (momentum < 0: None)
 *   inputs:  w.f32 b.f32 x_S_R.f32 dy_S_R.f32 (S = 0..steps, the last eval)
 *   outputs: y_S_R.f32 dx_S_R.f32 gw_S_R.f32 gb_S_R.f32 rm_S.f32 rv_S.f32 nbt_S.txt */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

typedef struct peer {
  const char *dir;
  int P, ndim, steps;
  int64_t shape[16][SBN_MAX_DIMS];
  sbn_layout layout;
  sbn_bn_options opt;
} peer;

static int io(const char *dir, const char *name, void *buf, size_t bytes, int write) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, write ? "wb" : "rb");
  if (!f) return fprintf(stderr, "torch_peer: cannot open %s\n", path), 1;
  size_t n = write ? fwrite(buf, 1, bytes, f) : fread(buf, 1, bytes, f);
  fclose(f);
  if (n != bytes) return fprintf(stderr, "torch_peer: short %s on %s\n", write ? "write" : "read", path), 1;
  return 0;
}

static int rank_main(sbn_group *world, void *arg) {
  const peer *pc = arg;
  const int rank = sbn_group_rank(world);
  const int64_t C = pc->opt.num_features;
  sbn_bn *bn;
  CHECK_OK(sbn_bn_create(&bn, &pc->opt, world));
  sbn_tensor v;
  if (pc->opt.affine) {
    CHECK_OK(sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_WEIGHT));
    if (io(pc->dir, "w.f32", v.data, 4 * (size_t)C, 0)) return 1;
    CHECK_OK(sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_BIAS));
    if (io(pc->dir, "b.f32", v.data, 4 * (size_t)C, 0)) return 1;
  }
  rank_data d;
  rank_data_alloc(&d, pc->ndim, pc->shape[rank], pc->layout);
  char name[64];
  int bad = 0;
  for (int s = 0; s <= pc->steps && !bad; s++) {
    size_t bytes = 4 * (size_t)d.numel;
    snprintf(name, sizeof name, "x_%d_%d.f32", s, rank), bad |= io(pc->dir, name, d.x, bytes, 0);
    snprintf(name, sizeof name, "dy_%d_%d.f32", s, rank), bad |= io(pc->dir, name, d.dy, bytes, 0);
    if (bad) break;
    sbn_tensor x = rank_tensor(&d, d.x), y = rank_tensor(&d, d.y), dy = rank_tensor(&d, d.dy), dx = rank_tensor(&d, d.dx);
    CHECK_OK(sbn_bn_set_training(bn, s < pc->steps));
    CHECK_OK(sbn_bn_zero_grad(bn));
    CHECK_OK(sbn_bn_forward(bn, &y, &x));
    CHECK_OK(sbn_bn_backward(bn, &dx, &dy, &x));
    snprintf(name, sizeof name, "y_%d_%d.f32", s, rank), bad |= io(pc->dir, name, d.y, bytes, 1);
    snprintf(name, sizeof name, "dx_%d_%d.f32", s, rank), bad |= io(pc->dir, name, d.dx, bytes, 1);
    if (pc->opt.affine) {
      CHECK_OK(sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_GRAD_WEIGHT));
      snprintf(name, sizeof name, "gw_%d_%d.f32", s, rank), bad |= io(pc->dir, name, v.data, 4 * (size_t)C, 1);
      CHECK_OK(sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_GRAD_BIAS));
      snprintf(name, sizeof name, "gb_%d_%d.f32", s, rank), bad |= io(pc->dir, name, v.data, 4 * (size_t)C, 1);
    }
    if (pc->opt.track_running_stats && rank == 0) {
      CHECK_OK(sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_RUNNING_MEAN));
      snprintf(name, sizeof name, "rm_%d.f32", s), bad |= io(pc->dir, name, v.data, 4 * (size_t)C, 1);
      CHECK_OK(sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_RUNNING_VAR));
      snprintf(name, sizeof name, "rv_%d.f32", s), bad |= io(pc->dir, name, v.data, 4 * (size_t)C, 1);
      int64_t nbt;
      CHECK_OK(sbn_bn_get_num_batches_tracked(bn, &nbt));
      char txt[32];
      int len = snprintf(txt, sizeof txt, "%lld\n", (long long)nbt);
      snprintf(name, sizeof name, "nbt_%d.txt", s), bad |= io(pc->dir, name, txt, (size_t)len, 1);
    }
  }
  rank_data_free(&d);
  sbn_bn_destroy(bn);
  return bad;
}

int main(int argc, char **argv) {
  if (argc != 2) return fprintf(stderr, "usage: torch_peer DIR\n"), 2;
  peer pc;
  memset(&pc, 0, sizeof pc);
  pc.dir = argv[1];
  char path[512];
  snprintf(path, sizeof path, "%s/config.txt", pc.dir);
  FILE *f = fopen(path, "r");
  if (!f) return fprintf(stderr, "torch_peer: cannot open %s\n", path), 2;
  long long C;
  int layout, affine, track;
  double mom, eps;
  int ok = fscanf(f, "%d %lld %d %d %d %d %lf %lf %d", &pc.P, &C, &pc.ndim, &layout, &affine, &track, &mom,
                  &eps, &pc.steps) == 9 && pc.P >= 1 && pc.P <= 16 && pc.ndim >= 2 && pc.ndim <= SBN_MAX_DIMS;
  for (int r = 0; ok && r < pc.P; r++)
    for (int i = 0; ok && i < pc.ndim; i++) {
      long long dim;
      ok = fscanf(f, "%lld", &dim) == 1;
      pc.shape[r][i] = dim;
    }
  fclose(f);
  if (!ok) return fprintf(stderr, "torch_peer: bad config\n"), 2;
  pc.layout = layout ? SBN_LAYOUT_CHANNELS_LAST : SBN_LAYOUT_CHANNELS_FIRST;
  pc.opt = sbn_bn_options_default(C);
  pc.opt.affine = affine, pc.opt.track_running_stats = track, pc.opt.eps = eps;
  pc.opt.momentum = mom < 0 ? SBN_MOMENTUM_CUMULATIVE : mom;
  sbn_status st = sbn_team_run(pc.P, rank_main, &pc);
  if (st != SBN_STATUS_OK) return fprintf(stderr, "torch_peer: %s\n", sbn_status_name(st)), 1;
  return 0;
}
