# syncbn — plain GNU Make: the project is C with a handful of optional
# backends detected by probing for their tools (mpicc, nvcc); no configure
# step is needed and every target works from a fresh clone (`make` itself
# installs nothing: `make deps-build` first, or `make run` / `make test`).
#
#   make deps-build install the Debian packages the build needs (when missing)
#   make            build the libraries, tools and tests into build/
#   make test       install missing Debian packages, build, run the suite
#   make run        install missing Debian packages, run the main job
#   make install    PREFIX=/usr/local (LIBDIR, BINDIR, INCLUDEDIR, DESTDIR):
#                   libraries, headers, pkg-config and CMake files, syncbn-train

.DEFAULT_GOAL := all
PREFIX     ?= /usr/local
LIBDIR     ?= $(PREFIX)/lib
BINDIR     ?= $(PREFIX)/bin
INCLUDEDIR ?= $(PREFIX)/include
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

# Two libraries: libsyncbn (everything but MPI) and libsyncbn_mpi (the MPI
# backend, syncbn_mpi.h; it links libsyncbn), so a program that uses thread
# ranks only never loads libmpi. Each as a static archive and a versioned
# shared library: libX.so.MAJOR.MINOR.PATCH, SONAME libX.so.MAJOR, and the
# libX.so link for linking (README, "Versions and ABI").
SBN_VERSION := $(shell sed -n 's/^\#define SYNCBN_VERSION_\(MAJOR\|MINOR\|PATCH\) //p' include/syncbn.h | paste -sd.)
SBN_MAJOR   := $(firstword $(subst ., ,$(SBN_VERSION)))
# In-tree programs (tests, tools, examples) link the static archives:
#   $(SBN_LD) -o $@ $< <objects> $(SBN_STATIC_LINK)     prerequisite: $(SBN_STATIC)
SBN_STATIC := $(BUILD)/libsyncbn_mpi.a $(BUILD)/libsyncbn.a
SBN_STATIC_LINK = $(SBN_STATIC) $(LDLIBS) $(MPI_LIB_LDLIBS) $(LIB_LDLIBS)

# Debian packages each target needs (installed by scripts/deps.sh when missing).
DEPS_BUILD := gcc make libc6-dev
DEPS_TEST  := $(DEPS_BUILD) python3-torch python3-numpy

LIB_SRCS := src/core/status.c src/core/tensor.c src/core/bn.c src/core/device.c src/core/file.c \
            src/cpu/bn_kernels.c \
            src/comm/group.c src/comm/threads.c src/comm/backend_host.c
TEST_SUPPORT := tests/testutil.c tests/bn_case.c tests/records_case.c
TESTS    := test_status test_team_start test_groups test_split_fault test_reference test_float64 test_equivalence test_misuse test_determinism test_empty test_bad_input test_first_call test_records
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
# The static archive holds only what libsyncbn.a does not (programs link
# both); the shared library carries its own hidden copy of stateless helpers.
MPI_LIB_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(filter-out $(LIB_SRCS),$(MPI_LIB_SRCS)))
# The shared backend library compiles the same sources with its calls into
# libsyncbn routed through the table libsyncbn.so exports (backend_client.h).
MPI_SO_OBJS  := $(MPI_LIB_SRCS:%.c=$(BUILD)/shared/%.o)
TEST_BINS := $(TESTS:%=$(BUILD)/tests/%) $(BUILD)/tests/torch_peer
TOOL_BINS := $(TOOLS:%=$(BUILD)/tools/%) $(EXAMPLES:%=$(BUILD)/examples/%)
SO_NAMES  := libsyncbn libsyncbn_mpi $(CUDA_SO_NAMES)
SO_FILES  := $(foreach l,$(SO_NAMES),$(BUILD)/$(l).so $(BUILD)/$(l).so.$(SBN_MAJOR) $(BUILD)/$(l).so.$(SBN_VERSION))

.PHONY: all lib test check run deps-build deps-test install clean
all: lib $(TEST_BINS) $(TOOL_BINS)
lib: $(SBN_STATIC) $(SO_FILES)

$(BUILD)/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(SBN_CC) -MMD -MP -c $< -o $@
$(BUILD)/shared/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(SBN_CC) -include src/comm/backend_client.h -MMD -MP -c $< -o $@

$(BUILD)/libsyncbn.a: $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/libsyncbn_mpi.a: $(MPI_LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

# -z defs: every symbol resolved at link time (a backend calling an internal
# function that is not in the host table fails here, not when loaded).
$(BUILD)/libsyncbn.so.$(SBN_VERSION): $(LIB_OBJS)
	$(SBN_LD) -shared -Wl,-z,defs -Wl,-soname,libsyncbn.so.$(SBN_MAJOR) -o $@ $^ $(LDLIBS) $(LIB_LDLIBS)
$(BUILD)/libsyncbn_mpi.so.$(SBN_VERSION): $(MPI_SO_OBJS) $(BUILD)/libsyncbn.so
	$(SBN_LD) -shared -Wl,-z,defs -Wl,-soname,libsyncbn_mpi.so.$(SBN_MAJOR) -o $@ $(MPI_SO_OBJS) \
	    -L$(BUILD) -lsyncbn $(LDLIBS) $(MPI_LIB_LDLIBS) -lm -pthread
$(BUILD)/%.so.$(SBN_MAJOR): $(BUILD)/%.so.$(SBN_VERSION)
	ln -sf $(notdir $<) $@
$(BUILD)/%.so: $(BUILD)/%.so.$(SBN_MAJOR)
	ln -sf $(notdir $<) $@

$(BUILD)/tests/%: tests/%.c $(TEST_SUPPORT:%.c=$(BUILD)/%.o) $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -Itests -o $@ $< $(TEST_SUPPORT:%.c=$(BUILD)/%.o) $(SBN_STATIC_LINK)

$(BUILD)/examples/%: examples/%.c $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -o $@ $< $(SBN_STATIC_LINK)

$(BUILD)/tools/%: tools/%.c $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -o $@ $< $(SBN_STATIC_LINK)

deps-build:
	@scripts/deps.sh $(DEPS_BUILD)

# `make` and `make lib` do not install anything; on a fresh machine they say
# what is missing and how to get it before the compiler fails on a header.
ifneq ($(filter all lib,$(or $(MAKECMDGOALS),all)),)
MISSING_BUILD_DEPS := $(shell scripts/deps.sh --check $(DEPS_BUILD))
ifneq ($(MISSING_BUILD_DEPS),)
$(warning missing Debian packages: $(MISSING_BUILD_DEPS). Run `make deps-build` to install them (`make run` and `make test` install what they need themselves))
endif
endif
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

# ---- install ------------------------------------------------------------
# Libraries (static, versioned shared + links), headers, pkg-config files
# (syncbn, syncbn-mpi), the CMake package (find_package(syncbn CONFIG)) and
# syncbn-train. PREFIX goes into the pkg-config files; the CMake files are
# relocatable. DESTDIR stages for packaging.
INSTALL_PROGRAMS += $(BUILD)/tools/syncbn-train
CMAKEDIR := $(LIBDIR)/cmake/syncbn
# Dependencies of the static archive that ship pkg-config files go to
# Requires.private, the rest (libm, threads) to Libs.private.
PC_MODULES := -lopenblas=openblas -lcjson=libcjson -lz=zlib
empty :=
comma := ,
PC_REQUIRES_PRIVATE := $(subst $(empty) $(empty),$(comma) ,$(strip $(foreach m,$(PC_MODULES),$(if $(filter $(word 1,$(subst =, ,$(m))),$(LIB_LDLIBS)),$(word 2,$(subst =, ,$(m)))))))
PC_LIBS_PRIVATE := $(strip $(filter-out $(foreach m,$(PC_MODULES),$(word 1,$(subst =, ,$(m)))),$(LIB_LDLIBS)))
# The MPI part names Open MPI's (or MPICH's) pkg-config module when there is
# one, else carries the flags mpicc reported.
MPI_PC := $(if $(MPI_LIB_LDLIBS),$(firstword $(foreach m,ompi-c mpich mpi-c,$(shell pkg-config --exists $(m) 2>/dev/null && echo $(m)))))
PC_SUBST = -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' \
  -e 's|@VERSION@|$(SBN_VERSION)|g' -e 's|@MAJOR@|$(SBN_MAJOR)|g' \
  -e 's|@REQUIRES_PRIVATE@|$(PC_REQUIRES_PRIVATE)|' -e 's|@LIBS_PRIVATE@|$(PC_LIBS_PRIVATE)|' \
  -e 's|@MPI_REQUIRES@|$(if $(MPI_PC),$(comma) $(MPI_PC))|' \
  -e 's|@MPI_CFLAGS@|$(if $(MPI_PC),,$(MPI_CFLAGS))|' -e 's|@MPI_LIBS_PRIVATE@|$(if $(MPI_PC),,$(MPI_LIB_LDLIBS))|' \
  -e 's|@WITH_MPI@|$(if $(MPI_LIB_LDLIBS),TRUE,FALSE)|' \
  -e "s|@CMAKE_TO_LIBDIR@|$$(realpath -m --relative-to=$(CMAKEDIR) $(LIBDIR))|" \
  -e "s|@CMAKE_TO_INCLUDEDIR@|$$(realpath -m --relative-to=$(CMAKEDIR) $(INCLUDEDIR))|"
PKG_FILES := pkgconfig/syncbn.pc pkgconfig/syncbn-mpi.pc cmake/syncbn/syncbn-config.cmake \
             cmake/syncbn/syncbn-config-version.cmake

.PHONY: uninstall
install: lib $(INSTALL_PROGRAMS)
	install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(CMAKEDIR) $(DESTDIR)$(BINDIR)
	install -m 644 include/*.h $(DESTDIR)$(INCLUDEDIR)/
	for l in $(SO_NAMES); do \
	  install -m 644 $(BUILD)/$$l.a $(DESTDIR)$(LIBDIR)/ && \
	  install -m 755 $(BUILD)/$$l.so.$(SBN_VERSION) $(DESTDIR)$(LIBDIR)/ && \
	  ln -sf $$l.so.$(SBN_VERSION) $(DESTDIR)$(LIBDIR)/$$l.so.$(SBN_MAJOR) && \
	  ln -sf $$l.so.$(SBN_MAJOR) $(DESTDIR)$(LIBDIR)/$$l.so || exit 1; \
	done
	for f in $(PKG_FILES); do \
	  sed $(PC_SUBST) packaging/$$(basename $$f).in > $(DESTDIR)$(LIBDIR)/$$f || exit 1; \
	done
	install -m 755 $(INSTALL_PROGRAMS) $(DESTDIR)$(BINDIR)/
uninstall:
	rm -f $(addprefix $(DESTDIR)$(INCLUDEDIR)/,$(notdir $(wildcard include/*.h))) \
	      $(foreach l,$(SO_NAMES),$(addprefix $(DESTDIR)$(LIBDIR)/$(l),.a .so .so.$(SBN_MAJOR) .so.$(SBN_VERSION))) \
	      $(addprefix $(DESTDIR)$(LIBDIR)/,$(PKG_FILES)) $(addprefix $(DESTDIR)$(BINDIR)/,$(notdir $(INSTALL_PROGRAMS)))
	-rmdir $(DESTDIR)$(CMAKEDIR)

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
