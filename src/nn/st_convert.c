/* Loading a safetensors entry into a model entry of another dtype, as
 * PyTorch's load_state_dict does with param.copy_(input): every conversion
 * goes through the C++ static_cast that copy_ uses, so the bits match
 * torch's (checked against torch 1.13 by tests/nn/test_nn_load_dtypes):
 *
 *   to float32:  (float)x from any type: one rounding, to nearest even;
 *   to float64:  (double)x;
 *   to f16/bf16: through float32 first, as c10::Half / c10::BFloat16 are
 *                built from a float (a float64 value is rounded twice);
 *   to int64:    integers exactly, floating point truncated toward zero;
 *   bool:        0 or 1.
 *
 * Where torch's result is undefined (NaN, infinity or a value out of int64's
 * range into an int64, a U64 above INT64_MAX) the load is refused. Float8
 * entries are refused: the PyTorch this targets has no float8 dtype. */
#include <string.h>

#include "../cpu/half.h"
#include "safetensors.h"

static int is_float_src(const char *dt) {
  return !strcmp(dt, "F32") || !strcmp(dt, "F64") || !strcmp(dt, "F16") || !strcmp(dt, "BF16");
}

static int is_int_src(const char *dt) {
  static const char *const ints[] = {"I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64", "BOOL"};
  for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
    if (!strcmp(dt, ints[i])) return 1;
  return 0;
}

int sbn_nn_st_convertible(const sbn_nn_st_tensor *t) {
  return is_float_src(t->dtype_name) || is_int_src(t->dtype_name);
}

/* Element k of an integer entry. *u64 gets a U64 entry's value (0 for the
 * others): one above INT64_MAX returns -1 and is told apart by it. */
static int64_t int_at(const sbn_nn_st_tensor *t, const uint8_t *p, int64_t k, uint64_t *u64) {
  const char *dt = t->dtype_name;
  p += (size_t)k * (size_t)t->elsize;
  *u64 = 0;
  if (!strcmp(dt, "BOOL")) return *p != 0;
  if (!strcmp(dt, "U8")) return *p;
  if (!strcmp(dt, "I8")) return (int8_t)*p;
  if (!strcmp(dt, "I16")) { int16_t v; memcpy(&v, p, 2); return v; }
  if (!strcmp(dt, "U16")) { uint16_t v; memcpy(&v, p, 2); return v; }
  if (!strcmp(dt, "I32")) { int32_t v; memcpy(&v, p, 4); return v; }
  if (!strcmp(dt, "U32")) { uint32_t v; memcpy(&v, p, 4); return v; }
  if (!strcmp(dt, "U64")) { memcpy(u64, p, 8); return *u64 > INT64_MAX ? -1 : (int64_t)*u64; }
  int64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* Element k of a floating-point entry, exactly, as a double. */
static double float_at(const sbn_nn_st_tensor *t, const uint8_t *p, int64_t k) {
  const char *dt = t->dtype_name;
  p += (size_t)k * (size_t)t->elsize;
  if (!strcmp(dt, "F64")) { double v; memcpy(&v, p, 8); return v; }
  if (!strcmp(dt, "F32")) { float v; memcpy(&v, p, 4); return v; }
  uint16_t h;
  memcpy(&h, p, 2);
  return !strcmp(dt, "F16") ? sbn_f16_to_f32(h) : sbn_bf16_to_f32(h);
}

/* static_cast<float>(x): an integer is rounded once, straight to float32
 * (not through a double, which could round twice). */
static float as_f32(const sbn_nn_st_tensor *t, const uint8_t *p, int64_t k) {
  if (is_float_src(t->dtype_name)) return (float)float_at(t, p, k);
  uint64_t u;
  int64_t v = int_at(t, p, k, &u);
  return u > INT64_MAX ? (float)u : (float)v;
}

static double as_f64(const sbn_nn_st_tensor *t, const uint8_t *p, int64_t k) {
  if (is_float_src(t->dtype_name)) return float_at(t, p, k);
  uint64_t u;
  int64_t v = int_at(t, p, k, &u);
  return u > INT64_MAX ? (double)u : (double)v;
}

int sbn_nn_st_int64_at(const sbn_nn_st_tensor *t, const uint8_t *data, int64_t k, int64_t *out, double *bad) {
  const uint8_t *p = data + t->begin;
  if (is_float_src(t->dtype_name)) {
    double d = float_at(t, p, k);
    *bad = d;
    /* [-2^63, 2^63): where the truncation is defined (NaN fails too). */
    if (!(d >= -0x1p63 && d < 0x1p63)) return 0;
    *out = (int64_t)d;
    return 1;
  }
  uint64_t u;
  *out = int_at(t, p, k, &u);
  *bad = (double)u;
  return u <= INT64_MAX;
}

void sbn_nn_st_convert(void *dst, sbn_dtype dtype, const uint8_t *data, const sbn_nn_st_tensor *t) {
  const uint8_t *p = data + t->begin;
  if (t->sbn_dtype == (int)dtype) {
    memcpy(dst, p, t->end - t->begin); /* same dtype: the bits as stored, NaN payloads included */
    return;
  }
  for (int64_t k = 0; k < t->numel; k++) {
    switch (dtype) {
    case SBN_DTYPE_FLOAT32: ((float *)dst)[k] = as_f32(t, p, k); break;
    case SBN_DTYPE_FLOAT64: ((double *)dst)[k] = as_f64(t, p, k); break;
    case SBN_DTYPE_FLOAT16: ((uint16_t *)dst)[k] = sbn_f32_to_f16(as_f32(t, p, k)); break;
    case SBN_DTYPE_BFLOAT16: ((uint16_t *)dst)[k] = sbn_f32_to_bf16(as_f32(t, p, k)); break;
    case SBN_DTYPE_INT64: {
      double bad;
      (void)sbn_nn_st_int64_at(t, data, k, &((int64_t *)dst)[k], &bad); /* checked before */
      break;
    }
    }
  }
}
