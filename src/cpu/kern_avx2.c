/* The kernels for CPUs with AVX2, FMA and F16C: the same source as
 * kern_generic.c compiled for that target (GCC target pragma), chosen at run
 * time by bn_kernels.c, so the library still runs on older CPUs. The
 * compiler fuses no product into an addition (-ffp-contract=off in
 * mk/cpu.mk); the source fuses some explicitly (vec.h vd4_fma: fma() in the
 * generic build) and adds on the multiply-add unit as fma(x, 1, y), which
 * rounds as the addition: the results equal the generic path's bit for bit. */
#if defined(__x86_64__) || defined(__i386__)
#if !defined(__clang__) /* clang has no target pragma: mk/cpu.mk passes -mavx2 -mfma -mf16c */
#pragma GCC target("avx2,fma,f16c")
#endif
#define SBN_VEC_F16C 1
#include <string.h>

#include "cpu_kern.h"
#include "vec.h"

#define ISA avx2
#define TABLE sbn_ktab_avx2
#include "kern_instances.inc"
#else
/* Not x86: the generic kernels stand in (never selected: no AVX2). */
#include "cpu_kern.h"
const sbn_ktable sbn_ktab_avx2[SBN_KTAB_DTYPES];
#endif
