/* The avx512bf16 level's narrowing (vec.h stz_bf16: vcvtneps2bf16 with its
 * subnormal lanes redone as integers) against the definition
 * (half.h sbn_f32_to_bf16) for every float32 bit pattern, bit for bit:
 * rounding, ties, overflow to infinity, subnormals (which the instruction
 * alone flushes to zero), and NaNs with their sign and payload (which the
 * elementwise test does not compare). Skipped where the CPU lacks
 * AVX512_BF16. */
#include <stdio.h>
#include <string.h>

#include "../../src/cpu/bn_kernels.h"
#include "../testutil.h"

#if defined(__x86_64__) || defined(__i386__)
/* Only the function below runs AVX-512 code, after the CPU check. In the
 * emulated build (SBN_AVX512_EMU, src/cpu/avx512_emu.h) it is AVX2 code and
 * checks the emulation's rounding. */
#if defined(SBN_AVX512_EMU) && defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#elif defined(SBN_AVX512_EMU)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#elif defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#endif
#define SBN_VEC_F16C 1
#define SBN_VEC_AVX512 1
#define SBN_VEC_BF16 1
#include "../../src/cpu/vec.h"

/* Differing values over all patterns; *sub counts the subnormal inputs. */
static double sweep(double *sub) {
  double bad = 0;
  *sub = 0;
  for (uint64_t b = 0; b < (1ull << 32); b += 16) {
    uint32_t in[16];
    uint16_t got[16];
    for (int j = 0; j < 16; j++) in[j] = (uint32_t)(b + (uint64_t)j);
    vf16 f;
    memcpy(&f, in, sizeof f);
    stz_bf16(got, f, 0);
    for (int j = 0; j < 16; j++) {
      bad += got[j] != sbn_f32_to_bf16(sbn_bits_f32(in[j]));
      *sub += (in[j] & 0x7f800000u) == 0 && (in[j] & 0x7fffffu) != 0;
    }
  }
  return bad;
}
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

int main(void) {
#if defined(__x86_64__) || defined(__i386__)
  if (!sbn_cpu_has_avx512bf16()) {
    printf("no AVX512_BF16 on this CPU: skipped\n");
    return 0;
  }
  double sub;
  const double bad = sweep(&sub);
  printf("vcvtneps2bf16 with the subnormal fix-up, all 2^32 float32 patterns (%.0f subnormal):\n", sub);
  const int r = check("  values differing from sbn_f32_to_bf16", bad, 0);
  printf(r ? "\nBF16 NARROWING CHECK FAILED\n" : "\nbfloat16 narrowing bit check passed\n");
  return r;
#else
  printf("not x86: skipped\n");
  return 0;
#endif
}
