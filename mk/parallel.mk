# Data-parallel wrapper (with_bagua) over the module layer. (Read after
# mpi.mk, whose MPICC/MPI_CFLAGS the test uses.)
LIB_SRCS += src/dp/buckets.c src/dp/comm_worker.c src/dp/data_parallel.c

DP_TEST := $(BUILD)/tests/dp/test_dp_equivalence
ifneq ($(strip $(MPICC)),)
DP_TEST_CFLAGS := -DSBN_TEST_WITH_MPI=1 $(MPI_CFLAGS)
endif
all: $(DP_TEST)
$(DP_TEST): tests/dp/test_dp_equivalence.c tools/train/model.c $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) $(DP_TEST_CFLAGS) -o $@ $< tools/train/model.c $(SBN_STATIC_LINK)
# The wrapper's single-process tests, each linked with the training tool's model.
DP_WRAP_TEST := $(BUILD)/tests/dp/test_dp_wrap
DP_FAULT_TEST := $(BUILD)/tests/dp/test_dp_wrap_faults
DP_MISMATCH_TEST := $(BUILD)/tests/dp/test_dp_wrap_mismatch
DP_ACCUM_TEST := $(BUILD)/tests/dp/test_dp_accumulation
DP_MODEL_TESTS := $(DP_WRAP_TEST) $(DP_FAULT_TEST) $(DP_MISMATCH_TEST) $(DP_ACCUM_TEST)
all: $(DP_MODEL_TESTS)
$(DP_MODEL_TESTS): $(BUILD)/tests/dp/%: tests/dp/%.c tools/train/model.c $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -o $@ $< tools/train/model.c $(SBN_STATIC_LINK)
DP_LOCAL_FAILURE_TEST := $(BUILD)/tests/dp/test_dp_local_failure
all: $(DP_LOCAL_FAILURE_TEST)
$(DP_LOCAL_FAILURE_TEST): tests/dp/test_dp_local_failure.c $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) $(DP_TEST_CFLAGS) -o $@ $< $(SBN_STATIC_LINK)
EXTRA_TEST_CMDS += 'cmd:$(DP_TEST) 2' 'cmd:$(DP_TEST) 4' 'cmd:$(DP_WRAP_TEST)' 'cmd:$(DP_FAULT_TEST)' \
	'cmd:$(DP_MISMATCH_TEST)' 'cmd:$(DP_ACCUM_TEST)' 'cmd:$(DP_LOCAL_FAILURE_TEST)'
ifneq ($(strip $(MPICC)),)
EXTRA_TEST_CMDS += 'cmd:tests/dp/run_mpi_dp.sh $(DP_TEST)' 'cmd:tests/dp/run_mpi_dp.sh $(DP_LOCAL_FAILURE_TEST)'
endif
