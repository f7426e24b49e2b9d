/* The integer lanes' encode and decode (format: exact_lanes.h) in blocks of
 * BLK values, bit for bit the scalar reference's outputs (exact_lanes.c)
 * at a fraction of its time per value.
 *
 * Nearly every value takes one straight path. Encode: a normal term whose
 * significand m lands at shift sh in [0, 2*57-53] of the window (enc1's
 * test), so hi and lo are two shifts of m. Decode: a window with top T in
 * [4, 55] and a normal result; the magnitude V = H 2^57 + L of the lanes
 * loses its low s bits into a sticky bit (s from the exponent of H as a
 * double, which may be one too large after rounding: t = V >> s keeps at
 * least 62 bits, or is V when s = 0), goes through one correctly rounded
 * conversion and one product with 2^(38T - 1150 + s) (exact short of
 * overflow). The correctly rounded value is unique, so this is the
 * reference's, and so is any overflow to inf. A branch-free loop
 * over the block computes the results and whether every value took that
 * path; the compiler vectorizes it. Any other block (a misfit, a zero or
 * subnormal term, inf/NaN, a window outside [4, 55], a float32 result
 * below FLT_MIN) is redone by the reference, so only speed depends on the data.
 *
 * The loops need per-lane variable 64-bit shifts, which SSE2 (the build's
 * baseline) lacks and AVX2 and AVX-512 have; AVX-512DQ also converts int64
 * to double natively (AVX2 by an exact two-part sum). So the same body is
 * compiled for "avx2" and "avx512"; "generic" is the reference alone. A
 * table picks one at first use: the CPU's best, or SYNCBN_CPU_ISA's when
 * supported (as the CPU kernels do; the comm layer keeps its own). */
#include <stdlib.h>
#include <string.h>

#include "exact_lanes.h"

enum { W = 38, D = 57, BLK = 64 };
#define LO_MASK ((UINT64_C(1) << D) - 1)
#define INL static inline __attribute__((always_inline))

INL uint64_t bits_of(double x) {
  uint64_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}
INL double dbl_of(uint64_t u) {
  double x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* ---- encode ---- */

/* The lanes of the double with bits u in the window of top T; nonzero when
 * u is off the straight path (then o is meaningless). hi = floor(m 2^(sh-57))
 * is (m 2^4) >> (61 - sh): m 2^4 < 2^57, exact; no shift count leaves
 * [0, 61] (off the path, sh counts as 0). */
INL uint64_t enc_lane(int64_t *o, uint64_t u, uint64_t T) {
  const uint64_t e = (u >> 52) & 0x7ff;
  const uint64_t m = (u & ((UINT64_C(1) << 52) - 1)) | (UINT64_C(1) << 52);
  const uint64_t sh = e - 1 + 2 * W - W * T; /* as enc1 computes it, modulo 2^64 */
  const uint64_t off = (e - 1 >= 0x7fe) | (sh > 2 * D - 53);
  const uint64_t s = sh & (off - 1);
  const uint64_t hi = (m << 4) >> (2 * D - 53 - s), lo = (m << s) & LO_MASK;
  const uint64_t neg = 0 - (u >> 63);
  o[0] = (int64_t)((hi ^ neg) - neg);
  o[1] = (int64_t)((lo ^ neg) - neg);
  return off;
}

/* Whether u is on the straight path (the test of enc_lane alone). */
INL uint64_t enc_off(uint64_t u, uint64_t T) {
  const uint64_t e = (u >> 52) & 0x7ff;
  return (e - 1 >= 0x7fe) | (e - 1 + 2 * W - W * T > 2 * D - 53);
}

/* ---- decode ---- */

/* x < 2^63 as a double, correctly rounded: natively (AVX-512DQ), or as one
 * addition of two exact parts, 2^84 + (x >> 32) 2^32 - (2^84 + 2^52) and
 * 2^52 + (x mod 2^32), read from their bits (vectorizes on SSE2 and AVX2). */
INL double u63_to_f64(uint64_t x, int native) {
  if (native) return (double)(int64_t)x;
  const double h = dbl_of((x >> 32) | UINT64_C(0x4530000000000000)) - 0x1.00000001p84;
  return h + dbl_of((x & 0xffffffff) | UINT64_C(0x4330000000000000));
}

/* The lanes' magnitude V as t = V >> s with a sticky bit, the scale's
 * exponent bits (for 2^(38T - 1150 + s)), the sign bit; nonzero when off
 * the common path (T outside [4, 55], or a magnitude of 2^120 or more,
 * which no sum within SBN_XLANES_MAX_TERMS has). */
INL uint64_t dec_lane(uint64_t *t, uint64_t *scale, uint64_t *sign, int64_t hi, int64_t lo, uint64_t T,
                      int native) {
  uint64_t H = (uint64_t)hi + (uint64_t)(lo >> D), L = (uint64_t)lo & LO_MASK;
  const uint64_t neg = 0 - (H >> 63), lz = 0 - (uint64_t)(L == 0);
  H = (H ^ neg) - (neg & lz);         /* negative: ~H, or -H when L = 0 */
  L = ((L ^ neg) - neg) & LO_MASK;    /* negative: 2^57 - L, or 0 */
  int64_t s = (int64_t)(bits_of(u63_to_f64(H, native)) >> 52) - (1022 + 6); /* bits of H - 6, or one more */
  s = s < 0 ? 0 : s;
  s = s > D ? D : s;
  const uint64_t Ls = L >> s;
  *t = (H << (D - s)) | Ls | (uint64_t)((Ls << s) != L);
  *scale = (W * T - 2 * W - 1074 + 1023 + (uint64_t)s) << 52;
  *sign = neg << 63;
  return (H >> 63) | (T - 4 > 55 - 4);
}

/* ---- block kernels: nonzero when every value took the straight path ---- */

INL int enc_block_f64(int64_t *restrict out, const double *restrict x, const uint8_t *restrict top, size_t k) {
  uint64_t off = 0;
  for (size_t j = 0; j < k; j++) off |= enc_lane(out + 2 * j, bits_of(x[j]), top[j]);
  return off == 0;
}

INL int enc_block_f32(int64_t *restrict out, const float *restrict x, const uint8_t *restrict top, size_t k) {
  uint64_t off = 0;
  for (size_t j = 0; j < k; j++) off |= enc_lane(out + 2 * j, bits_of((double)x[j]), top[j]);
  return off == 0;
}

INL int fit_block_f64(const double *restrict x, const uint8_t *restrict top, size_t k) {
  uint64_t off = 0;
  for (size_t j = 0; j < k; j++) off |= enc_off(bits_of(x[j]), top[j]);
  return off == 0;
}

INL int fit_block_f32(const float *restrict x, const uint8_t *restrict top, size_t k) {
  uint64_t off = 0;
  for (size_t j = 0; j < k; j++) off |= enc_off(bits_of((double)x[j]), top[j]);
  return off == 0;
}

INL int dec_block_f64(double *restrict out, const int64_t *restrict lanes, const uint8_t *restrict top, size_t k,
                      int native) {
  uint64_t off = 0;
  for (size_t j = 0; j < k; j++) {
    uint64_t t, scale, sign;
    off |= dec_lane(&t, &scale, &sign, lanes[2 * j], lanes[2 * j + 1], top[j], native);
    out[j] = dbl_of(bits_of(u63_to_f64(t, native) * dbl_of(scale)) | sign);
  }
  return off == 0;
}

/* float32: t of more than 53 bits first loses 10 more into the sticky bit
 * (at least 43 are left, ample for 24), so that t is exact as a double and
 * the conversion to float is the only rounding; natively in one step. */
INL int dec_block_f32(float *restrict out, const int64_t *restrict lanes, const uint8_t *restrict top, size_t k,
                      int native) {
  uint64_t off = 0;
  for (size_t j = 0; j < k; j++) {
    uint64_t t, scale, sign;
    off |= dec_lane(&t, &scale, &sign, lanes[2 * j], lanes[2 * j + 1], top[j], native);
    double r;
    if (native) {
      r = (double)(float)(int64_t)t;
    } else {
      const uint64_t c = (uint64_t)((t >> 53) != 0) * 10;
      const uint64_t tc = t >> c, t2 = tc | (uint64_t)((tc << c) != t);
      r = (double)(float)u63_to_f64(t2, 0);
      scale += c << 52;
    }
    r *= dbl_of(scale);
    off |= (uint64_t)(!(r >= 0x1p-126) & (t != 0)); /* float subnormal or underflow: the reference */
    out[j] = (float)dbl_of(bits_of(r) | sign);
  }
  return off == 0;
}

/* ---- variants ---- */

typedef struct {
  int (*enc_f64)(int64_t *restrict, const double *restrict, const uint8_t *restrict, size_t);
  int (*enc_f32)(int64_t *restrict, const float *restrict, const uint8_t *restrict, size_t);
  int (*fit_f64)(const double *restrict, const uint8_t *restrict, size_t);
  int (*fit_f32)(const float *restrict, const uint8_t *restrict, size_t);
  int (*dec_f64)(double *restrict, const int64_t *restrict, const uint8_t *restrict, size_t);
  int (*dec_f32)(float *restrict, const int64_t *restrict, const uint8_t *restrict, size_t);
} blk_fns;

#define VARIANT(V, ATTR, NATIVE)                                                                                \
  ATTR static int V##_enc_f64(int64_t *restrict o, const double *restrict x, const uint8_t *restrict t,        \
                              size_t k) {                                                                      \
    return enc_block_f64(o, x, t, k);                                                                          \
  }                                                                                                            \
  ATTR static int V##_enc_f32(int64_t *restrict o, const float *restrict x, const uint8_t *restrict t,         \
                              size_t k) {                                                                      \
    return enc_block_f32(o, x, t, k);                                                                          \
  }                                                                                                            \
  ATTR static int V##_fit_f64(const double *restrict x, const uint8_t *restrict t, size_t k) {                 \
    return fit_block_f64(x, t, k);                                                                             \
  }                                                                                                            \
  ATTR static int V##_fit_f32(const float *restrict x, const uint8_t *restrict t, size_t k) {                  \
    return fit_block_f32(x, t, k);                                                                             \
  }                                                                                                            \
  ATTR static int V##_dec_f64(double *restrict o, const int64_t *restrict l, const uint8_t *restrict t,        \
                              size_t k) {                                                                      \
    return dec_block_f64(o, l, t, k, NATIVE);                                                                  \
  }                                                                                                            \
  ATTR static int V##_dec_f32(float *restrict o, const int64_t *restrict l, const uint8_t *restrict t,         \
                              size_t k) {                                                                      \
    return dec_block_f32(o, l, t, k, NATIVE);                                                                  \
  }                                                                                                            \
  static const blk_fns V##_fns = {V##_enc_f64, V##_enc_f32, V##_fit_f64, V##_fit_f32, V##_dec_f64, V##_dec_f32};

/* generic: at the SSE2 baseline the block loops do not vectorize (no
 * variable 64-bit shifts, no 64-bit compares) and, branch-free but scalar,
 * measured no faster than the reference (0.6x to 1.4x, by operation and
 * run); so its kernels decline every block and the reference does it. */
static int supported_generic(void) { return 1; }
static int decline_enc_f64(int64_t *restrict o, const double *restrict x, const uint8_t *restrict t, size_t k) {
  return (void)o, (void)x, (void)t, (void)k, 0;
}
static int decline_enc_f32(int64_t *restrict o, const float *restrict x, const uint8_t *restrict t, size_t k) {
  return (void)o, (void)x, (void)t, (void)k, 0;
}
static int decline_fit_f64(const double *restrict x, const uint8_t *restrict t, size_t k) {
  return (void)x, (void)t, (void)k, 0;
}
static int decline_fit_f32(const float *restrict x, const uint8_t *restrict t, size_t k) {
  return (void)x, (void)t, (void)k, 0;
}
static int decline_dec_f64(double *restrict o, const int64_t *restrict l, const uint8_t *restrict t, size_t k) {
  return (void)o, (void)l, (void)t, (void)k, 0;
}
static int decline_dec_f32(float *restrict o, const int64_t *restrict l, const uint8_t *restrict t, size_t k) {
  return (void)o, (void)l, (void)t, (void)k, 0;
}
static const blk_fns generic_fns = {decline_enc_f64, decline_enc_f32, decline_fit_f64,
                                    decline_fit_f32, decline_dec_f64, decline_dec_f32};

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define X86_VARIANTS 1
static int supported_avx2(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}
static int supported_avx512(void) {
  __builtin_cpu_init(); /* the builtin also checks that the OS saves the zmm state */
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
}
VARIANT(avx2, __attribute__((target("avx2"))), 0)
VARIANT(avx512, __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw"))), 1)
#endif

static const struct isa_row {
  const char *name;
  int (*supported)(void);
  const blk_fns *fns;
} isas[] = {
    {"generic", supported_generic, &generic_fns},
#ifdef X86_VARIANTS
    {"avx2", supported_avx2, &avx2_fns},
    {"avx512", supported_avx512, &avx512_fns},
#endif
};
enum { N_ISA = sizeof isas / sizeof isas[0] };

int sbn_xlanes_isa_count(void) { return N_ISA; }
const char *sbn_xlanes_isa_name(int isa) { return isa >= 0 && isa < N_ISA ? isas[isa].name : NULL; }
int sbn_xlanes_isa_supported(int isa) { return isa >= 0 && isa < N_ISA && isas[isa].supported(); }

static int find(const char *name) {
  for (int i = 0; name && i < N_ISA; i++)
    if (strcmp(name, isas[i].name) == 0) return i;
  return -1;
}

static int isa_sel = -1; /* index into isas, -1: not chosen yet (races only choose the same) */

static int get_isa(void) {
  int s = __atomic_load_n(&isa_sel, __ATOMIC_RELAXED);
  if (s < 0) {
    s = find(getenv("SYNCBN_CPU_ISA"));
    if (!sbn_xlanes_isa_supported(s)) /* unset, unknown or unsupported: the best */
      for (s = N_ISA - 1; s > 0 && !isas[s].supported(); s--) {
      }
    __atomic_store_n(&isa_sel, s, __ATOMIC_RELAXED);
  }
  return s;
}

const char *sbn_xlanes_get_isa(void) { return isas[get_isa()].name; }
int sbn_xlanes_isa(void) { return get_isa(); }

int sbn_xlanes_set_isa(const char *name) {
  const int s = find(name);
  if (!sbn_xlanes_isa_supported(s)) return -1;
  __atomic_store_n(&isa_sel, s, __ATOMIC_RELAXED);
  return 0;
}

/* ---- entry points: block by block, the reference for a block off the path ---- */

INL size_t blk_len(size_t n, size_t i) { return n - i < BLK ? n - i : BLK; }

size_t sbn_xlanes_encode_f64(int64_t *out, const double *x, const uint8_t *top, size_t n) {
  const blk_fns *f = isas[get_isa()].fns;
  size_t bad = 0;
  for (size_t i = 0, k; i < n; i += k)
    if (!f->enc_f64(out + 2 * i, x + i, top + i, k = blk_len(n, i)))
      bad += sbn_xlanes_encode_ref_f64(out + 2 * i, x + i, top + i, k);
  return bad;
}

size_t sbn_xlanes_encode_f32(int64_t *out, const float *x, const uint8_t *top, size_t n) {
  const blk_fns *f = isas[get_isa()].fns;
  size_t bad = 0;
  for (size_t i = 0, k; i < n; i += k)
    if (!f->enc_f32(out + 2 * i, x + i, top + i, k = blk_len(n, i)))
      bad += sbn_xlanes_encode_ref_f32(out + 2 * i, x + i, top + i, k);
  return bad;
}

size_t sbn_xlanes_misfits_f64(const double *x, const uint8_t *top, size_t n) {
  const blk_fns *f = isas[get_isa()].fns;
  size_t bad = 0;
  for (size_t i = 0, k; i < n; i += k)
    if (!f->fit_f64(x + i, top + i, k = blk_len(n, i))) bad += sbn_xlanes_misfits_ref_f64(x + i, top + i, k);
  return bad;
}

size_t sbn_xlanes_misfits_f32(const float *x, const uint8_t *top, size_t n) {
  const blk_fns *f = isas[get_isa()].fns;
  size_t bad = 0;
  for (size_t i = 0, k; i < n; i += k)
    if (!f->fit_f32(x + i, top + i, k = blk_len(n, i))) bad += sbn_xlanes_misfits_ref_f32(x + i, top + i, k);
  return bad;
}

void sbn_xlanes_decode_f64(double *out, const int64_t *lanes, const uint8_t *top, size_t n) {
  const blk_fns *f = isas[get_isa()].fns;
  for (size_t i = 0, k; i < n; i += k)
    if (!f->dec_f64(out + i, lanes + 2 * i, top + i, k = blk_len(n, i)))
      sbn_xlanes_decode_ref_f64(out + i, lanes + 2 * i, top + i, k);
}

void sbn_xlanes_decode_f32(float *out, const int64_t *lanes, const uint8_t *top, size_t n) {
  const blk_fns *f = isas[get_isa()].fns;
  for (size_t i = 0, k; i < n; i += k)
    if (!f->dec_f32(out + i, lanes + 2 * i, top + i, k = blk_len(n, i)))
      sbn_xlanes_decode_ref_f32(out + i, lanes + 2 * i, top + i, k);
}
