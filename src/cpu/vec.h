/* Internal: 4 x float64 vectors (GCC vector extensions) and the loads and
 * stores of each storage type, for the kernel bodies (kern_body.inc).
 * Included by kern_generic.c (baseline x86-64 / any target: GCC lowers the
 * vectors to SSE2 or scalars), by kern_avx2.c (compiled for AVX2: ymm
 * registers, F16C conversions) and by kern_avx512.c (the same, plus the
 * reductions' 8-double loads at the end of this file). Every lane does the
 * same IEEE operations in each: no product fused into an addition by the
 * compiler (-ffp-contract=off), only where the source asks (vd4_fma, the
 * same rounding in every build); vd4_addm below adds on the multiply-add
 * unit, with the addition's rounding. So every instruction set gives the
 * same bits. */
#ifndef SBN_CPU_VEC_H
#define SBN_CPU_VEC_H

#include <stdint.h>
#include <string.h>

#include "half.h"
#ifdef SBN_VEC_F16C
#include <immintrin.h>
#endif
#if defined(SBN_AVX512_EMU) && defined(SBN_VEC_AVX512)
#include "avx512_emu.h" /* tests only: the AVX-512 levels on an AVX2 CPU */
#endif

typedef double vd4 __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));
typedef uint32_t vu4 __attribute__((vector_size(16)));
typedef int32_t vi4 __attribute__((vector_size(16)));
typedef uint16_t vh4 __attribute__((vector_size(8)));

static inline vd4 vd4_set1(double a) { return (vd4){a, a, a, a}; }
static inline vd4 vd4_ld(const double *p) {
  vd4 v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void vd4_st(double *p, vd4 v) { memcpy(p, &v, sizeof v); }

/* float32. The AVX2 build converts with one vcvtps2pd per 4 values (GCC
 * lowers __builtin_convertvector of 4 floats to two 128-bit converts and an
 * insert); the values are the same either way (widening is exact). */
#ifdef SBN_VEC_F16C
static inline vd4 ld4_f32(const float *p) { return (vd4)_mm256_cvtps_pd(_mm_loadu_ps(p)); }
static inline void st4_f32(float *p, vd4 v) { _mm_storeu_ps(p, _mm256_cvtpd_ps((__m256d)v)); }
#else
static inline vd4 ld4_f32(const float *p) {
  vf4 f;
  memcpy(&f, p, sizeof f);
  return __builtin_convertvector(f, vd4);
}
static inline void st4_f32(float *p, vd4 v) {
  vf4 f = __builtin_convertvector(v, vf4);
  memcpy(p, &f, sizeof f);
}
#endif
static inline double ld1_f32(const float *p) { return (double)*p; }
static inline void st1_f32(float *p, double v) { *p = (float)v; }

/* bfloat16: widen by a shift (AVX2: interleave with zeros); narrow double ->
 * float -> bf16, both RNE. */
#ifdef SBN_VEC_F16C
static inline vd4 ld4_bf16(const uint16_t *p) {
  __m128i h = _mm_loadl_epi64((const __m128i *)p);
  return (vd4)_mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h)));
}
#else
static inline vd4 ld4_bf16(const uint16_t *p) {
  vh4 h;
  memcpy(&h, p, sizeof h);
  vu4 u = __builtin_convertvector(h, vu4) << 16;
  return __builtin_convertvector((vf4)u, vd4);
}
#endif
static inline void st4_bf16(uint16_t *p, vd4 v) {
  vu4 u = (vu4)__builtin_convertvector(v, vf4);
  vu4 r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  vu4 nan = (vu4)((u & 0x7fffffffu) > 0x7f800000u); /* all-ones lanes */
  r = (r & ~nan) | (((u >> 16) | 0x40u) & nan);
  vh4 h = __builtin_convertvector(r, vh4);
  memcpy(p, &h, sizeof h);
}
static inline double ld1_bf16(const uint16_t *p) { return (double)sbn_bf16_to_f32(*p); }
static inline void st1_bf16(uint16_t *p, double v) { *p = sbn_f32_to_bf16((float)v); }

/* float16: F16C instructions in the AVX2 build, the scalar conversions
 * (same rounding, checked bit for bit by tests/cpu) otherwise. */
#ifdef SBN_VEC_F16C
static inline vd4 ld4_f16(const uint16_t *p) { /* vcvtps2pd, as ld4_f32 */
  return (vd4)_mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)p)));
}
static inline void st4_f16(uint16_t *p, vd4 v) {
  vf4 f = __builtin_convertvector(v, vf4);
  _mm_storel_epi64((__m128i *)p, _mm_cvtps_ph((__m128)f, _MM_FROUND_TO_NEAREST_INT));
}
#else
static inline vd4 ld4_f16(const uint16_t *p) {
  return (vd4){sbn_f16_to_f32(p[0]), sbn_f16_to_f32(p[1]), sbn_f16_to_f32(p[2]),
               sbn_f16_to_f32(p[3])};
}
static inline void st4_f16(uint16_t *p, vd4 v) {
  for (int j = 0; j < 4; j++) p[j] = sbn_f32_to_f16((float)v[j]);
}
#endif
static inline double ld1_f16(const uint16_t *p) { return (double)sbn_f16_to_f32(*p); }
static inline void st1_f16(uint16_t *p, double v) { *p = sbn_f32_to_f16((float)v); }

/* 8 values as two vectors of 4 doubles: the channels-first reductions'
 * load (AVX2: one 16-byte load for the 16-bit types). Their 8 values
 * belong to one channel, so the split only has to be the same in every
 * instruction set: bfloat16 splits into even and odd positions, widened by
 * a shift and a mask of each 32-bit pair (no shuffles: shuffles share one
 * port with the float64 conversions, the bound of this loop in cache). */
#ifdef SBN_VEC_F16C
static inline void ld8_f32(const float *p, vd4 *lo, vd4 *hi) {
  *lo = (vd4)_mm256_cvtps_pd(_mm_loadu_ps(p));
  *hi = (vd4)_mm256_cvtps_pd(_mm_loadu_ps(p + 4));
}
static inline void ld8_bf16(const uint16_t *p, vd4 *lo, vd4 *hi) {
  __m128i h = _mm_loadu_si128((const __m128i *)p);
  *lo = (vd4)_mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(h, 16)));
  *hi = (vd4)_mm256_cvtps_pd(_mm_castsi128_ps(_mm_and_si128(h, _mm_set1_epi32((int)0xffff0000u))));
}
static inline void ld8_f16(const uint16_t *p, vd4 *lo, vd4 *hi) {
  __m256 f = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
  *lo = (vd4)_mm256_cvtps_pd(_mm256_castps256_ps128(f));
  *hi = (vd4)_mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
}
#else
static inline void ld8_f32(const float *p, vd4 *lo, vd4 *hi) { *lo = ld4_f32(p), *hi = ld4_f32(p + 4); }
static inline void ld8_bf16(const uint16_t *p, vd4 *lo, vd4 *hi) {
  vu4 u;
  memcpy(&u, p, sizeof u);
  *lo = __builtin_convertvector((vf4)(u << 16), vd4);
  *hi = __builtin_convertvector((vf4)(u & 0xffff0000u), vd4);
}
static inline void ld8_f16(const uint16_t *p, vd4 *lo, vd4 *hi) { *lo = ld4_f16(p), *hi = ld4_f16(p + 4); }
#endif

/* 8 values in order as two vectors of 4 doubles (values 0-3, 4-7): the
 * rows layout's quads, whose lanes are channels (kern_rows.inc). AVX2:
 * one load; bfloat16 widened by two unpacks with zero. */
#ifdef SBN_VEC_F16C
static inline void ld8q_bf16(const uint16_t *p, vd4 *lo, vd4 *hi) {
  const __m128i h = _mm_loadu_si128((const __m128i *)p), z = _mm_setzero_si128();
  *lo = (vd4)_mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpacklo_epi16(z, h)));
  *hi = (vd4)_mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpackhi_epi16(z, h)));
}
#else
static inline void ld8q_bf16(const uint16_t *p, vd4 *lo, vd4 *hi) { *lo = ld4_bf16(p), *hi = ld4_bf16(p + 4); }
#endif
static inline void ld8q_f32(const float *p, vd4 *lo, vd4 *hi) { ld8_f32(p, lo, hi); }
static inline void ld8q_f16(const uint16_t *p, vd4 *lo, vd4 *hi) { ld8_f16(p, lo, hi); }

/* ---- 8 x float32: the elementwise passes of the 16-bit types ----
 * Their outputs keep 8 (bfloat16) or 11 (float16) bits, so float32
 * arithmetic (error ~1e-7 relative, with the mean split in hi + lo so that
 * x - mean stays exact for ill-conditioned channels) is far below their
 * rounding, and twice as fast as float64 where these passes are
 * compute-bound. Stores of 8 values may stream (non-temporal, bypassing the
 * caches) when nt != 0 and p is aligned to 8 elements (AVX2 build only). */
typedef float vf8 __attribute__((vector_size(32)));
typedef uint32_t vu8 __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));
typedef uint16_t vh8 __attribute__((vector_size(16)));

static inline vf8 vf8_set1(float a) { return (vf8){a, a, a, a, a, a, a, a}; }
static inline vf8 vf8_ld(const float *p) {
  vf8 v;
  memcpy(&v, p, sizeof v);
  return v;
}
#ifdef SBN_VEC_F16C
static inline vf8 vf8_join(vd4 lo, vd4 hi) { /* 8 doubles -> 8 floats, RNE */
  return (vf8)_mm256_set_m128(_mm256_cvtpd_ps((__m256d)hi), _mm256_cvtpd_ps((__m256d)lo));
}
static inline vf8 ld8f_bf16(const uint16_t *p) {
  return (vf8)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16);
}
/* u + 0x7fff + (bit 16 of u): round to nearest even on the top 16 bits
 * (a NaN may come out wrong: callers test for NaNs first). */
static inline __m256i bf16_rne8(vf8 f) {
  const __m256i u = (__m256i)f;
  return _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                          _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)));
}
/* Round to nearest even on the top 16 bits; NaN stays a quiet NaN. The
 * rounded values fit 16 bits, so the unsigned-saturating pack is exact.
 * (st16_bf16's one NaN test per store, tried here per 8 values, made the
 * 7x7 maps' backward elementwise 10-15% slower, --isa avx2.) */
static inline vh8 bf16_round8(vf8 f) {
  const __m256i u = (__m256i)f, hi = _mm256_srli_epi32(u, 16);
  __m256i r = _mm256_srli_epi32(bf16_rne8(f), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps((__m256)f, (__m256)f, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
  return (vh8)_mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}
#else
static inline vf8 vf8_join(vd4 lo, vd4 hi) { /* 8 doubles -> 8 floats, RNE */
  vf4 a = __builtin_convertvector(lo, vf4), b = __builtin_convertvector(hi, vf4);
  return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7);
}
static inline vf8 ld8f_bf16(const uint16_t *p) {
  vh8 h;
  memcpy(&h, p, sizeof h);
  return (vf8)(__builtin_convertvector(h, vu8) << 16);
}
static inline vh8 bf16_round8(vf8 f) {
  vu8 u = (vu8)f;
  vu8 r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  vu8 nan = (vu8)(f != f);
  r = (r & ~nan) | (((u >> 16) | 0x40u) & nan);
  return __builtin_convertvector(r, vh8);
}
#endif

/* ---- 16 x bfloat16 as two vectors of 8 floats: even and odd positions ----
 * Widened by a shift and a mask of each 32-bit pair, narrowed by rounding
 * each float's top 16 bits in place (to nearest even; NaN: quiet) and
 * merging the pairs back by a shift, a mask and an or: no shuffles or
 * packs, which share one port with the conversions and made the 8-value
 * bfloat16 elementwise passes half as fast per value as float16's (F16C).
 * Each value's arithmetic is the same as through the 8-value path. */
#ifdef SBN_VEC_F16C
static inline void ld16f_bf16(const uint16_t *p, vf8 *ev, vf8 *od) {
  const __m256i u = _mm256_loadu_si256((const __m256i *)p);
  *ev = (vf8)_mm256_slli_epi32(u, 16);
  *od = (vf8)_mm256_and_si256(u, _mm256_set1_epi32((int)0xffff0000u));
}
static inline __m256i bf16_top8(vf8 f) {
  const __m256i u = (__m256i)f;
  const __m256i r = _mm256_add_epi32(
      u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps((__m256)f, (__m256)f, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
}
/* Without a NaN among the 16 values (one compare and a branch for all of
 * them), the rounding alone, and the halves merged by one word blend: 12
 * vector operations instead of 17. Measured (--isa avx2, 2 threads, cold,
 * against a plain copy loop timed beside it, bench/ab_passes.sh): bfloat16
 * normalize 1.07-1.15x closer to it at 8x64x112x112, 8x256x56x56 and
 * 8x512x28x28 (0.82-0.93 -> 0.91-1.06, float16's level), backward
 * elementwise 1.00-1.05x; float16, the control, 0.97-1.01x. The same bits
 * as bf16_top8 for every float32 (test_cpu_bf16_narrow_avx2). */
static inline void st16_bf16(uint16_t *p, vf8 ev, vf8 od, int nt) {
  __m256i h;
  if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps((__m256)ev, (__m256)od, _CMP_UNORD_Q)) != 0, 0))
    h = _mm256_or_si256(_mm256_srli_epi32(bf16_top8(ev), 16),
                        _mm256_and_si256(bf16_top8(od), _mm256_set1_epi32((int)0xffff0000u)));
  else
    h = _mm256_blend_epi16(_mm256_srli_epi32(bf16_rne8(ev), 16), bf16_rne8(od), 0xaa);
  if (nt) _mm256_stream_si256((__m256i *)p, h);
  else _mm256_storeu_si256((__m256i *)p, h);
}
#else
static inline void ld16f_bf16(const uint16_t *p, vf8 *ev, vf8 *od) {
  vu8 u;
  memcpy(&u, p, sizeof u);
  *ev = (vf8)(u << 16);
  *od = (vf8)(u & 0xffff0000u);
}
static inline vu8 bf16_top8(vf8 f) {
  const vu8 u = (vu8)f, r = u + 0x7fffu + ((u >> 16) & 1u), nan = (vu8)(f != f);
  return (r & ~nan) | ((u | 0x400000u) & nan);
}
static inline void st16_bf16(uint16_t *p, vf8 ev, vf8 od, int nt) {
  (void)nt;
  const vu8 h = (bf16_top8(ev) >> 16) | (bf16_top8(od) & 0xffff0000u);
  memcpy(p, &h, sizeof h);
}
#endif

#ifdef SBN_VEC_F16C
static inline void st8_f32(float *p, vf8 f, int nt) {
  if (nt) _mm256_stream_ps(p, (__m256)f);
  else memcpy(p, &f, sizeof f);
}
#ifdef SBN_VEC_BF16
/* The avx512bf16 level: vcvtneps2bf16 on 8 lanes, subnormal lanes redone by
 * the integer rounding (bf16_top8, as stz_bf16 below): the 8-value steps (row tails, the
 * flat path's vectors that span two channels) cost as few uops as float16's
 * vcvtps2ph instead of bf16_round8's shifts, blend and pack. */
static inline void st8_bf16(uint16_t *p, vf8 f, int nt) {
  __m128i h = (__m128i)_mm256_cvtneps_pbh((__m256)f);
  const __mmask8 sub = _mm256_fpclass_ps_mask((__m256)f, 0x20); /* subnormal lanes */
  if (__builtin_expect(sub != 0, 0)) h = _mm256_mask_cvtepi32_epi16(h, sub, _mm256_srli_epi32(bf16_top8(f), 16));
  if (nt) _mm_stream_si128((__m128i *)p, h);
  else _mm_storeu_si128((__m128i *)p, h);
}
#else
static inline void st8_bf16(uint16_t *p, vf8 f, int nt) {
  vh8 h = bf16_round8(f);
  if (nt) _mm_stream_si128((__m128i *)p, (__m128i)h);
  else memcpy(p, &h, sizeof h);
}
#endif
static inline vf8 ld8f_f16(const uint16_t *p) {
  return (vf8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline void st8_f16(uint16_t *p, vf8 f, int nt) {
  __m128i h = _mm256_cvtps_ph((__m256)f, _MM_FROUND_TO_NEAREST_INT);
  if (nt) _mm_stream_si128((__m128i *)p, h);
  else _mm_storeu_si128((__m128i *)p, h);
}
static inline void stream_fence(void) { _mm_sfence(); }
#else
static inline void st8_f32(float *p, vf8 f, int nt) {
  (void)nt;
  memcpy(p, &f, sizeof f);
}
static inline void st8_bf16(uint16_t *p, vf8 f, int nt) {
  (void)nt;
  vh8 h = bf16_round8(f);
  memcpy(p, &h, sizeof h);
}
static inline vf8 ld8f_f16(const uint16_t *p) {
  vf8 f;
  for (int j = 0; j < 8; j++) f[j] = sbn_f16_to_f32(p[j]);
  return f;
}
static inline void st8_f16(uint16_t *p, vf8 f, int nt) {
  (void)nt;
  for (int j = 0; j < 8; j++) p[j] = sbn_f32_to_f16(f[j]);
}
static inline void stream_fence(void) {}
#endif
static inline float ld1f_bf16(const uint16_t *p) { return sbn_bf16_to_f32(*p); }
static inline float ld1f_f16(const uint16_t *p) { return sbn_f16_to_f32(*p); }
static inline void st1f_bf16(uint16_t *p, float v) { *p = sbn_f32_to_bf16(v); }
static inline void st1f_f16(uint16_t *p, float v) { *p = sbn_f32_to_f16(v); }

/* Software prefetch distance of the streaming loops. The hardware
 * prefetchers run too little ahead of a loop that converts every value to
 * float64: measured on one core, a float32 read with that arithmetic went
 * from 7.3 to 12.8 GB/s (a plain float sum: 13.8) with a prefetch 4 KiB
 * ahead; 1 KiB ahead gave 10.4. */
enum { SBN_PF_BYTES = 4096 };
static inline void pf_read(const void *p) { __builtin_prefetch(p, 0, 3); }
/* Into L2 only (prefetcht1): for lines wanted a whole work unit later. */
static inline void pf_read_l2(const void *p) { __builtin_prefetch(p, 0, 1); }

/* Fixed pairwise sum of 16 lanes. */
static inline double sum16(double *l) {
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; j++) l[j] += l[j + w];
  return l[0];
}

/* s + d and x - k on the multiply-add units where the build has them:
 * fma(d, 1, s) and fma(x, 1, -k) round once, exactly as the addition and
 * the subtraction do, so every finite result has the generic build's bits
 * (a NaN stays a NaN; of two NaNs of different payloads, either may be the
 * one that survives). Why: AMD's Zen cores issue floating-point additions
 * to two of their four pipes, multiplies and multiply-adds to the other
 * two. Which loops gain is measured loop by loop: below the AVX-512 levels
 * only the channels-first float32 reductions use it now (kern_body.inc,
 * CF_ADD); the 16-bit ones and the rows layout's ran faster plain.
 * SBN_CPU_PLAIN_ADD builds them as plain additions, to measure against. */
#if defined(SBN_VEC_F16C) && !defined(SBN_CPU_PLAIN_ADD)
static inline vd4 vd4_addm(vd4 s, vd4 d) { return (vd4)_mm256_fmadd_pd((__m256d)d, _mm256_set1_pd(1.0), (__m256d)s); }
static inline vd4 vd4_subm(vd4 x, vd4 k) { return (vd4)_mm256_fmsub_pd((__m256d)x, _mm256_set1_pd(1.0), (__m256d)k); }
#else
static inline vd4 vd4_addm(vd4 s, vd4 d) { return s + d; }
static inline vd4 vd4_subm(vd4 x, vd4 k) { return x - k; }
#endif

/* a * b + c rounded once, lane by lane, in every build: the multiply-add
 * instruction where the build has one, fma() elsewhere (the C library's:
 * exact, slow where the CPU has no such instruction). */
#ifdef SBN_VEC_F16C
static inline vd4 vd4_fma(vd4 a, vd4 b, vd4 c) { return (vd4)_mm256_fmadd_pd((__m256d)a, (__m256d)b, (__m256d)c); }
#else
static inline vd4 vd4_fma(vd4 a, vd4 b, vd4 c) {
  return (vd4){__builtin_fma(a[0], b[0], c[0]), __builtin_fma(a[1], b[1], c[1]), __builtin_fma(a[2], b[2], c[2]),
               __builtin_fma(a[3], b[3], c[3])};
}
#endif

/* Two sums folded side by side: out[0] = ((s0 + s1) + (s2 + s3)) + ts,
 * out[1] the same of q and tq, each then added to what out holds (add != 0)
 * or stored. The same additions in the same order in every build; with AVX
 * one horizontal add folds both. Small channels-first maps fold each
 * image's piece of a channel (49 values at 7x7): there the folds and the
 * sums' update took about a third of the statistics' samples (perf,
 * AMD EPYC), and folding both at once made the statistics and backward
 * reduce of 8x512x7x7, 8x2048x7x7 and 8x256x14x14 (float32, bfloat16,
 * 2 threads, out of cache, 9 alternating runs) 0.95-1.31x as fast, 1.08x
 * in geometric mean. */
#ifdef SBN_VEC_F16C
static inline void vd4_fold2(vd4 s, vd4 q, double ts, double tq, double *out, int add) {
  const __m256d h = _mm256_hadd_pd((__m256d)s, (__m256d)q); /* s0+s1, q0+q1, s2+s3, q2+q3 */
  __m128d f = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1));
  f = _mm_add_pd(f, _mm_set_pd(tq, ts));
  if (add) f = _mm_add_pd(_mm_loadu_pd(out), f);
  _mm_storeu_pd(out, f);
}
#else
static inline void vd4_fold2(vd4 s, vd4 q, double ts, double tq, double *out, int add) {
  const double a = ((s[0] + s[1]) + (s[2] + s[3])) + ts, b = ((q[0] + q[1]) + (q[2] + q[3])) + tq;
  if (add) out[0] += a, out[1] += b;
  else out[0] = a, out[1] = b;
}
#endif

/* ---- 8 x float64 (AVX-512 build only): the reductions' wide loads ----
 * Half h (0, 1) of 16 values as one vector of 8 doubles, lanes laid out as
 * the 4-double path's four accumulators pair up: float32 and float16 give
 * positions 8h..8h+7, i.e. [vector 2h | vector 2h+1] of the L8 pairs;
 * bfloat16 gives the even (h = 0) or odd (h = 1) positions of all 16, i.e.
 * [vector h | vector h+2] (ld8_bf16: even, odd of each 8). So each lane
 * does the 4-double path's additions for the same value, in order. */
#ifdef SBN_VEC_AVX512
typedef double vd8 __attribute__((vector_size(64)));
static inline vd8 vd8_set1(double a) { return (vd8)_mm512_set1_pd(a); }
static inline vd4 vd8_lo(vd8 v) { return (vd4)_mm512_castpd512_pd256((__m512d)v); }
static inline vd4 vd8_hi(vd8 v) { return (vd4)_mm512_extractf64x4_pd((__m512d)v, 1); }
/* v + [a | 0] on the low half only (masked: the high lanes keep their bits). */
static inline vd8 vd8_addlo(vd8 v, vd4 a) {
  return (vd8)_mm512_mask_add_pd((__m512d)v, 0x0f, (__m512d)v, _mm512_zextpd256_pd512((__m256d)a));
}
/* a * b + c rounded once, and the same on the low half only ([a | 0],
 * [b | 0]: the high lanes of v keep their bits). */
static inline vd8 vd8_fma(vd8 a, vd8 b, vd8 c) { return (vd8)_mm512_fmadd_pd((__m512d)a, (__m512d)b, (__m512d)c); }
static inline vd8 vd8_fmalo(vd8 v, vd4 a, vd4 b) {
  return (vd8)_mm512_mask3_fmadd_pd(_mm512_zextpd256_pd512((__m256d)a), _mm512_zextpd256_pd512((__m256d)b),
                                    (__m512d)v, 0x0f);
}
#ifndef SBN_CPU_PLAIN_ADD
static inline vd8 vd8_addm(vd8 s, vd8 d) { return (vd8)_mm512_fmadd_pd((__m512d)d, _mm512_set1_pd(1.0), (__m512d)s); }
static inline vd8 vd8_subm(vd8 x, vd8 k) { return (vd8)_mm512_fmsub_pd((__m512d)x, _mm512_set1_pd(1.0), (__m512d)k); }
#else
static inline vd8 vd8_addm(vd8 s, vd8 d) { return s + d; }
static inline vd8 vd8_subm(vd8 x, vd8 k) { return x - k; }
#endif
static inline vd8 ldw_f32(const float *p, int h) { return (vd8)_mm512_cvtps_pd(_mm256_loadu_ps(p + 8 * h)); }
static inline vd8 ldw_f16(const uint16_t *p, int h) {
  return (vd8)_mm512_cvtps_pd(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8 * h))));
}
static inline vd8 ldw_bf16(const uint16_t *p, int h) {
  const __m256i u = _mm256_loadu_si256((const __m256i *)p);
  const __m256i f = h ? _mm256_and_si256(u, _mm256_set1_epi32((int)0xffff0000u)) : _mm256_slli_epi32(u, 16);
  return (vd8)_mm512_cvtps_pd(_mm256_castsi256_ps(f));
}

/* ---- 16 x float32 (AVX-512 builds): the 16-bit types' elementwise passes ----
 * One zmm of 16 floats a step, natural order: float16 widens and narrows
 * with vcvtph2ps / vcvtps2ph, bfloat16 widens by a zero extension and a
 * shift and (SBN_VEC_BF16, the avx512bf16 level) narrows with
 * vcvtneps2bf16, which rounds to nearest even and quiets a NaN exactly as
 * sbn_f32_to_bf16 (bit 6 set, the payload's top bits kept; checked on every
 * float32) but flushes subnormal inputs to a signed zero: lanes with a zero
 * exponent field (vfpclassps) are redone by the integer rounding, a branch
 * that ordinary data does not take. Stores may stream (nt, 32-byte aligned). */
typedef float vf16 __attribute__((vector_size(64)));
static inline vf16 vf16_set1(float a) { return (vf16)_mm512_set1_ps(a); }
static inline vf16 vf16_ld(const float *p) { return (vf16)_mm512_loadu_ps(p); }
static inline void st16h(uint16_t *p, __m256i h, int nt) {
  if (nt) _mm256_stream_si256((__m256i *)p, h);
  else _mm256_storeu_si256((__m256i *)p, h);
}
static inline vf16 ldz_f16(const uint16_t *p) {
  return (vf16)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline void stz_f16(uint16_t *p, vf16 f, int nt) {
  st16h(p, _mm512_cvtps_ph((__m512)f, _MM_FROUND_TO_NEAREST_INT), nt);
}
#ifdef SBN_VEC_BF16
static inline vf16 ldz_bf16(const uint16_t *p) {
  return (vf16)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16);
}
static inline void stz_bf16(uint16_t *p, vf16 f, int nt) {
  __m256i h = (__m256i)_mm512_cvtneps_pbh((__m512)f);
  const __mmask16 sub = _mm512_fpclass_ps_mask((__m512)f, 0x20); /* subnormal lanes */
  if (__builtin_expect(sub != 0, 0)) {
    const __m512i u = (__m512i)f, one = _mm512_set1_epi32(1);
    const __m512i r = _mm512_add_epi32(
        u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
    h = _mm512_mask_cvtepi32_epi16(h, sub, _mm512_srli_epi32(r, 16));
  }
  st16h(p, h, nt);
}
#endif
#endif

#endif
