# syncbn-train, the main job. Built with MPI support when mpicc was found
# (mk/mpi.mk sets MPICC and MPI_CFLAGS first).
TRAIN_SRCS := tools/train/model.c tools/train/trainer.c tools/train/report.c tools/train/args.c \
              tools/train/launch.c tools/train/data.c tools/train/fail.c
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
