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

# The declared torch range, tested: the pin above (make test), the newest release and the floor
# (pyproject.toml's torch>=; today the pin's release, so CI's make test covers it), each in a venv
# of its own with only what these tests need. Measured here: the newest's venv installs in
# ~7.5 min (5.8 GB) and its tests take ~18 min on 2 shared cores, so CI runs it only when asked
# (HASTEN_CI_TORCH_NEWEST=1 bash .ci/run), which keeps CI near its 30-minute aim. torch
# comes from the package registry (a CUDA build, ~5 GB with its libraries; it runs on CPU), so
# the machine's own cap on torch versions is lifted for these installs alone.
TORCH_NEWEST ?= 2.15.*
TORCH_FLOOR ?= 2.13.*
TORCH_TESTS ?= tests/unit/compiler tests/unit/sifting $(wildcard tests/integration/test_compile_*.py)
TORCH_TEST_DEPS := numpy tqdm pytest pytest-timeout transformers accelerate scikit-learn

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

test-torch-newest:
	$(MAKE) --no-print-directory _test-torch TORCH_SPEC='$(TORCH_NEWEST)' TORCH_VENV=.venv-torch-newest

test-torch-floor:
	$(MAKE) --no-print-directory _test-torch TORCH_SPEC='$(TORCH_FLOOR)' TORCH_VENV=.venv-torch-floor

# One venv per torch release; rebuilt when the release asked for or the pins change.
_test-torch:
	@test -n "$(TORCH_SPEC)" && test -n "$(TORCH_VENV)"
	@if [ ! -f $(TORCH_VENV)/.installed ] || [ "$$(cat $(TORCH_VENV)/.installed)" != "$(TORCH_SPEC)" ] \
	    || [ requirements-dev.txt -nt $(TORCH_VENV)/.installed ]; then \
	  set -e; start=$$(date +%s); rm -rf $(TORCH_VENV); $(PYTHON) -m venv $(TORCH_VENV); \
	  PIP_CONSTRAINT=/dev/null $(TORCH_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
	    "torch==$(TORCH_SPEC)" \
	    $$(for p in $(TORCH_TEST_DEPS); do grep -i "^$$p==" requirements-dev.txt; done); \
	  $(TORCH_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .; \
	  echo '$(TORCH_SPEC)' > $(TORCH_VENV)/.installed; \
	  echo "$(TORCH_VENV): installed in $$(( $$(date +%s) - start )) s, $$(du -sh $(TORCH_VENV) | cut -f1)"; \
	fi
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
