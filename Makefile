# gpupool: everything a fresh machine needs is behind `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CKSUM  := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
STAMP  := $(VENV)/.installed-$(CKSUM)
DEMO_STAMP := $(VENV)/.installed-demo-$(CKSUM)
PYZ    := dist/gpupool-run.pyz

.PHONY: all install install-demo pyz demo demo-sharing lint docs test test-fast test-loaded gpu-check bench deploy undeploy cluster-build cluster-up cluster-down clean

all: install pyz

# Everything `make test` needs: all extras, TensorFlow, Lightning and the dev tools (minutes, GBs).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[all,dev,tf,lightning]"
	touch $@

# What `make demo` needs, no more: gpupool and its reference trainer (PyTorch, torchvision,
# scikit-learn; README says how long it takes). The full install above holds it already.
$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	test -f $(STAMP) || { $(BIN)/pip install -q --upgrade pip && $(BIN)/pip install -q -e ".[train]"; }
	touch $@

# The editable install runs from src/: compile it (pip does that for a wheel) so that `gpupool run`
# does not compile its modules at every start, also where PYTHONDONTWRITEBYTECODE is set.
# Bytecode is only a speed-up: a file that does not compile here fails in its tests instead.
install: $(STAMP)
	-$(BIN)/python -m compileall -q src/gpupool

install-demo: $(DEMO_STAMP)
	-$(BIN)/python -m compileall -q src/gpupool

# The workload side (core/, pooling/, workload/ and the stdlib verbs) as one stdlib-only zipapp.
pyz: $(DEMO_STAMP)
	$(BIN)/python tools/build_pyz.py $(PYZ)

# The main job: scikit-learn's digits, 2 data-parallel workers sharing an emulated pool.
demo: install-demo pyz
	GPUPOOL=$(BIN)/gpupool examples/digits_ddp_demo.sh

# Several concurrent `gpupool run`s sharing emulated GPUs, one of them queued.
demo-sharing: install-demo pyz
	$(BIN)/python examples/demo.py

# ruff (lint + format) and mypy (strict on the floors below server/jobs/kube/train); `make test` runs it first.
lint: install
	$(BIN)/ruff check src tests benchmarks tools examples
	$(BIN)/ruff format --check src tests benchmarks tools examples
	$(BIN)/mypy

# The documentation site into site/ (not committed); --strict fails on a broken link or anchor, a
# page missing from the nav, or a reference page or figure that cannot be generated (tools/docs/).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

test: install pyz lint docs cluster-build
	$(BIN)/python -m pytest -q

test-fast: install pyz
	$(BIN)/python -m pytest -q -m "not slow"

# The tests with a CPU hog on each core, as a busy CI machine runs them: a test that races the
# clock fails here (issue 39). Hogs: Debian's stress-ng (installed when missing and we are root),
# else busy Python loops; the trap ends them on every exit path. PYTEST_ARGS narrows the run, e.g.
# `make test-loaded PYTEST_ARGS=tests/serving/server`; HOGS sets how many.
HOGS        ?= $(shell nproc)
PYTEST_ARGS ?=
test-loaded: install pyz
	@hogs=""; trap 'kill $$hogs 2>/dev/null; wait 2>/dev/null' EXIT; trap 'exit 130' INT TERM HUP; \
	if ! command -v stress-ng >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get install -y -qq stress-ng >/dev/null 2>&1 || \
		{ apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq stress-ng >/dev/null 2>&1; } || true; \
	fi; \
	if command -v stress-ng >/dev/null; then \
		stress-ng --cpu $(HOGS) --quiet & hogs=$$!; echo "load: stress-ng --cpu $(HOGS)"; \
	else \
		for i in $$(seq $(HOGS)); do $(BIN)/python -c 'while 1: pass' & hogs="$$hogs $$!"; done; \
		echo "load: $(HOGS) busy Python loops"; \
	fi; \
	start=$$(date +%s); \
	$(BIN)/python -m pytest -q $(PYTEST_ARGS); code=$$?; \
	echo "tests under load took $$(( $$(date +%s) - start )) s (exit $$code)"; exit $$code

# On a machine with an NVIDIA GPU: the shares hold (hooks, MPS), two half shares fit, and the
# CUDA context overhead per process; figures in benchmarks/results/gpu-*.json.
gpu-check: install pyz
	$(BIN)/python -m pytest -m gpu tests/gpu -v -rs

bench: install pyz
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

# Kubernetes: certificates + kustomize (see docs/guides/kubernetes.md).
deploy:
	deploy/certs.sh && kubectl apply -k deploy/

undeploy:
	kubectl delete -k deploy/ --ignore-not-found

# A real Kubernetes control plane on loopback (tools/kube_cluster): etcd, kube-apiserver,
# controller-manager, kube-scheduler calling gpupool's extender, kwok with NODES nodes of GPUS
# GPUs and gpupool's components, built from the Go modules pinned in tools/kube-cluster (cold
# build: see docs/guides/kubernetes.md; then cached). `eval "$$(make -s cluster-up)"` sets KUBECONFIG.
NODES ?= 4
GPUS  ?= 8
# Of the NODES, how many run a real kubelet with containerd (root; the Debian packages .ci/run installs).
REAL_NODES ?= 0
# `make test` builds them first (a cold build inside a test would outrun its timeout); where Go
# is absent the cluster tests skip and say so.
cluster-build:
	@if command -v go >/dev/null; then tools/kube-cluster/build.sh >/dev/null && tools/kube-cluster/build.sh kueue kubelet >/dev/null; \
	else echo "cluster-build: no Go here; the cluster tests will skip"; fi

cluster-up: install pyz
	NODES=$(NODES) GPUS=$(GPUS) REAL_NODES=$(REAL_NODES) $(BIN)/python -m tools.kube_cluster up

cluster-down:
	$(BIN)/python -m tools.kube_cluster down

clean:
	rm -rf dist build site .pytest_cache .hypothesis src/*.egg-info
