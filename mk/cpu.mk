# CPU kernels: vectorized (instruction set chosen at run time), a pool of
# helper threads within a rank, float32/bfloat16/float16 storage.
.DEFAULT_GOAL := all

LIB_SRCS := $(filter-out src/cpu/bn_kernels.c,$(LIB_SRCS)) \
            src/cpu/bn_kernels.c src/cpu/cpu_threads.c src/cpu/cpu_parallel.c \
            src/cpu/kern_generic.c src/cpu/kern_avx2.c src/cpu/kern_avx512.c src/cpu/kern_avx512bf16.c \
            src/cpu/device_cpu.c

# No fused multiply-add in the kernels, so every instruction set rounds
# identically.
# errno is never read: sqrt may then vectorize (device_cpu.c's per-channel math).
$(BUILD)/src/cpu/%.o: SBN_CFLAGS += -ffp-contract=off -fno-math-errno -Wno-psabi
# The AVX2 and AVX-512 kernels' targets (GCC also has them as pragmas in the
# files; clang needs the flags). Only these files: the rest of the library
# runs anywhere.
ifneq ($(filter x86_64 i%86,$(shell uname -m)),)
$(BUILD)/src/cpu/kern_avx2.o: SBN_CFLAGS += -mavx2 -mfma -mf16c
$(BUILD)/src/cpu/kern_avx512.o: SBN_CFLAGS += -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq
$(BUILD)/src/cpu/kern_avx512bf16.o: SBN_CFLAGS += -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq \
                                                -mavx512bf16
endif

TESTS += cpu/test_cpu_dtypes cpu/test_cpu_determinism cpu/test_cpu_noalloc cpu/test_cpu_elemt_bits \
         cpu/test_cpu_sums_bits cpu/test_cpu_bf16_narrow cpu/test_cpu_bf16_narrow_avx2
# The same tests on each instruction set by name (the default run above uses
# the best one; the determinism test also compares every set bit for bit).
CPU_ISAS := generic avx2 avx512 avx512bf16
EXTRA_TEST_CMDS += $(foreach i,$(CPU_ISAS),'cmd:SYNCBN_CPU_ISA=$(i) $(BUILD)/tests/cpu/test_cpu_dtypes' \
                     'cmd:SYNCBN_CPU_ISA=$(i) $(BUILD)/tests/cpu/test_cpu_determinism')
