/* The kernels for CPUs with AVX-512 F/BW/VL/DQ and AVX512_BF16: kern_avx512.c's
 * bodies with the 16-bit elementwise passes 16 values a zmm and bfloat16
 * narrowed by vcvtneps2bf16 (SBN_VEC_BF16, vec.h: its subnormal lanes are
 * redone by the integer rounding, so the bits equal every other level's).
 * A level of its own in the table (bn_kernels.c), chosen only where CPUID
 * reports AVX512_BF16. */
#if defined(__x86_64__) || defined(__i386__)
#if defined(SBN_AVX512_EMU) /* tests only: emulated on AVX2 (avx512_emu.h) */
#pragma GCC target("avx2,fma,f16c")
#elif !defined(__clang__) /* clang: mk/cpu.mk passes the flags */
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#endif
#define SBN_VEC_F16C 1
#define SBN_VEC_AVX512 1
#define SBN_VEC_BF16 1
#include <string.h>

#include "cpu_kern.h"
#include "vec.h"

#define ISA avx512bf16
#define TABLE sbn_ktab_avx512bf16
#include "kern_instances.inc"
#else
/* Not x86: never selected (no AVX512_BF16). */
#include "cpu_kern.h"
const sbn_ktable sbn_ktab_avx512bf16[SBN_KTAB_DTYPES];
#endif
