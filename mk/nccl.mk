# NCCL backend (syncbn_nccl.h): src/comm/nccl.c and its kernels
# (src/cuda/nccl/, apart from src/cuda/*.cu, which are the CUDA layer's) in
# their own library, libsyncbn_nccl (.a and .so, the .so links libsyncbn.so,
# libnccl and libcudart), so that programs which do not use it never load
# libnccl. Built with NCCL when nvcc, nccl.h and
# libnccl are found (CUDA_HOME, NCCL_HOME; `make NVCC=` builds without);
# otherwise nccl.c compiles to constructors answering SBN_STATUS_NOT_BUILT.
#
# Tests: test_xsum_fixed (the two-phase exact sum against exact_sum.c, CPU,
# also compiled as C++), test_nccl_stub (the constructors of a build without
# NCCL, on every machine), cuda/test_nccl (GPU; prints SKIP without one).
# The GPU benchmark (bench/gpu/) is built when the CUDA layer's library is.
.DEFAULT_GOAL := all

NVCC ?= $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
CUDA_HOME ?= $(if $(NVCC),$(patsubst %/bin/nvcc,%,$(NVCC)),/usr/local/cuda)
NCCL_HOME ?= $(CUDA_HOME)
NVCC_GENCODE ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
                -gencode arch=compute_90,code=compute_90
NCCL_INCDIR := $(patsubst %/nccl.h,%,$(firstword $(wildcard $(NCCL_HOME)/include/nccl.h /usr/include/nccl.h)))
# libnccl.so.2 is enough (the nvidia-nccl wheel ships no unversioned link).
NCCL_LIBDIR := $(patsubst %/libnccl.so.2,%,$(firstword $(wildcard $(NCCL_HOME)/lib/libnccl.so.2 $(NCCL_HOME)/lib64/libnccl.so.2 /usr/lib/x86_64-linux-gnu/libnccl.so.2)))
CUDART_LIBDIR := $(patsubst %/libcudart.so,%,$(firstword $(wildcard $(CUDA_HOME)/lib64/libcudart.so $(CUDA_HOME)/lib/libcudart.so)))
# The sanitizer builds (SBN_SANITIZE=1) leave NCCL out: the CUDA runtime and
# libnccl are not instrumented; the stub is what they check.
NCCL_ENABLED := $(if $(filter 1,$(SBN_SANITIZE)),,$(if $(and $(strip $(NVCC)),$(NCCL_INCDIR),$(NCCL_LIBDIR),$(CUDART_LIBDIR)),1,))

NCCL_A  := $(BUILD)/libsyncbn_nccl.a
NCCL_SO := $(BUILD)/libsyncbn_nccl.so
NCCL_CU_OBJ := $(BUILD)/nccl/nccl_xsum.o
# What a program linking libsyncbn_nccl.a needs after the archives.
nccl_comma := ,
NCCL_LINK = $(if $(NCCL_ENABLED),-L$(NCCL_LIBDIR) -L$(CUDART_LIBDIR) -Wl$(nccl_comma)-rpath$(nccl_comma)$(NCCL_LIBDIR) \
              -Wl$(nccl_comma)-rpath$(nccl_comma)$(CUDART_LIBDIR) -l:libnccl.so.2 -lcudart -lstdc++)
NCCL_CFLAGS = $(if $(NCCL_ENABLED),-DSBN_WITH_NCCL=1 -I$(NCCL_INCDIR) -I$(CUDA_HOME)/include)

NCCL_STATE := $(if $(NCCL_ENABLED),nccl $(NVCC) $(NCCL_INCDIR) $(NCCL_LIBDIR) $(NVCC_GENCODE),none)
NCCL_STAMP := $(BUILD)/nccl.config
$(shell mkdir -p $(BUILD) && [ "$$(cat $(NCCL_STAMP) 2>/dev/null)" = "$(NCCL_STATE)" ] || echo "$(NCCL_STATE)" > $(NCCL_STAMP))

NCCL_C_OBJS := $(BUILD)/src/comm/nccl.o $(BUILD)/src/comm/nccl_watch.o
NCCL_C_SHARED := $(BUILD)/shared/src/comm/nccl.o $(BUILD)/shared/src/comm/nccl_watch.o
$(NCCL_C_OBJS) $(NCCL_C_SHARED): SBN_CFLAGS += $(NCCL_CFLAGS)
$(NCCL_C_OBJS) $(NCCL_C_SHARED): $(NCCL_STAMP)
$(BUILD)/src/comm/nccl.o $(BUILD)/shared/src/comm/nccl.o: src/comm/nccl_watch.h

# The kernels: nvcc for sm_80 and sm_90 machine code plus PTX.
$(NCCL_CU_OBJ): src/cuda/nccl/nccl_xsum.cu src/cuda/nccl/nccl_xsum.h src/comm/exact_sum_fixed.h include/syncbn.h $(NCCL_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) -O3 -std=c++17 $(NVCC_GENCODE) -Xcompiler -fPIC,-fvisibility=hidden,-fno-exceptions -Iinclude -c $< -o $@

NCCL_OBJS := $(NCCL_C_OBJS) $(if $(NCCL_ENABLED),$(NCCL_CU_OBJ))
$(NCCL_A): $(NCCL_OBJS)
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/libsyncbn_nccl.so.$(SBN_VERSION): $(NCCL_C_SHARED) $(if $(NCCL_ENABLED),$(NCCL_CU_OBJ)) $(BUILD)/libsyncbn.so
	$(SBN_LD) -shared -Wl,-z,defs -Wl,-soname,libsyncbn_nccl.so.$(SBN_MAJOR) -o $@ \
	    $(NCCL_C_SHARED) $(if $(NCCL_ENABLED),$(NCCL_CU_OBJ)) -L$(BUILD) -lsyncbn $(LDLIBS) \
	    $(NCCL_LINK) -lm -pthread

# The same source without NCCL, for the not-built test on every machine.
$(BUILD)/nccl/nccl_stub.o: src/comm/nccl.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(SBN_CC) -c $< -o $@

TESTS += test_xsum_fixed test_nccl_stub
$(BUILD)/tests/test_nccl_stub: tests/test_nccl_stub.c $(BUILD)/nccl/nccl_stub.o $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -o $@ $< $(BUILD)/nccl/nccl_stub.o $(SBN_STATIC_LINK)

# The header in C++ (the CUDA kernels include it): the same test as C++,
# with the sanitizer flags of the build it links into (exact_sum.o).
CXX_FOUND := $(shell command -v $(CXX) 2>/dev/null)
ifneq ($(CXX_FOUND),)
XSUM_CXX_SAN := $(filter -fsanitize=% -fno-sanitize%,$(CFLAGS))
$(BUILD)/tests/test_xsum_fixed_cxx: tests/test_xsum_fixed.c src/comm/exact_sum_fixed.h $(BUILD)/src/comm/exact_sum.o
	@mkdir -p $(dir $@)
	$(CXX) -O2 -Wall -Wextra $(XSUM_CXX_SAN) -Iinclude -x c++ -c $< -o $@.o
	$(CXX) $(XSUM_CXX_SAN) -o $@ $@.o $(BUILD)/src/comm/exact_sum.o -lm
all: $(BUILD)/tests/test_xsum_fixed_cxx
EXTRA_TEST_CMDS += 'cmd:$(BUILD)/tests/test_xsum_fixed_cxx'
endif

all: $(NCCL_A) $(NCCL_SO) $(NCCL_SO).$(SBN_MAJOR)
lib: $(NCCL_A) $(NCCL_SO)
ifneq ($(SBN_SANITIZE),1)
EXTRA_TEST_CMDS += 'cmd:scripts/check_exports.sh $(NCCL_SO) include/syncbn_nccl.h' \
                   'cmd:scripts/check_prefix.sh $(NCCL_A)'
endif

# GPU programs: the NCCL test, and the benchmark once the CUDA layer is
# built. They run on a GPU machine (scripts/gpu-check.sh); in `make check`
# the test prints SKIP without a GPU.
ifneq ($(NCCL_ENABLED),)
GPU_NCCL_TESTS := $(BUILD)/tests/cuda/test_nccl
$(BUILD)/tests/cuda/test_nccl: tests/cuda/test_nccl.c $(NCCL_A) $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -I$(CUDA_HOME)/include -Isrc -o $@ $< $(NCCL_A) $(SBN_STATIC_LINK) $(NCCL_LINK)
all: $(GPU_NCCL_TESTS)
EXTRA_TEST_CMDS += 'cmd:$(BUILD)/tests/cuda/test_nccl'

# The benchmark needs the CUDA layer's library (mk/cuda.mk: SBN_CUDA_LINK,
# defined once the kernels exist).
ifneq ($(strip $(SBN_CUDA_LINK)),)
$(BUILD)/bench/syncbn-bench-gpu: bench/gpu/bench_gpu.c $(NCCL_A) $(BUILD)/libsyncbn_cuda.a $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -I$(CUDA_HOME)/include -o $@ $< $(NCCL_A) $(SBN_CUDA_LINK) $(NCCL_LINK)
all: $(BUILD)/bench/syncbn-bench-gpu
endif
endif

# The PyTorch side of the GPU benchmark checks its arguments on every
# machine (without CUDA it says so and exits 0).
EXTRA_TEST_CMDS += 'cmd:$(PYTHON) bench/gpu/torch_chain.py --iters 2 --only 32x2048 --dtype f32 --layout cf'

# make install: the backend library next to libsyncbn_mpi (its header is
# installed with the others).
.PHONY: install-nccl uninstall-nccl
install: install-nccl
uninstall: uninstall-nccl
install-nccl: $(NCCL_A) $(BUILD)/libsyncbn_nccl.so.$(SBN_VERSION)
	install -d $(DESTDIR)$(LIBDIR)
	install -m 644 $(NCCL_A) $(DESTDIR)$(LIBDIR)/
	install -m 755 $(BUILD)/libsyncbn_nccl.so.$(SBN_VERSION) $(DESTDIR)$(LIBDIR)/
	ln -sf libsyncbn_nccl.so.$(SBN_VERSION) $(DESTDIR)$(LIBDIR)/libsyncbn_nccl.so.$(SBN_MAJOR)
	ln -sf libsyncbn_nccl.so.$(SBN_MAJOR) $(DESTDIR)$(LIBDIR)/libsyncbn_nccl.so
uninstall-nccl:
	rm -f $(addprefix $(DESTDIR)$(LIBDIR)/libsyncbn_nccl,.a .so .so.$(SBN_MAJOR) .so.$(SBN_VERSION))

# The GPU tests' commands, one a line (scripts/gpu-check.sh runs them):
# every test command of the suite under tests/cuda/ (and the standalone
# kernel tests' build/cuda_kernels/), and the CPU check of the NCCL
# backend's arithmetic.
.PHONY: print-gpu-tests
print-gpu-tests:
	@printf '%s\n' $(EXTRA_TEST_CMDS) $(addprefix cmd:$(BUILD)/tests/,$(filter cuda/%,$(TESTS))) \
	    cmd:$(BUILD)/tests/test_xsum_fixed | sed -n 's|^cmd:||p' \
	    | grep -e '/tests/cuda/' -e '/cuda_kernels/' -e 'test_xsum_fixed$$' || true
