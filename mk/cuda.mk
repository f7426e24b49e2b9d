# CUDA: the layer on NVIDIA GPUs, in its own library libsyncbn_cuda (.a and
# a versioned .so linking libcudart), so that libsyncbn.so never depends on
# libcudart; libsyncbn finds the CUDA device table at run time
# (src/core/device.c, ARCHITECTURE.md "Devices").
#
# nvcc is found on the PATH or as /usr/local/cuda/bin/nvcc; `make NVCC=`
# builds without CUDA (every CUDA call then answers SBN_STATUS_NOT_BUILT).
# Where nvcc exists the CUDA sources are compiled by every `make`, for
# sm_80 and sm_90 plus compute_90 PTX, so compile errors show without a GPU.
#
# Other fragments append to:
#   CUDA_SRCS   library sources of the CUDA part (.cu by nvcc, .c by $(CC)
#               with the CUDA headers)
#   CUDA_TESTS  test programs tests/cuda/<name>.cu, run by make check; each
#               prints a SKIP line and exits 0 when there is no GPU
.DEFAULT_GOAL := all

NVCC ?= $(shell command -v nvcc 2>/dev/null || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; })
# The sanitizer and fuzzing builds (clang, instrumented) leave CUDA out.
ifeq ($(SBN_SANITIZE),1)
override NVCC :=
endif

# Every .cu file of src/cuda is part of the library. The four passes'
# kernels (bn_kernels_cuda.h) come in their own files: until they exist the
# CUDA sources are compiled (checked) but no CUDA library or test is linked,
# and CUDA requests answer SBN_STATUS_NOT_BUILT.
CUDA_SRCS += src/cuda/device_cuda.c $(wildcard src/cuda/*.cu)
CUDA_KERNELS := $(filter-out src/cuda/bn_finish.cu,$(wildcard src/cuda/*.cu))
CUDA_TESTS += test_cuda_kernels test_cuda_plan test_cuda_layer test_cuda_graph test_cuda_equivalence test_cuda_misuse test_cuda_records

# Always: a program linked without libsyncbn_cuda gets SBN_STATUS_NOT_BUILT
# for every CUDA request, and CPU layers refuse streams.
TESTS += cuda/test_cuda_stub

ifneq ($(strip $(NVCC)),)
CUDA_HOME := $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/targets/x86_64-linux/lib) $(CUDA_HOME)/lib64)
CUDA_ARCH := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
NVCC_FLAGS ?= -O3
SBN_NVCC = $(NVCC) -std=c++17 $(NVCC_FLAGS) $(CUDA_ARCH) -Iinclude -Xcompiler -fPIC,-fvisibility=hidden,-Wall
CUDA_LDLIBS := -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcudart -lstdc++
CUDA_STATE := cuda $(NVCC) $(CUDA_ARCH) $(NVCC_FLAGS) $(CUDA_KERNELS)
else
CUDA_STATE := none
endif
# device.o and the CUDA objects depend on what was detected.
CUDA_STAMP := $(BUILD)/cuda.config
$(shell mkdir -p $(BUILD) && [ "$$(cat $(CUDA_STAMP) 2>/dev/null)" = "$(CUDA_STATE)" ] || echo "$(CUDA_STATE)" > $(CUDA_STAMP))
$(BUILD)/src/core/device.o: $(CUDA_STAMP)

ifneq ($(strip $(NVCC)),)

CUDA_C_SRCS := $(filter %.c,$(CUDA_SRCS))
CUDA_CU_SRCS := $(filter %.cu,$(CUDA_SRCS))
CUDA_OBJS := $(CUDA_C_SRCS:%.c=$(BUILD)/%.o) $(CUDA_CU_SRCS:%.cu=$(BUILD)/%.cu.o)
# The shared library's C sources call libsyncbn through its host table
# (backend_client.h, as libsyncbn_mpi.so does); the kernels call nothing.
CUDA_SO_OBJS := $(CUDA_C_SRCS:%.c=$(BUILD)/shared/%.o) $(CUDA_CU_SRCS:%.cu=$(BUILD)/%.cu.o)

$(CUDA_C_SRCS:%.c=$(BUILD)/%.o) $(CUDA_C_SRCS:%.c=$(BUILD)/shared/%.o): SBN_CFLAGS += -I$(CUDA_HOME)/include
# The per-channel kernels round as the CPU table does: no fused multiply-add.
$(BUILD)/src/cuda/bn_finish.cu.o: NVCC_FLAGS += -fmad=false

$(BUILD)/%.cu.o: %.cu $(CUDA_STAMP)
	@mkdir -p $(dir $@)
	$(SBN_NVCC) -MMD -MP -c $< -o $@

$(BUILD)/tests/cuda/%.cu.o: tests/cuda/%.cu $(CUDA_STAMP)
	@mkdir -p $(dir $@)
	$(SBN_NVCC) -Itests -Itests/cuda -MMD -MP -c $< -o $@

ifeq ($(strip $(CUDA_KERNELS)),)
all: $(CUDA_OBJS) $(CUDA_TESTS:%=$(BUILD)/tests/cuda/%.cu.o)
else
$(BUILD)/libsyncbn_cuda.a: $(CUDA_OBJS)
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/libsyncbn_cuda.so.$(SBN_VERSION): $(CUDA_SO_OBJS) $(BUILD)/libsyncbn.so
	$(SBN_LD) -shared -Wl,-z,defs -Wl,-soname,libsyncbn_cuda.so.$(SBN_MAJOR) -o $@ $(CUDA_SO_OBJS) \
	    -L$(BUILD) -lsyncbn $(LDLIBS) $(CUDA_LDLIBS) -lm -pthread
CUDA_SO_NAMES := libsyncbn_cuda
$(BUILD)/src/core/device.o: SBN_CFLAGS += -DSBN_WITH_CUDA=1
lib: $(BUILD)/libsyncbn_cuda.a $(BUILD)/libsyncbn_cuda.so $(BUILD)/libsyncbn_cuda.so.$(SBN_MAJOR)

# Programs that use the GPU link the CUDA archive before libsyncbn's; -u
# pulls in the device table that libsyncbn references weakly.
SBN_CUDA_LINK = -Wl,-u,sbn_internal_cuda_device_v3 $(BUILD)/libsyncbn_cuda.a $(SBN_STATIC_LINK) $(CUDA_LDLIBS)
CUDA_TEST_SUPPORT := $(BUILD)/tests/testutil.o $(BUILD)/tests/bn_case.o $(BUILD)/tests/records_case.o
$(BUILD)/tests/cuda/%: $(BUILD)/tests/cuda/%.cu.o $(CUDA_TEST_SUPPORT) $(BUILD)/libsyncbn_cuda.a $(SBN_STATIC)
	$(SBN_LD) -o $@ $< $(CUDA_TEST_SUPPORT) $(SBN_CUDA_LINK)
# The host-side checks that run without a GPU: the table is found and
# answers, and a missing or wrong device is a clear error (not a crash).
$(BUILD)/tests/cuda/test_cuda_host: tests/cuda/test_cuda_host.c $(CUDA_TEST_SUPPORT) $(BUILD)/libsyncbn_cuda.a $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -I$(CUDA_HOME)/include -Itests -o $@ $< $(CUDA_TEST_SUPPORT) $(SBN_CUDA_LINK)
# Through the shared libraries: libsyncbn.so opens libsyncbn_cuda.so.MAJOR
# from its own directory; a program that only uses the CPU never loads
# libcudart.
$(BUILD)/tests/cuda/test_cuda_shared: tests/cuda/test_cuda_shared.c $(BUILD)/libsyncbn.so $(BUILD)/libsyncbn_cuda.so
	@mkdir -p $(dir $@)
	$(SBN_LD) -o $@ $< -L$(BUILD) -lsyncbn -Wl,-rpath,$(abspath $(BUILD))
CUDA_TEST_BINS := $(CUDA_TESTS:%=$(BUILD)/tests/cuda/%) $(BUILD)/tests/cuda/test_cuda_host \
                  $(BUILD)/tests/cuda/test_cuda_shared
all: $(CUDA_TEST_BINS)
EXTRA_TEST_CMDS += $(CUDA_TESTS:%=cmd:$(BUILD)/tests/cuda/%) cmd:$(BUILD)/tests/cuda/test_cuda_host \
                   'cmd:$(BUILD)/tests/cuda/test_cuda_shared cpu' 'cmd:$(BUILD)/tests/cuda/test_cuda_shared cuda'
ifneq ($(SBN_SANITIZE),1)
EXTRA_TEST_CMDS += 'cmd:scripts/check_exports.sh --allow sbn_internal_cuda_device_v3 $(BUILD)/libsyncbn_cuda.so'
endif
endif
endif

# For scripts/gpu-check.sh's benchmark variants: the kernel sources and nvcc.
.PHONY: print-cuda-kernels print-nvcc
print-cuda-kernels:
	@printf '%s\n' $(CUDA_KERNELS)
print-nvcc:
	@printf '%s\n' '$(NVCC)'
