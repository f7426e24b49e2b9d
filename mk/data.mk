# Datasets for the training program (CIFAR-10, MNIST, synthetic).
LIB_SRCS += src/data/dataset.c src/data/cifar10.c src/data/mnist.c src/data/gunzip.c src/data/synthetic.c
TEST_BINS_DATA := $(BUILD)/tests/data/test_loaders
EXTRA_TEST_CMDS += cmd:$(BUILD)/tests/data/test_loaders
all: $(TEST_BINS_DATA)
$(BUILD)/tests/data/%: tests/data/%.c $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -o $@ $< $(SBN_STATIC_LINK)
