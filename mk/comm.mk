# Process groups: exact summation shared by every backend, its unit test.
.DEFAULT_GOAL := all
LIB_SRCS += src/comm/exact_sum.c
TESTS += test_exact_sum
