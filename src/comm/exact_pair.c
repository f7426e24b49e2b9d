/* Two-term exact sums in bulk (see exact_sum.h): the MPI backend's sums at
 * P = 2, where each rank holds both ranks' raw terms.
 *
 * Most pairs pass the shortcut's test (both terms normal, exponents at most
 * 22 apart, no overflow), and then the hardware's a + b is the binned sum's
 * bits. The test is done per block of BLK pairs in a branch-free loop on
 * the exponent fields (float64: 64-bit integer adds and logical shifts
 * only, which SSE2 has; float32: comparisons of x & exponent bits, the
 * power of two 2^e as a float), which the compiler vectorizes; a block
 * that passes is added in a second vectorized loop, any other block goes
 * pair by pair through sbn_xsum_pair_* and, where that declines, the
 * general binned path. So the result is the binned sum's, bit for bit,
 * whatever the data; only the speed depends on it. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "exact_sum.h"

enum { BLK = 64 };

static inline float pow2_of_f(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  u &= UINT32_C(0xff) << 23;
  memcpy(&x, &u, 4);
  return x;
}

static double general_f64(double a, double b) {
  double s;
  if (sbn_xsum_pair_f64(a, b, &s)) return s;
  sbn_xbin acc = sbn_xsum_zero();
  sbn_xsum_add(&acc, a);
  sbn_xsum_add(&acc, b);
  sbn_xsum_decode_f64(&s, &acc, 1);
  return s;
}

static float general_f32(float a, float b) {
  float s;
  if (sbn_xsum_pair_f32(a, b, &s)) return s;
  sbn_xbin acc = sbn_xsum_zero();
  sbn_xsum_add(&acc, a);
  sbn_xsum_add(&acc, b);
  sbn_xsum_decode_f32(&s, &acc, 1);
  return s;
}

void sbn_xsum_pair_sum_f64(double *out, const double *a, const double *b, size_t n) {
  for (size_t i0 = 0; i0 < n; i0 += BLK) {
    const size_t k = n - i0 < BLK ? n - i0 : BLK;
    const double *x = a + i0, *y = b + i0;
    double *o = out + i0;
    uint64_t bad = 0;
    for (size_t j = 0; j < k; j++) {
      const double s = x[j] + y[j];
      uint64_t ua, ub, us;
      memcpy(&ua, &x[j], 8), memcpy(&ub, &y[j], 8), memcpy(&us, &s, 8);
      const uint64_t ea = (ua >> 52) & 0x7ff, eb = (ub >> 52) & 0x7ff, es = (us >> 52) & 0x7ff;
      /* nonzero unless: 1 <= ea, eb <= 0x7fe (normal), es != 0x7ff (no
       * overflow), |ea - eb| <= 22 (each difference + 41 within 0..63) */
      bad |= ((ea - 1) >> 63) | ((ea + 1) >> 11) | ((eb - 1) >> 63) | ((eb + 1) >> 11) | ((es + 1) >> 11) |
             ((ea - eb + 41) >> 6) | ((eb - ea + 41) >> 6);
    }
    if (!bad)
      for (size_t j = 0; j < k; j++) o[j] = x[j] + y[j];
    else
      for (size_t j = 0; j < k; j++) o[j] = general_f64(x[j], y[j]);
  }
}

void sbn_xsum_pair_sum_f32(float *out, const float *a, const float *b, size_t n) {
  for (size_t i0 = 0; i0 < n; i0 += BLK) {
    const size_t k = n - i0 < BLK ? n - i0 : BLK;
    const float *x = a + i0, *y = b + i0;
    float *o = out + i0;
    int bad = 0;
    for (size_t j = 0; j < k; j++) { /* float normals only (float subnormals: pair by pair) */
      const float pa = pow2_of_f(x[j]), pb = pow2_of_f(y[j]), s = (float)((double)x[j] + (double)y[j]);
      bad |= !(pa >= FLT_MIN) | !(pa <= 0x1p127f) | !(pb >= FLT_MIN) | !(pb <= 0x1p127f) |
             !(pa <= pb * 0x1p22f) | !(pb <= pa * 0x1p22f) | !(fabsf(s) <= FLT_MAX);
    }
    if (!bad)
      for (size_t j = 0; j < k; j++) o[j] = (float)((double)x[j] + (double)y[j]);
    else
      for (size_t j = 0; j < k; j++) o[j] = general_f32(x[j], y[j]);
  }
}
