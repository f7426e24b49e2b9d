/* Internal: scalar conversions between float32 and the 16-bit storage types.
 * Both round to nearest even, as the hardware (F16C vcvtps2ph, AVX-512 BF16)
 * and PyTorch do, so the portable and the vector paths give the same bits.
 * Widening (16 -> 32 bits) is exact. */
#ifndef SBN_CPU_HALF_H
#define SBN_CPU_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t sbn_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float sbn_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* bfloat16 is the top half of a float32. */
static inline float sbn_bf16_to_f32(uint16_t h) { return sbn_bits_f32((uint32_t)h << 16); }

static inline uint16_t sbn_f32_to_bf16(float f) {
  uint32_t u = sbn_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
static inline float sbn_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return sbn_bits_f32(sign | 0x7f800000u | (m << 13)); /* inf, NaN */
  if (e) return sbn_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
  /* zero or subnormal: m * 2^-24, exact in float32 */
  return sbn_bits_f32(sign | sbn_f32_bits((float)m * 0x1p-24f));
}

static inline uint16_t sbn_f32_to_f16(float f) {
  uint32_t u = sbn_f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) /* inf; NaN stays NaN, quiet, top payload bits kept */
    return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
  if (a < 0x38800000u) {
    /* Below the smallest normal 2^-14: adding 0.5 puts the value in [0.5, 1)
     * where the float32 ulp is 2^-24, the half subnormal step; the FPU's
     * round-to-nearest-even does the rounding (0x400 = smallest normal). */
    float t = sbn_bits_f32(a) + 0.5f;
    return (uint16_t)(sign | (sbn_f32_bits(t) - 0x3f000000u));
  }
  /* Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits
   * to nearest even; a carry into the exponent is the correct result. */
  a += 0xc8000fffu + ((a >> 13) & 1u);
  return (uint16_t)(sign | (a >> 13));
}

#endif
