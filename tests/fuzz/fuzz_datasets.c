/* libFuzzer target: the dataset loaders (CIFAR-10 binary, MNIST IDX) on
 * arbitrary bytes. The input goes into an in-memory file (memfd, a regular
 * file reached through /proc/self/fd) so the loaders run exactly as on disk.
 * Built twice: -DFUZZ_CIFAR10 (the whole input is one CIFAR-10 file) and
 * -DFUZZ_MNIST (the first two bytes, big-endian, say how many of the rest
 * form the image file; the remainder is the label file). A failure must leave the dataset empty with a
 * message; a success must hold labels < 10. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "syncbn_data.h"

static int file_of(const uint8_t *p, size_t n, char *path, size_t cap) {
  int fd = memfd_create("fuzz", 0);
  if (fd < 0) abort();
  for (size_t off = 0; off < n;) {
    ssize_t w = write(fd, p + off, n - off);
    if (w <= 0) abort();
    off += (size_t)w;
  }
  snprintf(path, cap, "/proc/self/fd/%d", fd);
  return fd;
}

static void check(sbn_status st, const sbn_dataset *d) {
  if (st != SBN_STATUS_OK) {
    if (d->images || d->labels || d->count || !sbn_last_error()[0]) abort();
    return;
  }
  for (int64_t i = 0; i < d->count; i++)
    if (d->labels[i] < 0 || d->labels[i] >= 10) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  sbn_dataset d;
  char a[64];
#ifdef FUZZ_CIFAR10
  int fa = file_of(data, size, a, sizeof a);
  const char *files[1] = {a};
  sbn_status st = sbn_dataset_load_cifar10(&d, files, 1);
  check(st, &d);
  sbn_dataset_free(&d);
  close(fa);
#else
  char b[64];
  if (size < 2) return 0;
  size_t cut = (size_t)data[0] << 8 | data[1];
  if (cut > size - 2) cut = size - 2;
  int fa = file_of(data + 2, cut, a, sizeof a), fb = file_of(data + 2 + cut, size - 2 - cut, b, sizeof b);
  sbn_status st = sbn_dataset_load_mnist(&d, a, b);
  check(st, &d);
  sbn_dataset_free(&d);
  close(fa), close(fb);
#endif
  return 0;
}
