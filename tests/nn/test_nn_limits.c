/* Sizes that overflow and values read from files that are out of range are
 * refused with a status and a message, before anything is allocated,
 * written or changed:
 *   sbn_tensor_numel (-1), module inputs, Linear [2^61, 8], Conv2d with
 *   H = W = 2^33, MaxPool2d padding near INT_MAX, sbn_dataset_synthetic of
 *   2^62 images, sbn_dataset_gather with n < 0;
 *   num_batches_tracked = INT64_MAX or < 0 in a checkpoint (rejected at
 *   load, model untouched) and the forward's saturating increment;
 *   sbn_nn_save_entries with numel != prod(shape) (no file written);
 *   loaders given a FIFO or a directory (refused at once, never blocking);
 *   BatchNorm modules with float64 parameters (the nn modules, optimizers
 *   and checkpoints are float32; float64 layers are sbn_bn's only);
 *   child names whose state-dict names would exceed SBN_NN_NAME_MAX - 1
 *   characters, refused when the child is attached (not at the first save),
 *   naming the parent's path and the limit; names exactly at the limit save
 *   and load.
 * An alarm turns a hang into a failure. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nn_testutil.h"
#include "syncbn_data.h"

static int failures;

/* For void helpers: count a failed setup call and return. */
#define CHECK_OK_V(call)                                                                          \
  do {                                                                                            \
    sbn_status st_ = (call);                                                                      \
    if (st_ != SBN_STATUS_OK) {                                                                   \
      printf("%s:%d: %s -> %s: %s FAIL\n", __FILE__, __LINE__, #call, sbn_status_name(st_),        \
             sbn_last_error());                                                                   \
      failures++;                                                                                 \
      return;                                                                                     \
    }                                                                                             \
  } while (0)

/* Expect status `want` and a message containing `needle`. */
static void expect(const char *what, sbn_status got, sbn_status want, const char *needle) {
  const char *msg = sbn_last_error();
  int ok = got == want && msg[0] && (!needle || strstr(msg, needle));
  printf("%-58s -> %-28s \"%s\" %s\n", what, sbn_status_name(got), msg, ok ? "ok" : "FAIL");
  if (!ok) {
    printf("   expected %s with a message containing \"%s\"\n", sbn_status_name(want), needle ? needle : "");
    failures++;
  }
}

static void test_sizes(void) {
  /* sbn_tensor_numel */
  int64_t big[2] = {INT64_C(1) << 61, 8}, neg[2] = {2, -3}, ok[3] = {2, 3, 4}, zero_big[3] = {0, INT64_C(1) << 40,
                                                                                              INT64_C(1) << 40};
  sbn_tensor t = sbn_tensor_cpu(NULL, 2, big, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_tensor tn = sbn_tensor_cpu(NULL, 2, neg, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_tensor to = sbn_tensor_cpu(NULL, 3, ok, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  sbn_tensor tz = sbn_tensor_cpu(NULL, 3, zero_big, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  int64_t n1 = sbn_tensor_numel(&t), n2 = sbn_tensor_numel(&tn), n3 = sbn_tensor_numel(&to), n4 = sbn_tensor_numel(&tz);
  int nok = n1 == -1 && n2 == -1 && n3 == 24 && n4 == -1;
  printf("sbn_tensor_numel: [2^61, 8] -> %lld, [2, -3] -> %lld, [2, 3, 4] -> %lld, [0, 2^40, 2^40] -> %lld "
         "(expected -1, -1, 24, -1: the non-zero dimensions overflow) %s\n",
         (long long)n1, (long long)n2, (long long)n3, (long long)n4, nok ? "ok" : "FAIL");
  failures += !nok;

  /* Linear: [2^61, 8] must fail (it used to return OK with a 1-float buffer) */
  float buf[64] = {0};
  sbn_module *lin, *conv, *pool, *bn;
  CHECK_OK_V(sbn_nn_linear_create(&lin, 8, 4, 1, 1));
  sbn_tensor x = sbn_tensor_cpu(buf, 2, big, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), y;
  expect("Linear.forward x [2^61, 8]", sbn_module_forward(lin, &y, &x), SBN_STATUS_INVALID_ARGUMENT, "overflows");
  int64_t rows[2] = {INT64_C(1) << 32, 8}; /* fits int64, not the BLAS int */
  x = sbn_tensor_cpu(buf, 2, rows, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  expect("Linear.forward x [2^32, 8]", sbn_module_forward(lin, &y, &x), SBN_STATUS_INVALID_ARGUMENT, "rows");
  /* a module input with a negative dim, a 3-D one whose product overflows */
  int64_t o3[3] = {INT64_C(1) << 31, INT64_C(1) << 31, 8};
  x = sbn_tensor_cpu(buf, 3, o3, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  expect("Linear.forward x [2^31, 2^31, 8]", sbn_module_forward(lin, &y, &x), SBN_STATUS_INVALID_ARGUMENT,
         "overflows");

  /* Conv2d with H = W = 2^33: rejected before im2col writes anything */
  CHECK_OK_V(sbn_nn_conv2d_create(&conv, 1, 2, 3, 1, 1, 1, 2));
  int64_t huge[4] = {1, 1, INT64_C(1) << 33, INT64_C(1) << 33};
  x = sbn_tensor_cpu(buf, 4, huge, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  expect("Conv2d.forward x [1, 1, 2^33, 2^33]", sbn_module_forward(conv, &y, &x), SBN_STATUS_INVALID_ARGUMENT,
         "overflows");
  /* numel fits int64 but the output plane does not fit the GEMM's int */
  int64_t tall[4] = {1, 1, INT64_C(1) << 31, 4};
  x = sbn_tensor_cpu(buf, 4, tall, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  expect("Conv2d.forward x [1, 1, 2^31, 4]", sbn_module_forward(conv, &y, &x), SBN_STATUS_INVALID_ARGUMENT,
         "overflows");
  /* an empty batch whose planes are huge: N = 0 but H*W overflow */
  int64_t empty_huge[4] = {0, 1, INT64_C(1) << 40, INT64_C(1) << 40};
  x = sbn_tensor_cpu(NULL, 4, empty_huge, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  expect("Conv2d.forward x [0, 1, 2^40, 2^40]", sbn_module_forward(conv, &y, &x), SBN_STATUS_INVALID_ARGUMENT,
         "overflows");

  /* MaxPool2d: 2 * padding used to overflow the check */
  pool = (sbn_module *)1;
  expect("sbn_nn_maxpool2d_create(3, 1, INT_MAX)", sbn_nn_maxpool2d_create(&pool, 3, 1, 0x7fffffff),
         SBN_STATUS_INVALID_ARGUMENT, "padding");
  if (pool) printf("   *out not cleared FAIL\n"), failures++;
  expect("sbn_nn_maxpool2d_create(INT_MAX, 1, 2^30)", sbn_nn_maxpool2d_create(&pool, 0x7fffffff, 1, 0x40000000),
         SBN_STATUS_INVALID_ARGUMENT, "padding");
  CHECK_OK_V(sbn_nn_maxpool2d_create(&pool, 4, 1, 2));
  int64_t wide[4] = {1, 1, 2, INT64_MAX - 1};
  x = sbn_tensor_cpu(buf, 4, wide, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  expect("MaxPool2d.forward x [1, 1, 2, 2^63-2]", sbn_module_forward(pool, &y, &x), SBN_STATUS_INVALID_ARGUMENT,
         "overflows");

  /* BatchNorm (module and core layer) */
  sbn_bn_options bo = sbn_bn_options_default(8);
  CHECK_OK_V(sbn_nn_batchnorm_create(&bn, 1, &bo));
  x = sbn_tensor_cpu(buf, 2, big, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST);
  expect("BatchNorm1d.forward x [2^61, 8]", sbn_module_forward(bn, &y, &x), SBN_STATUS_INVALID_ARGUMENT, "overflows");
  sbn_bn *core;
  CHECK_OK_V(sbn_module_bn(&core, bn));
  sbn_tensor yy = x;
  expect("sbn_bn_forward x [2^61, 8]", sbn_bn_forward(core, &yy, &x), SBN_STATUS_INVALID_ARGUMENT, "overflows");
  int64_t nbt = -1;
  sbn_bn_get_num_batches_tracked(core, &nbt);
  if (nbt != 0) printf("   num_batches_tracked changed to %lld FAIL\n", (long long)nbt), failures++;

  /* datasets */
  sbn_dataset d;
  expect("sbn_dataset_synthetic(2^62 images)", sbn_dataset_synthetic(&d, INT64_C(1) << 62, 1),
         SBN_STATUS_INVALID_ARGUMENT, "overflows");
  if (d.images || d.count) printf("   dataset not left empty FAIL\n"), failures++;
  CHECK_OK_V(sbn_dataset_synthetic(&d, 4, 1));
  int64_t idx[1] = {0};
  int32_t lab[1] = {77};
  float img[3 * 16 * 16];
  expect("sbn_dataset_gather(n = -1)", sbn_dataset_gather(img, lab, &d, idx, -1), SBN_STATUS_INVALID_ARGUMENT,
         "negative");
  if (lab[0] != 77) printf("   labels written FAIL\n"), failures++;
  sbn_dataset_free(&d);
  sbn_module_destroy(lin), sbn_module_destroy(conv), sbn_module_destroy(pool), sbn_module_destroy(bn);
}

/* num_batches_tracked from a file: out of range is refused at load. */
static void test_nbt(const char *dir) {
  sbn_bn_options o = sbn_bn_options_default(3);
  sbn_module *a, *b;
  CHECK_OK_V(sbn_nn_batchnorm_create(&a, 2, &o));
  CHECK_OK_V(sbn_nn_batchnorm_create(&b, 2, &o));
  rng r = rng_seed(5);
  nn_randomize(a, &r);
  nn_randomize(b, &r);
  sbn_nn_entry *e;
  int n;
  CHECK_OK_V(sbn_module_entries(&e, &n, a, SBN_NN_STATE));
  int64_t *nbt = NULL;
  for (int i = 0; i < n; i++)
    if (!strcmp(e[i].name, "num_batches_tracked")) nbt = e[i].data;
  char path[512];
  snprintf(path, sizeof path, "%s/nbt.safetensors", dir);
  const int64_t bad[3] = {INT64_MAX, -5, (INT64_C(1) << 53) + 1};
  for (int k = 0; k < 3; k++) {
    *nbt = bad[k];
    CHECK_OK_V(sbn_nn_save(path, a)); /* the writer does not judge values */
    nn_snapshot s;
    nn_snapshot_take(&s, b);
    char what[96], why[256] = "";
    snprintf(what, sizeof what, "sbn_nn_load: num_batches_tracked = %lld", (long long)bad[k]);
    expect(what, sbn_nn_load(b, path, SBN_NN_LOAD_STRICT, NULL), SBN_STATUS_INVALID_ARGUMENT, "out of range");
    int changed = nn_snapshot_diff(&s, b, 1, why, sizeof why);
    if (changed) printf("   model changed by the failed load (%s) FAIL\n", why), failures++;
    nn_snapshot_free(&s);
  }
  /* the largest valid value loads, and a forward saturates instead of
   * overflowing */
  *nbt = SBN_NUM_BATCHES_TRACKED_MAX;
  CHECK_OK_V(sbn_nn_save(path, a));
  CHECK_OK_V(sbn_nn_load(b, path, SBN_NN_LOAD_STRICT, NULL));
  float xs[2 * 3 * 2 * 2];
  for (int i = 0; i < 24; i++) xs[i] = (float)(i % 7) - 2.5f;
  int64_t shape[4] = {2, 3, 2, 2};
  sbn_tensor x = sbn_tensor_cpu(xs, 4, shape, SBN_DTYPE_FLOAT32, SBN_LAYOUT_CHANNELS_FIRST), y;
  sbn_status st = sbn_module_forward(b, &y, &x);
  sbn_nn_entry *eb;
  int nb;
  CHECK_OK_V(sbn_module_entries(&eb, &nb, b, SBN_NN_STATE));
  int64_t after = -1;
  for (int i = 0; i < nb; i++)
    if (!strcmp(eb[i].name, "num_batches_tracked")) after = *(int64_t *)eb[i].data;
  int ok = st == SBN_STATUS_OK && after == SBN_NUM_BATCHES_TRACKED_MAX;
  printf("forward at num_batches_tracked = 2^53 -> %s, now %lld (expected OK, saturated at 2^53) %s\n",
         sbn_status_name(st), (long long)after, ok ? "ok" : "FAIL");
  failures += !ok;
  /* set refuses out-of-range values */
  sbn_bn *core;
  CHECK_OK_V(sbn_module_bn(&core, b));
  expect("sbn_bn_set_num_batches_tracked(INT64_MAX)", sbn_bn_set_num_batches_tracked(core, INT64_MAX),
         SBN_STATUS_INVALID_ARGUMENT, "2^53");
  free(e), free(eb);
  sbn_module_destroy(a), sbn_module_destroy(b);
}

/* save_entries with numel != prod(shape): refused, nothing written */
static void test_save_entries(const char *dir) {
  float data[6] = {1, 2, 3, 4, 5, 6};
  sbn_nn_entry e;
  memset(&e, 0, sizeof e);
  snprintf(e.name, sizeof e.name, "w");
  e.kind = SBN_NN_ENTRY_KIND_PARAMETER, e.dtype = SBN_DTYPE_FLOAT32, e.ndim = 2, e.shape[0] = 2, e.shape[1] = 3;
  e.numel = 5, e.data = data;
  char path[512];
  snprintf(path, sizeof path, "%s/entries.safetensors", dir);
  expect("sbn_nn_save_entries numel 5, shape [2, 3]", sbn_nn_save_entries(path, &e, 1), SBN_STATUS_INVALID_ARGUMENT,
         "numel");
  struct stat sb;
  if (stat(path, &sb) == 0) printf("   a file was written FAIL\n"), failures++;
  e.shape[0] = INT64_C(1) << 62, e.shape[1] = 8, e.numel = 0;
  expect("sbn_nn_save_entries shape [2^62, 8]", sbn_nn_save_entries(path, &e, 1), SBN_STATUS_INVALID_ARGUMENT,
         "overflowing");
  e.shape[0] = 2, e.shape[1] = 3, e.numel = 6;
  CHECK_OK_V(sbn_nn_save_entries(path, &e, 1));
  if (stat(path, &sb) != 0) printf("   the valid save wrote nothing FAIL\n"), failures++;
}

/* FIFO and directory: refused at once (an alarm catches a blocked open) */
static void test_special_files(const char *dir) {
  char fifo[512], sub[512];
  snprintf(fifo, sizeof fifo, "%s/fifo", dir);
  snprintf(sub, sizeof sub, "%s/subdir", dir);
  if (mkfifo(fifo, 0600) != 0 || mkdir(sub, 0700) != 0) {
    printf("cannot create a FIFO or directory in %s: %s FAIL\n", dir, strerror(errno));
    failures++;
    return;
  }
  const char *paths[2] = {fifo, sub};
  const char *kinds[2] = {"FIFO", "directory"};
  sbn_module *m;
  sbn_bn_options o = sbn_bn_options_default(3);
  CHECK_OK_V(sbn_nn_batchnorm_create(&m, 2, &o));
  for (int k = 0; k < 2; k++) {
    char what[128];
    sbn_dataset d;
    alarm(20);
    snprintf(what, sizeof what, "sbn_dataset_load_cifar10(%s)", kinds[k]);
    expect(what, sbn_dataset_load_cifar10(&d, &paths[k], 1), SBN_STATUS_IO_ERROR, "regular file");
    snprintf(what, sizeof what, "sbn_dataset_load_mnist(%s, %s)", kinds[k], kinds[k]);
    expect(what, sbn_dataset_load_mnist(&d, paths[k], paths[k]), SBN_STATUS_IO_ERROR, "regular file");
    snprintf(what, sizeof what, "sbn_nn_load(%s)", kinds[k]);
    expect(what, sbn_nn_load(m, paths[k], 0, NULL), SBN_STATUS_IO_ERROR, "regular file");
    alarm(0);
  }
  sbn_module_destroy(m);
  unlink(fifo);
  rmdir(sub);
}

static void test_float64_modules(void) {
  sbn_bn_options o = sbn_bn_options_default(3);
  o.param_dtype = SBN_DTYPE_FLOAT64;
  sbn_module *m = (sbn_module *)&o; /* not NULL: the failure must clear it */
  expect("sbn_nn_batchnorm_create(param_dtype FLOAT64)", sbn_nn_batchnorm_create(&m, 2, &o),
         SBN_STATUS_UNSUPPORTED, "nn modules are float32");
  if (m) printf("   *out not NULL after the failure FAIL\n"), failures++;
  expect("sbn_nn_sync_batchnorm_create(param_dtype FLOAT64)", sbn_nn_sync_batchnorm_create(&m, &o, NULL),
         SBN_STATUS_UNSUPPORTED, "float64");
}

/* A Linear appended to a root so that "<name>.weight" has `len` characters. */
static sbn_status append_linear_of_len(sbn_module *seq, size_t len, sbn_module **child) {
  char name[600];
  const size_t nl = len - strlen(".weight");
  memset(name, 'n', nl);
  name[nl] = 0;
  sbn_status st = sbn_nn_linear_create(child, 2, 2, 1, 3);
  return st == SBN_STATUS_OK ? sbn_nn_sequential_append(seq, name, *child) : st;
}

static void test_name_limits(const char *dir) {
  const int limit = SBN_NN_NAME_MAX - 1;
  char path[512], what[128], needle[64];
  snprintf(path, sizeof path, "%s/names.safetensors", dir);
  snprintf(needle, sizeof needle, "over the limit of %d", limit);
  sbn_module *seq, *lin;
  CHECK_OK_V(sbn_nn_sequential_create(&seq));
  /* At the limit: accepted, and the checkpoint round-trips. */
  CHECK_OK_V(append_linear_of_len(seq, (size_t)limit, &lin));
  CHECK_OK_V(sbn_nn_save(path, seq));
  CHECK_OK_V(sbn_nn_load(seq, path, SBN_NN_LOAD_STRICT, NULL));
  printf("%-58s -> saved and loaded ok\n", "a Linear whose weight name has 255 characters");
  /* One over: refused at append, the tree and the child as they were. */
  snprintf(what, sizeof what, "append a Linear whose weight name has %d characters", limit + 1);
  sbn_status st = append_linear_of_len(seq, (size_t)limit + 1, &lin);
  expect(what, st, SBN_STATUS_INVALID_ARGUMENT, needle);
  if (!strstr(sbn_last_error(), "the root")) printf("   the message does not say where FAIL\n"), failures++;
  if (sbn_module_num_children(seq) != 1 || sbn_module_destroy(lin) != SBN_STATUS_OK)
    printf("   the tree changed or the child is not the caller's FAIL\n"), failures++;
  /* A 399-character name, even for a module without state. */
  char longname[400];
  memset(longname, 'n', 399), longname[399] = 0;
  sbn_module *relu;
  CHECK_OK_V(sbn_nn_relu_create(&relu));
  expect("append a ReLU named with 399 characters", sbn_nn_sequential_append(seq, longname, relu),
         SBN_STATUS_INVALID_ARGUMENT, "(399 characters)");
  sbn_module_destroy(relu);
  sbn_module_destroy(seq);

  /* 30 nested levels: the path is fine, the Linears under it are not. */
  sbn_module *root, *cur, *s;
  CHECK_OK_V(sbn_nn_sequential_create(&root));
  cur = root;
  char nm[64];
  for (int i = 0; i < 30; i++) {
    CHECK_OK_V(sbn_nn_sequential_create(&s));
    snprintf(nm, sizeof nm, "level%02d", i);
    CHECK_OK_V(sbn_nn_sequential_append(cur, nm, s));
    cur = s;
  }
  CHECK_OK_V(sbn_nn_linear_create(&lin, 2, 2, 1, 1));
  expect("append \"second_linear\" 30 levels deep", sbn_nn_sequential_append(cur, "second_linear", lin),
         SBN_STATUS_INVALID_ARGUMENT, needle);
  if (!strstr(sbn_last_error(), "under module \"level00.level01.") || !strstr(sbn_last_error(), "level29\""))
    printf("   the message does not name the parent's path FAIL\n"), failures++;
  sbn_module_destroy(lin);
  /* A subtree built on its own, then attached deep down: checked as a whole. */
  sbn_module *sub, *inner;
  CHECK_OK_V(sbn_nn_sequential_create(&sub));
  CHECK_OK_V(sbn_nn_sequential_create(&inner));
  CHECK_OK_V(sbn_nn_sequential_append(sub, "inner", inner));
  CHECK_OK_V(sbn_nn_linear_create(&lin, 2, 2, 1, 1));
  CHECK_OK_V(sbn_nn_sequential_append(inner, "fc", lin));
  expect("append a subtree with inner.fc.weight 30 levels deep", sbn_nn_sequential_append(cur, "subtree", sub),
         SBN_STATUS_INVALID_ARGUMENT, "subtree.inner.fc.weight");
  sbn_module_destroy(sub);
  /* Everything that was accepted lists, saves and changes requires_grad. */
  sbn_nn_entry *e;
  int n;
  CHECK_OK_V(sbn_module_entries(&e, &n, root, SBN_NN_STATE));
  free(e);
  CHECK_OK_V(sbn_module_set_requires_grad(root, NULL, 0));
  CHECK_OK_V(sbn_nn_save(path, root));
  printf("%-58s -> entries, set_requires_grad and save ok\n", "the 30-level tree as accepted");
  sbn_module_destroy(root);
}

int main(void) {
  char dir[] = "/tmp/sbn_limits_XXXXXX";
  if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
  test_sizes();
  test_nbt(dir);
  test_save_entries(dir);
  test_special_files(dir);
  test_float64_modules();
  test_name_limits(dir);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  printf(failures ? "FAIL: %d problem(s)\n" : "limits: all ok\n", failures);
  return failures != 0;
}
