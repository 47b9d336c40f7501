# Two commands on a fresh machine: `make run` and `make test`. Everything installs into .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test test-unit test-integration test-e2e lint bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: the CPU build installs from local disk; see constraints.txt
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[runtime,megatron,dev]"
	touch $(STAMP)

install: $(STAMP)

run: install  ## start the embedded platform on http://127.0.0.1:8400
	$(VENV)/bin/relaxctl up

test: install  ## the whole suite (unit, integration on SQLite+PostgreSQL and Redis, Ray, end to end)
	$(PY) -m pytest -q -ra $(PYTEST_ARGS)

test-unit: install
	$(PY) -m pytest -q tests/unit

test-integration: install
	$(PY) -m pytest -q tests/integration

test-e2e: install
	$(PY) -m pytest -q tests/e2e

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) .relax
