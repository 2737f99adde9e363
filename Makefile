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

.PHONY: demo test test-fast lint format venv clean

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

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)

format: $(STAMP)
	$(VENV)/bin/ruff check --fix $(LINT_PATHS)
	$(VENV)/bin/ruff format $(LINT_PATHS)

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache
