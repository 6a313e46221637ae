# blitzq: the two commands a new user needs are `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RUNTIME := $(VENV)/.runtime

.PHONY: demo test test-valkey test-django6 test-latest lock chaos-long lint bench install clean

## The project and its run-time dependencies only (what `make demo` needs).
$(RUNTIME): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $(RUNTIME)

## Plus the development set (test runners, linters, the frameworks the tests cover), at the exact
## versions and hashes of the lock (requirements/dev.txt), so a commit tests the same on any day.
## `make lock` refreshes the lock; `make test-latest` runs the suite on the newest releases.
LOCK := requirements/dev.txt
$(STAMP): $(RUNTIME) pyproject.toml $(LOCK)
	$(PY) -m pip install -q --require-hashes -r $(LOCK)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

## README command 1: hash every file of the Python standard library through a real worker.
demo: $(RUNTIME)
	$(PY) examples/stdlib_hash/run_demo.py

## README command 2: lint, type-check and run the whole test suite against Redis (and the
## Django tasks tests again under Django 6 when a Python >= 3.12 is there: test-django6).
## The suite runs in six pytest-xdist worker processes, one test file per worker at a time
## (docs/testing.md, "Worker processes"); PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 6
PYTEST_PARALLEL := $(if $(filter 0,$(PYTEST_WORKERS)),-p no:xdist,-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/mypy
	$(PY) -m pytest -q $(PYTEST_PARALLEL)
	$(MAKE) --no-print-directory test-django6

## The same suite on the embedded Valkey server instead of Redis.
test-valkey: $(STAMP)
	BLITZQ_TEST_REDIS_URL=embedded $(PY) -m pytest -q $(PYTEST_PARALLEL)

## tests/integration/test_django_tasks.py (and test_django_example.py) under Django 6's django.tasks, which needs Python >=
## 3.12: a venv of its own in .venv-dj6 (made once). Without such a Python it says so and skips.
PY312 ?= $(shell for p in python3.13 python3.12 $(HOME)/.pyenv/versions/3.1[2-9]*/bin/python; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1 && { echo $$p; break; }; \
	done)
VENV_DJ6 ?= .venv-dj6

$(VENV_DJ6)/.installed: pyproject.toml requirements/django6.txt
	$(PY312) -m venv $(VENV_DJ6)
	$(VENV_DJ6)/bin/python -m pip install -q --require-hashes -r requirements/django6.txt
	$(VENV_DJ6)/bin/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

ifeq ($(strip $(PY312)),)
test-django6:
	@echo "test-django6: skipped: no Python >= 3.12 found (Django 6 needs it); set PY312=..."
else
test-django6: $(VENV_DJ6)/.installed
	$(VENV_DJ6)/bin/python -m pytest -q -p no:cacheprovider tests/integration/test_django_tasks.py \
		tests/integration/test_django_example.py tests/integration/test_django_admin.py
endif

## Refresh the locks from pyproject.toml and requirements/*.in: the newest releases within the
## ranges, with their hashes (uv pip compile; docs/testing.md, "The locked toolchain").
UV_COMPILE := $(VENV)/bin/uv pip compile -q --generate-hashes --universal
lock: $(STAMP)
	$(UV_COMPILE) --python-version 3.11 pyproject.toml requirements/tools.in --extra dev \
		-o requirements/dev.txt
	$(UV_COMPILE) --python-version 3.12 pyproject.toml requirements/django6.in \
		-o requirements/django6.txt

## The suite on the newest releases that pyproject.toml allows (what a user installing today
## gets), in a venv of its own, .venv-latest: a release that breaks blitzq is seen here before
## users see it and before `make lock` takes it. Not run by CI (its result depends on the day).
VENV_LATEST ?= .venv-latest
test-latest:
	$(PYTHON) -m venv $(VENV_LATEST)
	$(VENV_LATEST)/bin/python -m pip install -q --upgrade pip
	$(VENV_LATEST)/bin/python -m pip install -q --upgrade --upgrade-strategy eager -e ".[dev]"
	$(VENV_LATEST)/bin/python -m pip list --format=freeze > $(VENV_LATEST)/versions.txt
	$(VENV_LATEST)/bin/ruff check src tests bench examples
	$(VENV_LATEST)/bin/mypy
	$(VENV_LATEST)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_PARALLEL)

## The long form of the chaos suite (docs/testing.md); `make test` runs its short form.
chaos-long: $(STAMP)
	BLITZQ_CHAOS=long $(PY) -m pytest -q tests/chaos

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/ruff format --check src tests bench examples
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/bench.py
	$(PY) bench/amqp.py
	$(PY) bench/targets.py

.PHONY: bench-workers
bench-workers: $(STAMP)  ## one vs two worker processes on one queue (bench/README.md)
	$(PY) bench/two_workers.py

.PHONY: bench-metrics
bench-metrics: $(STAMP)  ## the paired metrics-on/off drain (bench/README.md, "Metrics cost")
	$(PY) bench/metrics_cost.py

clean:
	rm -rf $(VENV) $(VENV_DJ6) $(VENV_LATEST) .pytest_cache .mypy_cache .ruff_cache
