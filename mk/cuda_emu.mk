# The CUDA layer run on the CPU: src/cuda's kernels and device table, and the
# GPU tests of tests/cuda, compiled as C++/C against a CPU emulation of the
# CUDA runtime (tests/cuda_emu/cuda_emu.h: host memory, one fiber per CUDA
# thread, barriers and warp shuffles as real barriers, graphs recorded and
# replayed). Needs neither a GPU nor nvcc, so every machine runs the GPU
# tests' logic: indexing, numerics, the bits the kernels promise, the layer's
# per-channel kernels, misuse, graph capture, missing stream waits, the NCCL
# backend with 1 and 4 ranks (tests/cuda_emu/include/nccl.h: four emulated
# GPUs) and the GPU benchmark program (a smoke run on one shape). The tests
# also run under AddressSanitizer: no kernel reads or writes outside its
# buffers (what compute-sanitizer's memcheck checks on a GPU). What only a GPU shows
# (timing, concurrency between streams, the hardware's own arithmetic)
# still needs scripts/gpu-check.sh on one.
#
#   make check-cuda-emu        build and run them (also part of make test)
.DEFAULT_GOAL := all
DEPS_TEST += g++

# The sanitizer builds (mk/sanitize.mk) leave it out: it has its own
# AddressSanitizer variant here. It needs x86-64 (its fiber switch) and a
# C++ compiler with _Float16 (GCC 12, clang 15).
EMU_OK := $(if $(filter x86_64,$(shell uname -m)),$(shell echo '_Float16 h;' | $(CXX) -x c++ -fsyntax-only - 2>/dev/null && echo 1))
ifneq ($(SBN_SANITIZE),1)
ifeq ($(EMU_OK),1)
EMU_DIR := $(BUILD)/cuda_emu
EMU_CXX = $(CXX) -std=c++17 -g -ffp-contract=off -Wall -Wno-unused-function -Wno-unknown-pragmas \
          -Wno-sign-compare -pthread -Iinclude -Itests/cuda_emu/include $(CPPFLAGS)
EMU_HDRS := tests/cuda_emu/cuda_emu.h $(wildcard tests/cuda_emu/include/*.h) $(wildcard src/cuda/*.h src/cuda/*.cuh) \
            $(wildcard tests/cuda/*.h)
EMU_KERNELS := bn_reduce bn_elemt bn_finish
EMU_TESTS := test_cuda_kernels test_cuda_layer test_cuda_graph test_cuda_equivalence test_cuda_misuse test_cuda_records
EMU_SUPPORT := $(BUILD)/tests/testutil.o $(BUILD)/tests/bn_case.o $(BUILD)/tests/records_case.o
EMU_ASAN := -fsanitize=address -fno-omit-frame-pointer

# CUDA sources with their launches rewritten (the tests' too), then C++.
$(EMU_DIR)/gen/%.cpp: %.cu tests/cuda_emu/cu2cpp.sh
	@mkdir -p $(dir $@)
	tests/cuda_emu/cu2cpp.sh $< $@
.SECONDARY: $(EMU_KERNELS:%=$(EMU_DIR)/gen/src/cuda/%.cpp) $(EMU_TESTS:%=$(EMU_DIR)/gen/tests/cuda/%.cpp) \
            $(EMU_DIR)/gen/src/cuda/nccl/nccl_xsum.cpp

# One build per variant: $(1) its directory, $(2) its compiler flags.
define EMU_VARIANT
$(1)/%.o: $(EMU_DIR)/gen/src/cuda/%.cpp $(EMU_HDRS)
	@mkdir -p $$(dir $$@)
	$$(EMU_CXX) $(2) -Isrc/cuda -c $$< -o $$@
$(1)/device_cuda.o: src/cuda/device_cuda.c $(EMU_HDRS)
	@mkdir -p $$(dir $$@)
	$$(SBN_CC) $(2) -Itests/cuda_emu/include -c $$< -o $$@
$(1)/cuda_emu.o $(1)/emu_kernels.o: $(1)/%.o: tests/cuda_emu/%.cpp tests/cuda_emu/cuda_emu.h tests/cuda_emu/emu_internal.h
	@mkdir -p $$(dir $$@)
	$$(EMU_CXX) $(2) -c $$< -o $$@
$(1)/libsyncbn_cuda_emu.a: $(EMU_KERNELS:%=$(1)/%.o) $(1)/device_cuda.o $(1)/cuda_emu.o $(1)/emu_kernels.o
	@rm -f $$@
	ar rcs $$@ $$^
$(1)/nccl_xsum.o: $(EMU_DIR)/gen/src/cuda/nccl/nccl_xsum.cpp $(EMU_HDRS) src/cuda/nccl/nccl_xsum.h
	@mkdir -p $$(dir $$@)
	$$(EMU_CXX) $(2) -Isrc/cuda/nccl -c $$< -o $$@
$(1)/nccl.o: src/comm/nccl.c src/comm/nccl_watch.h $(EMU_HDRS) tests/cuda_emu/include/nccl.h
	@mkdir -p $$(dir $$@)
	$$(SBN_CC) $(2) -DSBN_WITH_NCCL=1 -Itests/cuda_emu/include -c $$< -o $$@
$(1)/nccl_watch.o: src/comm/nccl_watch.c src/comm/nccl_watch.h tests/cuda_emu/include/nccl.h
	@mkdir -p $$(dir $$@)
	$$(SBN_CC) $(2) -DSBN_WITH_NCCL=1 -Itests/cuda_emu/include -c $$< -o $$@
$(1)/nccl_emu.o: tests/cuda_emu/nccl_emu.cpp tests/cuda_emu/include/nccl.h tests/cuda_emu/cuda_emu.h
	@mkdir -p $$(dir $$@)
	$$(EMU_CXX) $(2) -c $$< -o $$@
$(1)/libsyncbn_nccl_emu.a: $(1)/nccl.o $(1)/nccl_watch.o $(1)/nccl_xsum.o $(1)/nccl_emu.o
	@rm -f $$@
	ar rcs $$@ $$^
$(1)/test_nccl: tests/cuda/test_nccl.c $(1)/libsyncbn_nccl_emu.a $(1)/libsyncbn_cuda_emu.a $(SBN_STATIC) $(EMU_HDRS)
	$$(SBN_CC) $(2) -Itests/cuda_emu/include -Isrc -c $$< -o $$@.o
	$$(EMU_CXX) $(2) -o $$@ $$@.o $(1)/libsyncbn_nccl_emu.a $(1)/libsyncbn_cuda_emu.a $$(SBN_STATIC_LINK)
$(1)/%: $(EMU_DIR)/gen/tests/cuda/%.cpp $(1)/libsyncbn_cuda_emu.a $(EMU_SUPPORT) $(SBN_STATIC) $(EMU_HDRS)
	$$(EMU_CXX) $(2) -Itests -Itests/cuda $$< -o $$@ $(EMU_SUPPORT) \
	    -Wl,-u,sbn_internal_cuda_device_v3 $(1)/libsyncbn_cuda_emu.a $$(SBN_STATIC_LINK)
endef
$(eval $(call EMU_VARIANT,$(EMU_DIR)/plain,-O2))
$(eval $(call EMU_VARIANT,$(EMU_DIR)/asan,-O1 $(EMU_ASAN)))
# The kernels' measuring knobs that are off by default (src/cuda/bn_elemt.cu)
# are built and tested too, so that their code keeps working until a GPU
# measures it.
EMU_KNOBS := -DSBN_CUDA_SEPARATE_FINISH -DSBN_CUDA_FINISH_PREFETCH
$(eval $(call EMU_VARIANT,$(EMU_DIR)/knobs,-O2 $(EMU_KNOBS)))

# The GPU benchmark program, run once on a small shape as a smoke test (its
# times measure the emulation, not a GPU).
$(EMU_DIR)/plain/syncbn-bench-gpu: bench/gpu/bench_gpu.c $(EMU_DIR)/plain/libsyncbn_nccl_emu.a \
                                   $(EMU_DIR)/plain/libsyncbn_cuda_emu.a $(SBN_STATIC) $(EMU_HDRS)
	$(SBN_CC) -Itests/cuda_emu/include -c $< -o $@.o
	$(EMU_CXX) -o $@ $@.o $(EMU_DIR)/plain/libsyncbn_nccl_emu.a -Wl,-u,sbn_internal_cuda_device_v3 \
	    $(EMU_DIR)/plain/libsyncbn_cuda_emu.a $(SBN_STATIC_LINK)

# Under AddressSanitizer (and LeakSanitizer) too, but the long layer test.
EMU_ASAN_TESTS := test_cuda_kernels test_cuda_graph test_cuda_equivalence test_cuda_misuse test_cuda_records test_nccl
EMU_KNOB_TESTS := test_cuda_kernels test_cuda_layer test_cuda_graph test_cuda_equivalence
EMU_BINS := $(EMU_TESTS:%=$(EMU_DIR)/plain/%) $(EMU_DIR)/plain/test_nccl $(EMU_ASAN_TESTS:%=$(EMU_DIR)/asan/%) \
            $(EMU_DIR)/plain/syncbn-bench-gpu $(EMU_KNOB_TESTS:%=$(EMU_DIR)/knobs/%)
EMU_CMDS := 'cmd:$(EMU_DIR)/plain/test_cuda_kernels --quick' \
            $(filter-out %/test_cuda_kernels,$(EMU_TESTS:%=cmd:$(EMU_DIR)/plain/%)) cmd:$(EMU_DIR)/plain/test_nccl \
            'cmd:$(EMU_DIR)/asan/test_cuda_kernels --quick' \
            $(filter-out %/test_cuda_kernels,$(EMU_ASAN_TESTS:%=cmd:$(EMU_DIR)/asan/%)) \
            'cmd:$(EMU_DIR)/plain/syncbn-bench-gpu --iters 1 --warmup 0 --only 32x2048' \
            'cmd:$(EMU_DIR)/knobs/test_cuda_kernels --quick' \
            $(filter-out %/test_cuda_kernels,$(EMU_KNOB_TESTS:%=cmd:$(EMU_DIR)/knobs/%))
all: $(EMU_BINS)
EXTRA_TEST_CMDS += $(EMU_CMDS)

.PHONY: check-cuda-emu
check-cuda-emu: $(EMU_BINS)
	@scripts/run_tests.sh $(BUILD) $(EMU_CMDS)
else
.PHONY: check-cuda-emu
check-cuda-emu:
	@echo "check-cuda-emu: the CUDA emulator needs x86-64 and a C++ compiler with _Float16 ($(CXX) here)"; exit 77
endif
endif
