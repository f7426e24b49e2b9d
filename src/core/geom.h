/* Internal: the (N, C, S) view of a layer input that every device's kernels
 * take. A base type (like error.h): the core builds it from a tensor
 * (tensor.c), the CPU and CUDA kernels read it. */
#ifndef SBN_CORE_GEOM_H
#define SBN_CORE_GEOM_H

#include <stdint.h>

#include "syncbn.h"

/* A (N, C, S) view of an input: S is the product of the spatial dims. */
typedef struct sbn_geom {
  int64_t n, c, s;
  sbn_layout layout;
  sbn_dtype dtype; /* FLOAT32, BFLOAT16, FLOAT16 or FLOAT64 (CPU only) */
} sbn_geom;

#endif
