/* Internal, tests only: the AVX-512 intrinsics that vec.h uses, written with
 * GCC vector extensions (and AVX2/F16C where a half does the work), so the
 * avx512 and avx512bf16 kernel levels' own source (kern_body.inc,
 * kern_rows.inc with SBN_VEC_AVX512 / SBN_VEC_BF16) builds and runs on a
 * CPU without AVX-512. A build with SBN_AVX512_EMU=1 (mk/cpu.mk) uses it:
 * `make check-avx512-emu` runs the kernel tests at those levels there, so
 * the bit-for-bit comparisons with the other levels run on every machine,
 * not only where the hardware has AVX-512. Each function does what Intel's
 * documentation says the instruction does, for the operands vec.h passes;
 * vcvtneps2bf16's rounding (nearest even; subnormal inputs as zero; NaNs
 * quieted) is checked against half.h over every float32 pattern by
 * tests/cpu/test_cpu_bf16_narrow.c in that build. (SIMDe, the portable
 * library of intrinsics, lacks most of these in Debian 12's version.) */
#ifndef SBN_CPU_AVX512_EMU_H
#define SBN_CPU_AVX512_EMU_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

typedef double emu_d8 __attribute__((vector_size(64)));
typedef double emu_d4 __attribute__((vector_size(32)));
typedef float emu_f16 __attribute__((vector_size(64)));
typedef float emu_f8 __attribute__((vector_size(32)));
typedef uint32_t emu_u16 __attribute__((vector_size(64)));
typedef uint32_t emu_u8 __attribute__((vector_size(32)));
typedef uint16_t emu_h16 __attribute__((vector_size(32)));
typedef uint16_t emu_h8 __attribute__((vector_size(16)));

static inline __m512d emu_set1_pd(double a) { return (__m512d)((emu_d8){0} + a); }
static inline __m512 emu_set1_ps(float a) { return (__m512)((emu_f16){0} + a); }
static inline __m512i emu_set1_epi32(int a) { return (__m512i)((emu_u16){0} + (uint32_t)a); }
static inline __m512 emu_loadu_ps(const float *p) {
  emu_f16 v;
  memcpy(&v, p, sizeof v);
  return (__m512)v;
}
static inline __m256d emu_castpd512_pd256(__m512d v) {
  return (__m256d)__builtin_shufflevector((emu_d8)v, (emu_d8)v, 0, 1, 2, 3);
}
static inline __m256d emu_extractf64x4_pd(__m512d v, int hi) {
  return hi ? (__m256d)__builtin_shufflevector((emu_d8)v, (emu_d8)v, 4, 5, 6, 7) : emu_castpd512_pd256(v);
}
static inline __m512d emu_zextpd256_pd512(__m256d a) {
  return (__m512d)__builtin_shufflevector((emu_d4)a, (emu_d4){0}, 0, 1, 2, 3, 4, 5, 6, 7);
}
static inline __m512d emu_mask_add_pd(__m512d src, __mmask8 k, __m512d a, __m512d b) {
  emu_d8 r = (emu_d8)src;
  for (int l = 0; l < 8; l++)
    if (k >> l & 1) r[l] = ((emu_d8)a)[l] + ((emu_d8)b)[l];
  return (__m512d)r;
}
/* a * b + c and a * b - c, each rounded once */
static inline __m512d emu_fmadd_pd(__m512d a, __m512d b, __m512d c) {
  emu_d8 r;
  for (int l = 0; l < 8; l++) r[l] = __builtin_fma(((emu_d8)a)[l], ((emu_d8)b)[l], ((emu_d8)c)[l]);
  return (__m512d)r;
}
static inline __m512d emu_fmsub_pd(__m512d a, __m512d b, __m512d c) { return emu_fmadd_pd(a, b, -c); }
static inline __m512d emu_mask3_fmadd_pd(__m512d a, __m512d b, __m512d c, __mmask8 k) {
  emu_d8 r = (emu_d8)c;
  for (int l = 0; l < 8; l++)
    if (k >> l & 1) r[l] = __builtin_fma(((emu_d8)a)[l], ((emu_d8)b)[l], ((emu_d8)c)[l]);
  return (__m512d)r;
}
static inline __m512d emu_cvtps_pd(__m256 a) { return (__m512d)__builtin_convertvector((emu_f8)a, emu_d8); }

/* 16 lanes as two halves of 8 */
static inline __m512 emu_join_ps(__m256 lo, __m256 hi) {
  return (__m512)__builtin_shufflevector((emu_f8)lo, (emu_f8)hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                                         15);
}
static inline __m512i emu_join_si(__m256i lo, __m256i hi) {
  return (__m512i)__builtin_shufflevector((emu_u8)lo, (emu_u8)hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                          14, 15);
}
static inline __m256 emu_half_ps(__m512 v, int hi) {
  return hi ? (__m256)__builtin_shufflevector((emu_f16)v, (emu_f16)v, 8, 9, 10, 11, 12, 13, 14, 15)
            : (__m256)__builtin_shufflevector((emu_f16)v, (emu_f16)v, 0, 1, 2, 3, 4, 5, 6, 7);
}
static inline __m512 emu_cvtph_ps(__m256i h) {
  return emu_join_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
}
/* float16 with round to nearest even (the only rounding vec.h asks for) */
static inline __m256i emu_cvtps_ph_rne(__m512 f) {
  return _mm256_set_m128i(_mm256_cvtps_ph(emu_half_ps(f, 1), _MM_FROUND_TO_NEAREST_INT),
                          _mm256_cvtps_ph(emu_half_ps(f, 0), _MM_FROUND_TO_NEAREST_INT));
}
static inline __m512i emu_cvtepu16_epi32(__m256i h) {
  return emu_join_si(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)),
                     _mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)));
}
static inline __m512i emu_slli_epi32(__m512i a, unsigned n) { return (__m512i)((emu_u16)a << n); }
static inline __m512i emu_srli_epi32(__m512i a, unsigned n) { return (__m512i)((emu_u16)a >> n); }
static inline __m512i emu_add_epi32(__m512i a, __m512i b) { return (__m512i)((emu_u16)a + (emu_u16)b); }
static inline __m512i emu_and_si512(__m512i a, __m512i b) { return (__m512i)((emu_u16)a & (emu_u16)b); }

/* vfpclassps with imm 0x20 (denormal), the only class vec.h asks for: the
 * macros below refuse any other at compile time. */
static inline unsigned emu_denormal_mask(const float *f, int n) {
  unsigned m = 0;
  for (int l = 0; l < n; l++) {
    uint32_t u;
    memcpy(&u, &f[l], sizeof u);
    if ((u & 0x7f800000u) == 0 && (u & 0x7fffffu) != 0) m |= 1u << l;
  }
  return m;
}
static inline __mmask16 emu_fpclass_denormal16(__m512 f) {
  emu_f16 v = (emu_f16)f;
  float a[16];
  memcpy(a, &v, sizeof a);
  return (__mmask16)emu_denormal_mask(a, 16);
}
static inline __mmask8 emu_fpclass_denormal8(__m256 f) {
  emu_f8 v = (emu_f8)f;
  float a[8];
  memcpy(a, &v, sizeof a);
  return (__mmask8)emu_denormal_mask(a, 8);
}

/* vcvtneps2bf16: nearest even, denormal inputs as zeros of their sign,
 * NaNs quieted (bit 6 of the result set), no exceptions */
static inline uint16_t emu_bf16_ne(uint32_t u) {
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) return (uint16_t)(u >> 16 | 0x40);
  if ((u & 0x7f800000u) == 0) return (uint16_t)(u >> 16 & 0x8000);
  return (uint16_t)((u + 0x7fffu + (u >> 16 & 1)) >> 16);
}
static inline __m256i emu_cvtneps_pbh16(__m512 f) {
  emu_u16 u = (emu_u16)f;
  emu_h16 h;
  for (int l = 0; l < 16; l++) h[l] = emu_bf16_ne(u[l]);
  return (__m256i)h;
}
static inline __m128i emu_cvtneps_pbh8(__m256 f) {
  emu_u8 u = (emu_u8)f;
  emu_h8 h;
  for (int l = 0; l < 8; l++) h[l] = emu_bf16_ne(u[l]);
  return (__m128i)h;
}
/* vpmovdw with a merge mask: the low 16 bits of the selected lanes */
static inline __m256i emu_mask_cvtepi32_epi16_16(__m256i src, __mmask16 k, __m512i a) {
  emu_h16 r = (emu_h16)src;
  for (int l = 0; l < 16; l++)
    if (k >> l & 1) r[l] = (uint16_t)((emu_u16)a)[l];
  return (__m256i)r;
}
static inline __m128i emu_mask_cvtepi32_epi16_8(__m128i src, __mmask8 k, __m256i a) {
  emu_h8 r = (emu_h8)src;
  for (int l = 0; l < 8; l++)
    if (k >> l & 1) r[l] = (uint16_t)((emu_u8)a)[l];
  return (__m128i)r;
}

#define EMU_ONLY_DENORMAL(imm) (void)sizeof(char[(imm) == 0x20 ? 1 : -1])
#define EMU_ONLY_RNE(r) (void)sizeof(char[(r) == _MM_FROUND_TO_NEAREST_INT ? 1 : -1])
#define _mm512_set1_pd emu_set1_pd
#define _mm512_set1_ps emu_set1_ps
#define _mm512_set1_epi32 emu_set1_epi32
#define _mm512_loadu_ps emu_loadu_ps
#define _mm512_castpd512_pd256 emu_castpd512_pd256
#define _mm512_extractf64x4_pd emu_extractf64x4_pd
#define _mm512_zextpd256_pd512 emu_zextpd256_pd512
#define _mm512_mask_add_pd emu_mask_add_pd
#define _mm512_fmadd_pd emu_fmadd_pd
#define _mm512_fmsub_pd emu_fmsub_pd
#define _mm512_mask3_fmadd_pd emu_mask3_fmadd_pd
#define _mm512_cvtps_pd emu_cvtps_pd
#define _mm512_cvtph_ps emu_cvtph_ps
#define _mm512_cvtps_ph(f, r) (EMU_ONLY_RNE(r), emu_cvtps_ph_rne(f))
#define _mm512_cvtepu16_epi32 emu_cvtepu16_epi32
#define _mm512_slli_epi32 emu_slli_epi32
#define _mm512_srli_epi32 emu_srli_epi32
#define _mm512_add_epi32 emu_add_epi32
#define _mm512_and_si512 emu_and_si512
#define _mm512_fpclass_ps_mask(f, imm) (EMU_ONLY_DENORMAL(imm), emu_fpclass_denormal16(f))
#define _mm256_fpclass_ps_mask(f, imm) (EMU_ONLY_DENORMAL(imm), emu_fpclass_denormal8(f))
#define _mm512_cvtneps_pbh emu_cvtneps_pbh16
#define _mm256_cvtneps_pbh emu_cvtneps_pbh8
#define _mm512_mask_cvtepi32_epi16 emu_mask_cvtepi32_epi16_16
#define _mm256_mask_cvtepi32_epi16 emu_mask_cvtepi32_epi16_8

#endif
