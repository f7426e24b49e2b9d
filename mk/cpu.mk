# CPU kernels: vectorized (AVX2 chosen at run time), OpenMP threads
# within a rank, float32/bfloat16/float16 storage.
.DEFAULT_GOAL := all

LIB_SRCS := $(filter-out src/cpu/bn_kernels.c,$(LIB_SRCS)) \
            src/cpu/bn_kernels.c src/cpu/cpu_threads.c src/cpu/cpu_parallel.c \
            src/cpu/kern_generic.c src/cpu/kern_avx2.c
LIB_LDLIBS += -fopenmp

# OpenMP only where the parallel loop lives; no fused multiply-add in the
# kernels, so the AVX2 and the portable builds round identically.
$(BUILD)/src/cpu/%.o: SBN_CFLAGS += -ffp-contract=off -Wno-psabi
$(BUILD)/src/cpu/cpu_parallel.o: SBN_CFLAGS += -fopenmp
# The AVX2 kernels' target (GCC also has it as a pragma in the file; clang
# needs the flags). Only this file: the rest of the library runs anywhere.
ifneq ($(filter x86_64 i%86,$(shell uname -m)),)
$(BUILD)/src/cpu/kern_avx2.o: SBN_CFLAGS += -mavx2 -mfma -mf16c
endif

TESTS += cpu/test_cpu_dtypes cpu/test_cpu_determinism cpu/test_cpu_noalloc
