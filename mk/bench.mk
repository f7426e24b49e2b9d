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
