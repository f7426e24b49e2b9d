/* Test support for tests/cpu: tensors in a storage dtype next to the float
 * copy of their exact values (what the float64 reference reads). */
#ifndef SBN_TEST_CPU_DATA_H
#define SBN_TEST_CPU_DATA_H

#include <stdlib.h>
#include <string.h>

#include "../../src/cpu/half.h"
#include "testutil.h"

static inline size_t dt_size(sbn_dtype dt) {
  return dt == SBN_DTYPE_FLOAT64 ? 8 : dt == SBN_DTYPE_FLOAT32 ? 4 : 2;
}
static inline const char *dt_name(sbn_dtype dt) {
  return dt == SBN_DTYPE_FLOAT64   ? "float64"
         : dt == SBN_DTYPE_FLOAT32 ? "float32"
         : dt == SBN_DTYPE_BFLOAT16 ? "bfloat16"
                                    : "float16";
}

/* float -> storage (rounded to nearest even) */
static inline void to_storage(void *dst, const float *src, int64_t n, sbn_dtype dt) {
  for (int64_t i = 0; i < n; i++) {
    if (dt == SBN_DTYPE_FLOAT32) ((float *)dst)[i] = src[i];
    else if (dt == SBN_DTYPE_FLOAT64) ((double *)dst)[i] = src[i];
    else if (dt == SBN_DTYPE_BFLOAT16) ((uint16_t *)dst)[i] = sbn_f32_to_bf16(src[i]);
    else ((uint16_t *)dst)[i] = sbn_f32_to_f16(src[i]);
  }
}
/* storage -> float (exact) */
static inline void from_storage(float *dst, const void *src, int64_t n, sbn_dtype dt) {
  for (int64_t i = 0; i < n; i++) {
    if (dt == SBN_DTYPE_FLOAT32) dst[i] = ((const float *)src)[i];
    else if (dt == SBN_DTYPE_FLOAT64) dst[i] = (float)((const double *)src)[i];
    else if (dt == SBN_DTYPE_BFLOAT16) dst[i] = sbn_bf16_to_f32(((const uint16_t *)src)[i]);
    else dst[i] = sbn_f16_to_f32(((const uint16_t *)src)[i]);
  }
}
/* Round the float values through the storage type, in place. */
static inline void quantize(float *v, int64_t n, sbn_dtype dt) {
  void *tmp = malloc((size_t)(n ? n : 1) * 4);
  to_storage(tmp, v, n, dt);
  from_storage(v, tmp, n, dt);
  free(tmp);
}

#endif
