# The Python package (python/syncbn: ctypes over libsyncbn.so, no build
# against PyTorch) and its tests, run with Debian's torch (/usr/bin/python3).
#
#   make python-install [VENV=dir]   build libsyncbn, create the venv (default
#                                    ./venv, --system-site-packages so that it
#                                    sees python3-torch) and pip-install the
#                                    package with libsyncbn.so bundled
.DEFAULT_GOAL := all
VENV ?= $(CURDIR)/venv
DEPS_PYTHON := python3-torch python3-venv python3-setuptools
DEPS_TEST += $(DEPS_PYTHON)
PY_TEST_ENV := PYTHONPATH=python SYNCBN_LIBRARY=$(abspath $(BUILD)/libsyncbn.so)
# Not in the sanitizer builds: an instrumented libsyncbn.so needs its
# sanitizer runtime loaded before everything else, and preloaded into the
# interpreter (LD_PRELOAD) ASan's C++ exception interceptor fails on torch's
# first exception. The C tests run the same library paths instrumented.
ifneq ($(SBN_SANITIZE),1)
EXTRA_TEST_CMDS += 'cmd:$(PY_TEST_ENV) $(PYTHON) tests/python/test_module.py' \
                   'cmd:$(PY_TEST_ENV) $(PYTHON) tests/python/test_distributed.py 2 3' \
                   'cmd:$(PY_TEST_ENV) $(PYTHON) tests/python/test_cuda.py' \
                   'cmd:$(PY_TEST_ENV) $(PYTHON) bench/python_bn.py --quick' \
                   'cmd:tests/python/test_install.sh $(BUILD)'
endif

.PHONY: python-install
python-install: deps-build
	@scripts/deps.sh $(DEPS_PYTHON)
	@$(MAKE) --no-print-directory $(BUILD)/libsyncbn.so
	@[ -x $(VENV)/bin/python ] || $(PYTHON) -m venv --system-site-packages $(VENV)
	@rm -rf $(BUILD)/python-pkg && cp -r python $(BUILD)/python-pkg
	SYNCBN_LIBRARY=$(abspath $(BUILD)/libsyncbn.so) $(VENV)/bin/python -m pip install -q \
	    --no-build-isolation --no-deps --no-index --force-reinstall $(BUILD)/python-pkg
	@$(VENV)/bin/python -c 'import torch' 2>/dev/null || echo "python-install: warning: torch is not importable in $(VENV) (create it with --system-site-packages, or install torch there)" >&2
	@echo "syncbn installed into $(VENV): . $(VENV)/bin/activate"

# The same Python tests under the newest PyTorch from PyPI (a separate venv,
# a few GB of download: not part of `make test`, which uses Debian's 1.13).
#   make python-test-pypi-torch [TORCH_VENV=dir] [TORCH_SPEC=torch==2.15.0]
TORCH_VENV ?= $(BUILD)/venv-pypi-torch
TORCH_SPEC ?= torch
.PHONY: python-test-pypi-torch
python-test-pypi-torch: deps-build
	@scripts/deps.sh $(DEPS_PYTHON)
	@$(MAKE) --no-print-directory $(BUILD)/libsyncbn.so
	@[ -x $(TORCH_VENV)/bin/python ] || $(PYTHON) -m venv $(TORCH_VENV)
	@$(TORCH_VENV)/bin/python -c 'import torch' 2>/dev/null || $(TORCH_VENV)/bin/python -m pip install -q '$(TORCH_SPEC)' numpy
	@$(TORCH_VENV)/bin/python -c 'import torch; print("PyTorch", torch.__version__, "from PyPI in $(TORCH_VENV)")'
	$(PY_TEST_ENV) $(TORCH_VENV)/bin/python tests/python/test_module.py
	$(PY_TEST_ENV) $(TORCH_VENV)/bin/python tests/python/test_distributed.py 2 3
	$(PY_TEST_ENV) $(TORCH_VENV)/bin/python tests/python/test_cuda.py
