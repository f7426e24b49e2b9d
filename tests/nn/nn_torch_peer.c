/* The C side of the PyTorch peer test (tests/nn/torch_peer.py).
 *   export DIR: build the reference network with random weights and
 *     buffers, write DIR/model.safetensors and DIR/input.safetensors, run
 *     two training steps (forward, cross-entropy, backward, SGD with
 *     momentum, weight decay, Nesterov) and an eval forward, and write every
 *     result to DIR/results.safetensors for the peer to compare.
 *   import DIR: load DIR/torch_model.safetensors written by PyTorch into a
 *     fresh network (strict) and compare its eval and training outputs
 *     with PyTorch's (DIR/torch_out.safetensors). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn_testutil.h"

#define N 6
static const sbn_nn_sgd_options SGD = {0.1, 0.9, 0.0, 1e-4, 1};

typedef struct outs {
  sbn_nn_entry e[128];
  int n;
} outs;

static void put(outs *o, const char *name, sbn_dtype dt, int ndim, const int64_t *shape, const void *data) {
  sbn_nn_entry *e = &o->e[o->n++];
  memset(e, 0, sizeof *e);
  snprintf(e->name, sizeof e->name, "%s", name);
  e->dtype = dt, e->ndim = ndim, e->numel = 1;
  for (int i = 0; i < ndim; i++) e->shape[i] = shape[i], e->numel *= shape[i];
  size_t b = nn_entry_bytes(e);
  e->data = malloc(b + 1);
  memcpy(e->data, data, b);
}

static int step(sbn_module *net, sbn_tensor *x, int64_t *t, sbn_nn_sgd *opt, outs *o, double *loss, int record) {
  sbn_tensor y, dx;
  CHECK_OK(sbn_module_zero_grad(net));
  CHECK_OK(sbn_module_forward(net, &y, x));
  CHECK_OK(sbn_nn_cross_entropy_forward(loss, &y, t, 0));
  float dl[N * NET_CLASSES];
  sbn_tensor dlt = sbn_tensor_cpu(dl, 2, y.shape, SBN_DTYPE_FLOAT32, 0);
  CHECK_OK(sbn_nn_cross_entropy_backward(&dlt, &y, t, 0));
  if (record) put(o, "step1.logits", SBN_DTYPE_FLOAT32, 2, y.shape, y.data);
  CHECK_OK(sbn_module_backward(net, &dx, &dlt));
  if (record) {
    put(o, "step1.dx", SBN_DTYPE_FLOAT32, 4, dx.shape, dx.data);
    sbn_nn_entry *e;
    int n;
    CHECK_OK(sbn_module_entries(&e, &n, net, SBN_NN_PARAMETERS));
    for (int i = 0; i < n; i++) {
      char nm[300];
      snprintf(nm, sizeof nm, "grad.%s", e[i].name);
      put(o, nm, SBN_DTYPE_FLOAT32, e[i].ndim, e[i].shape, e[i].grad);
    }
    free(e);
  }
  CHECK_OK(sbn_nn_sgd_step(opt));
  return 0;
}

static int do_export(const char *dir) {
  char path[4096];
  sbn_module *net;
  if (nn_build_net(&net, 7)) return 1;
  rng r = rng_seed(77);
  nn_randomize(net, &r);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  CHECK_OK(sbn_nn_save(path, net));
  static float x[N * 3 * 8 * 8];
  int64_t t[N], xs[4] = {N, 3, 8, 8}, ts[1] = {N};
  for (size_t i = 0; i < sizeof x / sizeof *x; i++) x[i] = (float)rng_normal(&r);
  for (int i = 0; i < N; i++) t[i] = rng_int(&r, 0, NET_CLASSES - 1);
  outs in = {.n = 0}, *o = calloc(1, sizeof *o);
  put(&in, "x", SBN_DTYPE_FLOAT32, 4, xs, x);
  put(&in, "targets", SBN_DTYPE_INT64, 1, ts, t);
  snprintf(path, sizeof path, "%s/input.safetensors", dir);
  CHECK_OK(sbn_nn_save_entries(path, in.e, in.n));

  sbn_tensor xt = sbn_tensor_cpu(x, 4, xs, SBN_DTYPE_FLOAT32, 0), y;
  sbn_nn_sgd *opt;
  CHECK_OK(sbn_nn_sgd_create(&opt, net, &SGD));
  double loss[2];
  if (step(net, &xt, t, opt, o, &loss[0], 1) || step(net, &xt, t, opt, o, &loss[1], 0)) return 1;
  int64_t two = 2;
  put(o, "loss", SBN_DTYPE_FLOAT64, 1, &two, loss);
  sbn_nn_entry *e;
  int n;
  CHECK_OK(sbn_module_entries(&e, &n, net, SBN_NN_STATE));
  for (int i = 0; i < n; i++) {
    char nm[300];
    snprintf(nm, sizeof nm, "after.%s", e[i].name);
    put(o, nm, e[i].dtype, e[i].ndim, e[i].shape, e[i].data);
  }
  free(e);
  CHECK_OK(sbn_module_train(net, 0));
  CHECK_OK(sbn_module_forward(net, &y, &xt));
  put(o, "eval.logits", SBN_DTYPE_FLOAT32, 2, y.shape, y.data);
  snprintf(path, sizeof path, "%s/results.safetensors", dir);
  CHECK_OK(sbn_nn_save_entries(path, o->e, o->n));
  printf("exported model, input and results (losses %.6f %.6f, %d result tensors) to %s\n", loss[0], loss[1], o->n, dir);
  for (int i = 0; i < o->n; i++) free(o->e[i].data);
  for (int i = 0; i < in.n; i++) free(in.e[i].data);
  free(o);
  sbn_nn_sgd_destroy(opt);
  sbn_module_destroy(net);
  return 0;
}

static int load_file(const char *path, sbn_nn_entry *e, int n) {
  unsigned char *buf;
  size_t len;
  if (nn_read_file(path, &buf, &len)) return fprintf(stderr, "cannot read %s\n", path), 1;
  sbn_status st = sbn_nn_load_entries(e, n, buf, len, SBN_NN_LOAD_STRICT, NULL);
  free(buf);
  CHECK_OK(st);
  return 0;
}

static int do_import(const char *dir) {
  char path[4096];
  sbn_module *net;
  if (nn_build_net(&net, 999)) return 1;
  snprintf(path, sizeof path, "%s/torch_model.safetensors", dir);
  CHECK_OK(sbn_nn_load(net, path, SBN_NN_LOAD_STRICT, NULL));
  static float x[N * 3 * 8 * 8], ev[N * NET_CLASSES], tr[N * NET_CLASSES], rm[8];
  int64_t t[N], xs[4] = {N, 3, 8, 8}, ts[1] = {N}, ls[2] = {N, NET_CLASSES}, cs[1] = {8}, nbt = 0;
  sbn_nn_entry in[2] = {{.name = "targets", .dtype = SBN_DTYPE_INT64, .ndim = 1, .numel = N, .data = t},
                        {.name = "x", .dtype = SBN_DTYPE_FLOAT32, .ndim = 4, .numel = N * 192, .data = x}};
  memcpy(in[0].shape, ts, sizeof ts), memcpy(in[1].shape, xs, sizeof xs);
  snprintf(path, sizeof path, "%s/input.safetensors", dir);
  if (load_file(path, in, 2)) return 1;
  sbn_nn_entry out[4] = {{.name = "eval.logits", .dtype = SBN_DTYPE_FLOAT32, .ndim = 2, .numel = N * NET_CLASSES, .data = ev},
                         {.name = "train.logits", .dtype = SBN_DTYPE_FLOAT32, .ndim = 2, .numel = N * NET_CLASSES, .data = tr},
                         {.name = "train.1.running_mean", .dtype = SBN_DTYPE_FLOAT32, .ndim = 1, .numel = 8, .data = rm},
                         {.name = "train.1.num_batches_tracked", .dtype = SBN_DTYPE_INT64, .ndim = 0, .numel = 1, .data = &nbt}};
  memcpy(out[0].shape, ls, sizeof ls), memcpy(out[1].shape, ls, sizeof ls), memcpy(out[2].shape, cs, sizeof cs);
  snprintf(path, sizeof path, "%s/torch_out.safetensors", dir);
  if (load_file(path, out, 4)) return 1;
  /* Same tolerance argument as the peer's: float32 on both sides, different
   * summation orders, errors ~1e-6 of the output scale. */
  sbn_tensor xt = sbn_tensor_cpu(x, 4, xs, SBN_DTYPE_FLOAT32, 0), y;
  double scale = 0, e1 = 0, e2 = 0, e3 = 0;
  CHECK_OK(sbn_module_train(net, 0));
  CHECK_OK(sbn_module_forward(net, &y, &xt));
  for (int i = 0; i < N * NET_CLASSES; i++) scale = fmax(scale, fabs(ev[i])), e1 = fmax(e1, fabs(((float *)y.data)[i] - ev[i]));
  CHECK_OK(sbn_module_train(net, 1));
  CHECK_OK(sbn_module_forward(net, &y, &xt));
  for (int i = 0; i < N * NET_CLASSES; i++) e2 = fmax(e2, fabs(((float *)y.data)[i] - tr[i]));
  sbn_nn_entry *e;
  int n;
  CHECK_OK(sbn_module_entries(&e, &n, net, SBN_NN_BUFFERS));
  for (int c = 0; c < 8; c++) e3 = fmax(e3, fabs(((float *)e[0].data)[c] - rm[c]));
  int64_t my_nbt = *(int64_t *)e[2].data;
  printf("PyTorch-saved checkpoint loaded here (%s = %lld after a training step, PyTorch %lld)\n", e[2].name,
         (long long)my_nbt, (long long)nbt);
  free(e);
  int bad = check("eval logits vs PyTorch", e1, 1e-4 * fmax(scale, 1));
  bad |= check("train-mode logits vs PyTorch", e2, 1e-4 * fmax(scale, 1));
  bad |= check("running_mean of layer 1 after a step vs PyTorch", e3, 1e-5);
  bad |= my_nbt != nbt;
  sbn_module_destroy(net);
  return bad;
}

int main(int argc, char **argv) {
  if (argc != 3) return fprintf(stderr, "usage: %s export|import DIR\n", argv[0]), 2;
  if (!strcmp(argv[1], "export")) return do_export(argv[2]);
  if (!strcmp(argv[1], "import")) return do_import(argv[2]);
  return 2;
}
