# Two commands on a fresh machine: `make run` and `make test`. Everything installs into .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test test-unit test-integration test-e2e lint bench clean

# A GPU host (docs/benchmarks.md, "Through the platform on one GPU"): where $(PYTHON) already imports a CUDA
# torch, or a wheel folder is given (`make run WHEELS=DIR`, staged by tools/stage_gpu_wheels.sh for an offline
# host), .venv is made over that Python with its torch kept and the platform installed beside it
# (tools/host_venv.sh; offline from WHEELS). `HOST_TORCH=` (empty) forces the CPU install below.
WHEELS ?=
HOST_TORCH ?= $(shell $(PYTHON) -c 'import torch; print("cuda" if torch.version.cuda else "")' 2>/dev/null)

$(STAMP): pyproject.toml constraints.txt
ifneq ($(WHEELS)$(HOST_TORCH),)
	bash tools/host_venv.sh $(VENV) $(PYTHON) $(WHEELS)
else
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: the CPU build installs from local disk; see constraints.txt
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[runtime,megatron,dev]"
endif
	touch $(STAMP)

install: $(STAMP)

# The dashboard (web/): built into web/dist, which the API serves at /. Where npm is missing it is
# skipped with a warning, and the API serves a plain page at / instead. npm ci runs only when the
# lockfile is newer than the installed node_modules.
WEB_SOURCES := $(shell find web/src web/scripts -type f 2>/dev/null) web/index.html web/package.json \
	web/package-lock.json web/vite.config.ts web/tsconfig.json examples/grpo-arith.yaml
.PHONY: web
web: web/dist/index.html  ## build the dashboard into web/dist

web/dist/index.html: $(WEB_SOURCES)
	@if command -v npm >/dev/null 2>&1; then \
	  cd web && { [ node_modules/.package-lock.json -nt package-lock.json ] || npm ci --no-audit --no-fund; } \
	  && npm run build; \
	else \
	  echo "warning: npm not found: the dashboard is not built (the API serves a plain page at /)"; \
	fi

install: web/dist/index.html

# Debian's Chromium for the browser tests (tests/browser): Playwright's own browser download does not work on
# these machines. `make test` never installs it: where no `chromium` is on PATH the browser tests skip, saying
# so. `make browser` is the explicit step that installs it with apt-get (as root: it changes this machine
# outside the checkout, and says so first); .ci/run calls it before `make test`.
.PHONY: browser
browser:  ## install Debian's chromium for the browser tests (apt-get, needs root)
	@if command -v chromium >/dev/null 2>&1; then \
	  echo "browser: $$(command -v chromium) is installed"; \
	else \
	  echo "browser: installing Debian's chromium with apt-get (outside this checkout: system packages)"; \
	  apt-get update && apt-get install -y chromium; \
	fi

run: install  ## start the embedded platform on http://127.0.0.1:8400
	$(VENV)/bin/relaxctl up

# Two pytest-xdist workers by default (`-n 2 --dist loadgroup`): the tests that start Ray, a Celery worker or a
# whole platform run in two lanes, one worker each, the first lane from the start and the last after the light
# tests, so that two of them rarely run at once (tests/conftest.py says why and how). Measured on this 2-core
# machine: pytest 1,034 s (fresh clone, 2026-12-04) and 1,359 s (fresh clone, 2026-12-05) with three heavy groups
# side by side; the lanes: see README's Tests line. The last serial run took 2,793 s (before the learning tests
# were shortened) and three workers 2,535 s (three heavy groups at once overload two cores).
# `make test PYTEST_XDIST=` (empty) or `PYTEST_ARGS="-n 0"` runs serially.
PYTEST_XDIST ?= -n 2 --dist loadgroup
test: install  ## the whole suite (unit, integration on SQLite+PostgreSQL and Redis, Ray, end to end)
	@command -v chromium >/dev/null 2>&1 || echo "note: no chromium on PATH: the browser tests will skip (\`make browser\` installs it)"
	$(PY) -m pytest -q -ra $(PYTEST_XDIST) $(PYTEST_ARGS)

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
