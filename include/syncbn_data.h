/*
 * syncbn_data.h — image datasets for the training program: CIFAR-10's binary
 * format, MNIST's IDX format, and a built-in synthetic dataset. Images are
 * float32, channels-first (C, H, W); pixel bytes p become (p/255 - 0.5) * 4
 * (about [-2, 2]); labels are class indices.
 */
#ifndef SYNCBN_DATA_H
#define SYNCBN_DATA_H

#include "syncbn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sbn_dataset {
  int64_t count;                /* number of images */
  int channels, height, width;  /* each image is channels x height x width */
  int num_classes;
  float *images;                /* count * channels * height * width, owned */
  int32_t *labels;              /* count, owned */
  char name[64];
} sbn_dataset;

/* CIFAR-10 binary version: records of 1 label byte + 3072 pixel bytes
 * (32x32 R, G, B planes). Loads and concatenates `nfiles` files. A file whose
 * size is not a whole number of records, or a label >= 10, is an error that
 * names the file, and so is CIFAR-10's python (pickle) version, with a pointer
 * to the binary one. On error *out is left empty. */
SBN_API sbn_status sbn_dataset_load_cifar10(sbn_dataset *out, const char *const *files, int nfiles);

/* MNIST IDX: an image file (magic 0x00000803, count, rows, cols, bytes) and a
 * label file (magic 0x00000801, count, bytes). Magic, sizes, counts and labels
 * (< 10) are checked; errors name the file and what was wrong. Files may be
 * gzipped, as MNIST and Fashion-MNIST are distributed (inflated with zlib);
 * a gzip file of several members (cat a.gz b.gz, bgzip, pigz -i) reads whole,
 * as zcat reads it, and data after the last member other than zero padding
 * is an error. */
SBN_API sbn_status sbn_dataset_load_mnist(sbn_dataset *out, const char *images_path, const char *labels_path);

/* The built-in synthetic dataset (offline default): `count` 3x16x16 images
 * of 10 classes. The class is the contrast of a random texture (amplitude
 * sbn_synthetic_contrast(class) = 0.5 * 1.2^class) under a random
 * brightness: per-channel statistics over a batch are what identify it, so
 * normalizing with the statistics of a tiny per-rank batch (local BatchNorm)
 * erases most of the signal, while statistics over the whole synchronized
 * batch keep it. Deterministic in `seed`. */
SBN_API sbn_status sbn_dataset_synthetic(sbn_dataset *out, int64_t count, uint64_t seed);
SBN_API double sbn_synthetic_contrast(int k);

/* Copy images/labels idx[0..n) into batch buffers (channels-first). */
SBN_API sbn_status sbn_dataset_gather(float *images, int32_t *labels, const sbn_dataset *d,
                                      const int64_t *idx, int64_t n);

SBN_API void sbn_dataset_free(sbn_dataset *d);

#ifdef __cplusplus
}
#endif
#endif
