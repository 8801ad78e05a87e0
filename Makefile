# Two commands do all the set-up: `make run` (the embedded default job) and `make test`.
# Both create the virtual environment first when it is missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed first, from your pip index: PyPI's Linux wheel of torch 2.13.0 is a CUDA
# build (several GB); a machine whose index or wheel cache holds the CPU wheel gets that. For a
# CPU-only install elsewhere: make test TORCH_SPEC="torch==2.13.0 --index-url
# https://download.pytorch.org/whl/cpu". Any torch >= 2.6 works (pyproject.toml).
TORCH_SPEC ?= torch==2.13.0
ARGS ?=

.PHONY: venv run test test-unit lint format bench clean-runs

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

run: venv
	$(PY) -m raytrain_vla.run $(ARGS)

test: venv
	$(PY) -m pytest -q --durations=15 tests

test-unit: venv
	$(PY) -m pytest -q tests/unit

lint: venv
	$(VENV)/bin/ruff check raytrain_vla tests benchmarks notebooks
	$(VENV)/bin/ruff format --check raytrain_vla tests benchmarks notebooks

format: venv
	$(VENV)/bin/ruff format raytrain_vla tests benchmarks notebooks

bench: venv
	$(PY) benchmarks/overhead.py
