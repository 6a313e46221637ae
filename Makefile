# blitzq: the two commands a new user needs are `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RUNTIME := $(VENV)/.runtime

.PHONY: demo test test-valkey chaos-long lint bench install clean

## The project and its run-time dependencies only (what `make demo` needs).
$(RUNTIME): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $(RUNTIME)

## Plus the development set (test runners, linters, the frameworks the tests cover).
$(STAMP): $(RUNTIME) pyproject.toml
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

## README command 1: hash every file of the Python standard library through a real worker.
demo: $(RUNTIME)
	$(PY) examples/stdlib_hash/run_demo.py

## README command 2: lint, type-check and run the whole test suite against Redis.
test: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/mypy
	$(PY) -m pytest -q

## The same suite on the embedded Valkey server instead of Redis.
test-valkey: $(STAMP)
	BLITZQ_TEST_REDIS_URL=embedded $(PY) -m pytest -q

## The long form of the chaos suite (docs/testing.md); `make test` runs its short form.
chaos-long: $(STAMP)
	BLITZQ_CHAOS=long $(PY) -m pytest -q tests/chaos

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/ruff format --check src tests bench examples
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/bench.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
