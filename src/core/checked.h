/* Internal: overflow-checked size arithmetic, the one place every shape
 * product, element count and byte size of the library is computed. Each
 * helper returns 1 and stores the result when it fits, else returns 0 and
 * leaves *out unspecified. */
#ifndef SBN_CHECKED_H
#define SBN_CHECKED_H

#include <stddef.h>
#include <stdint.h>

/* a * b for non-negative int64 values. */
static inline int sbn_mul_i64(int64_t *out, int64_t a, int64_t b) {
  return a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, out);
}
/* a + b for non-negative int64 values. */
static inline int sbn_add_i64(int64_t *out, int64_t a, int64_t b) {
  return a >= 0 && b >= 0 && !__builtin_add_overflow(a, b, out);
}
/* Product of n dimensions. A shape with a zero dimension has no elements,
 * but its other dimensions are still used to index (H * W of an empty
 * batch), so the product of the non-zero dimensions must fit too. Negative
 * dimensions fail. */
static inline int sbn_shape_numel(int64_t *out, int n, const int64_t *shape) {
  int64_t p = 1;
  int zero = 0;
  for (int i = 0; i < n; i++) {
    if (shape[i] < 0) return 0;
    if (shape[i] == 0) zero = 1;
    else if (!sbn_mul_i64(&p, p, shape[i])) return 0;
  }
  *out = zero ? 0 : p;
  return 1;
}
/* count elements of `size` bytes each, as a size_t byte count that also
 * fits in int64 (offsets and ptrdiff_t stay valid). */
static inline int sbn_bytes(size_t *out, int64_t count, size_t size) {
  int64_t b;
  if (count < 0 || size > (size_t)INT64_MAX || !sbn_mul_i64(&b, count, (int64_t)size)) return 0;
  *out = (size_t)b;
  return 1;
}

#endif
