/* Checkpoints: round trip; every failure mode leaves the model bit-for-bit
 * unchanged (truncation at many offsets, byte flips in the length, the
 * header and the data, hand-made corrupt headers, wrong shape, another dtype (converted),
 * unknown and missing keys, negative num_batches_tracked); strict and
 * non-strict modes; a checkpoint without num_batches_tracked; atomic save
 * (an I/O failure and a simulated crash mid-save leave the previous file);
 * optimizer state. Data flips are detected by the CRC32 of the data that
 * save stores in __metadata__ (without it any bit pattern is a valid float). */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nn_testutil.h"

extern long sbn_nn_test_save_fault_at;
extern int sbn_nn_test_save_fault_kind;

static sbn_module *target;     /* the model every failing load must leave alone */
static nn_snapshot target_snap;
static int failures;

/* A load that must fail with `want` and leave the target unchanged. */
static void must_fail(const char *what, const void *buf, size_t len, unsigned flags, sbn_status want, int verbose) {
  sbn_status st = sbn_nn_load_memory(target, buf, len, flags, NULL);
  char why[300], msg[1024];
  snprintf(msg, sizeof msg, "%s", sbn_last_error());
  int d = nn_snapshot_diff(&target_snap, target, 1, why, sizeof why);
  int bad = st == SBN_STATUS_OK || (want != SBN_STATUS_OK && st != want) || d != 0;
  if (verbose || bad)
    printf("  %-44s -> %s: %s%s\n", what, sbn_status_name(st), msg, d ? " [MODEL CHANGED]" : "");
  if (bad) failures++, printf("  FAIL (%s)\n", what);
  if (d) nn_snapshot_restore(&target_snap, target);
}

static size_t build_raw(unsigned char *out, const char *json, const void *data, size_t dlen) {
  size_t n = strlen(json);
  for (int i = 0; i < 8; i++) out[i] = (unsigned char)((uint64_t)n >> (8 * i));
  memcpy(out + 8, json, n);
  memcpy(out + 8 + n, data, dlen);
  return 8 + n + dlen;
}

static int count_tmp(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)))
    if (strstr(e->d_name, ".tmp-")) n++;
  if (d) closedir(d);
  return n;
}

int main(void) {
  char dir[] = "/tmp/sbn_ckpt_XXXXXX", path[256], why[300];
  if (!mkdtemp(dir)) return 1;
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  rng r = rng_seed(707);
  sbn_module *src;
  if (nn_build_net(&src, 1) || nn_build_net(&target, 2)) return 1;
  nn_randomize(src, &r);
  nn_randomize(target, &r);
  CHECK_OK(sbn_nn_save(path, src));
  unsigned char *file;
  size_t len;
  if (nn_read_file(path, &file, &len)) return 1;
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | file[i];
  printf("saved %zu bytes: header %llu bytes, data %llu bytes\n", len, (unsigned long long)hl,
         (unsigned long long)(len - 8 - hl));
  printf("  header starts: %.160s...\n", (const char *)file + 8);

  /* Round trip into a model with other values. */
  sbn_module *copy;
  if (nn_build_net(&copy, 9)) return 1;
  nn_randomize(copy, &r);
  CHECK_OK(sbn_nn_load(copy, path, SBN_NN_LOAD_STRICT, NULL));
  nn_snapshot src_snap;
  nn_snapshot_take(&src_snap, src);
  int d = nn_snapshot_diff(&src_snap, copy, 0, why, sizeof why);
  printf("round trip: %d entries differ bit for bit%s%s\n", d, d ? ": " : "", why);
  failures += d != 0;

  nn_snapshot_take(&target_snap, target);
  /* Truncation: every byte of the first 64 and around the header end, then
   * every 37th byte, and the last byte. */
  int ntr = 0;
  for (size_t cut = 0; cut < len; cut++) {
    int pick = cut < 64 || (cut + 16 > 8 + hl && cut < 8 + hl + 16) || cut % 37 == 0 || cut == len - 1;
    if (!pick) continue;
    char what[64];
    snprintf(what, sizeof what, "truncated to %zu bytes", cut);
    must_fail(what, file, cut, SBN_NN_LOAD_STRICT, SBN_STATUS_IO_ERROR, cut == 4 || cut == 8 + hl / 2 || cut == len - 1);
    ntr++;
  }
  printf("truncation: %d cut points, all rejected with the model unchanged\n", ntr);
  /* Also from a truncated file on disk. */
  char tpath[300];
  snprintf(tpath, sizeof tpath, "%s/truncated.safetensors", dir);
  nn_write_file(tpath, file, len / 2);
  sbn_status st = sbn_nn_load(target, tpath, SBN_NN_LOAD_STRICT, NULL);
  printf("  truncated file on disk -> %s: %s\n", sbn_status_name(st), sbn_last_error());
  failures += st != SBN_STATUS_IO_ERROR || nn_snapshot_diff(&target_snap, target, 1, NULL, 0);

  /* Flips in the length and the header: every byte, 3 masks. A flip may be
   * harmless (e.g. in the "format" value): then the load succeeds and gives
   * exactly the saved state; otherwise it is rejected, model unchanged. */
  unsigned char *mut = malloc(len);
  static const unsigned char masks[3] = {0x01, 0x20, 0x80};
  int rejected = 0, harmless = 0;
  for (size_t i = 0; i < 8 + hl; i++)
    for (int k = 0; k < 3; k++) {
      memcpy(mut, file, len);
      mut[i] ^= masks[k];
      st = sbn_nn_load_memory(target, mut, len, SBN_NN_LOAD_STRICT, NULL);
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", sbn_last_error());
      if (st == SBN_STATUS_OK) {
        harmless++;
        if (nn_snapshot_diff(&src_snap, target, 0, why, sizeof why)) {
          printf("  FAIL: flip 0x%02x at byte %zu loaded but gave a different state (%s)\n", masks[k], i, why);
          failures++;
        }
        nn_snapshot_restore(&target_snap, target);
      } else {
        rejected++;
        if (nn_snapshot_diff(&target_snap, target, 1, why, sizeof why)) {
          printf("  FAIL: flip at byte %zu rejected but the model changed (%s)\n", i, why);
          failures++;
          nn_snapshot_restore(&target_snap, target);
        }
        if (i == 3 || i == 8 + hl / 3 || i == 8 + 2 * hl / 3) printf("  flip 0x%02x at byte %zu -> %s: %s\n", masks[k], i, sbn_status_name(st), msg);
      }
    }
  printf("header flips: %d rejected (model unchanged), %d harmless (loaded the exact saved state)\n", rejected, harmless);
  /* Flips in the data: every 7th byte and the last; all caught by the CRC. */
  int ndata = 0;
  for (size_t i = 8 + hl; i < len; i += (i + 7 < len ? 7 : 1)) {
    memcpy(mut, file, len);
    mut[i] ^= 0x01;
    must_fail("data flip", mut, len, SBN_NN_LOAD_STRICT, SBN_STATUS_IO_ERROR, i == 8 + hl);
    ndata++;
    if (i == len - 1) break;
  }
  printf("data flips: %d positions, all rejected by the CRC32 with the model unchanged\n", ndata);
  /* Trailing garbage after the data. */
  unsigned char *big = malloc(len + 4);
  memcpy(big, file, len);
  memcpy(big + len, "junk", 4);
  must_fail("4 bytes appended", big, len + 4, SBN_NN_LOAD_STRICT, SBN_STATUS_IO_ERROR, 1);
  free(big);

  /* Hand-made headers. */
  {
    unsigned char raw[1024];
    float f4[4] = {1, 2, 3, 4};
    static const struct { const char *what, *json; size_t dlen; } cases[] = {
        {"not JSON", "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]", 8},
        {"duplicate key", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8},
        {"overlapping offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12},
        {"hole in the data", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12},
        {"offsets past the end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8},
        {"offsets disagree with shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8},
        {"unknown dtype", "{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8},
        {"negative dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8},
        {"fractional offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.5]}}", 8},
        {"missing data_offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8},
        {"extra field", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8},
        {"header is an array", "[1, 2]", 0},
        {"bad crc string", "{\"__metadata__\":{\"syncbn_crc32\":\"xyz\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8},
        {"metadata value not a string", "{\"__metadata__\":{\"n\":1},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8},
        {"NUL inside the header", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}\0  ", 8},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
      size_t n = build_raw(raw, cases[i].json, f4, cases[i].dlen);
      if (i == sizeof cases / sizeof *cases - 1) { /* length covers the NUL and spaces */
        size_t jl = strlen(cases[i].json) + 3;
        for (int b = 0; b < 8; b++) raw[b] = (unsigned char)((uint64_t)jl >> (8 * b));
        memcpy(raw + 8, cases[i].json, jl);
        memcpy(raw + 8 + jl, f4, 8);
        n = 8 + jl + 8;
      }
      must_fail(cases[i].what, raw, n, SBN_NN_LOAD_STRICT, SBN_STATUS_IO_ERROR, 1);
    }
    memset(raw, 0xff, 8);
    must_fail("header length 2^64-1", raw, 64, SBN_NN_LOAD_STRICT, SBN_STATUS_IO_ERROR, 1);
  }

  /* Files that are valid but do not fit the model. */
  sbn_nn_entry *e;
  int n;
  CHECK_OK(sbn_module_entries(&e, &n, src, SBN_NN_STATE));
  char p2[300];
  snprintf(p2, sizeof p2, "%s/other.safetensors", dir);
  unsigned char *f2;
  size_t l2;
  {
    /* Wrong shape: a wider last layer. */
    sbn_nn_entry *e2 = malloc(sizeof *e2 * (size_t)(n + 1));
    memcpy(e2, e, sizeof *e * (size_t)n);
    sbn_nn_entry *last = &e2[n - 2]; /* 11.weight (5, 12) */
    float *w = calloc(6 * 12, sizeof(float));
    last->shape[0] = 6, last->numel = 72, last->data = w;
    CHECK_OK(sbn_nn_save_entries(p2, e2, n));
    nn_read_file(p2, &f2, &l2);
    must_fail("wrong shape (11.weight 6x12)", f2, l2, 0, SBN_STATUS_INVALID_ARGUMENT, 1);
    free(f2);
    /* Another dtype: float64 for a float32 parameter converts, as in PyTorch
     * (test_nn_load_dtypes checks every pair against torch's bits). */
    memcpy(e2, e, sizeof *e * (size_t)n);
    double *wd = calloc(60, sizeof(double));
    for (int i = 0; i < 60; i++) wd[i] = 0.1 * i;
    e2[n - 2].dtype = SBN_DTYPE_FLOAT64, e2[n - 2].data = wd;
    CHECK_OK(sbn_nn_save_entries(p2, e2, n));
    nn_read_file(p2, &f2, &l2);
    {
      st = sbn_nn_load_memory(target, f2, l2, SBN_NN_LOAD_STRICT, NULL);
      sbn_nn_entry *te;
      int tn, conv = 0;
      CHECK_OK(sbn_module_entries(&te, &tn, target, SBN_NN_STATE));
      for (int i = 0; i < 60; i++) conv += ((float *)te[tn - 2].data)[i] == (float)wd[i];
      printf("  11.weight saved as F64 -> %s, %d of 60 values (float)x\n", sbn_status_name(st), conv);
      failures += st != SBN_STATUS_OK || conv != 60;
      free(te);
      nn_snapshot_restore(&target_snap, target);
    }
    free(f2), free(w), free(wd);
    /* Negative num_batches_tracked. */
    memcpy(e2, e, sizeof *e * (size_t)n);
    int64_t neg = -3;
    for (int i = 0; i < n; i++)
      if (e2[i].dtype == SBN_DTYPE_INT64) e2[i].data = &neg;
    CHECK_OK(sbn_nn_save_entries(p2, e2, n));
    nn_read_file(p2, &f2, &l2);
    must_fail("negative num_batches_tracked", f2, l2, 0, SBN_STATUS_INVALID_ARGUMENT, 1);
    free(f2);
    /* Unknown key: strict fails; non-strict loads and reports it. */
    memcpy(e2, e, sizeof *e * (size_t)n);
    e2[n] = e[n - 1];
    snprintf(e2[n].name, sizeof e2[n].name, "fc.extra");
    CHECK_OK(sbn_nn_save_entries(p2, e2, n + 1));
    nn_read_file(p2, &f2, &l2);
    must_fail("unexpected key, strict", f2, l2, SBN_NN_LOAD_STRICT, SBN_STATUS_INVALID_ARGUMENT, 1);
    sbn_nn_load_report rep;
    CHECK_OK(sbn_nn_load_memory(target, f2, l2, 0, &rep));
    d = nn_snapshot_diff(&src_snap, target, 0, why, sizeof why);
    printf("  unexpected key, non-strict -> OK, %d missing, %d unexpected (%s), %d entries differ from the saved state\n",
           rep.num_missing, rep.num_unexpected, rep.num_unexpected ? rep.unexpected[0] : "", d);
    failures += rep.num_missing != 0 || rep.num_unexpected != 1 || strcmp(rep.unexpected[0], "fc.extra") || d;
    sbn_nn_load_report_free(&rep);
    nn_snapshot_restore(&target_snap, target);
    free(f2);
    /* Missing key (0.weight): strict fails; non-strict loads the rest. */
    CHECK_OK(sbn_nn_save_entries(p2, e + 1, n - 1));
    nn_read_file(p2, &f2, &l2);
    must_fail("missing key, strict", f2, l2, SBN_NN_LOAD_STRICT, SBN_STATUS_INVALID_ARGUMENT, 1);
    CHECK_OK(sbn_nn_load_memory(target, f2, l2, 0, &rep));
    sbn_nn_entry *te;
    int tn;
    CHECK_OK(sbn_module_entries(&te, &tn, target, SBN_NN_STATE));
    int kept = !memcmp(te[0].data, target_snap.bytes[0], nn_entry_bytes(&te[0]));
    int rest = 0;
    for (int i = 1; i < tn; i++) rest += memcmp(te[i].data, src_snap.bytes[i], nn_entry_bytes(&te[i])) != 0;
    printf("  missing key, non-strict -> OK, missing %d (%s), %s kept its value, %d other entries differ from the file\n",
           rep.num_missing, rep.num_missing ? rep.missing[0] : "", te[0].name, rest);
    failures += rep.num_missing != 1 || strcmp(rep.missing[0], "0.weight") || !kept || rest || rep.num_unexpected;
    free(te);
    sbn_nn_load_report_free(&rep);
    nn_snapshot_restore(&target_snap, target);
    free(f2);
    /* Without any num_batches_tracked (pre-version-2 state dict): strict
     * load succeeds and sets them to 0. */
    int m = 0;
    for (int i = 0; i < n; i++)
      if (e[i].dtype != SBN_DTYPE_INT64) e2[m++] = e[i];
    CHECK_OK(sbn_nn_save_entries(p2, e2, m));
    CHECK_OK(sbn_nn_load(target, p2, SBN_NN_LOAD_STRICT, &rep));
    CHECK_OK(sbn_module_entries(&te, &tn, target, SBN_NN_STATE));
    int zeros = 0, nbts = 0, same = 0;
    for (int i = 0; i < tn; i++) {
      if (te[i].dtype == SBN_DTYPE_INT64) nbts++, zeros += *(int64_t *)te[i].data == 0;
      else same += !memcmp(te[i].data, src_snap.bytes[i], nn_entry_bytes(&te[i]));
    }
    printf("  no num_batches_tracked in the file, strict -> OK: %d of %d set to 0, %d of %d other tensors loaded, %d reported missing\n",
           zeros, nbts, same, tn - nbts, rep.num_missing);
    failures += zeros != nbts || nbts != 7 || same != tn - nbts || rep.num_missing;
    free(te);
    sbn_nn_load_report_free(&rep);
    nn_snapshot_restore(&target_snap, target);
    free(e2);
    free(e);
  }

  /* Atomic save: a failing save leaves the previous file, no temp files. */
  {
    long at[] = {0, 5, 100, (long)len / 2, (long)len - 1};
    for (int i = 0; i < 5; i++) {
      sbn_nn_test_save_fault_at = at[i];
      sbn_nn_test_save_fault_kind = 1;
      st = sbn_nn_save(path, copy);
      sbn_nn_test_save_fault_at = -1;
      unsigned char *now;
      size_t nl;
      nn_read_file(path, &now, &nl);
      int intact = nl == len && !memcmp(now, file, len);
      printf("  save failing after %ld bytes -> %s; previous file %s, %d temp files left\n", at[i], sbn_status_name(st),
             intact ? "intact" : "DAMAGED", count_tmp(dir));
      failures += st != SBN_STATUS_IO_ERROR || !intact || count_tmp(dir) != 0;
      free(now);
    }
    /* A crash (the process dies) mid-save. */
    pid_t pid = fork();
    if (pid == 0) {
      sbn_nn_test_save_fault_at = (long)len / 2;
      sbn_nn_test_save_fault_kind = 2;
      sbn_nn_save(path, copy);
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    st = sbn_nn_load(target, path, SBN_NN_LOAD_STRICT, NULL);
    d = nn_snapshot_diff(&src_snap, target, 0, NULL, 0);
    printf("  crash mid-save (child exit %d) -> previous checkpoint loads: %s, equals the saved state: %s (%d temp file left by the crash)\n",
           WEXITSTATUS(status), sbn_status_name(st), d ? "NO" : "yes", count_tmp(dir));
    failures += WEXITSTATUS(status) != 3 || st != SBN_STATUS_OK || d;
    nn_snapshot_restore(&target_snap, target);
    char nodir[300];
    snprintf(nodir, sizeof nodir, "%s/no/such/dir/m.safetensors", dir);
    st = sbn_nn_save(nodir, copy);
    printf("  save into a missing directory -> %s: %s\n", sbn_status_name(st), sbn_last_error());
    failures += st != SBN_STATUS_IO_ERROR;
    st = sbn_nn_load(target, nodir, SBN_NN_LOAD_STRICT, NULL);
    printf("  load of a missing file -> %s: %s\n", sbn_status_name(st), sbn_last_error());
    failures += st != SBN_STATUS_IO_ERROR;
  }

  /* Optimizer state round trip (resume). */
  {
    sbn_nn_sgd *o1, *o2;
    sbn_nn_sgd_options so = {0.1, 0.9, 0, 0, 0};
    CHECK_OK(sbn_nn_sgd_create(&o1, src, &so));
    CHECK_OK(sbn_module_entries(&e, &n, src, SBN_NN_PARAMETERS));
    for (int i = 0; i < n; i++)
      for (int64_t j = 0; j < e[i].numel; j++) e[i].grad[j] = (float)rng_normal(&r);
    free(e);
    CHECK_OK(sbn_nn_sgd_step(o1));
    CHECK_OK(sbn_nn_sgd_create(&o2, src, &so));
    sbn_nn_entry *a, *b;
    int na, nb;
    CHECK_OK(sbn_nn_sgd_entries(&a, &na, o1));
    CHECK_OK(sbn_nn_sgd_entries(&b, &nb, o2));
    CHECK_OK(sbn_nn_save_entries(p2, a, na));
    nn_read_file(p2, &f2, &l2);
    CHECK_OK(sbn_nn_load_entries(b, nb, f2, l2, SBN_NN_LOAD_STRICT, NULL));
    int diff = na != nb;
    for (int i = 0; !diff && i < na; i++) diff = memcmp(a[i].data, b[i].data, nn_entry_bytes(&a[i])) != 0;
    printf("  SGD state (%d entries: momentum buffers and step) round trip: %s\n", na, diff ? "DIFFERS" : "identical");
    failures += diff;
    free(f2), free(a), free(b);
    sbn_nn_sgd_destroy(o1), sbn_nn_sgd_destroy(o2);
  }

  free(mut), free(file);
  nn_snapshot_free(&src_snap), nn_snapshot_free(&target_snap);
  sbn_module_destroy(src), sbn_module_destroy(target), sbn_module_destroy(copy);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) printf("warning: could not remove %s\n", dir);
  printf("%s (%d failures)\n", failures ? "FAILED" : "all ok", failures);
  return failures ? 1 : 0;
}
