/* MNIST, IDX format: big-endian header (magic, dimensions) then bytes;
 * plain or gzipped (as distributed). */
#include <stdlib.h>
#include <string.h>

#include "dataset_io.h"

static uint32_t be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

sbn_status sbn_dataset_load_mnist(sbn_dataset *out, const char *images_path, const char *labels_path) {
  sbn_clear_error();
  if (!out || !images_path || !labels_path)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_dataset_load_mnist: NULL argument");
  memset(out, 0, sizeof *out);
  unsigned char *img = NULL, *lab = NULL;
  size_t img_size = 0, lab_size = 0;
  sbn_status st = sbn_read_file(&img, &img_size, images_path);
  if (st == SBN_STATUS_OK) st = sbn_gunzip_if_needed(&img, &img_size, images_path);
  if (st == SBN_STATUS_OK) st = sbn_read_file(&lab, &lab_size, labels_path);
  if (st == SBN_STATUS_OK) st = sbn_gunzip_if_needed(&lab, &lab_size, labels_path);
  uint32_t n = 0, rows = 0, cols = 0;
  if (st == SBN_STATUS_OK) {
    /* The magic first: a short file with a wrong one is not IDX at all. */
    if (img_size < 4 || be32(img) != 0x00000803)
      st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: not an IDX image file (magic %#x, expected 0x803)",
                    images_path, img_size >= 4 ? be32(img) : 0);
    else if (img_size < 16)
      st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %zu bytes, shorter than an IDX image header (16; truncated?)",
                    images_path, img_size);
    else if (lab_size < 4 || be32(lab) != 0x00000801)
      st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: not an IDX label file (magic %#x, expected 0x801)",
                    labels_path, lab_size >= 4 ? be32(lab) : 0);
    else if (lab_size < 8)
      st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %zu bytes, shorter than an IDX label header (8; truncated?)",
                    labels_path, lab_size);
  }
  if (st == SBN_STATUS_OK) {
    n = be32(img + 4), rows = be32(img + 8), cols = be32(img + 12);
    if (rows == 0 || cols == 0 || rows > 4096 || cols > 4096 || n == 0)
      st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: implausible dimensions %u x %u x %u", images_path, n, rows, cols);
    else if (img_size != 16 + (size_t)n * rows * cols)
      st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %zu bytes, expected %zu for %u images of %ux%u (truncated?)",
                    images_path, img_size, 16 + (size_t)n * rows * cols, n, rows, cols);
    else if (be32(lab + 4) != n)
      st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %u labels for %u images in %s", labels_path, be32(lab + 4), n,
                    images_path);
    else if (lab_size != 8 + (size_t)n)
      st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: %zu bytes, expected %zu (truncated?)", labels_path, lab_size,
                    8 + (size_t)n);
  }
  for (uint32_t i = 0; st == SBN_STATUS_OK && i < n; i++)
    if (lab[8 + i] >= 10)
      st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: label %u of image %u (expected 0..9)", labels_path, lab[8 + i], i);
  if (st == SBN_STATUS_OK) st = sbn_dataset_alloc(out, n, 1, (int)rows, (int)cols, "mnist");
  if (st == SBN_STATUS_OK) {
    for (size_t p = 0; p < (size_t)n * rows * cols; p++) out->images[p] = sbn_pixel(img[16 + p]);
    for (uint32_t i = 0; i < n; i++) out->labels[i] = lab[8 + i];
  }
  free(img), free(lab);
  return st;
}
