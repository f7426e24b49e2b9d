/* Driver for tests/torch_peer.py: runs the scenario described in DIR on P
 * thread ranks and writes every output back to DIR for comparison with
 * PyTorch.
 *   DIR/config.txt: "P C ndim layout affine track momentum eps steps [bits]",
 *                   then one line of ndim dims per rank (momentum < 0: None;
 *                   bits 64: a float64 layer and float64 files .f64, else
 *                   float32 and .f32, EXT below)
 *   inputs:  w.EXT b.EXT x_S_R.EXT dy_S_R.EXT (S = 0..steps, the last eval)
 *   outputs: y_S_R.EXT dx_S_R.EXT gw_S_R.EXT gb_S_R.EXT rm_S.EXT rv_S.EXT nbt_S.txt */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

typedef struct peer {
  const char *dir;
  int P, ndim, steps;
  int64_t shape[16][SBN_MAX_DIMS];
  sbn_layout layout;
  sbn_bn_options opt;
  sbn_dtype dtype; /* of inputs, outputs and the layer's state */
  size_t es;       /* its size */
  const char *ext; /* "f32" or "f64" */
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
    char wn[16], bn_[16];
    snprintf(wn, sizeof wn, "w.%s", pc->ext), snprintf(bn_, sizeof bn_, "b.%s", pc->ext);
    if (io(pc->dir, wn, v.data, pc->es * (size_t)C, 0)) return 1;
    CHECK_OK(sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_BIAS));
    if (io(pc->dir, bn_, v.data, pc->es * (size_t)C, 0)) return 1;
  }
  const int64_t *shape = pc->shape[rank];
  int64_t numel = 1;
  for (int i = 0; i < pc->ndim; i++) numel *= shape[i];
  const size_t bytes = pc->es * (size_t)numel;
  void *buf[4]; /* x, dy, y, dx */
  for (int i = 0; i < 4; i++) buf[i] = calloc(1, bytes ? bytes : 1);
  const char *ext = pc->ext;
  char name[64];
  int bad = !buf[0] || !buf[1] || !buf[2] || !buf[3];
  for (int s = 0; s <= pc->steps && !bad; s++) {
    snprintf(name, sizeof name, "x_%d_%d.%s", s, rank, ext), bad |= io(pc->dir, name, buf[0], bytes, 0);
    snprintf(name, sizeof name, "dy_%d_%d.%s", s, rank, ext), bad |= io(pc->dir, name, buf[1], bytes, 0);
    if (bad) break;
    sbn_tensor x = sbn_tensor_cpu(buf[0], pc->ndim, shape, pc->dtype, pc->layout);
    sbn_tensor dy = sbn_tensor_cpu(buf[1], pc->ndim, shape, pc->dtype, pc->layout);
    sbn_tensor y = sbn_tensor_cpu(buf[2], pc->ndim, shape, pc->dtype, pc->layout);
    sbn_tensor dx = sbn_tensor_cpu(buf[3], pc->ndim, shape, pc->dtype, pc->layout);
    CHECK_OK(sbn_bn_set_training(bn, s < pc->steps));
    CHECK_OK(sbn_bn_zero_grad(bn));
    CHECK_OK(sbn_bn_forward(bn, &y, &x));
    CHECK_OK(sbn_bn_backward(bn, &dx, &dy, &x));
    snprintf(name, sizeof name, "y_%d_%d.%s", s, rank, ext), bad |= io(pc->dir, name, buf[2], bytes, 1);
    snprintf(name, sizeof name, "dx_%d_%d.%s", s, rank, ext), bad |= io(pc->dir, name, buf[3], bytes, 1);
    const size_t cb = pc->es * (size_t)C;
    if (pc->opt.affine) {
      CHECK_OK(sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_GRAD_WEIGHT));
      snprintf(name, sizeof name, "gw_%d_%d.%s", s, rank, ext), bad |= io(pc->dir, name, v.data, cb, 1);
      CHECK_OK(sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_GRAD_BIAS));
      snprintf(name, sizeof name, "gb_%d_%d.%s", s, rank, ext), bad |= io(pc->dir, name, v.data, cb, 1);
    }
    if (pc->opt.track_running_stats && rank == 0) {
      CHECK_OK(sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_RUNNING_MEAN));
      snprintf(name, sizeof name, "rm_%d.%s", s, ext), bad |= io(pc->dir, name, v.data, cb, 1);
      CHECK_OK(sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_RUNNING_VAR));
      snprintf(name, sizeof name, "rv_%d.%s", s, ext), bad |= io(pc->dir, name, v.data, cb, 1);
      int64_t nbt;
      CHECK_OK(sbn_bn_get_num_batches_tracked(bn, &nbt));
      char txt[32];
      int len = snprintf(txt, sizeof txt, "%lld\n", (long long)nbt);
      snprintf(name, sizeof name, "nbt_%d.txt", s), bad |= io(pc->dir, name, txt, (size_t)len, 1);
    }
  }
  for (int i = 0; i < 4; i++) free(buf[i]);
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
  int bits = 32; /* optional: a line of 9 values is float32 (the MPI driver's format too) */
  char rest[64] = "";
  if (ok && fgets(rest, sizeof rest, f) && sscanf(rest, "%d", &bits) != 1) bits = 32;
  ok = ok && (bits == 32 || bits == 64);
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
  pc.dtype = bits == 64 ? SBN_DTYPE_FLOAT64 : SBN_DTYPE_FLOAT32;
  pc.opt.param_dtype = pc.dtype;
  pc.es = bits == 64 ? 8 : 4;
  pc.ext = bits == 64 ? "f64" : "f32";
  sbn_status st = sbn_team_run(pc.P, rank_main, &pc);
  if (st != SBN_STATUS_OK) return fprintf(stderr, "torch_peer: %s\n", sbn_status_name(st)), 1;
  return 0;
}
