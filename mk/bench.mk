# syncbn-bench: CPU kernels vs copy bandwidth and vs PyTorch.
#   make bench          build and run it (installs gnuplot and python3-torch
#                       when missing); results in build/bench/
#   make bench BENCH_ARGS=--quick   N = 8 shapes only
.DEFAULT_GOAL := all
BENCH_ARGS ?=
DEPS_BENCH := gnuplot-nox python3-torch

$(BUILD)/bench/syncbn-bench: bench/bench_cpu.c bench/bench_machine.h bench/bench_arith.h $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -o $@ $< $(SBN_STATIC_LINK)

all: $(BUILD)/bench/syncbn-bench

.PHONY: bench
bench: $(BUILD)/bench/syncbn-bench
	@scripts/deps.sh $(DEPS_BENCH) || echo "bench: could not install $(DEPS_BENCH); continuing without"
	$(BUILD)/bench/syncbn-bench --out $(BUILD)/bench $(BENCH_ARGS)

# syncbn-bench-passes: each kernel pass alone against the copy bandwidth.
$(BUILD)/bench/syncbn-bench-passes: bench/bench_passes.c bench/bench_machine.h $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -o $@ $< $(SBN_STATIC_LINK)

all: $(BUILD)/bench/syncbn-bench-passes

# syncbn-bench-consumer: a forward followed by a pass that reads its output,
# under either streaming threshold (BENCHMARKS.md, "Streamed outputs of 1-4
# MiB").
$(BUILD)/bench/syncbn-bench-consumer: bench/bench_consumer.c $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -o $@ $< $(SBN_STATIC_LINK)

all: $(BUILD)/bench/syncbn-bench-consumer

# syncbn-bench-bf16-ops: the bfloat16 statistics' float64 work per value on
# one core in L1, against variants of it (BENCHMARKS.md, "What the float64
# work costs per bfloat16 value").
$(BUILD)/bench/syncbn-bench-bf16-ops: bench/bench_bf16_ops.c
	@mkdir -p $(dir $@)
	$(SBN_CC) -mavx2 -mfma -ffp-contract=off $(LDFLAGS) -o $@ $< -lm

all: $(BUILD)/bench/syncbn-bench-bf16-ops
# In the suite: one round, for its check that every variant sums the same bits.
EXTRA_TEST_CMDS += 'cmd:$(BUILD)/bench/syncbn-bench-bf16-ops 1'
