# One entry for everything.  `make run` and `make test` set up what they need.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
TORCH  ?= torch==2.13.0

.PHONY: install run test test-fast lint fmt bench bench-vllm soak browser clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH)" numpy
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## Start the service with the demo workload: http://127.0.0.1:8000/
run: $(STAMP)
	$(VENV)/bin/blockpool serve --demo

## Every test: lint, types, unit, property, service, browser.
test: $(STAMP) browser
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -p no:cacheprovider --hypothesis-profile=ci

test-fast: $(STAMP)
	$(PY) -m pytest -x -q -m "not browser and not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

fmt: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

## Headless Chromium for the browser tests (Debian's package; root installs it).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium is missing: install Debian's chromium package (browser tests fail without it)"; fi; }

bench: $(STAMP)
	$(PY) bench/bench_pool.py

## Side by side with vLLM 0.16.0's own pool (builds /tmp/vllm016 once).
bench-vllm:
	bash ../shared/vllm-speed-reference/vllm016_setup.sh
	/tmp/vllm016/bin/python ../shared/vllm-speed-reference/bench_vs_vllm.py --candidate blockpool --candidate-path . --variant both

soak: $(STAMP)
	$(PY) -m tests.blockpool.soak --ops 2000000

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis test-artifacts
