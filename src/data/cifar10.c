/* CIFAR-10, binary version: 10000 records per file of <1 label byte><3072
 * pixel bytes: the 1024 red, then green, then blue values of a 32x32 image. */
#include <stdlib.h>
#include <string.h>

#include "dataset_io.h"

enum { CIFAR_PIXELS = 3 * 32 * 32, CIFAR_RECORD = 1 + CIFAR_PIXELS };

sbn_status sbn_dataset_load_cifar10(sbn_dataset *out, const char *const *files, int nfiles) {
  sbn_clear_error();
  if (!out || !files || nfiles < 1)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "sbn_dataset_load_cifar10: need out and at least one file");
  memset(out, 0, sizeof *out);
  unsigned char **data = calloc((size_t)nfiles, sizeof *data);
  size_t *sizes = calloc((size_t)nfiles, sizeof *sizes);
  sbn_status st = data && sizes ? SBN_STATUS_OK : sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "out of memory");
  int64_t total = 0;
  /* Validate every file before building anything. */
  for (int f = 0; f < nfiles && st == SBN_STATUS_OK; f++) {
    st = sbn_read_file(&data[f], &sizes[f], files[f]);
    if (st != SBN_STATUS_OK) break;
    if (sizes[f] >= 2 && data[f][0] == 0x80 && data[f][1] >= 2 && data[f][1] <= 5) {
      st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "%s is CIFAR-10's python version (a pickle); syncbn reads the binary version: "
                    "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz (data_batch_N.bin)",
                    files[f]);
      break;
    }
    if (sizes[f] == 0 || sizes[f] % CIFAR_RECORD != 0) {
      st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "%s: %zu bytes is not a whole number of CIFAR-10 records (%d bytes each): "
                    "truncated or not a CIFAR-10 binary file",
                    files[f], sizes[f], CIFAR_RECORD);
      break;
    }
    for (size_t r = 0; r < sizes[f] / CIFAR_RECORD; r++)
      if (data[f][r * CIFAR_RECORD] >= 10) {
        st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: record %zu has label %d (expected 0..9)", files[f], r,
                      data[f][r * CIFAR_RECORD]);
        break;
      }
    total += (int64_t)(sizes[f] / CIFAR_RECORD);
  }
  if (st == SBN_STATUS_OK) st = sbn_dataset_alloc(out, total, 3, 32, 32, "cifar10");
  int64_t i = 0;
  for (int f = 0; f < nfiles && st == SBN_STATUS_OK; f++)
    for (size_t r = 0; r < sizes[f] / CIFAR_RECORD; r++, i++) {
      const unsigned char *rec = data[f] + r * CIFAR_RECORD;
      out->labels[i] = rec[0];
      for (int p = 0; p < CIFAR_PIXELS; p++) out->images[i * CIFAR_PIXELS + p] = sbn_pixel(rec[1 + p]);
    }
  for (int f = 0; data && f < nfiles; f++) free(data[f]);
  free(data), free(sizes);
  return st;
}
