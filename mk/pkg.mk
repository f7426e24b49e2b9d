# Packaging: what the shared library exports, and that the user's CC/CFLAGS
# work (tests/pkg/).
.DEFAULT_GOAL := all
DEPS_TEST += binutils clang libomp-dev

EXTRA_TEST_CMDS += 'cmd:scripts/check_exports.sh $(BUILD)/libsyncbn.so include/*.h' \
                   'cmd:tests/pkg/test_user_flags.sh'
