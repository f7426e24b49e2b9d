# Custom process group (callbacks supplied by the caller, syncbn_custom.h):
# how the Python package rides on torch.distributed and C users on any engine.
LIB_SRCS += src/comm/custom.c
TESTS += custom/test_custom_group
