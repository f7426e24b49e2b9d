# The CUDA kernels' test checked on every machine: tests/cuda/test_cuda_kernels.cu
# compiled as C++ for the CPU, where its float64 reference, tolerances and
# aliasing checks run against the CPU kernels behind the CUDA kernels'
# contract (tests/cuda/cpu_shim.h). Needs neither a GPU nor nvcc; the GPU
# build of the same test is one of CUDA_TESTS.
.DEFAULT_GOAL := all

CUDA_KTEST_CPU := $(BUILD)/tests/cuda/test_cuda_kernels_cpu
$(CUDA_KTEST_CPU): tests/cuda/test_cuda_kernels.cu tests/cuda/cpu_shim.h tests/cuda/kernel_ref.h \
                   src/cuda/bn_kernels_cuda.h $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 -Wall -Wextra -pthread -Iinclude -DSBN_KERNEL_TEST_ON_CPU $(CPPFLAGS) $(CFLAGS) \
	    -x c++ $< -x none -o $@ $(LDFLAGS) $(SBN_STATIC_LINK)
all: $(CUDA_KTEST_CPU)
EXTRA_TEST_CMDS += 'cmd:$(CUDA_KTEST_CPU) --quick'

# nvcc for the rules below (the same search as mk/cuda.mk).
KNVCC := $(shell command -v nvcc 2>/dev/null || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; })
ifeq ($(SBN_SANITIZE),1)
KNVCC :=
endif
ifneq ($(strip $(KNVCC)),)
KCUDA_HOME := $(patsubst %/bin/nvcc,%,$(realpath $(KNVCC)))
KCUDA_LIBDIR := $(firstword $(wildcard $(KCUDA_HOME)/lib64 $(KCUDA_HOME)/targets/x86_64-linux/lib) $(KCUDA_HOME)/lib64)
KNV = $(KNVCC) -std=c++17 -O3 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
      -gencode arch=compute_90,code=compute_90 -Iinclude -Xcompiler -fPIC,-Wall
KDIR := $(BUILD)/cuda_kernels

# The kernels' microbenchmark (bench/gpu/bench_cuda_kernels.cu), built on
# demand with its own copy of the kernels: make cuda-kernels-bench, then
# build/cuda_kernels/bench_cuda_kernels on a GPU machine.
.PHONY: cuda-kernels-bench
cuda-kernels-bench: $(KDIR)/bench_cuda_kernels
$(KDIR)/bench_cuda_kernels: bench/gpu/bench_cuda_kernels.cu $(wildcard src/cuda/bn_*.cu) src/cuda/kern_common.cuh \
                            src/cuda/bn_kernels_cuda.h
	@mkdir -p $(dir $@)
	$(KNV) -o $@ $(filter %.cu,$^)

# Until the CUDA library build (mk/cuda.mk, which defines CUDA_STAMP) is
# there, compile the kernels and their two tests standalone, so that compile
# errors show on every machine with nvcc, and run the tests
# (test_cuda_kernels prints SKIP without a GPU; test_cuda_plan checks the
# kernels' indexing on the host).
ifndef CUDA_STAMP
KOBJS := $(patsubst src/cuda/%.cu,$(KDIR)/%.o,$(wildcard src/cuda/bn_*.cu))
$(KDIR)/%.o: src/cuda/%.cu
	@mkdir -p $(dir $@)
	$(KNV) -MMD -MP -c $< -o $@
$(KDIR)/%.cu.o: tests/cuda/%.cu
	@mkdir -p $(dir $@)
	$(KNV) -MMD -MP -c $< -o $@
-include $(KOBJS:.o=.d) $(KDIR)/test_cuda_kernels.cu.d $(KDIR)/test_cuda_plan.cu.d
$(KDIR)/test_cuda_kernels: $(KDIR)/test_cuda_kernels.cu.o $(KOBJS) $(SBN_STATIC)
	$(SBN_LD) -o $@ $< $(KOBJS) $(SBN_STATIC_LINK) -L$(KCUDA_LIBDIR) -Wl,-rpath,$(KCUDA_LIBDIR) -lcudart -lstdc++
$(KDIR)/test_cuda_plan: $(KDIR)/test_cuda_plan.cu.o
	$(SBN_LD) -o $@ $< -L$(KCUDA_LIBDIR) -Wl,-rpath,$(KCUDA_LIBDIR) -lcudart -lstdc++
all: $(KDIR)/test_cuda_kernels $(KDIR)/test_cuda_plan
EXTRA_TEST_CMDS += cmd:$(KDIR)/test_cuda_kernels cmd:$(KDIR)/test_cuda_plan
endif
endif
