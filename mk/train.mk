# syncbn-train, the main job. Built with MPI support when mpicc was found
# (mk/mpi.mk sets MPICC and MPI_CFLAGS first).
TRAIN_SRCS := tools/train/model.c tools/train/trainer.c tools/train/report.c tools/train/args.c \
              tools/train/launch.c tools/train/data.c tools/train/fail.c tools/train/file.c tools/train/resume.c
TRAIN_BIN := $(BUILD)/tools/syncbn-train
DEPS_BUILD += libopenblas-dev libcjson-dev zlib1g-dev gnuplot-nox
DEPS_TEST += gnuplot-nox
ifneq ($(strip $(MPICC)),)
TRAIN_CFLAGS := -DSBN_TRAIN_WITH_MPI=1 $(MPI_CFLAGS)
endif
all: $(TRAIN_BIN)
$(TRAIN_BIN): tools/syncbn-train.c $(TRAIN_SRCS) $(wildcard tools/train/*.h) $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) $(TRAIN_CFLAGS) -o $@ tools/syncbn-train.c $(TRAIN_SRCS) $(SBN_STATIC_LINK)
EXTRA_TEST_CMDS += 'cmd:tests/train/test_train.sh $(TRAIN_BIN)' 'cmd:tests/train/test_train_mpi.sh $(TRAIN_BIN)'
# The README's PyTorch recipe against the C network's eval outputs.
TRAIN_EVAL_DUMP := $(BUILD)/tests/train/eval_dump
all: $(TRAIN_EVAL_DUMP)
$(TRAIN_EVAL_DUMP): tests/train/eval_dump.c tools/train/model.c tools/train/model.h $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -Itools -o $@ tests/train/eval_dump.c tools/train/model.c $(SBN_STATIC_LINK)
EXTRA_TEST_CMDS += 'cmd:tests/train/test_pytorch_recipe.sh $(TRAIN_BIN) $(TRAIN_EVAL_DUMP)'
EXTRA_TEST_CMDS += 'cmd:tests/train/test_train_data.sh $(TRAIN_BIN)'

# The main job on real data: Fashion-MNIST from Debian's package (installed
# when missing), SyncBN and local BN at a small per-rank batch. Minutes, not
# seconds: `make run` stays on the synthetic data. Results: BENCHMARKS.md.
FASHION_ARGS ?= --data fashion-mnist --ranks 4 --batch 2 --epochs 2 --out $(BUILD)/run-fashion-mnist
.PHONY: run-fashion-mnist
run-fashion-mnist: deps-build
	@scripts/deps.sh dataset-fashion-mnist
	@$(MAKE) --no-print-directory $(TRAIN_BIN)
	$(TRAIN_BIN) $(FASHION_ARGS)
EXTRA_TEST_CMDS += 'cmd:tests/train/test_train_output.sh $(TRAIN_BIN)'

# The resume checkpoint's validation (tools/train/resume.c) over the seed corpus of
# its fuzz target (tests/fuzz/corpus/resume, written by make fuzz-seeds).
RESUME_TEST_SRCS := tests/train/resume_fixture.c tools/train/resume.c tools/train/fail.c tools/train/file.c tools/train/model.c
RESUME_TEST := $(BUILD)/tests/train/test_resume
all: $(RESUME_TEST)
$(RESUME_TEST): tests/train/test_resume.c $(RESUME_TEST_SRCS) tests/train/resume_fixture.h $(wildcard tools/train/*.h) \
                $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -Itools -Itests/train -o $@ $< $(RESUME_TEST_SRCS) $(SBN_STATIC_LINK)
EXTRA_TEST_CMDS += 'cmd:$(RESUME_TEST) tests/fuzz/corpus/resume'
