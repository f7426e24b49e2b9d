/* Dataset loaders on small files written here: CIFAR-10 binary and MNIST IDX
 * (good files load with the right labels and pixels; truncated files, wrong
 * magic, bad labels and mismatched counts give a clear error; gzipped MNIST
 * of several members loads whole, as zcat and Python's gzip read it, and a
 * truncated or trailing-garbage gzip file is refused), and the
 * synthetic dataset (deterministic, and its class signal is the image's mean
 * colour: visible over a large batch, mostly erased by a batch of 2). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "syncbn_data.h"

static int failures;
static void expect(int ok, const char *what, const char *detail) {
  printf("  %-58s %s%s%s\n", what, ok ? "ok" : "FAIL", detail && detail[0] ? "  | " : "", detail ? detail : "");
  failures += !ok;
}

static void write_file(const char *path, const unsigned char *data, size_t n) {
  FILE *f = fopen(path, "wb");
  fwrite(data, 1, n, f);
  fclose(f);
}

static void put32(unsigned char *p, uint32_t v) { p[0] = v >> 24, p[1] = v >> 16, p[2] = v >> 8, p[3] = v; }

static void cifar(const char *dir) {
  enum { REC = 3073, N = 5 };
  unsigned char *buf = malloc(REC * N);
  for (int r = 0; r < N; r++) {
    buf[r * REC] = (unsigned char)(r * 2 % 10);
    for (int p = 0; p < 3072; p++) buf[r * REC + 1 + p] = (unsigned char)((p * 7 + r * 13) % 256);
  }
  char good[256], trunc[256], badlab[256];
  snprintf(good, sizeof good, "%s/data_batch_1.bin", dir);
  snprintf(trunc, sizeof trunc, "%s/truncated.bin", dir);
  snprintf(badlab, sizeof badlab, "%s/badlabel.bin", dir);
  write_file(good, buf, REC * N);
  write_file(trunc, buf, REC * N - 100);
  buf[REC * 3] = 12;
  write_file(badlab, buf, REC * N);
  buf[REC * 3] = 6;
  sbn_dataset d;
  const char *files[2] = {good, good};
  sbn_status st = sbn_dataset_load_cifar10(&d, files, 2);
  int ok = st == SBN_STATUS_OK && d.count == 2 * N && d.channels == 3 && d.height == 32;
  double err = 0;
  for (int i = 0; ok && i < 2 * N; i++) {
    int r = i % N;
    ok &= d.labels[i] == r * 2 % 10;
    for (int p = 0; p < 3072; p++)
      err = fmax(err, fabs(d.images[(size_t)i * 3072 + p] - ((((p * 7 + r * 13) % 256) / 255.0) - 0.5) * 4));
  }
  char detail[200];
  snprintf(detail, sizeof detail, "%lld images, max pixel error %.1e", (long long)d.count, err);
  expect(ok && err < 1e-6, "CIFAR-10: two files load with right labels and pixels", detail);
  sbn_dataset_free(&d);
  files[0] = trunc;
  st = sbn_dataset_load_cifar10(&d, files, 1);
  expect(st == SBN_STATUS_INVALID_ARGUMENT && strstr(sbn_last_error(), "truncated") && d.count == 0,
         "CIFAR-10: truncated file rejected", sbn_last_error());
  files[0] = badlab;
  st = sbn_dataset_load_cifar10(&d, files, 1);
  expect(st == SBN_STATUS_INVALID_ARGUMENT && strstr(sbn_last_error(), "label 12"), "CIFAR-10: label 12 rejected",
         sbn_last_error());
  files[0] = "/nonexistent/cifar.bin";
  st = sbn_dataset_load_cifar10(&d, files, 1);
  expect(st == SBN_STATUS_IO_ERROR, "CIFAR-10: missing file is an I/O error", sbn_last_error());
  free(buf);
}

/* One gzip member of data[0, n) appended at out + *len (cap bytes in all). */
static void gz_member(unsigned char *out, size_t *len, size_t cap, const unsigned char *data, size_t n) {
  z_stream z;
  memset(&z, 0, sizeof z);
  if (deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) exit(1);
  z.next_in = (unsigned char *)data, z.avail_in = (uInt)n;
  z.next_out = out + *len, z.avail_out = (uInt)(cap - *len);
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) exit(1);
  *len = cap - z.avail_out;
  deflateEnd(&z);
}

/* Gzipped MNIST files of several members: images split inside the header
 * (members of 10 bytes, 0 bytes and the rest), labels with zero padding
 * after their member (gzip and Python skip it). */
static void mnist_gzip(const char *dir, const unsigned char *img, size_t ni, const unsigned char *lab, size_t nl) {
  enum { CAP = 4096 };
  unsigned char gi[CAP], gl[CAP];
  size_t li = 0, ll = 0;
  gz_member(gi, &li, CAP, img, 10), gz_member(gi, &li, CAP, img + 10, 0), gz_member(gi, &li, CAP, img + 10, ni - 10);
  gz_member(gl, &ll, CAP, lab, nl);
  memset(gl + ll, 0, 4), ll += 4;
  char ip[256], lp[256], bad[256], detail[300];
  snprintf(ip, sizeof ip, "%s/mm-images.gz", dir), snprintf(lp, sizeof lp, "%s/mm-labels.gz", dir);
  snprintf(bad, sizeof bad, "%s/mm-bad.gz", dir);
  write_file(ip, gi, li), write_file(lp, gl, ll);
  sbn_dataset d;
  sbn_status st = sbn_dataset_load_mnist(&d, ip, lp);
  double err = 0;
  const int64_t np = (int64_t)ni - 16;
  for (int64_t i = 0; st == SBN_STATUS_OK && i < np; i++) err = fmax(err, fabs(d.images[i] - (img[16 + i] / 255.0 - 0.5) * 4));
  snprintf(detail, sizeof detail, "%s; %lld images, max pixel error %.1e", st ? sbn_last_error() : "loaded",
           (long long)(st ? 0 : d.count), err);
  expect(st == SBN_STATUS_OK && d.count == 3 && d.labels[0] == 7 && d.labels[2] == 9 && err < 1e-6,
         "MNIST: gzip of 3 members (images), padded (labels) loads", detail);
  sbn_dataset_free(&d);
  write_file(bad, gi, li - 5);
  st = sbn_dataset_load_mnist(&d, bad, lp);
  expect(st == SBN_STATUS_INVALID_ARGUMENT && strstr(sbn_last_error(), "corrupt or truncated gzip data in member 3"),
         "MNIST: multi-member gzip cut short rejected", sbn_last_error());
  memcpy(gl + ll - 4, "junk", 4);
  write_file(bad, gl, ll);
  st = sbn_dataset_load_mnist(&d, ip, bad);
  expect(st == SBN_STATUS_INVALID_ARGUMENT && strstr(sbn_last_error(), "gzip data in member 2"),
         "MNIST: gzip followed by non-gzip bytes rejected", sbn_last_error());
}

static void mnist(const char *dir) {
  enum { N = 3, R = 4, C = 5 };
  unsigned char img[16 + N * R * C], lab[8 + N];
  put32(img, 0x803), put32(img + 4, N), put32(img + 8, R), put32(img + 12, C);
  for (int i = 0; i < N * R * C; i++) img[16 + i] = (unsigned char)(i * 11);
  put32(lab, 0x801), put32(lab + 4, N);
  lab[8] = 7, lab[9] = 0, lab[10] = 9;
  char ip[256], lp[256], bad[256];
  snprintf(ip, sizeof ip, "%s/images.idx", dir), snprintf(lp, sizeof lp, "%s/labels.idx", dir);
  snprintf(bad, sizeof bad, "%s/bad.idx", dir);
  write_file(ip, img, sizeof img), write_file(lp, lab, sizeof lab);
  sbn_dataset d;
  sbn_status st = sbn_dataset_load_mnist(&d, ip, lp);
  double err = 0;
  for (int i = 0; st == SBN_STATUS_OK && i < N * R * C; i++)
    err = fmax(err, fabs(d.images[i] - (((unsigned char)(i * 11) / 255.0) - 0.5) * 4));
  expect(st == SBN_STATUS_OK && d.count == N && d.height == R && d.width == C && d.labels[0] == 7 &&
             d.labels[2] == 9 && err < 1e-6,
         "MNIST: loads 3 images of 4x5 with right labels and pixels", "");
  sbn_dataset_free(&d);
  write_file(bad, img, sizeof img - 7);
  st = sbn_dataset_load_mnist(&d, bad, lp);
  expect(st == SBN_STATUS_INVALID_ARGUMENT && strstr(sbn_last_error(), "truncated"), "MNIST: truncated images rejected",
         sbn_last_error());
  write_file(bad, img, 10);
  st = sbn_dataset_load_mnist(&d, bad, lp);
  expect(st == SBN_STATUS_INVALID_ARGUMENT && strstr(sbn_last_error(), "10 bytes, shorter than an IDX image header"),
         "MNIST: images cut inside the header rejected as such", sbn_last_error());
  write_file(bad, lab, 6);
  st = sbn_dataset_load_mnist(&d, ip, bad);
  expect(st == SBN_STATUS_INVALID_ARGUMENT && strstr(sbn_last_error(), "6 bytes, shorter than an IDX label header"),
         "MNIST: labels cut inside the header rejected as such", sbn_last_error());
  unsigned char wrong[sizeof img];
  memcpy(wrong, img, sizeof img);
  put32(wrong, 0x801);
  write_file(bad, wrong, sizeof wrong);
  st = sbn_dataset_load_mnist(&d, bad, lp);
  expect(st == SBN_STATUS_INVALID_ARGUMENT && strstr(sbn_last_error(), "magic"), "MNIST: wrong magic rejected",
         sbn_last_error());
  st = sbn_dataset_load_mnist(&d, ip, ip);
  expect(st == SBN_STATUS_INVALID_ARGUMENT && strstr(sbn_last_error(), "label file"),
         "MNIST: image file given as labels rejected", sbn_last_error());
  unsigned char lab2[8 + N + 1];
  memcpy(lab2, lab, 8 + N), put32(lab2 + 4, N + 1), lab2[8 + N] = 1;
  write_file(bad, lab2, sizeof lab2);
  st = sbn_dataset_load_mnist(&d, ip, bad);
  expect(st == SBN_STATUS_INVALID_ARGUMENT && strstr(sbn_last_error(), "4 labels for 3 images"),
         "MNIST: count mismatch rejected", sbn_last_error());
  mnist_gzip(dir, img, sizeof img, lab, sizeof lab);
}

/* Nearest class contrast from each image's standard deviation, after
 * dividing by the RMS of its batch of `b` images and rescaling by the
 * dataset's (what BatchNorm does to a channel's scale). */
static double contrast_accuracy(const sbn_dataset *d, int b) {
  const int S = d->height * d->width, per = 3 * S;
  double *sd = malloc(sizeof(double) * (size_t)d->count), all = 0;
  for (int64_t i = 0; i < d->count; i++) {
    double m = 0, v = 0;
    for (int p = 0; p < per; p++) m += d->images[i * per + p] / per;
    for (int p = 0; p < per; p++) v += (d->images[i * per + p] - m) * (d->images[i * per + p] - m) / per;
    sd[i] = sqrt(v);
    all += v / (double)d->count;
  }
  int64_t correct = 0, n = d->count / b * b;
  for (int64_t i0 = 0; i0 < n; i0 += b) {
    double bv = 0;
    for (int64_t i = i0; i < i0 + b; i++) bv += sd[i] * sd[i] / b;
    for (int64_t i = i0; i < i0 + b; i++) {
      double est = sd[i] / sqrt(bv) * sqrt(all), bestd = 1e30;
      int best = 0;
      for (int k = 0; k < 10; k++) { /* texture of a 2x2 box blur: std = amplitude */
        double dist = fabs(log(est) - log(sbn_synthetic_contrast(k)));
        if (dist < bestd) bestd = dist, best = k;
      }
      correct += best == d->labels[i];
    }
  }
  free(sd);
  return (double)correct / (double)n;
}

int main(void) {
  char dir[] = "/tmp/syncbn_loaders_XXXXXX";
  if (!mkdtemp(dir)) return 1;
  cifar(dir);
  mnist(dir);
  sbn_dataset a, b;
  sbn_dataset_synthetic(&a, 2000, 7);
  sbn_dataset_synthetic(&b, 2000, 7);
  expect(a.count == 2000 && memcmp(a.images, b.images, sizeof(float) * 2000 * 768) == 0,
         "synthetic: deterministic in its seed", "");
  int hist[10] = {0};
  for (int i = 0; i < 2000; i++) hist[a.labels[i]]++;
  int balanced = 1;
  for (int k = 0; k < 10; k++) balanced &= hist[k] > 120 && hist[k] < 280;
  expect(balanced, "synthetic: 10 classes, roughly balanced", "");
  double big = contrast_accuracy(&a, 2000), small = contrast_accuracy(&a, 2);
  char detail[128];
  snprintf(detail, sizeof detail, "contrast-only accuracy: whole-batch stats %.2f, batch-of-2 stats %.2f", big, small);
  expect(big > 0.6 && small < big - 0.2, "synthetic: signal survives large-batch stats, not batch of 2", detail);
  sbn_dataset_free(&a), sbn_dataset_free(&b);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd)) {}
  printf(failures ? "FAILED (%d)\n" : "loader checks passed\n", failures);
  return failures != 0;
}
