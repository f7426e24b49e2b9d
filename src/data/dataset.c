/* Dataset ownership, batch gathering and whole-file reading shared by the loaders. */
#include "dataset_io.h"

#include "../core/checked.h"
#include "../core/file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void sbn_dataset_free(sbn_dataset *d) {
  if (!d) return;
  free(d->images);
  free(d->labels);
  memset(d, 0, sizeof *d);
}

sbn_status sbn_dataset_alloc(sbn_dataset *d, int64_t count, int c, int h, int w, const char *name) {
  memset(d, 0, sizeof *d);
  int64_t n;
  size_t ib, lb;
  if (count < 0 || c < 0 || h < 0 || w < 0 || !sbn_mul_i64(&n, count, c) || !sbn_mul_i64(&n, n, h) ||
      !sbn_mul_i64(&n, n, w) || !sbn_bytes(&ib, n, sizeof(float)) || !sbn_bytes(&lb, count, sizeof(int32_t)) ||
      ib == SIZE_MAX)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "dataset %s: %lld images of %dx%dx%d: size overflows", name,
                    (long long)count, c, h, w);
  d->images = malloc(ib + 1);
  d->labels = malloc(lb + 1);
  if (!d->images || !d->labels) {
    sbn_dataset_free(d);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "dataset %s: out of memory for %lld images", name,
                    (long long)count);
  }
  d->count = count, d->channels = c, d->height = h, d->width = w, d->num_classes = 10;
  snprintf(d->name, sizeof d->name, "%s", name);
  return SBN_STATUS_OK;
}

sbn_status sbn_read_file(unsigned char **data, size_t *size, const char *path) {
  *data = NULL, *size = 0;
  FILE *f;
  size_t ignored;
  sbn_status st = sbn_open_regular(&f, &ignored, path, "dataset");
  if (st != SBN_STATUS_OK) return st;
  size_t cap = 1 << 20, len = 0;
  unsigned char *buf = malloc(cap);
  while (buf) {
    len += fread(buf + len, 1, cap - len, f);
    if (len < cap) break;
    unsigned char *bigger = realloc(buf, cap * 2);
    if (!bigger) free(buf);
    buf = bigger, cap *= 2;
  }
  int err = ferror(f);
  fclose(f);
  if (!buf) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "out of memory reading %s", path);
  if (err) {
    free(buf);
    return sbn_fail(SBN_STATUS_IO_ERROR, "error reading %s", path);
  }
  *data = buf, *size = len;
  return SBN_STATUS_OK;
}

sbn_status sbn_dataset_gather(float *images, int32_t *labels, const sbn_dataset *d,
                              const int64_t *idx, int64_t n) {
  sbn_clear_error();
  if (n < 0) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_dataset_gather: n = %lld is negative", (long long)n);
  if (!images || !labels || !d || (!idx && n))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_dataset_gather: NULL argument");
  const size_t per = (size_t)d->channels * d->height * d->width;
  for (int64_t i = 0; i < n; i++) {
    if (idx[i] < 0 || idx[i] >= d->count)
      return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_dataset_gather: index %lld out of range [0, %lld)",
                      (long long)idx[i], (long long)d->count);
    memcpy(images + (size_t)i * per, d->images + (size_t)idx[i] * per, per * sizeof(float));
    labels[i] = d->labels[idx[i]];
  }
  return SBN_STATUS_OK;
}
