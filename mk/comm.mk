# Process groups: exact summation shared by every backend, its unit test,
# and the threads backend's stress tests (also under ASan and TSan).
.DEFAULT_GOAL := all
LIB_SRCS += src/comm/exact_sum.c src/comm/exact_pair.c src/comm/exact_lanes.c src/comm/exact_lanes_blocks.c src/comm/sum_plan.c
TESTS += test_exact_sum test_exact_lanes test_threads_stress test_timeout_forever

# The threads backend and the status code built with a sanitizer, straight
# from their sources (not in the sanitizer builds of mk/sanitize.mk, which
# run the whole suite that way already):
#   ASan: the stress test (timeouts of 10 us .. 10 ms, buffers unmapped right
#         after each collective; stack reads after return detected too);
#   TSan: the stress test, test_status_race (sbn_fail on 8 threads at once),
#         and test_split_fault (splits that fail on one rank, then recover).
ifneq ($(SBN_SANITIZE),1)
COMM_SAN_SRCS := src/core/status.c src/core/tensor.c src/comm/group.c src/comm/threads.c src/comm/exact_sum.c \
                 src/comm/exact_pair.c src/comm/exact_lanes.c src/comm/exact_lanes_blocks.c
$(BUILD)/tests/asan/test_threads_stress: tests/test_threads_stress.c $(COMM_SAN_SRCS)
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 -Iinclude -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -pthread -o $@ $^ -lm
$(BUILD)/tests/tsan/%: tests/%.c $(COMM_SAN_SRCS)
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 -Iinclude -O1 -g -fsanitize=thread -pthread -o $@ $^ -lm
all: $(BUILD)/tests/asan/test_threads_stress $(BUILD)/tests/tsan/test_threads_stress $(BUILD)/tests/tsan/test_status_race \
     $(BUILD)/tests/tsan/test_split_fault
EXTRA_TEST_CMDS += 'cmd:ASAN_OPTIONS=detect_stack_use_after_return=1 $(BUILD)/tests/asan/test_threads_stress 200' \
                   'cmd:TSAN_OPTIONS=halt_on_error=1 $(BUILD)/tests/tsan/test_threads_stress 60' \
                   'cmd:TSAN_OPTIONS=halt_on_error=1 $(BUILD)/tests/tsan/test_status_race' \
                   'cmd:TSAN_OPTIONS=halt_on_error=1 $(BUILD)/tests/tsan/test_split_fault'
endif

# syncbn-bench-lanes: ns per value of the lane encode/decode, the scalar
# reference against each instruction-set variant (not run by make check).
$(BUILD)/bench/syncbn-bench-lanes: bench/bench_lanes.c $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -o $@ $< $(SBN_STATIC_LINK)
all: $(BUILD)/bench/syncbn-bench-lanes
