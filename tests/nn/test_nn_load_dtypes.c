/* Loading checkpoint entries of another dtype than the model's, against
 * PyTorch's own load_state_dict (param.copy_(input)): tests/nn/load_dtypes.py
 * writes every source dtype torch has (F64 F32 F16 BF16 I64 I32 I16 I8 U8
 * BOOL) with torch's conversion of it into each model dtype (F32 F64 F16
 * BF16 I64); the loaded bits must be torch's (NaN: any NaN, as torch's own
 * scalar and vector paths give different NaN bits). Then BatchNorm2d
 * checkpoints saved from .double(), .half(), .bfloat16() models and one
 * with an int32 num_batches_tracked load into the float32 module exactly as
 * torch loads them. Refusals leave the state unchanged: a shape mismatch,
 * float8 entries, NaN/infinite/out-of-range values into an int64, an
 * out-of-range num_batches_tracked, a U64 above INT64_MAX.
 *
 * Usage: test_nn_load_dtypes DIR (the folder load_dtypes.py wrote). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nn_testutil.h"

static const char *const float_srcs[] = {"F64", "F32", "F16", "BF16"};
static const char *const int_srcs[] = {"I64", "I32", "I16", "I8", "U8", "BOOL"};
static const sbn_dtype dests[] = {SBN_DTYPE_FLOAT32, SBN_DTYPE_FLOAT64, SBN_DTYPE_FLOAT16, SBN_DTYPE_BFLOAT16,
                                  SBN_DTYPE_INT64};
static const char *const dest_names[] = {"F32", "F64", "F16", "BF16", "I64"};
static const int dest_size[] = {4, 8, 2, 2, 8};

static sbn_nn_entry entry(const char *name, sbn_dtype dt, int64_t n, void *data) {
  sbn_nn_entry e;
  memset(&e, 0, sizeof e);
  snprintf(e.name, sizeof e.name, "%s", name);
  e.kind = SBN_NN_ENTRY_KIND_BUFFER;
  e.dtype = dt, e.ndim = 1, e.shape[0] = n, e.numel = n, e.data = data;
  return e;
}

static int is_nan_bits(const unsigned char *p, int d) {
  if (d == 0) { float f; memcpy(&f, p, 4); return isnan(f); }
  if (d == 1) { double f; memcpy(&f, p, 8); return isnan(f); }
  uint16_t h;
  memcpy(&h, p, 2);
  return d == 2 ? (h & 0x7fff) > 0x7c00 : (h & 0x7fff) > 0x7f80;
}

/* Load `src` as dest d and torch's "want" beside it in one call; compare. */
static int check_pair(const unsigned char *file, size_t len, const char *src, const char *want, int64_t n, int d) {
  unsigned char *got = calloc((size_t)n + 1, 8), *ref = calloc((size_t)n + 1, 8);
  sbn_nn_entry e[2] = {entry(src, dests[d], n, got), entry(want, dests[d], n, ref)};
  sbn_status st = sbn_nn_load_entries(e, 2, file, len, 0, NULL);
  int bad = 0, first = -1;
  if (st != SBN_STATUS_OK) {
    printf("  FAIL %s -> %s: %s\n", src, dest_names[d], sbn_last_error());
    bad = 1;
  }
  for (int64_t k = 0; st == SBN_STATUS_OK && k < n; k++) {
    const unsigned char *a = got + k * dest_size[d], *b = ref + k * dest_size[d];
    int same = !memcmp(a, b, (size_t)dest_size[d]) || (d < 4 && is_nan_bits(a, d) && is_nan_bits(b, d));
    if (!same && first < 0) first = (int)k;
    bad += !same;
  }
  if (first >= 0) {
    unsigned long long ga = 0, rb = 0;
    memcpy(&ga, got + first * dest_size[d], (size_t)dest_size[d]);
    memcpy(&rb, ref + first * dest_size[d], (size_t)dest_size[d]);
    printf("  FAIL %s -> %s: %d of %lld values differ from torch's; first at %d: 0x%llx, torch 0x%llx\n", src,
           dest_names[d], bad, (long long)n, first, ga, rb);
  }
  free(got), free(ref);
  return bad != 0;
}

static int test_against_torch(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/convert.safetensors", dir);
  unsigned char *file;
  size_t len;
  NN_CHECK(nn_read_file(path, &file, &len) == 0, "reading %s", path);
  int64_t counts[14];
  sbn_nn_entry c = entry("counts", SBN_DTYPE_INT64, 14, counts);
  NN_CHECK(sbn_nn_load_entries(&c, 1, file, len, 0, NULL) == SBN_STATUS_OK, "counts");
  int fails = 0, pairs = 0;
  char src[64], want[64];
  for (int s = 0; s < 4; s++)
    for (int d = 0; d < 5; d++) {
      snprintf(src, sizeof src, "%s.%s", d == 4 ? "srci" : "src", float_srcs[s]);
      snprintf(want, sizeof want, "want.%s.%s", float_srcs[s], dest_names[d]);
      fails += check_pair(file, len, src, want, counts[2 * s + (d == 4)], d), pairs++;
    }
  for (int s = 0; s < 6; s++)
    for (int d = 0; d < 5; d++) {
      snprintf(src, sizeof src, "src.%s", int_srcs[s]);
      snprintf(want, sizeof want, "want.%s.%s", int_srcs[s], dest_names[d]);
      fails += check_pair(file, len, src, want, counts[8 + s], d), pairs++;
    }
  printf("%d source->model dtype pairs (%lld float values per float source, rounding ties, subnormals, overflow, "
         "NaN): %d differ from torch's copy_\n",
         pairs, (long long)counts[0], fails);
  free(file);
  return fails;
}

/* A BatchNorm2d(3) loads each torch state dict of another dtype (strict) and
 * must then hold what torch's float32 model held after load_state_dict. */
static int test_bn_files(const char *dir) {
  static const char *const variants[] = {"f64", "f16", "bf16", "i32nbt"};
  int fails = 0;
  for (int v = 0; v < 4; v++) {
    sbn_bn_options o = sbn_bn_options_default(3);
    sbn_module *got, *want;
    NN_CHECK(sbn_nn_batchnorm_create(&got, 2, &o) == SBN_STATUS_OK && sbn_nn_batchnorm_create(&want, 2, &o) == SBN_STATUS_OK, "create");
    char p[4096], pw[4096];
    snprintf(p, sizeof p, "%s/bn_%s.safetensors", dir, variants[v]);
    snprintf(pw, sizeof pw, "%s/bn_%s.want.safetensors", dir, variants[v]);
    sbn_status st = sbn_nn_load(got, p, SBN_NN_LOAD_STRICT, NULL);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", st == SBN_STATUS_OK ? "" : sbn_last_error());
    NN_CHECK(sbn_nn_load(want, pw, SBN_NN_LOAD_STRICT, NULL) == SBN_STATUS_OK, "torch's float32 state");
    nn_snapshot s;
    nn_snapshot_take(&s, want);
    char why[300] = "";
    int d = st == SBN_STATUS_OK ? nn_snapshot_diff(&s, got, 0, why, sizeof why) : -1;
    printf("  BatchNorm2d(3) float32 <- torch %s state dict (strict): %s %s, %d entries differ from torch's load%s%s\n",
           variants[v], sbn_status_name(st), msg, d, d ? ": " : "", why);
    fails += d != 0;
    nn_snapshot_free(&s);
    sbn_module_destroy(got), sbn_module_destroy(want);
  }
  return fails;
}

/* Raw safetensors image of one entry "w". */
static size_t raw1(unsigned char *out, const char *dtype, int64_t n, int elsize, const void *data) {
  char json[256];
  int k = snprintf(json, sizeof json, "{\"w\":{\"dtype\":\"%s\",\"shape\":[%lld],\"data_offsets\":[0,%lld]}}",
                   dtype, (long long)n, (long long)(n * elsize));
  while (k % 8) json[k++] = ' ';
  for (int i = 0; i < 8; i++) out[i] = (unsigned char)((uint64_t)k >> (8 * i));
  memcpy(out + 8, json, (size_t)k);
  memcpy(out + 8 + k, data, (size_t)(n * elsize));
  return 8 + (size_t)k + (size_t)(n * elsize);
}

/* A refused load: the status, the key in the message, nothing written. */
static int refuse(const char *what, const char *dtype, int elsize, const void *data, int64_t n, sbn_dtype to) {
  unsigned char file[512], dst[64];
  size_t len = raw1(file, dtype, n, elsize, data);
  memset(dst, 0xab, sizeof dst);
  /* "ok" is not in the file: a non-strict load would write nothing to it either. */
  sbn_nn_entry e[2] = {entry("ok", SBN_DTYPE_FLOAT32, 1, dst + 32), entry("w", to, n, dst)};
  sbn_status st = sbn_nn_load_entries(e, 2, file, len, 0, NULL);
  int untouched = 1;
  for (size_t i = 0; i < sizeof dst; i++) untouched &= dst[i] == 0xab;
  int bad = st != SBN_STATUS_INVALID_ARGUMENT || !strstr(sbn_last_error(), "\"w\"") || !untouched;
  printf("  %-46s -> %s: %s%s\n", what, sbn_status_name(st), sbn_last_error(), untouched ? "" : " [STATE CHANGED]");
  if (bad) printf("  FAIL (%s)\n", what);
  return bad;
}

static int test_refusals(void) {
  int fails = 0;
  const double nan_inf[2] = {1.0, NAN}, inf[1] = {INFINITY}, big[1] = {0x1p63};
  const float big32[1] = {-0x1p64f};
  const uint64_t u64[2] = {5, UINT64_C(0x8000000000000000)};
  const uint8_t f8[2] = {0x38, 0x40};
  const int32_t wide[3] = {1, 2, 3};
  fails += refuse("F64 NaN into an I64", "F64", 8, nan_inf, 2, SBN_DTYPE_INT64);
  fails += refuse("F64 infinity into an I64", "F64", 8, inf, 1, SBN_DTYPE_INT64);
  fails += refuse("F64 2^63 into an I64", "F64", 8, big, 1, SBN_DTYPE_INT64);
  fails += refuse("F32 -2^64 into an I64", "F32", 4, big32, 1, SBN_DTYPE_INT64);
  fails += refuse("U64 2^63 into an I64", "U64", 8, u64, 2, SBN_DTYPE_INT64);
  fails += refuse("F8_E4M3 into an F32", "F8_E4M3", 1, f8, 2, SBN_DTYPE_FLOAT32);
  fails += refuse("F8_E5M2 into an F32", "F8_E5M2", 1, f8, 2, SBN_DTYPE_FLOAT32);
  {
    /* Shape mismatch with a dtype change: refused, as torch does. */
    unsigned char file[512], dst[16];
    size_t len = raw1(file, "I32", 3, 4, wide);
    memset(dst, 0xab, sizeof dst);
    sbn_nn_entry e = entry("w", SBN_DTYPE_FLOAT32, 2, dst);
    sbn_status st = sbn_nn_load_entries(&e, 1, file, len, 0, NULL);
    int untouched = dst[0] == 0xab && dst[7] == 0xab;
    printf("  %-46s -> %s: %s\n", "I32 [3] into an F32 [2]", sbn_status_name(st), sbn_last_error());
    if (st != SBN_STATUS_INVALID_ARGUMENT || !untouched) fails++, printf("  FAIL (shape)\n");
  }
  {
    /* num_batches_tracked from a float: truncated as torch; -3.7 -> -3 is out of range. */
    sbn_bn_options o = sbn_bn_options_default(2);
    sbn_module *bn;
    NN_CHECK(sbn_nn_batchnorm_create(&bn, 1, &o) == SBN_STATUS_OK, "create");
    sbn_nn_entry *e;
    int n;
    NN_CHECK(sbn_module_entries(&e, &n, bn, SBN_NN_STATE) == SBN_STATUS_OK, "entries");
    float vals[4][2] = {{1.5f, -2.f}, {0.25f, 0.5f}, {3.f, 4.f}, {0.f, 0.f}};
    double nbt = 7.9;
    sbn_nn_entry save[5];
    for (int i = 0; i < n; i++) {
      save[i] = e[i];
      if (e[i].dtype == SBN_DTYPE_INT64) save[i].dtype = SBN_DTYPE_FLOAT64, save[i].data = &nbt;
      else save[i].data = vals[i];
    }
    char path[] = "/tmp/sbn_nbt_XXXXXX";
    int fd = mkstemp(path);
    NN_CHECK(fd >= 0, "mkstemp");
    close(fd);
    NN_CHECK(sbn_nn_save_entries(path, save, n) == SBN_STATUS_OK, "save");
    sbn_status st = sbn_nn_load(bn, path, SBN_NN_LOAD_STRICT, NULL);
    int64_t got = -1;
    for (int i = 0; i < n; i++)
      if (e[i].dtype == SBN_DTYPE_INT64) got = *(int64_t *)e[i].data;
    printf("  F64 num_batches_tracked 7.9 -> %s, %lld (torch: 7)\n", sbn_status_name(st), (long long)got);
    fails += st != SBN_STATUS_OK || got != 7;
    nn_snapshot s;
    nn_snapshot_take(&s, bn);
    nbt = -3.7;
    for (int i = 0; i < 4; i++) vals[i][0] += 1; /* a load that would change the floats too */
    NN_CHECK(sbn_nn_save_entries(path, save, n) == SBN_STATUS_OK, "save");
    st = sbn_nn_load(bn, path, SBN_NN_LOAD_STRICT, NULL);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", sbn_last_error());
    int d = nn_snapshot_diff(&s, bn, 1, NULL, 0);
    printf("  F64 num_batches_tracked -3.7 -> %s: %s%s\n", sbn_status_name(st), msg,
           d ? " [STATE CHANGED]" : " (state unchanged)");
    fails += st != SBN_STATUS_INVALID_ARGUMENT || d;
    /* The same file with a valid value: converted by default, refused with
     * SBN_NN_LOAD_EXACT_DTYPES (its message names the entry), and unknown
     * flag bits are refused; neither refusal changes anything. */
    nbt = 5.0;
    NN_CHECK(sbn_nn_save_entries(path, save, n) == SBN_STATUS_OK, "save");
    const unsigned flag_sets[] = {SBN_NN_LOAD_STRICT | SBN_NN_LOAD_EXACT_DTYPES, SBN_NN_LOAD_EXACT_DTYPES, 0x10u};
    for (int f = 0; f < 3; f++) {
      st = sbn_nn_load(bn, path, flag_sets[f], NULL);
      snprintf(msg, sizeof msg, "%s", sbn_last_error());
      d = nn_snapshot_diff(&s, bn, 1, NULL, 0);
      const char *want = f < 2 ? "num_batches_tracked" : "flags";
      printf("  F64 num_batches_tracked 5.0, flags 0x%x -> %s: %s%s\n", flag_sets[f], sbn_status_name(st), msg,
             d ? " [STATE CHANGED]" : " (state unchanged)");
      if (st != SBN_STATUS_INVALID_ARGUMENT || d || !strstr(msg, want))
        fails++, printf("  FAIL: expected INVALID_ARGUMENT naming \"%s\", state unchanged\n", want);
    }
    nn_snapshot_free(&s);
    unlink(path);
    free(e);
    sbn_module_destroy(bn);
  }
  return fails;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR (written by tests/nn/load_dtypes.py)\n", argv[0]);
    return 2;
  }
  int fails = test_against_torch(argv[1]);
  fails += test_bn_files(argv[1]);
  fails += test_refusals();
  printf("%s: %d failure(s)\n", fails ? "FAIL" : "OK", fails);
  return fails != 0;
}
