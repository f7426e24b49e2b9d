# Module layer: src/nn/* into libsyncbn, its tests and the example.
# Needs OpenBLAS (GEMMs of Linear/Conv2d), cJSON (safetensors headers) and
# zlib (checkpoint data checksum), all Debian packages.
NN_SRCS := $(sort $(wildcard src/nn/*.c))
LIB_SRCS += $(NN_SRCS)
LIB_LDLIBS += -lopenblas -lcjson -lz
DEPS_BUILD += libopenblas-dev libcjson-dev zlib1g-dev
DEPS_TEST += libopenblas-dev libcjson-dev zlib1g-dev python3-numpy python3-torch

NN_TESTS := nn/test_nn_layers nn/test_nn_convert nn/test_nn_checkpoint nn/test_nn_checkpoint_edges nn/test_nn_limits \
            nn/test_nn_convert_optim nn/test_nn_relu_special
TESTS += $(NN_TESTS)
NN_TEST_SUPPORT := $(BUILD)/tests/testutil.o $(BUILD)/tests/nn/nn_testutil.o

# Tests in tests/nn link their own support next to the common one.
$(BUILD)/tests/nn/nn_testutil.o: tests/nn/nn_testutil.c
	@mkdir -p $(dir $@)
	$(SBN_CC) -Itests -MMD -MP -c $< -o $@
$(BUILD)/tests/nn/%: tests/nn/%.c $(NN_TEST_SUPPORT) $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -Itests -Itests/nn -o $@ $< $(NN_TEST_SUPPORT) $(SBN_STATIC_LINK)

# The PyTorch peer: C exports model + input + its results, Debian's torch
# (/usr/bin/python3) recomputes and compares, then C loads PyTorch's file.
NN_PEER := $(BUILD)/tests/nn/nn_torch_peer
all: $(NN_PEER) $(BUILD)/examples/nn_example
EXTRA_TEST_CMDS += 'cmd:d=$$(mktemp -d) && $(NN_PEER) export $$d && $(PYTHON) tests/nn/torch_peer.py $$d && $(NN_PEER) import $$d; rc=$$?; rm -rf $$d; exit $$rc'
# Loading entries of another dtype, bit for bit against torch's load_state_dict.
NN_LOAD_DTYPES := $(BUILD)/tests/nn/test_nn_load_dtypes
all: $(NN_LOAD_DTYPES)
EXTRA_TEST_CMDS += 'cmd:d=$$(mktemp -d) && $(PYTHON) tests/nn/load_dtypes.py $$d && $(NN_LOAD_DTYPES) $$d; rc=$$?; rm -rf $$d; exit $$rc'
EXTRA_TEST_CMDS += 'cmd:d=$$(mktemp -d) && $(BUILD)/examples/nn_example $$d/model.safetensors; rc=$$?; rm -rf $$d; exit $$rc'
