# MPI backend: src/comm/mpi.c in its own library, libsyncbn_mpi (.a and
# .so, built by the Makefile from MPI_LIB_SRCS, linked with MPI_LIB_LDLIBS),
# so that libsyncbn.so never depends on libmpi; tests under tests/mpi/,
# bench-mpi.
#
# Open MPI is detected by probing for mpicc when the Makefile is read
# (`make test` installs libopenmpi-dev, then re-reads). Without it mpi.c
# compiles to a stub whose constructor answers SBN_STATUS_NOT_BUILT.
# `make MPICC=` builds as if MPI were absent.

# Every rule below would otherwise become the default goal (fragments are
# read before the Makefile's own `all`).
.DEFAULT_GOAL := all

MPICC ?= $(shell command -v mpicc 2>/dev/null)
MPIRUN ?= $(shell command -v mpirun 2>/dev/null)
DEPS_TEST += libopenmpi-dev openmpi-bin
# exact_sum.c is stateless: the MPI library carries its own copy (hidden)
# rather than calling libsyncbn's through the host table.
MPI_LIB_SRCS := src/comm/mpi.c src/comm/mpi_pair.c src/comm/mpi_reqs.c src/comm/exact_sum.c src/comm/exact_pair.c src/comm/exact_lanes.c src/comm/exact_lanes_blocks.c src/comm/sum_plan.c

MPI_TEST_NAMES := test_mpi_equivalence test_mpi_faults test_mpi_group_setup torch_peer_mpi
MPI_TEST_BINS := $(MPI_TEST_NAMES:%=$(BUILD)/tests/mpi/%)
MPI_STUB_TEST := $(BUILD)/tests/mpi/test_mpi_stub

ifneq ($(strip $(MPICC)),)
MPI_CFLAGS := $(shell $(MPICC) --showme:compile)
MPI_LDLIBS := $(shell $(MPICC) --showme:link)
MPI_STATE := mpi $(MPI_CFLAGS) $(MPI_LDLIBS)
MPI_LIB_LDLIBS := $(MPI_LDLIBS)
$(BUILD)/src/comm/mpi.o $(BUILD)/shared/src/comm/mpi.o $(BUILD)/src/comm/mpi_reqs.o $(BUILD)/shared/src/comm/mpi_reqs.o $(BUILD)/src/comm/mpi_pair.o $(BUILD)/shared/src/comm/mpi_pair.o: SBN_CFLAGS += -DSBN_WITH_MPI=1 $(MPI_CFLAGS)
all: $(MPI_TEST_BINS)
EXTRA_TEST_CMDS += 'cmd:tests/mpi/run_mpi.sh $(BUILD) equivalence' \
                   'cmd:tests/mpi/run_mpi.sh $(BUILD) faults' \
                   'cmd:tests/mpi/run_mpi.sh $(BUILD) setup' \
                   'cmd:tests/mpi/run_mpi.sh $(BUILD) algorithms' \
                   'cmd:tests/mpi/run_mpi.sh $(BUILD) kill' \
                   'cmd:tests/mpi/run_mpi.sh $(BUILD) torch'
else
MPI_STATE := none
all: $(MPI_STUB_TEST)
EXTRA_TEST_CMDS += 'cmd:$(MPI_STUB_TEST)'
endif

# mpi.o depends on what was detected: a stub built before Open MPI was
# installed is rebuilt once it is (and the other way round).
MPI_STAMP := $(BUILD)/mpi.config
$(shell mkdir -p $(BUILD) && [ "$$(cat $(MPI_STAMP) 2>/dev/null)" = "$(MPI_STATE)" ] || echo "$(MPI_STATE)" > $(MPI_STAMP))
$(BUILD)/src/comm/mpi.o $(BUILD)/shared/src/comm/mpi.o $(BUILD)/src/comm/mpi_reqs.o $(BUILD)/shared/src/comm/mpi_reqs.o $(BUILD)/src/comm/mpi_pair.o $(BUILD)/shared/src/comm/mpi_pair.o: $(MPI_STAMP)

MPI_TEST_SUPPORT := $(BUILD)/tests/testutil.o $(BUILD)/tests/bn_case.o

# The GPU equivalence suite over MPI processes sharing a GPU
# (tests/cuda/test_cuda_mpi.c, the host-staged path): built with the CUDA
# layer (scripts/gpu-check.sh runs it where mpirun is found; without a GPU
# it prints SKIP) and under the CUDA emulator (mk/cuda_emu.mk), where make
# test runs it.
ifneq ($(strip $(MPICC)),)
CUDA_MPI_DEPS := tests/cuda/test_cuda_mpi.c tests/mpi/mpi_case.h tests/mpi/mpi_check.h $(MPI_TEST_SUPPORT) $(SBN_STATIC)
ifneq ($(strip $(SBN_CUDA_LINK)),)
$(BUILD)/tests/cuda/test_cuda_mpi: $(CUDA_MPI_DEPS) $(BUILD)/libsyncbn_cuda.a
	@mkdir -p $(dir $@)
	$(SBN_LD) $(MPI_CFLAGS) -I$(CUDA_HOME)/include -Itests -Itests/mpi -o $@ $< $(MPI_TEST_SUPPORT) $(SBN_CUDA_LINK)
all: $(BUILD)/tests/cuda/test_cuda_mpi
endif
ifneq ($(strip $(EMU_DIR)),)
$(EMU_DIR)/plain/test_cuda_mpi: $(CUDA_MPI_DEPS) $(EMU_DIR)/plain/libsyncbn_cuda_emu.a $(EMU_HDRS)
	@mkdir -p $(dir $@)
	$(SBN_CC) -O2 $(MPI_CFLAGS) -Itests/cuda_emu/include -Itests -Itests/mpi -c $< -o $@.o
	$(EMU_CXX) -O2 -o $@ $@.o $(MPI_TEST_SUPPORT) -Wl,-u,sbn_internal_cuda_device_v3 \
	    $(EMU_DIR)/plain/libsyncbn_cuda_emu.a $(SBN_STATIC_LINK)
all: $(EMU_DIR)/plain/test_cuda_mpi
EXTRA_TEST_CMDS += 'cmd:tests/mpi/run_mpi.sh $(BUILD) cuda $(EMU_DIR)/plain/test_cuda_mpi'
endif
endif

$(BUILD)/tests/mpi/%: tests/mpi/%.c tests/mpi/mpi_case.h tests/mpi/mpi_check.h $(MPI_TEST_SUPPORT) $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) $(MPI_CFLAGS) -Itests -Itests/mpi -o $@ $< $(MPI_TEST_SUPPORT) $(SBN_STATIC_LINK)

# The latency benchmark: make bench-mpi runs it on 2, 4 and 8 ranks
# (BENCH_MPI_ARGS: batches and calls); see BENCHMARKS.md.
BENCH_MPI_ARGS ?= 200 20
.PHONY: bench-mpi bench-mpi-scaling
bench-mpi: $(BUILD)/bench/syncbn-bench-mpi
	@for np in 2 4 8; do OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
	    $(MPIRUN) --oversubscribe -np $$np $(BUILD)/bench/syncbn-bench-mpi $(BENCH_MPI_ARGS) || exit 1; done
# bench/mpi_scaling.sh BUILD: messages and bytes per rank per collective, P = 2..64.
bench-mpi-scaling: $(BUILD)/bench/syncbn-bench-mpi-count
	bench/mpi_scaling.sh $(BUILD)
$(BUILD)/bench/syncbn-bench-mpi-count: bench/bench_mpi_count.c $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) $(MPI_CFLAGS) -o $@ $< $(SBN_STATIC_LINK)
$(BUILD)/bench/syncbn-bench-mpi: bench/bench_mpi.c $(SBN_STATIC)
	@mkdir -p $(dir $@)
	@[ -n "$(strip $(MPICC))" ] || { echo "bench-mpi: mpicc not found (apt-get install libopenmpi-dev)" >&2; exit 1; }
	$(SBN_LD) $(MPI_CFLAGS) -o $@ $< $(SBN_STATIC_LINK)
