/* The AVX2 level's bfloat16 narrowing (vec.h st16_bf16: the integer
 * rounding of even and odd positions merged by a word blend, and the
 * NaN-preserving rounding when one of the 16 is a NaN; st8_bf16: 8 values,
 * packed) against the
 * definition (half.h sbn_f32_to_bf16) for every float32 bit pattern, bit
 * for bit: rounding, ties, overflow to infinity, subnormals, and NaNs with
 * their sign and payload, alone and beside ordinary values in one store.
 * Skipped where the CPU lacks AVX2. */
#include <stdio.h>
#include <string.h>

#include "../../src/cpu/bn_kernels.h"
#include "../testutil.h"

#if defined(__x86_64__) || defined(__i386__)
/* Only the function below runs AVX2 code, after the CPU check. */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#define SBN_VEC_F16C 1
#include "../../src/cpu/vec.h"

/* Differing values over all patterns: the even positions of each store
 * take patterns b .. b + 7, the odd ones b + 8 .. b + 15. */
static double sweep(void) {
  double bad = 0;
  for (uint64_t b = 0; b < (1ull << 32); b += 16) {
    uint32_t ev[8], od[8];
    uint16_t got[16], got8[8];
    for (int j = 0; j < 8; j++) ev[j] = (uint32_t)(b + (uint64_t)j), od[j] = (uint32_t)(b + 8 + (uint64_t)j);
    vf8 fe, fo;
    memcpy(&fe, ev, sizeof fe);
    memcpy(&fo, od, sizeof fo);
    st16_bf16(got, fe, fo, 0);
    st8_bf16(got8, fe, 0);
    for (int j = 0; j < 8; j++) {
      bad += got8[j] != sbn_f32_to_bf16(sbn_bits_f32(ev[j]));
      bad += got[2 * j] != sbn_f32_to_bf16(sbn_bits_f32(ev[j]));
      bad += got[2 * j + 1] != sbn_f32_to_bf16(sbn_bits_f32(od[j]));
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
  if (!sbn_cpu_has_avx2()) {
    printf("no AVX2 on this CPU: skipped\n");
    return 0;
  }
  const double bad = sweep();
  printf("AVX2 bfloat16 stores of 16 and of 8 values, all 2^32 float32 patterns:\n");
  const int r = check("  values differing from sbn_f32_to_bf16", bad, 0);
  printf(r ? "\nBF16 NARROWING CHECK FAILED\n" : "\nbfloat16 narrowing bit check passed\n");
  return r;
#else
  printf("not x86: skipped\n");
  return 0;
#endif
}
