# syncbn — plain GNU Make: the project is C with a handful of optional
# backends detected by probing for their tools (mpicc, nvcc); no configure
# step is needed and every target works from a fresh clone.
#
#   make            build the library, tools and tests into build/
#   make test       install missing Debian packages, build, run the suite
#   make run        install missing Debian packages, run the main job
#   make install    PREFIX=/usr/local: headers, libraries, pkg-config

.DEFAULT_GOAL := all
PREFIX  ?= /usr/local
BUILD   := build
PYTHON  := /usr/bin/python3

# CC, CPPFLAGS, CFLAGS, LDFLAGS and LDLIBS belong to whoever runs make
# (`make CC=clang CFLAGS=-O2` works). What the project needs lives in its own
# variables, which fragments extend (target-specific `SBN_CFLAGS += ...`):
# language level, warnings, PIC, threads, include path, and hidden
# visibility (only SBN_API declarations of include/*.h are exported).
CFLAGS     ?= -O3 -g
SBN_CFLAGS := -std=gnu11 -Wall -Wextra -Wshadow -fPIC -pthread -Iinclude -fvisibility=hidden
LIB_LDLIBS := -lm -pthread
SBN_CC = $(CC) $(SBN_CFLAGS) $(CPPFLAGS) $(CFLAGS)
SBN_LD = $(SBN_CC) $(LDFLAGS)

# Debian packages each target needs (installed by scripts/deps.sh when missing).
DEPS_BUILD := gcc make libc6-dev
DEPS_TEST  := $(DEPS_BUILD) python3-torch python3-numpy

LIB_SRCS := src/core/status.c src/core/tensor.c src/core/bn.c \
            src/cpu/bn_kernels.c \
            src/comm/group.c src/comm/threads.c
TEST_SUPPORT := tests/testutil.c tests/bn_case.c
TESTS    := test_status test_groups test_reference test_equivalence test_misuse test_determinism
TOOLS    := syncbn-demo
EXAMPLES := two_ranks
EXTRA_TEST_CMDS := cmd:$(BUILD)/examples/two_ranks cmd:$(BUILD)/tools/syncbn-demo

# Optional parts and later components add to the lists above (LIB_SRCS,
# LIB_LDLIBS, TESTS, TOOLS, EXTRA_TEST_CMDS, DEPS_TEST, ...), one fragment each.
-include $(sort $(wildcard mk/*.mk))

# Objects depend on the compiler and flags they were built with, so that
# `make CC=clang` or `make CFLAGS=-O2` after another build rebuilds them.
FLAGS_STAMP := $(BUILD)/flags.config
FLAGS_STATE := $(CC) $(SBN_CFLAGS) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS)
$(shell mkdir -p $(BUILD) && [ "$$(cat $(FLAGS_STAMP) 2>/dev/null)" = '$(FLAGS_STATE)' ] || echo '$(FLAGS_STATE)' > $(FLAGS_STAMP))

LIB_OBJS  := $(LIB_SRCS:%.c=$(BUILD)/%.o)
TEST_BINS := $(TESTS:%=$(BUILD)/tests/%) $(BUILD)/tests/torch_peer
TOOL_BINS := $(TOOLS:%=$(BUILD)/tools/%) $(EXAMPLES:%=$(BUILD)/examples/%)

.PHONY: all lib test check run deps-build deps-test install clean
all: lib $(TEST_BINS) $(TOOL_BINS)
lib: $(BUILD)/libsyncbn.a $(BUILD)/libsyncbn.so

$(BUILD)/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(SBN_CC) -MMD -MP -c $< -o $@

$(BUILD)/libsyncbn.a: $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libsyncbn.so: $(LIB_OBJS)
	$(SBN_LD) -shared -Wl,-soname,libsyncbn.so.0 -o $@ $^ $(LDLIBS) $(LIB_LDLIBS)

$(BUILD)/tests/%: tests/%.c $(TEST_SUPPORT:%.c=$(BUILD)/%.o) $(BUILD)/libsyncbn.a
	@mkdir -p $(dir $@)
	$(SBN_LD) -Itests -o $@ $< $(TEST_SUPPORT:%.c=$(BUILD)/%.o) $(BUILD)/libsyncbn.a $(LDLIBS) $(LIB_LDLIBS)

$(BUILD)/examples/%: examples/%.c $(BUILD)/libsyncbn.a
	@mkdir -p $(dir $@)
	$(SBN_LD) -o $@ $< $(BUILD)/libsyncbn.a $(LDLIBS) $(LIB_LDLIBS)

$(BUILD)/tools/%: tools/%.c $(BUILD)/libsyncbn.a
	@mkdir -p $(dir $@)
	$(SBN_LD) -o $@ $< $(BUILD)/libsyncbn.a $(LDLIBS) $(LIB_LDLIBS)

deps-build:
	@scripts/deps.sh $(DEPS_BUILD)
deps-test:
	@scripts/deps.sh $(DEPS_TEST)

# The whole suite; each test prints its evidence and exits non-zero on failure.
# `test` installs first, then re-reads this file (`check`) so that optional
# parts whose tools were just installed (mpicc) are detected.
test: deps-test
	@$(MAKE) --no-print-directory check
check: all
	@scripts/run_tests.sh $(BUILD) $(TESTS) $(EXTRA_TEST_CMDS)

# The main job: 4 thread ranks with a small per-rank batch, SyncBN and
# local BN trained side by side (syncbn-train --help for the options).
run: deps-build
	@$(MAKE) --no-print-directory $(BUILD)/tools/syncbn-train
	$(BUILD)/tools/syncbn-train

install: lib
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 include/*.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(BUILD)/libsyncbn.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(BUILD)/libsyncbn.so $(DESTDIR)$(PREFIX)/lib/libsyncbn.so.0
	ln -sf libsyncbn.so.0 $(DESTDIR)$(PREFIX)/lib/libsyncbn.so
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBS_PRIVATE@|$(LIB_LDLIBS)|' -e 's|@VERSION@|$(shell sed -n 's/^#define SYNCBN_VERSION_\(MAJOR\|MINOR\|PATCH\) //p' include/syncbn.h | paste -sd.)|' \
	    syncbn.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/syncbn.pc

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
