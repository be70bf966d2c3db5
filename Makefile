# pdkit: one Makefile for developers and CI. `make check` is exactly what .ci/run runs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SGLANG_VENV := .venv-sglang
SMG_VENV := .venv-smg
ROUTER_VENV := .venv-sglang-router
SGLANG_VERSION := 0.5.23
# The other SGLang versions pdkit supports (kit/sglang/dialects/): each gets its own parser venv,
# .venv-sglang-<version>, for its catalog and the tests that parse rendered argv with it.
SGLANG_OTHER_VERSIONS := 0.5.22
SGLANG_OTHER_VENVS := $(foreach v,$(SGLANG_OTHER_VERSIONS),.venv-sglang-$(v)/.stamp)
TORCH_VERSION := 2.13.0
# Small pure dependencies that SGLang's argument parser imports (see reference section 8), and its
# request path (tests/oracles/sglang_requests.py): openai at SGLang's pin, regex,
# partial-json-parser.
SGLANG_PARSER_DEPS := msgspec psutil numpy orjson pybase64 requests packaging pillow starlette \
	pydantic pyzmq aiohttp fastapi uvicorn uvloop setproctitle openai==2.8.0 regex partial-json-parser

export PDKIT_SGLANG_PYTHON := $(abspath $(SGLANG_VENV))/bin/python
export PDKIT_SMG := $(abspath $(SMG_VENV))/bin/smg
export PDKIT_SGLANG_ROUTER_PYTHON := $(abspath $(ROUTER_VENV))/bin/python

.PHONY: help os-packages venv test test-unit check lint typecheck catalog sglang-version up down slurm-up slurm-down slurm-real bench-lb bench-chaos bench-real bench-real-faults bench-real-kv bench-admission bench-limits bench-vip bench-vip-deployed bench-sim bench-status bench-bench bench-goodput bench-size bench-routing bench-kvpool bench-autoscale clean

help:
	@echo "make up          bring up topologies/local.yaml (sim engine, 2 prefill + 1 decode + router)"
	@echo "make down        stop it"
	@echo "make up-sglang   bring up topologies/local-sglang.yaml (the real SGLang on the CPU, 1 prefill + 1 decode + router)"
	@echo "make down-sglang stop it"
	@echo "make slurm-up    start a real 3-node Slurm here (namespaces, fake GPUs); make slurm-down stops it"
	@echo "make slurm-real  the real SGLang on the CPU up through that Slurm, one request, down"
	@echo "make real-ranks  the real SGLang on the CPU: a 2-rank decode on the multi-host bed, a rank killed under load"
	@echo "make test        the whole test suite (what CI runs)"
	@echo "make check       lint + types + tests, exactly as .ci/run"
	@echo "make catalog     regenerate SGLang flag catalogs from SGLang's own parser"
	@echo "make bench-lb | bench-chaos | bench-real | bench-real-faults | bench-real-kv | bench-admission | bench-limits | bench-vip | bench-vip-deployed | bench-sim | bench-status | bench-bench | bench-goodput | bench-size | bench-routing | bench-kvpool | bench-autoscale"

$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.stamp

$(SGLANG_VENV)/.stamp:
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install -q torch==$(TORCH_VERSION)
	$(SGLANG_VENV)/bin/pip install -q --no-deps sglang==$(SGLANG_VERSION)
	$(SGLANG_VENV)/bin/pip install -q $(SGLANG_PARSER_DEPS)
	touch $@

# Another SGLang version's parser venv, built as .venv-sglang is.
.venv-sglang-%/.stamp:
	$(PYTHON) -m venv .venv-sglang-$*
	.venv-sglang-$*/bin/pip install -q torch==$(TORCH_VERSION)
	.venv-sglang-$*/bin/pip install -q --no-deps sglang==$*
	.venv-sglang-$*/bin/pip install -q $(SGLANG_PARSER_DEPS)
	touch $@

$(SMG_VENV)/.stamp:
	$(PYTHON) -m venv $(SMG_VENV)
	$(SMG_VENV)/bin/pip install -q smg==1.13.0
	touch $@

$(ROUTER_VENV)/.stamp:
	$(PYTHON) -m venv $(ROUTER_VENV)
	$(ROUTER_VENV)/bin/pip install -q sglang-router==0.3.2
	touch $@

# What the tests need from the OS (Debian's names): the Mooncake transfer engine's libraries, the
# multi-host test bed (network namespaces with their own sshd) and Prometheus (promtool checks
# the rendered config; the monitoring e2e runs it) and Slurm with munge (make slurm-up: the
# local 3-node cluster the Slurm launcher's tests run on). Installed as root, else the line to run.
TEST_OS_PACKAGES := libibverbs1 librdmacm1 libnuma1 openssh-server openssh-client iproute2 prometheus \
	slurmctld slurmd slurm-client munge

os-packages:
	@tools/os_packages.sh $(TEST_OS_PACKAGES)

deps: os-packages $(VENV)/.stamp $(SGLANG_VENV)/.stamp $(SGLANG_OTHER_VENVS) $(SMG_VENV)/.stamp sglang-cpu

lint: $(VENV)/.stamp
	$(VENV)/bin/ruff check kit tests tools benchmarks
	$(VENV)/bin/ruff format --check kit tests tools benchmarks
	$(VENV)/bin/ansible-lint playbooks/
	$(PY) -m tools.gen_docs_reference --check

typecheck: $(VENV)/.stamp
	$(VENV)/bin/mypy

# The suite in two runs. First every test but SERIAL_E2E's, spread over PYTEST_WORKERS processes
# (pytest-xdist, --dist loadgroup: an e2e module stays in one worker in file order, so do the
# real engine's modules that share its servers; tests/conftest.py). Most e2e time is waiting on
# servers (a real SGLang server's start is about 30 s of CPU in 30-110 s of wall), so more
# workers than cores, and the real engine's PD module, the longest group, runs beside the rest
# from the start. Then SERIAL_E2E alone, if any. The second runs even if the first failed.
PYTEST_WORKERS ?= 5
# e2e modules whose timing fails beside the other workers on 2 cores, to run alone after the
# rest: none now (the KV pool module waits for its write-through instead).
SERIAL_E2E :=
test: deps
	status=0; \
	$(VENV)/bin/pytest -q -ra --durations=25 -n $(PYTEST_WORKERS) --dist loadgroup \
		$(addprefix --ignore=,$(SERIAL_E2E)) || status=$$?; \
	$(if $(SERIAL_E2E),$(VENV)/bin/pytest -q -ra --durations=5 $(SERIAL_E2E) || status=$$?;) \
	exit $$status

test-unit: $(VENV)/.stamp
	$(VENV)/bin/pytest -q -m "not e2e and not sglang"

check: lint typecheck test

catalog: $(SGLANG_VENV)/.stamp $(SGLANG_OTHER_VENVS)
	$(SGLANG_VENV)/bin/python tools/gen_catalog.py --out kit/sglang/catalogs/$(SGLANG_VERSION).json
	for v in $(SGLANG_OTHER_VERSIONS); do \
		.venv-sglang-$$v/bin/python tools/gen_catalog.py --out kit/sglang/catalogs/$$v.json || exit 1; \
	done

# A new SGLang version (docs/development.md): its parser venv, its catalog, and the review of
# the newest start-up rule table against its source, e.g. `make sglang-version V=0.5.24`.
sglang-version: $(VENV)/.stamp .venv-sglang-$(V)/.stamp
	.venv-sglang-$(V)/bin/python tools/gen_catalog.py --out kit/sglang/catalogs/$(V).json
	$(PY) -m tools.review_startup_rules --base $(SGLANG_VERSION) \
		--srt .venv-sglang-$(V)/lib/python3.11/site-packages/sglang/srt

# From a fresh machine: OS packages (as root, else the apt-get line to run), .venv, then pdkit up.
up:
	PYTHON=$(PYTHON) tools/up_local.sh

down: $(VENV)/.stamp
	$(VENV)/bin/pdkit down topologies/local.yaml

# A real 3-node Slurm on this machine (tests/support/slurm_cluster.py): slurmctld, three slurmd in
# network namespaces with 4 fake GPUs each, munge; in about a second. Then
# `export SLURM_CONF=/tmp/pdkit-slurm/slurm.conf` and `pdkit up topologies/local-slurm.yaml`.
slurm-up: os-packages
	$(PYTHON) -m tests.support.slurm_cluster up

slurm-down:
	$(PYTHON) -m tests.support.slurm_cluster down

bench-lb: $(VENV)/.stamp $(SMG_VENV)/.stamp $(ROUTER_VENV)/.stamp
	$(PY) -m benchmarks.bench_lb

bench-chaos: $(VENV)/.stamp $(SMG_VENV)/.stamp
	$(PY) -m benchmarks.bench_chaos $(BENCH_CHAOS_ARGS)

# The real SGLang on the CPU behind pdkit's router, behind smg and direct: the TTFT/TPOT each adds.
bench-real: $(VENV)/.stamp $(SMG_VENV)/.stamp sglang-cpu
	$(PY) -m benchmarks.bench_real $(BENCH_REAL_ARGS)

# The real SGLang on the CPU with workers dying: a chat stream whose decode is SIGKILLed, the
# poison request with the router's checks off (#34).
bench-real-faults: $(VENV)/.stamp sglang-cpu
	$(PY) -m benchmarks.real_pd_faults $(BENCH_REAL_FAULTS_ARGS)

# The real SGLang's prefills' cached tokens against cache_aware's predictions, on multi-turn
# chats with shared system prompts (#34; --workload ids: /generate with input_ids).
bench-real-kv: $(VENV)/.stamp sglang-cpu
	$(PY) -m benchmarks.real_kv_events --workload chat $(BENCH_REAL_KV_ARGS)

bench-admission: $(VENV)/.stamp
	$(PY) -m benchmarks.bench_admission

# Two clients, one at 5x its token bucket (router.limits): the other's goodput and TTFT p90.
bench-limits: $(VENV)/.stamp
	$(PY) -m benchmarks.bench_limits

# keepalived moving the router's VIP between two namespace hosts (root, keepalived installed).
bench-vip: $(VENV)/.stamp
	$(PY) -m benchmarks.bench_vip

# The VIP's move on a deployment pdkit provision and pdkit up made on the multi-host bed.
bench-vip-deployed: $(VENV)/.stamp
	$(PY) -m benchmarks.bench_vip_deployed

bench-sim: $(VENV)/.stamp
	$(PY) -m benchmarks.bench_sim

bench-status: $(VENV)/.stamp
	$(PY) -m benchmarks.bench_status

bench-bench: $(VENV)/.stamp
	$(PY) -m benchmarks.bench_bench

bench-goodput: $(VENV)/.stamp
	$(PY) -m benchmarks.bench_goodput

bench-size: $(VENV)/.stamp
	$(PY) -m benchmarks.bench_size

bench-routing: $(VENV)/.stamp $(SMG_VENV)/.stamp
	$(PY) -m benchmarks.bench_routing

bench-kvpool: $(VENV)/.stamp
	$(PY) -m benchmarks.bench_kvpool
	$(PY) -m benchmarks.bench_kvpool --workload trace

bench-autoscale: $(VENV)/.stamp
	$(PY) -m benchmarks.bench_autoscale

clean:
	rm -rf $(VENV) $(SGLANG_VENV) .venv-sglang-[0-9]* $(SMG_VENV) $(ROUTER_VENV) $(SGLANG_CPU_VENV) .pytest_cache .mypy_cache .ruff_cache

# Real SGLang 0.5.23 on a CPU-only host (tools/sglang_cpu/): the engine itself, not only its
# parser. One venv, rebuilt only when the installer or its patches change; the tiny model and
# the smoke run's logs go under .pdkit/.
SGLANG_CPU_TORCH ?= 2.13.0
# Cached outside the checkout (3.6 GB, 4-5 min to build), keyed by the installer's own digest of
# its inputs: a fresh clone on the same machine reuses it; .venv-sglang-cpu links to it.
PDKIT_CACHE ?= $(HOME)/.cache/pdkit
SGLANG_CPU_VENV := .venv-sglang-cpu
SGLANG_CPU_CACHED := $(PDKIT_CACHE)/sglang-cpu-$(SGLANG_VERSION)-torch$(SGLANG_CPU_TORCH)
export PDKIT_SGLANG_CPU_PYTHON := $(abspath $(SGLANG_CPU_VENV))/bin/python
.PHONY: sglang-cpu sglang-cpu-smoke up-sglang down-sglang real-ranks
TINY_MODEL := .pdkit/models/tiny-llama

sglang-cpu:
	$(PYTHON) tools/sglang_cpu/install.py --venv $(SGLANG_CPU_CACHED) --torch $(SGLANG_CPU_TORCH)
	ln -sfn $(SGLANG_CPU_CACHED) $(SGLANG_CPU_VENV)

sglang-cpu-smoke: sglang-cpu
	$(SGLANG_CPU_VENV)/bin/python tools/sglang_cpu/smoke.py

# The tiny model topologies/local-sglang.yaml serves (generated, deterministic, not committed).
$(TINY_MODEL)/config.json: tools/tiny_model.py | sglang-cpu
	$(SGLANG_CPU_VENV)/bin/python tools/tiny_model.py --out $(TINY_MODEL) --seed 0

# The real engine on this machine: SGLang 0.5.23 on the CPU behind pdkit's router.
up-sglang: $(VENV)/.stamp sglang-cpu $(TINY_MODEL)/config.json
	$(VENV)/bin/pdkit up topologies/local-sglang.yaml

down-sglang: $(VENV)/.stamp
	$(VENV)/bin/pdkit down topologies/local-sglang.yaml

# The real SGLang 0.5.23 on the CPU, a decode of two ranks on two hosts of the multi-host bed, one
# rank SIGKILLed under load (#35; not in the suite: five real servers start, minutes on 2 cores):
# greedy tokens against one process's, the seconds the instance is away, the requests failed.
# Needs root (network namespaces, sshd). REAL_RANKS_ARGS: --decodes 1 (no other instance), --rate.
real-ranks: $(VENV)/.stamp sglang-cpu
	$(PY) -m benchmarks.real_ranks $(REAL_RANKS_ARGS)

# The real SGLang 0.5.23 on the CPU through Slurm (not in the suite: its start takes minutes):
# topologies/local-slurm-sglang.yaml up on the local cluster, one chat request through the
# router, its status, then down (nothing left in squeue).
SLURM_REAL := topologies/local-slurm-sglang.yaml
slurm-real: $(VENV)/.stamp sglang-cpu $(TINY_MODEL)/config.json slurm-up
	export SLURM_CONF=/tmp/pdkit-slurm/slurm.conf; \
	$(VENV)/bin/pdkit up $(SLURM_REAL) --timeout 900 && \
	node0=$$($(VENV)/bin/python -c 'import json; print(json.load(open(".pdkit/local-slurm-sglang/job.json"))["addresses"]["node0"])') && \
	curl -sS --max-time 120 http://$$node0:8001/v1/chat/completions -H 'Content-Type: application/json' \
		-d '{"model": "tiny-llama", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}' && echo && \
	$(VENV)/bin/pdkit status $(SLURM_REAL); rc=$$?; \
	$(VENV)/bin/pdkit down $(SLURM_REAL); squeue; exit $$rc
