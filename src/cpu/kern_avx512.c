/* The kernels for CPUs with AVX-512 (F, BW, VL, DQ): kern_avx2.c's bodies
 * with the reductions' hot loops 8 doubles a vector (SBN_VEC_AVX512: vec.h,
 * kern_body.inc, kern_rows.inc), the widening to float64 being their bound.
 * Each lane does the 4-double path's additions in its order, so the bits
 * equal the other instruction sets'. The elementwise passes are the AVX2
 * bodies, re-encoded, but for float16's, 16 values a zmm (vcvtph2ps /
 * vcvtps2ph); bfloat16's go so only with AVX512_BF16 (kern_avx512bf16.c),
 * here they keep the even/odd path (narrowing 16 floats in natural order
 * as integers needs a vpmovdw shuffle; not tried). */
#if defined(__x86_64__) || defined(__i386__)
#if defined(SBN_AVX512_EMU) /* tests only: emulated on AVX2 (avx512_emu.h) */
#pragma GCC target("avx2,fma,f16c")
#elif !defined(__clang__) /* clang: mk/cpu.mk passes the flags */
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")
#endif
#define SBN_VEC_F16C 1
#define SBN_VEC_AVX512 1
#include <string.h>

#include "cpu_kern.h"
#include "vec.h"

#define ISA avx512
#define TABLE sbn_ktab_avx512
#include "kern_instances.inc"
#else
/* Not x86: never selected (no AVX-512). */
#include "cpu_kern.h"
const sbn_ktable sbn_ktab_avx512[SBN_KTAB_DTYPES];
#endif
