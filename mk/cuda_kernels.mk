# The CUDA kernels' test checked on every machine: tests/cuda/test_cuda_kernels.cu
# compiled as C++ for the CPU, where its float64 reference, tolerances and
# aliasing checks run against the CPU kernels behind the CUDA kernels'
# contract (tests/cuda/cpu_shim.h). Needs neither a GPU nor nvcc; the GPU
# build of the same test is one of CUDA_TESTS.
.DEFAULT_GOAL := all
CXX ?= g++

CUDA_KTEST_CPU := $(BUILD)/tests/cuda/test_cuda_kernels_cpu
$(CUDA_KTEST_CPU): tests/cuda/test_cuda_kernels.cu tests/cuda/cpu_shim.h tests/cuda/kernel_ref.h \
                   src/cuda/bn_kernels_cuda.h $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 -Wall -Wextra -pthread -Iinclude -DSBN_KERNEL_TEST_ON_CPU $(CPPFLAGS) $(CFLAGS) \
	    -x c++ $< -x none -o $@ $(LDFLAGS) $(SBN_STATIC_LINK)
all: $(CUDA_KTEST_CPU)
EXTRA_TEST_CMDS += 'cmd:$(CUDA_KTEST_CPU) --quick'
