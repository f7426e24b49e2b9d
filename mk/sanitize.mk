# Sanitizer builds of the whole project, each in its own build directory:
#
#   make check-asan   AddressSanitizer + UndefinedBehaviorSanitizer (+ leak
#                     checking), build-asan/, the whole suite
#   make check-tsan   ThreadSanitizer, build-tsan/, the whole suite
#   make check-asan-quick, check-tsan-quick   the subsets `make check` runs
#                     (SAN_QUICK_*)
#
# Both include the MPI backend and its tests under mpirun: Open MPI itself is
# not instrumented, and its own allocations are suppressed (tests/sanitize/
# lsan.supp, each entry with its reason; the ASan runs unwind fully so that
# Open MPI's frames show). The kernels' helper threads (src/cpu/
# cpu_parallel.c, no OpenMP) are instrumented like everything else.
# SBN_TEST_SANITIZED=1 makes the slowest tests leave out their largest
# shapes (the normal build runs them). The Python tests need an
# uninstrumented library (mk/python.mk) and stay in the normal suite.
.DEFAULT_GOAL := all

# tests/cpu/test_cpu_noalloc replaces malloc for the whole process to count
# calls, which no sanitizer runtime allows; tests/test_team_start limits the
# address space, where the sanitizers' shadow memory does not fit: both run
# in the normal suite only.
ifeq ($(SBN_SANITIZE),1)
TESTS := $(filter-out cpu/test_cpu_noalloc test_team_start,$(TESTS))
endif

ASAN_CFLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
TSAN_CFLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=thread
SAN_SUPP := $(CURDIR)/tests/sanitize
ASAN_ENV := TEST_TIMEOUT=1800 SBN_TEST_SANITIZED=1 ASAN_OPTIONS=abort_on_error=0:detect_leaks=1:allocator_may_return_null=1:detect_stack_use_after_return=1:fast_unwind_on_malloc=0 \
            LSAN_OPTIONS=suppressions=$(SAN_SUPP)/lsan.supp:print_suppressions=0 \
            UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$(SAN_SUPP)/ubsan.supp
TSAN_ENV := TEST_TIMEOUT=1800 SBN_TEST_SANITIZED=1 TSAN_OPTIONS=halt_on_error=1:allocator_may_return_null=1:second_deadlock_stack=1:suppressions=$(SAN_SUPP)/tsan.supp:report_signal_unsafe=0
ASAN_MAKE := $(MAKE) --no-print-directory BUILD=build-asan SBN_SANITIZE=1 CFLAGS="$(ASAN_CFLAGS)"
TSAN_MAKE := $(MAKE) --no-print-directory BUILD=build-tsan SBN_SANITIZE=1 CFLAGS="$(TSAN_CFLAGS)"

# The subset run by `make check` (a few minutes on 2 cores, timed in
# README): the tests of misuse, empty batches, limits, checkpoints, the
# wrapper's and the MPI backend's faults and the bad-input matrix under
# ASan/UBSan, and the tests
# whose ranks and threads share memory under TSan. The full runs are the
# targets above.
SAN_QUICK_ASAN := test_misuse test_empty test_bad_input test_float64 test_records nn/test_nn_limits nn/test_nn_checkpoint \
                  nn/test_nn_checkpoint_edges \
                  nn/test_nn_convert_optim
SAN_QUICK_ASAN_CMDS := cmd:build-asan/tests/dp/test_dp_wrap_faults
# torch_peer too: run_tests.sh runs it whenever the build folder has one (a stale
# one from an earlier full sanitizer build would run against today's script).
SAN_QUICK_ASAN_BUILD := $(SAN_QUICK_ASAN:%=build-asan/tests/%) build-asan/tests/dp/test_dp_wrap_faults \
                        build-asan/tests/torch_peer
SAN_QUICK_TSAN := test_groups test_misuse test_empty test_first_call test_records
SAN_QUICK_TSAN_CMDS := cmd:build-tsan/tests/dp/test_dp_wrap cmd:build-tsan/tests/dp/test_dp_wrap_faults \
                       cmd:build-tsan/tests/dp/test_dp_local_failure
SAN_QUICK_TSAN_BUILD := $(SAN_QUICK_TSAN:%=build-tsan/tests/%) $(SAN_QUICK_TSAN_CMDS:cmd:%=%) \
                        build-tsan/tests/torch_peer
# and the MPI backend's fault paths (mismatch, timeouts) under ASan (30 s)
ifneq ($(strip $(MPICC)),)
SAN_QUICK_ASAN_CMDS += 'cmd:tests/mpi/run_mpi.sh build-asan faults'
SAN_QUICK_ASAN_BUILD += build-asan/tests/mpi/test_mpi_faults
endif

.PHONY: check-asan check-tsan check-asan-quick check-tsan-quick
check-asan:
	+@$(ASAN_MAKE) all
	+@env $(ASAN_ENV) $(ASAN_MAKE) check
check-tsan:
	+@$(TSAN_MAKE) all
	+@env $(TSAN_ENV) $(TSAN_MAKE) check
check-asan-quick:
	+@$(ASAN_MAKE) $(SAN_QUICK_ASAN_BUILD)
	+@env $(ASAN_ENV) scripts/run_tests.sh build-asan $(SAN_QUICK_ASAN) $(SAN_QUICK_ASAN_CMDS)
check-tsan-quick:
	+@$(TSAN_MAKE) $(SAN_QUICK_TSAN_BUILD)
	+@env $(TSAN_ENV) scripts/run_tests.sh build-tsan $(SAN_QUICK_TSAN) $(SAN_QUICK_TSAN_CMDS)

# In the normal suite (not inside a sanitizer build).
ifneq ($(SBN_SANITIZE),1)
EXTRA_TEST_CMDS += 'cmd:$(MAKE) --no-print-directory -j2 check-asan-quick' \
                   'cmd:$(MAKE) --no-print-directory -j2 check-tsan-quick'
endif
