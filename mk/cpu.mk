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
ifeq ($(SBN_AVX512_EMU),1) # the AVX-512 levels on AVX2: see check-avx512-emu below
SBN_CFLAGS += -DSBN_AVX512_EMU
$(BUILD)/src/cpu/kern_avx512.o $(BUILD)/src/cpu/kern_avx512bf16.o: SBN_CFLAGS += -mavx2 -mfma -mf16c
else
$(BUILD)/src/cpu/kern_avx512.o: SBN_CFLAGS += -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq
$(BUILD)/src/cpu/kern_avx512bf16.o: SBN_CFLAGS += -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq \
                                                -mavx512bf16
endif
endif

TESTS += cpu/test_cpu_dtypes cpu/test_cpu_determinism cpu/test_cpu_noalloc cpu/test_cpu_elemt_bits \
         cpu/test_cpu_sums_bits cpu/test_cpu_bf16_narrow cpu/test_cpu_bf16_narrow_avx2
# The same tests on each instruction set by name (the default run above uses
# the best one; the determinism test also compares every set bit for bit).
CPU_ISAS := generic avx2 avx512 avx512bf16
EXTRA_TEST_CMDS += $(foreach i,$(CPU_ISAS),'cmd:SYNCBN_CPU_ISA=$(i) $(BUILD)/tests/cpu/test_cpu_dtypes' \
                     'cmd:SYNCBN_CPU_ISA=$(i) $(BUILD)/tests/cpu/test_cpu_determinism')

# The AVX-512 levels' source on a CPU without AVX-512: a build of its own
# (build-emu512/, SBN_AVX512_EMU=1) compiles kern_avx512.c and
# kern_avx512bf16.c for AVX2 with the few AVX-512 intrinsics they use
# written out in src/cpu/avx512_emu.h, and reports both levels as supported.
# The kernel tests then run at each level and compare all four bit for bit
# (test_cpu_determinism, test_cpu_sums_bits), so a change to the AVX-512
# paths is checked on every machine, an AVX2 one included; the narrowing
# test checks the emulated vcvtneps2bf16 over every float32 pattern. Only
# the arithmetic and the order of operations are checked so: the real
# instructions' speed, and that they exist, need an AVX-512 CPU (`make check`
# there runs the same tests natively).
EMU512_MAKE := $(MAKE) --no-print-directory BUILD=build-emu512 SBN_AVX512_EMU=1
EMU512_EACH := cpu/test_cpu_dtypes test_reference test_float64 test_empty # at each of the two levels
EMU512_ONCE := cpu/test_cpu_determinism cpu/test_cpu_sums_bits cpu/test_cpu_elemt_bits \
               cpu/test_cpu_bf16_narrow # these compare every level themselves
EMU512_CMDS := $(foreach i,avx512 avx512bf16,$(foreach t,$(EMU512_EACH),'cmd:SYNCBN_CPU_ISA=$(i) build-emu512/tests/$(t)')) \
               $(EMU512_ONCE)
.PHONY: check-avx512-emu
check-avx512-emu:
	+@$(EMU512_MAKE) $(EMU512_EACH:%=build-emu512/tests/%) $(EMU512_ONCE:%=build-emu512/tests/%)
	+@scripts/run_tests.sh build-emu512 $(EMU512_CMDS)
# In the normal suite (not inside a sanitizer build or this one), on x86.
ifneq ($(SBN_SANITIZE),1)
ifneq ($(SBN_AVX512_EMU),1)
ifneq ($(filter x86_64 i%86,$(shell uname -m)),)
EXTRA_TEST_CMDS += 'cmd:$(MAKE) --no-print-directory -j2 check-avx512-emu'
endif
endif
endif
