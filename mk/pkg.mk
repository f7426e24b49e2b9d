# Packaging checks (tests/pkg/): each shared library exports exactly its
# public headers' SBN_API declarations, every global symbol of the static
# archives starts with sbn_; the user's CC/CFLAGS work
# (clang, -O2); make install + consumers built with pkg-config and CMake;
# the repository refers only to itself. And the OpenBLAS thread policy
# (src/nn/blas.c).
.DEFAULT_GOAL := all
DEPS_TEST += binutils clang libomp-dev cmake pkgconf

# Headers of the backend libraries; every other public header is libsyncbn's.
BACKEND_HEADERS := include/syncbn_mpi.h include/syncbn_nccl.h
CORE_HEADERS = $(filter-out $(BACKEND_HEADERS),$(sort $(wildcard include/*.h)))
TESTS += nn/test_nn_blas_threads
# Not in the sanitizer builds (mk/sanitize.mk): instrumented libraries export
# the sanitizers' own symbols and need their runtime in every consumer.
ifneq ($(SBN_SANITIZE),1)
EXTRA_TEST_CMDS += 'cmd:scripts/check_exports.sh --allow sbn_internal_backend_host_v1 $(BUILD)/libsyncbn.so $(CORE_HEADERS)' \
                   'cmd:scripts/check_exports.sh $(BUILD)/libsyncbn_mpi.so include/syncbn_mpi.h' \
                   'cmd:tests/pkg/test_user_flags.sh' \
                   'cmd:tests/pkg/test_install.sh $(BUILD)' \
                   'cmd:scripts/check_prefix.sh $(SBN_STATIC)' \
                   'cmd:tests/pkg/test_self_contained.sh'
endif

# Both export checks on a build directory (test_user_flags.sh runs it on its
# clang build): make check-exports BUILD=dir
.PHONY: check-exports
check-exports: $(BUILD)/libsyncbn.so $(BUILD)/libsyncbn_mpi.so
	@scripts/check_exports.sh --allow sbn_internal_backend_host_v1 $(BUILD)/libsyncbn.so $(CORE_HEADERS)
	@scripts/check_exports.sh $(BUILD)/libsyncbn_mpi.so include/syncbn_mpi.h
