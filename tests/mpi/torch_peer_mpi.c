/* The PyTorch peer check through MPI ranks: driven by torch_peer_mpi.py,
 * which writes a configuration and every rank's inputs to DIR, runs
 * `mpirun -np P torch_peer_mpi DIR`, and compares our outputs with
 * F.batch_norm + autograd on the concatenated batch.
 *
 * DIR/config.txt: "ndim layout C affine track momentum eps steps [bits]" then
 * one line per rank with its shape (ndim values, C included). layout 0 is
 * channels-first, 1 channels-last; momentum < 0 means None; bits 64: a
 * float64 layer with float64 files (.f64), else float32 (.f32, EXT below).
 * Steps 0..steps-1 train, step `steps` is an eval step. Inputs DIR/w.EXT,
 * b.EXT, x_S_R.EXT, dy_S_R.EXT (memory order of the layout); outputs
 * y_S_R.EXT, dx_S_R.EXT, gw_S_R.EXT, gb_S_R.EXT, rm_S_R.EXT, rv_S_R.EXT. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "syncbn_mpi.h"

static int rank;

static int load(const char *dir, const char *name, void *buf, size_t bytes) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  if (!f) return fprintf(stderr, "rank %d: can't open %s\n", rank, path), 1;
  size_t got = bytes ? fread(buf, 1, bytes, f) : 0;
  fclose(f);
  if (got != bytes) return fprintf(stderr, "rank %d: %s: %zu of %zu bytes\n", rank, path, got, bytes), 1;
  return 0;
}

static int save(const char *dir, const char *name, const void *buf, size_t bytes) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) return fprintf(stderr, "rank %d: can't write %s\n", rank, path), 1;
  size_t put = bytes ? fwrite(buf, 1, bytes, f) : 0;
  fclose(f);
  return put != bytes;
}

#define TRY(call)                                                                                     \
  do {                                                                                                \
    sbn_status st_ = (call);                                                                          \
    if (st_ != SBN_STATUS_OK) {                                                                       \
      fprintf(stderr, "rank %d: %s -> %s: %s\n", rank, #call, sbn_status_name(st_), sbn_last_error()); \
      MPI_Abort(MPI_COMM_WORLD, 2);                                                                   \
    }                                                                                                 \
  } while (0)

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int P;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  if (argc < 2) {
    fprintf(stderr, "usage: torch_peer_mpi DIR\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  const char *dir = argv[1];
  char path[1024];
  snprintf(path, sizeof path, "%s/config.txt", dir);
  FILE *f = fopen(path, "r");
  int ndim, layout, affine, track, steps;
  long long C;
  double momentum, eps;
  int64_t shape[SBN_MAX_DIMS] = {0};
  int ok = f && fscanf(f, "%d %d %lld %d %d %lf %lf %d", &ndim, &layout, &C, &affine, &track, &momentum, &eps, &steps) == 8 &&
           ndim >= 2 && ndim <= SBN_MAX_DIMS;
  int bits = 32; /* optional, the rest of the first line */
  char rest[64] = "";
  if (ok && fgets(rest, sizeof rest, f) && sscanf(rest, "%d", &bits) != 1) bits = 32;
  ok = ok && (bits == 32 || bits == 64);
  const sbn_dtype dt = bits == 64 ? SBN_DTYPE_FLOAT64 : SBN_DTYPE_FLOAT32;
  const size_t es = bits / 8;
  const char *ext = bits == 64 ? "f64" : "f32";
  for (int r = 0; ok && r < P; r++)
    for (int i = 0; ok && i < ndim; i++) {
      long long v;
      ok = fscanf(f, "%lld", &v) == 1;
      if (r == rank) shape[i] = v;
    }
  if (f) fclose(f);
  if (!ok) {
    fprintf(stderr, "rank %d: bad %s\n", rank, path);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  sbn_group *world;
  TRY(sbn_group_from_mpi(&world, MPI_COMM_WORLD));
  sbn_bn_options opt = sbn_bn_options_default(C);
  opt.affine = affine, opt.track_running_stats = track, opt.eps = eps;
  opt.momentum = momentum < 0 ? SBN_MOMENTUM_CUMULATIVE : momentum;
  opt.param_dtype = dt;
  sbn_bn *bn;
  TRY(sbn_bn_create(&bn, &opt, world));
  sbn_tensor v;
  int bad = 0;
  if (affine) {
    TRY(sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_WEIGHT));
    char wn[16], bn_[16];
    snprintf(wn, sizeof wn, "w.%s", ext), snprintf(bn_, sizeof bn_, "b.%s", ext);
    bad |= load(dir, wn, v.data, es * (size_t)C);
    TRY(sbn_bn_tensor(&v, bn, SBN_BN_TENSOR_BIAS));
    bad |= load(dir, bn_, v.data, es * (size_t)C);
  }
  size_t numel = 1;
  for (int i = 0; i < ndim; i++) numel *= (size_t)shape[i];
  void *x = malloc(es * numel + 8), *dy = malloc(es * numel + 8), *y = malloc(es * numel + 8), *dx = malloc(es * numel + 8);
  sbn_layout lay = layout ? SBN_LAYOUT_CHANNELS_LAST : SBN_LAYOUT_CHANNELS_FIRST;
  sbn_tensor tx = sbn_tensor_cpu(x, ndim, shape, dt, lay), ty = sbn_tensor_cpu(y, ndim, shape, dt, lay);
  sbn_tensor tdy = sbn_tensor_cpu(dy, ndim, shape, dt, lay), tdx = sbn_tensor_cpu(dx, ndim, shape, dt, lay);
  char name[64];
  for (int s = 0; s <= steps && !bad; s++) {
    snprintf(name, sizeof name, "x_%d_%d.%s", s, rank, ext), bad |= load(dir, name, x, es * numel);
    snprintf(name, sizeof name, "dy_%d_%d.%s", s, rank, ext), bad |= load(dir, name, dy, es * numel);
    if (bad) break;
    TRY(sbn_bn_set_training(bn, s < steps));
    TRY(sbn_bn_zero_grad(bn));
    TRY(sbn_bn_forward(bn, &ty, &tx));
    TRY(sbn_bn_backward(bn, &tdx, &tdy, &tx));
    snprintf(name, sizeof name, "y_%d_%d.%s", s, rank, ext), bad |= save(dir, name, y, es * numel);
    snprintf(name, sizeof name, "dx_%d_%d.%s", s, rank, ext), bad |= save(dir, name, dx, es * numel);
    static const struct { sbn_bn_tensor_id id; const char *n; } outs[] = {
        {SBN_BN_TENSOR_GRAD_WEIGHT, "gw"}, {SBN_BN_TENSOR_GRAD_BIAS, "gb"},
        {SBN_BN_TENSOR_RUNNING_MEAN, "rm"}, {SBN_BN_TENSOR_RUNNING_VAR, "rv"}};
    for (int k = 0; k < 4; k++) {
      if (sbn_bn_tensor(&v, bn, outs[k].id) != SBN_STATUS_OK) continue; /* layer has none */
      snprintf(name, sizeof name, "%s_%d_%d.%s", outs[k].n, s, rank, ext);
      bad |= save(dir, name, v.data, es * (size_t)C);
    }
  }
  int any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
  sbn_bn_destroy(bn);
  sbn_group_destroy(world);
  free(x), free(dy), free(y), free(dx);
  MPI_Finalize();
  return any ? 1 : 0;
}
