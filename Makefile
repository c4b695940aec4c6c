# The README's two commands: `make demo` and `make test`. Both create (or reuse) a local
# virtual environment; constraints.txt pins torch to the local CPU wheel here.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --disable-pip-version-check -q -c constraints.txt
SHARED_DATA := $(abspath ../shared/data)
export PYRO_EXT_DATA ?= $(if $(wildcard $(SHARED_DATA)),$(SHARED_DATA),)

.PHONY: demo test test-integration test-all test-slow bench gpu-check lint format docs clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(PY) pyproject.toml constraints.txt
	$(PIP) -e .
	@touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) -e ".[test]"
	@touch $@

$(VENV)/.installed-demo: $(VENV)/.installed
	$(PIP) -e ".[demo]"
	@touch $@

$(VENV)/.installed-docs: $(VENV)/.installed
	$(PIP) -e ".[docs]"
	@touch $@

$(VENV)/.installed-lint: $(PY) constraints.txt
	$(PIP) ruff
	@touch $@

# ruff's rules and format settings live in pyproject.toml; CI runs this target.
lint: $(VENV)/.installed-lint
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Apply the house format and the safe lint fixes.
format: $(VENV)/.installed-lint
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The API reference (docs/_build/html), warnings as errors, and the docstrings' examples.
# The tutorials are executed (quick mode) for the site first; fresh copies are reused, such as
# those the integration tests saved (docs/execute_tutorials.py).
docs: $(VENV)/.installed-docs
	$(PY) docs/execute_tutorials.py
	$(VENV)/bin/sphinx-build -W --keep-going -q -b html docs docs/_build/html
	$(PY) docs/check_links.py docs/_build/html
	$(VENV)/bin/sphinx-build -W --keep-going -q -b doctest docs docs/_build/doctest

# The tour prints its results and writes its figures to pyro_ext_demo_figures/.
demo: $(VENV)/.installed-demo
	$(PY) -m pyro_ext.demo

# pytest exits 5 when it collects no test: that is not a failure of the suite.
# The default run: every module's unit tests, about five minutes on 2 cores (5 min 1 s for
# 2047 tests on a quiet machine); the long statistical checks are in test-integration, each
# module keeping a fast test here. The slowest tests are listed at the end, so that they stay
# in view.
test: $(VENV)/.installed-test
	$(PY) -m pytest -n 2 -q --durations=20; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; fi; exit $$rc

# End to end: each benchmark's quick mode, each demo chapter and each tutorial notebook; and
# the unit tests' long statistical checks (each says why it is here), whose modules keep a
# fast test in the default run. The slowest are listed at the end here too.
test-integration: $(VENV)/.installed-test
	$(PY) -m pytest -n 2 -q --durations=20 -m "integration and not slow"; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; fi; exit $$rc

# What CI runs: the two above.
test-all: test test-integration

test-slow: $(VENV)/.installed-test
	$(PY) -m pytest -n 2 -q -m slow; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; fi; exit $$rc

# The CUDA check (README, "Running on CUDA"): the device-fixture tests on CUDA and the
# benchmarks' CUDA rows in at most 8 minutes, written to benchmarks/results/cuda.md; it stops
# at the first broken capability. It runs with the Python that has CUDA torch (GPU_PYTHON),
# not the CPU venv, and installs nothing.
GPU_PYTHON ?= $(PYTHON)
gpu-check:
	$(GPU_PYTHON) benchmarks/gpu_check.py --device cuda

bench: $(VENV)/.installed
	for script in benchmarks/[!_]*.py; do $(PY) $$script || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis docs/_build pyro_ext_demo_figures
