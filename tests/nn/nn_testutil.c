#include "nn_testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRY(call)                                   \
  do {                                              \
    if ((call) != SBN_STATUS_OK) {                  \
      fprintf(stderr, "%s: %s\n", #call, sbn_last_error()); \
      return 1;                                     \
    }                                               \
  } while (0)

static int add(sbn_module *seq, sbn_module *m) { return sbn_nn_sequential_append(seq, NULL, m) != SBN_STATUS_OK; }

int nn_build_net(sbn_module **out, uint64_t seed) {
  sbn_module *s, *m;
  sbn_bn_options o8 = sbn_bn_options_default(8), o12 = sbn_bn_options_default(12);
  TRY(sbn_nn_sequential_create(&s));
  TRY(sbn_nn_conv2d_create(&m, 3, 8, 3, 1, 1, 1, seed + 1)); if (add(s, m)) return 1;
  TRY(sbn_nn_batchnorm_create(&m, 2, &o8)); if (add(s, m)) return 1;
  TRY(sbn_nn_relu_create(&m)); if (add(s, m)) return 1;
  TRY(sbn_nn_maxpool2d_create(&m, 2, 0, 0)); if (add(s, m)) return 1;
  TRY(sbn_nn_basic_block_create(&m, 8, 8, 1, seed + 2)); if (add(s, m)) return 1;
  TRY(sbn_nn_basic_block_create(&m, 8, 16, 2, seed + 3)); if (add(s, m)) return 1;
  TRY(sbn_nn_global_avgpool_create(&m)); if (add(s, m)) return 1;
  TRY(sbn_nn_flatten_create(&m)); if (add(s, m)) return 1;
  TRY(sbn_nn_linear_create(&m, 16, 12, 1, seed + 4)); if (add(s, m)) return 1;
  TRY(sbn_nn_batchnorm_create(&m, 1, &o12)); if (add(s, m)) return 1;
  TRY(sbn_nn_relu_create(&m)); if (add(s, m)) return 1;
  TRY(sbn_nn_linear_create(&m, 12, NET_CLASSES, 1, seed + 5)); if (add(s, m)) return 1;
  *out = s;
  return 0;
}

void nn_randomize(sbn_module *m, rng *r) {
  sbn_nn_entry *e;
  int n;
  if (sbn_module_entries(&e, &n, m, SBN_NN_STATE) != SBN_STATUS_OK) return;
  for (int i = 0; i < n; i++) {
    const char *nm = e[i].name;
    size_t L = strlen(nm);
    if (e[i].dtype == SBN_DTYPE_INT64) {
      *(int64_t *)e[i].data = rng_int(r, 0, 20);
      continue;
    }
    float *p = e[i].data;
    int is_var = L >= 11 && !strcmp(nm + L - 11, "running_var");
    int is_bn_w = e[i].ndim == 1 && L >= 6 && !strcmp(nm + L - 6, "weight");
    for (int64_t j = 0; j < e[i].numel; j++) {
      double v = rng_normal(r);
      if (is_var) p[j] = (float)(0.5 + rng_uniform(r));
      else if (is_bn_w) p[j] = (float)(1.0 + 0.3 * v);
      else p[j] = (float)(0.3 * v);
    }
  }
  free(e);
}

size_t nn_entry_bytes(const sbn_nn_entry *e) {
  return (size_t)e->numel * (e->dtype == SBN_DTYPE_INT64 || e->dtype == SBN_DTYPE_FLOAT64 ? 8 : 4);
}

int nn_snapshot_take(nn_snapshot *s, sbn_module *m) {
  memset(s, 0, sizeof *s);
  if (sbn_module_entries(&s->e, &s->n, m, SBN_NN_STATE) != SBN_STATUS_OK) return 1;
  s->bytes = calloc((size_t)s->n + 1, sizeof *s->bytes);
  s->grads = calloc((size_t)s->n + 1, sizeof *s->grads);
  for (int i = 0; i < s->n; i++) {
    size_t b = nn_entry_bytes(&s->e[i]);
    s->bytes[i] = malloc(b + 1);
    memcpy(s->bytes[i], s->e[i].data, b);
    if (s->e[i].grad) {
      s->grads[i] = malloc(b + 1);
      memcpy(s->grads[i], s->e[i].grad, b);
    }
  }
  return 0;
}

int nn_snapshot_diff(const nn_snapshot *s, sbn_module *m, int with_grads, char *why, size_t cap) {
  sbn_nn_entry *e;
  int n, bad = 0;
  if (why && cap) why[0] = 0;
  if (sbn_module_entries(&e, &n, m, SBN_NN_STATE) != SBN_STATUS_OK) return -1;
  if (n != s->n) {
    if (why) snprintf(why, cap, "entry count %d vs %d", n, s->n);
    free(e);
    return abs(n - s->n) + 1;
  }
  for (int i = 0; i < n; i++) {
    int d = strcmp(e[i].name, s->e[i].name) || e[i].ndim != s->e[i].ndim || e[i].dtype != s->e[i].dtype ||
            e[i].requires_grad != s->e[i].requires_grad || e[i].kind != s->e[i].kind;
    for (int k = 0; !d && k < e[i].ndim; k++) d = e[i].shape[k] != s->e[i].shape[k];
    if (!d) d = memcmp(e[i].data, s->bytes[i], nn_entry_bytes(&e[i])) != 0;
    if (!d && with_grads && (e[i].grad != NULL) != (s->grads[i] != NULL)) d = 1;
    if (!d && with_grads && e[i].grad) d = memcmp(e[i].grad, s->grads[i], nn_entry_bytes(&e[i])) != 0;
    if (d && !bad && why) snprintf(why, cap, "%s", e[i].name);
    bad += d;
  }
  free(e);
  return bad;
}

void nn_snapshot_restore(const nn_snapshot *s, sbn_module *m) {
  sbn_nn_entry *e;
  int n;
  if (sbn_module_entries(&e, &n, m, SBN_NN_STATE) != SBN_STATUS_OK) return;
  for (int i = 0; i < n && i < s->n; i++) memcpy(e[i].data, s->bytes[i], nn_entry_bytes(&e[i]));
  free(e);
}

void nn_snapshot_free(nn_snapshot *s) {
  for (int i = 0; i < s->n; i++) free(s->bytes[i]), free(s->grads[i]);
  free(s->bytes), free(s->grads), free(s->e);
  memset(s, 0, sizeof *s);
}

int nn_read_file(const char *path, unsigned char **buf, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return 1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  *buf = malloc((size_t)n + 1);
  *len = fread(*buf, 1, (size_t)n, f);
  fclose(f);
  return *len != (size_t)n;
}

int nn_write_file(const char *path, const void *buf, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) return 1;
  size_t w = fwrite(buf, 1, len, f);
  return (fclose(f) != 0) | (w != len);
}
