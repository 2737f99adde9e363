# Two commands do all set-up on a fresh machine:
#   make demo   create .venv, install, run the eager vs hasten side-by-side (table + plot)
#   make test   create .venv, install, run the whole test suite (slow tests included)
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_OUT ?= out/demo
PYTEST_ARGS ?=
LINT_PATHS := src tests $(wildcard benchmarks)

# The declared torch range, tested: the pin (make test), the newest release on the package index
# and the floor (pyproject.toml's torch>=; today the pin's release, so make test covers it too),
# each on the compiler and sifting unit tests and the compile integration tests. Each release gets
# an overlay venv (.ci/torch_venv.py): torch alone is installed over .venv, whose packages it
# shares, so only torch (the registry's CUDA build, 5.2 GB with its libraries; it runs on CPU) is
# downloaded, and the machine's own cap on torch versions is lifted for it alone. Measured here
# (2-core AMD EPYC, load ~1.5): torch 2.15.0's overlay installed in 97 s (the earlier separate venv,
# test dependencies included, took ~450 s); its tests (480) took 821 s here under load 5-8
# (2026-12-02). CI (.ci/run) runs the newest on every run, its download beside make test.
# The floor is the pin because older releases do not pass: 2.6 failed 24 of 462; 2.12.1
# (2026-12-03, Xeon) failed one compiler unit test and then hung in the compile integration
# tests (killed after 25 min); 2.7-2.11 untried.
TORCH_NEWEST ?= newest
TORCH_FLOOR ?= 2.13.*
TORCH_TESTS ?= tests/unit/compiler tests/unit/sifting $(wildcard tests/integration/test_compile_*.py)

.PHONY: demo test test-fast lint format venv clean test-torch-newest test-torch-floor

venv: $(STAMP)

# torch first, from the pinned list, so nothing pulls a multi-GB CUDA build through a range.
$(STAMP): pyproject.toml requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --disable-pip-version-check "$$(grep '^torch==' requirements-dev.txt)"
	$(VPY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(VPY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

demo: $(STAMP)
	$(VENV)/bin/hasten demo --out $(DEMO_OUT)

test: $(STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VPY) -m pytest $(PYTEST_ARGS)

# Inner loop: skips tests marked slow.
test-fast: $(STAMP)
	$(VPY) -m pytest -m "not slow" $(PYTEST_ARGS)

# Exit status 3 from .ci/torch_venv.py: that torch cannot be had here (index unreachable), said
# in one line; .ci/run reports it and goes on, make fails.
test-torch-newest: $(STAMP)
	$(PYTHON) .ci/torch_venv.py '$(TORCH_NEWEST)' .venv-torch-newest --base $(VENV)
	$(MAKE) --no-print-directory _test-torch TORCH_VENV=.venv-torch-newest

test-torch-floor: $(STAMP)
	$(PYTHON) .ci/torch_venv.py '$(TORCH_FLOOR)' .venv-torch-floor --base $(VENV)
	$(MAKE) --no-print-directory _test-torch TORCH_VENV=.venv-torch-floor

_test-torch:
	@test -n "$(TORCH_VENV)"
	$(TORCH_VENV)/bin/python -c "import torch; print('torch', torch.__version__)"
	$(TORCH_VENV)/bin/python -m pytest $(TORCH_TESTS) $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)

format: $(STAMP)
	$(VENV)/bin/ruff check --fix $(LINT_PATHS)
	$(VENV)/bin/ruff format $(LINT_PATHS)

clean:
	rm -rf $(VENV) .venv-torch-newest .venv-torch-floor out .pytest_cache .ruff_cache
