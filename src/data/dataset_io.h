/* Internal helpers shared by the dataset loaders. */
#ifndef SBN_DATASET_IO_H
#define SBN_DATASET_IO_H

#include <stdio.h>

#include "../core/error.h"
#include "syncbn_data.h"

/* Allocate images and labels for `count` images of c x h x w (10 classes). */
sbn_status sbn_dataset_alloc(sbn_dataset *d, int64_t count, int c, int h, int w, const char *name);
/* Read a whole file into a malloc'd buffer. */
sbn_status sbn_read_file(unsigned char **data, size_t *size, const char *path);

/* If *data is gzip (magic 1f 8b), replace it by its inflated bytes. */
sbn_status sbn_gunzip_if_needed(unsigned char **data, size_t *size, const char *path);

/* Pixel bytes to the float scale used everywhere: (p/255 - 0.5) / 0.25. */
static inline float sbn_pixel(unsigned char p) { return ((float)p / 255.0f - 0.5f) * 4.0f; }

#endif
