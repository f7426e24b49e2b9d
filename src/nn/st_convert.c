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

/* The source dtypes, resolved from the entry's name once per entry (not
 * per element). */
typedef enum { SRC_NONE, SRC_F64, SRC_F32, SRC_F16, SRC_BF16, SRC_BOOL, SRC_U8, SRC_I8, SRC_I16, SRC_U16,
               SRC_I32, SRC_U32, SRC_I64, SRC_U64 } src_kind;

static src_kind kind_of(const sbn_nn_st_tensor *t) {
  static const struct { const char *name; src_kind k; } kinds[] = {
      {"F64", SRC_F64}, {"F32", SRC_F32}, {"F16", SRC_F16}, {"BF16", SRC_BF16}, {"BOOL", SRC_BOOL},
      {"U8", SRC_U8},   {"I8", SRC_I8},   {"I16", SRC_I16}, {"U16", SRC_U16},   {"I32", SRC_I32},
      {"U32", SRC_U32}, {"I64", SRC_I64}, {"U64", SRC_U64}};
  for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
    if (!strcmp(t->dtype_name, kinds[i].name)) return kinds[i].k;
  return SRC_NONE;
}

static int is_float(src_kind k) { return k >= SRC_F64 && k <= SRC_BF16; }

int sbn_nn_st_convertible(const sbn_nn_st_tensor *t) { return kind_of(t) != SRC_NONE; }

/* Element k of an integer entry. *u64 gets a U64 entry's value (0 for the
 * others): one above INT64_MAX returns -1 and is told apart by it. */
static int64_t int_at(src_kind kind, int elsize, const uint8_t *p, int64_t k, uint64_t *u64) {
  p += (size_t)k * (size_t)elsize;
  *u64 = 0;
  switch (kind) {
  case SRC_BOOL: return *p != 0;
  case SRC_U8: return *p;
  case SRC_I8: return (int8_t)*p;
  case SRC_I16: { int16_t v; memcpy(&v, p, 2); return v; }
  case SRC_U16: { uint16_t v; memcpy(&v, p, 2); return v; }
  case SRC_I32: { int32_t v; memcpy(&v, p, 4); return v; }
  case SRC_U32: { uint32_t v; memcpy(&v, p, 4); return v; }
  case SRC_U64: memcpy(u64, p, 8); return *u64 > INT64_MAX ? -1 : (int64_t)*u64;
  default: { int64_t v; memcpy(&v, p, 8); return v; }
  }
}

/* Element k of a floating-point entry, exactly, as a double. */
static double float_at(src_kind kind, int elsize, const uint8_t *p, int64_t k) {
  p += (size_t)k * (size_t)elsize;
  if (kind == SRC_F64) { double v; memcpy(&v, p, 8); return v; }
  if (kind == SRC_F32) { float v; memcpy(&v, p, 4); return v; }
  uint16_t h;
  memcpy(&h, p, 2);
  return kind == SRC_F16 ? sbn_f16_to_f32(h) : sbn_bf16_to_f32(h);
}

/* static_cast<float>(x): an integer is rounded once, straight to float32
 * (not through a double, which could round twice). */
static float as_f32(src_kind kind, int elsize, const uint8_t *p, int64_t k) {
  if (is_float(kind)) return (float)float_at(kind, elsize, p, k);
  uint64_t u;
  int64_t v = int_at(kind, elsize, p, k, &u);
  return u > INT64_MAX ? (float)u : (float)v;
}

static double as_f64(src_kind kind, int elsize, const uint8_t *p, int64_t k) {
  if (is_float(kind)) return float_at(kind, elsize, p, k);
  uint64_t u;
  int64_t v = int_at(kind, elsize, p, k, &u);
  return u > INT64_MAX ? (double)u : (double)v;
}

static int i64_at(src_kind kind, int elsize, const uint8_t *p, int64_t k, int64_t *out, double *bad) {
  if (is_float(kind)) {
    double d = float_at(kind, elsize, p, k);
    *bad = d;
    /* [-2^63, 2^63): where the truncation is defined (NaN fails too). */
    if (!(d >= -0x1p63 && d < 0x1p63)) return 0;
    *out = (int64_t)d;
    return 1;
  }
  uint64_t u;
  *out = int_at(kind, elsize, p, k, &u);
  *bad = (double)u;
  return u <= INT64_MAX;
}

int64_t sbn_nn_st_int64_scan(const sbn_nn_st_tensor *t, const uint8_t *data, int64_t lo, int64_t hi, int64_t *value,
                             double *raw, int *defined) {
  const src_kind kind = kind_of(t);
  for (int64_t k = 0; k < t->numel; k++) {
    *defined = i64_at(kind, t->elsize, data + t->begin, k, value, raw);
    if (!*defined || *value < lo || *value > hi) return k;
  }
  return -1;
}

void sbn_nn_st_convert(void *dst, sbn_dtype dtype, const uint8_t *data, const sbn_nn_st_tensor *t) {
  const uint8_t *p = data + t->begin;
  if (t->sbn_dtype == (int)dtype) {
    memcpy(dst, p, t->end - t->begin); /* same dtype: the bits as stored, NaN payloads included */
    return;
  }
  const src_kind kind = kind_of(t);
  const int es = t->elsize;
  for (int64_t k = 0; k < t->numel; k++) {
    switch (dtype) {
    case SBN_DTYPE_FLOAT32: ((float *)dst)[k] = as_f32(kind, es, p, k); break;
    case SBN_DTYPE_FLOAT64: ((double *)dst)[k] = as_f64(kind, es, p, k); break;
    case SBN_DTYPE_FLOAT16: ((uint16_t *)dst)[k] = sbn_f32_to_f16(as_f32(kind, es, p, k)); break;
    case SBN_DTYPE_BFLOAT16: ((uint16_t *)dst)[k] = sbn_f32_to_bf16(as_f32(kind, es, p, k)); break;
    case SBN_DTYPE_INT64: {
      double bad;
      (void)i64_at(kind, es, p, k, &((int64_t *)dst)[k], &bad); /* checked before */
      break;
    }
    }
  }
}
