# Fuzz targets (libFuzzer, clang) for what reads untrusted bytes:
#   fuzz_safetensors  the checkpoint loader (sbn_nn_load_memory)
#   fuzz_cifar10      the CIFAR-10 binary loader
#   fuzz_mnist        the MNIST IDX loader (image and label files)
#   fuzz_resume       syncbn-train's resume checkpoint (resume_load_memory,
#                     what --resume runs: format, configuration, position)
# Seeds are checked in under tests/fuzz/corpus/<target>; `make fuzz-seeds`
# rewrites them (tests/fuzz/make_seeds.py; the resume seeds start from files
# that tests/train/test_resume writes, and that test checks them all).
#
#   make fuzz              each target for FUZZ_TIME seconds (default 600);
#                          new inputs in build-fuzz/corpus/, crashes in
#                          build-fuzz/artifacts/
#   make check-fuzz-quick  each target for FUZZ_QUICK_TIME seconds (make check)
#
# Everything is built by clang (installed by scripts/deps.sh when missing)
# into build-fuzz/, with ASan and UBSan, MPI left out.
.DEFAULT_GOAL := all

FUZZ_CC ?= clang
FUZZ_TIME ?= 600
FUZZ_QUICK_TIME ?= 3
FUZZ_NAMES := safetensors cifar10 mnist resume
FUZZ_CFLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined \
               -fsanitize=fuzzer-no-link
FUZZ_MAKE := $(MAKE) --no-print-directory BUILD=build-fuzz CC=$(FUZZ_CC) MPICC= SBN_SANITIZE=1 \
             CFLAGS="$(FUZZ_CFLAGS)"
FUZZ_ENV := ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

# Built inside the clang sub-make only (BUILD=build-fuzz).
$(BUILD)/fuzz/fuzz_safetensors: tests/fuzz/fuzz_safetensors.c $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -fsanitize=fuzzer -o $@ $< $(SBN_STATIC_LINK)
$(BUILD)/fuzz/fuzz_cifar10: tests/fuzz/fuzz_datasets.c $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -fsanitize=fuzzer -DFUZZ_CIFAR10 -o $@ $< $(SBN_STATIC_LINK)
$(BUILD)/fuzz/fuzz_mnist: tests/fuzz/fuzz_datasets.c $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -fsanitize=fuzzer -DFUZZ_MNIST -o $@ $< $(SBN_STATIC_LINK)

FUZZ_RESUME_SRCS := tests/train/resume_fixture.c tools/train/resume.c tools/train/fail.c tools/train/file.c tools/train/model.c
$(BUILD)/fuzz/fuzz_resume: tests/fuzz/fuzz_resume.c $(FUZZ_RESUME_SRCS) tests/train/resume_fixture.h \
                           $(wildcard tools/train/*.h) $(SBN_STATIC)
	@mkdir -p $(dir $@)
	$(SBN_LD) -fsanitize=fuzzer -Itools -Itests/train -o $@ $< $(FUZZ_RESUME_SRCS) $(SBN_STATIC_LINK)

.PHONY: fuzz fuzz-build check-fuzz-quick fuzz-seeds
fuzz-seeds: $(BUILD)/tests/train/test_resume
	$(PYTHON) tests/fuzz/make_seeds.py $(BUILD)/tests/train/test_resume
fuzz-build:
	@command -v $(FUZZ_CC) >/dev/null || scripts/deps.sh clang
	+@$(FUZZ_MAKE) $(FUZZ_NAMES:%=build-fuzz/fuzz/fuzz_%)
fuzz: fuzz-build
	@set -e; for t in $(FUZZ_NAMES); do \
	  mkdir -p build-fuzz/corpus/$$t build-fuzz/artifacts; \
	  echo "=== fuzz_$$t for $(FUZZ_TIME) s"; \
	  env $(FUZZ_ENV) build-fuzz/fuzz/fuzz_$$t -max_total_time=$(FUZZ_TIME) -print_final_stats=1 \
	    -artifact_prefix=build-fuzz/artifacts/$$t- build-fuzz/corpus/$$t tests/fuzz/corpus/$$t; \
	done
# A short run of each target over the checked-in seeds and what it finds in
# a few seconds; fails on any crash, leak or sanitizer report.
check-fuzz-quick: fuzz-build
	@set -e; for t in $(FUZZ_NAMES); do \
	  d=$$(mktemp -d); \
	  env $(FUZZ_ENV) build-fuzz/fuzz/fuzz_$$t -max_total_time=$(FUZZ_QUICK_TIME) -print_final_stats=1 \
	    -artifact_prefix=$$d/ $$d tests/fuzz/corpus/$$t 2>&1 | grep -E "^(#[0-9]+ *DONE|stat::number_of_executed_units|==[0-9]+==ERROR|SUMMARY)" || true; \
	  test -z "$$(ls $$d | grep -E '^(crash|leak|timeout|oom)-')" || { echo "fuzz_$$t: failing input in $$d" >&2; exit 1; }; \
	  rm -rf $$d; echo "fuzz_$$t: $(FUZZ_QUICK_TIME) s, no failure"; \
	done

# In the normal suite (not inside a sanitizer build).
ifneq ($(SBN_SANITIZE),1)
EXTRA_TEST_CMDS += 'cmd:$(MAKE) --no-print-directory -j2 check-fuzz-quick'
endif
