# One entry point for every task. `make run` and `make test` are the two commands of the README.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
REPO_ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
# Built Go binaries go to $(GO_CACHE_DIR)/bin (Go's own caches stay where `go env` says).
GO_CACHE_DIR ?= $(HOME)/.cache/ca-externalgrpc-go
# A Go module proxy directory serving the cluster-autoscaler versions the go.mod files pin from
# CA 1.35 on (the public proxy does not have them); see tests/conformance/README.md.
CA_MODULE_PROXY ?= $(abspath $(REPO_ROOT)/../shared/goproxy)
export GO_CACHE_DIR CA_MODULE_PROXY
# Which build.toml groups `make build` compiles; empty means all. The suite targets below narrow it
# for their own run (a target-specific value also applies to that target's prerequisites).
GO_BUILD_GROUPS ?=

.PHONY: install lock audit reproduce release native-test protos protos-check run build test unit integration conformance chaos e2e e2e-ca-matrix e2e-image node-e2e node-images kube lint typecheck bench bench-ca bench-kube soak alerts clean wheels image deploy-check docs reference

# Everything from the lock (uv.lock, exported to requirements/; tests/support/lock.py): first the
# dev set with every file's hash checked (--require-hashes; --no-deps: the lock already holds every
# dependency), then the lock's check against pyproject.toml, then the project itself in editable mode
# with no dependency of its own (--no-deps) and the locked setuptools as its build backend
# (--no-build-isolation: nothing is fetched outside the lock). Quiet: pip says nothing unless something
# fails, and setuptools' notice that every editable install prints (a folder named like the package may
# shadow it) is filtered out; errors still show.
LOCKED_DEPS := $(VENV)/.locked-deps
$(LOCKED_DEPS): requirements/dev.txt
	@$(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps -r requirements/dev.txt
	@touch $@
$(STAMP): $(LOCKED_DEPS) pyproject.toml uv.lock
	@$(PY) -m tests.support.lock --check --who "make install"
	@PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

# Update the lock after a change of pyproject.toml's dependencies: uv keeps every locked version the
# ranges still allow and resolves the rest (a few seconds), then writes requirements/. To move
# everything to the newest versions the ranges allow: make lock LOCK_ARGS=--upgrade (or
# --upgrade-package NAME).
lock: $(LOCKED_DEPS)
	@$(PY) -m tests.support.lock --write $(LOCK_ARGS)

# The native serving engine (native/, Rust): built by maturin into the venv, rebuilt when its sources
# change. Cargo keeps its downloads in $(HOME)/.cargo and its build in native/target (both reused);
# a first build fetches the crates from crates.io and takes a few minutes on 2 cores.
# rustup looks for its toolchains in $RUSTUP_HOME, by default ~/.rustup. With HOME pointed at a fresh
# folder (a clean CI home) it finds none, so fall back to the toolchains installed beside the cargo on
# PATH (rustup keeps ~/.cargo/bin and ~/.rustup side by side).
ifeq ($(RUSTUP_HOME),)
ifneq ($(shell cargo --version > /dev/null 2>&1 || echo broken),)
RUSTUP_BESIDE_CARGO := $(abspath $(dir $(shell command -v cargo))/../../.rustup)
ifneq ($(wildcard $(RUSTUP_BESIDE_CARGO)/toolchains),)
export RUSTUP_HOME := $(RUSTUP_BESIDE_CARGO)
endif
endif
endif
NATIVE_STAMP := $(VENV)/.native-installed
NATIVE_SOURCES := native/Cargo.toml native/Cargo.lock native/pyproject.toml $(wildcard native/src/*.rs)
$(NATIVE_STAMP): $(STAMP) $(NATIVE_SOURCES)
	@cargo --version > /dev/null 2>&1 || { echo "make install: the native engine needs a working Rust toolchain (cargo on PATH; with rustup, a default toolchain)"; exit 1; }
	@echo "building the native serving engine (native/) with cargo; progress below"
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release --manifest-path native/Cargo.toml
	@touch $(NATIVE_STAMP)
	@echo "installed into $(VENV) from the lock (requirements/dev.txt): $(VENV)/bin/ca-externalgrpc --version prints"
	@$(VENV)/bin/ca-externalgrpc --version | sed 's/^/  /'

install: $(STAMP) $(NATIVE_STAMP)

# The two distributions as wheels in dist/: the server (pure Python) and the native engine (one abi3
# wheel for CPython >= 3.11, built by maturin with the cargo on PATH; its build reuses native/target).
# `pip install` of them needs no Rust (docs/how-to/install.md); make image takes the native one.
# Each is rebuilt only when its sources change. Both are built by the lock's tools (setuptools without
# build isolation, maturin), from the venv make install made.
SERVER_SOURCES := pyproject.toml setup.py README.md $(shell find protos server providers -name '*.py' -not -path '*/__pycache__/*' 2>/dev/null)
# The server's wheel records the commit it is built from (setup.py; ca-externalgrpc --version): a new
# commit rebuilds it, through dist/.commit, which changes only when HEAD does.
HEAD_COMMIT := $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
$(shell mkdir -p dist && [ "$$(cat dist/.commit 2>/dev/null)" = "$(HEAD_COMMIT)" ] || echo "$(HEAD_COMMIT)" > dist/.commit)
dist/.server-wheel: $(STAMP) $(SERVER_SOURCES) dist/.commit
	@echo "building the server's wheel into dist/"
	@rm -f dist/ca_externalgrpc_server-*.whl
	@$(PY) -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation --wheel-dir dist .
	@rm -rf build ca_externalgrpc_server.egg-info
	@touch $@
dist/.native-wheel: $(STAMP) $(NATIVE_SOURCES)
	@cargo --version > /dev/null 2>&1 || { echo "make wheels: the native engine's wheel needs a working Rust toolchain (cargo on PATH; with rustup, a default toolchain)"; exit 1; }
	@echo "building the native engine's wheel into dist/ with cargo; progress below"
	@rm -f dist/ca_externalgrpc_native-*.whl
	$(VENV)/bin/maturin build --release --locked --manifest-path native/Cargo.toml --out dist
	@touch $@
wheels: dist/.server-wheel dist/.native-wheel
	@ls -l dist/*.whl

# Regenerate the Python code from protos/*.proto (the only place generated code lives).
protos: install
	$(PY) -m server.protogen --write

protos-check: install
	$(PY) -m server.protogen --check

# The demo: our server in front of both simulated clouds. Other ports: make run LISTEN=... HTTP_LISTEN=...
LISTEN ?= 127.0.0.1:8086
HTTP_LISTEN ?= 127.0.0.1:8087
# Without Rust (no working cargo) the native engine is left out and the demo serves on grpcio, saying so
# in the same one line at start as a pip install of the server's wheel alone.
run: $(STAMP)
	@if cargo --version > /dev/null 2>&1; then $(MAKE) --no-print-directory $(NATIVE_STAMP); fi
	@$(PY) -m devstack --listen $(LISTEN) --http-listen $(HTTP_LISTEN)

# The references generated from the code (docs/reference/config.md, metrics.md, cli.md, alerts.md;
# tests/support/reference.py): run after a change of a config key, a metric, a CLI option or an alert.
# make test fails, naming this command, while a page and the code disagree (tests/docs/test_reference.py).
reference: install
	@$(PY) -m tests.support.reference --write

# The docs site: docs/ built by MkDocs with the Material theme into site/ (never committed), strictly: a
# link to a missing page, file or heading fails it (mkdocs.yml; make test runs the same build in
# tests/docs/test_site.py). NO_MKDOCS_2_WARNING: the theme's notice about MkDocs 2.0 (pyproject.toml
# keeps MkDocs below 2).
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy server providers simulators devstack deploy/sbom.py

# The one Go build step: every binary declared by a build.toml (tests/support/gobuild.py), rebuilt
# only when its sources or Go changed. Tests never compile; they fail with "run make build".
build: install
	$(PY) -m tests.support.gobuild $(addprefix --group ,$(GO_BUILD_GROUPS))

unit: install
	$(PY) -m pytest -q tests/unit

integration: GO_BUILD_GROUPS = conformance bench integration
integration: build
	$(PY) -m pytest -q tests/integration

conformance: GO_BUILD_GROUPS = conformance
conformance: build
	$(PY) -m tests.conformance.run

# End-to-end: the real cluster-autoscaler 1.36.1 with etcd, kube-apiserver and kube-scheduler against
# our server and the simulated clouds, every scenario (tests/e2e/README.md). make test runs the smoke.
# (bench: the upstream example server, which the smoke of make bench-ca runs against the real CA too;
# deploy and ca-matrix: the compatibility matrix below, part of make e2e.)
# (The scenarios on a real node have their own target, make node-e2e.)
E2E_STEADY_SECONDS ?= 180
# Rounds of the split-brain scenario (tests/e2e/test_failover.py), each variant; make test runs one round.
E2E_PARTITION_ROUNDS ?= 10
e2e: GO_BUILD_GROUPS = e2e bench deploy ca-matrix
e2e: build
	$(PY) -m pytest -q tests/e2e --e2e -m "not node" --steady-seconds=$(E2E_STEADY_SECONDS) --partition-rounds=$(E2E_PARTITION_ROUNDS)

# The compatibility matrix alone (tests/e2e/test_ca_matrix.py, also part of make e2e): CA 1.33.6, 1.34.5,
# 1.35.2, 1.36.1 and HEAD, each with the control plane of the Kubernetes release it pins, against our
# server: scale-up and scale-down on both clouds with the CA's status ConfigMap read back, scale from
# zero on both, a failed creation backed off on each, and the flags we pass or ship known to each CA
# (docs/reference/compatibility.md). Group ca-matrix is declared default = false in its build.toml
# files, so make build, make test and .ci/run never build it; a first build here takes about 20 minutes
# on 2 cores.
e2e-ca-matrix: GO_BUILD_GROUPS = e2e deploy ca-matrix
e2e-ca-matrix: build
	$(PY) -m pytest -q tests/e2e --e2e -k ca_matrix

# Our layouts on a real node (kubelet, containerd, kube-proxy, CoreDNS in namespaces of their own):
# every Helm values file with the official chart and every kustomize overlay, deployed as an operator
# does and driven by the real CA; the Service path with two replicas; probes, mounts and rotations
# (tests/e2e/README.md, "A real node"). Root, podman and runc needed; make test runs the sidecar smoke.
node-e2e: GO_BUILD_GROUPS = e2e node deploy
node-e2e: build image node-images
	$(PY) -m pytest -q tests/e2e --e2e -m node

# The images the real node runs besides ours: the CA 1.36.1 binary and the pod sandbox's (tests/support/nodeimages.py).
node-images: build image
	@$(PY) -m tests.support.nodeimages

# The e2e smoke's scale-up and scale-down with the server as the container image (tests/e2e/test_image.py,
# needs podman). make test runs it too whenever podman is installed.
e2e-image: GO_BUILD_GROUPS = e2e
e2e-image: build image
	$(PY) -m pytest -q tests/e2e/test_image.py

# The optional Kubernetes features (leader election, journal, learned templates, Events) against a real
# kube-apiserver and etcd that authorize by RBAC (tests/kube). make test runs them too.
kube: GO_BUILD_GROUPS = e2e
kube: build
	$(PY) -m pytest -q tests/kube


# The Rust side of the native engine: format, lints and its own tests (cached in native/target).
native-test: install
	cd native && cargo fmt --check && cargo clippy --release --all-targets -- -D warnings && cargo test --release

# Every test with the default serving engine (native), then the gRPC tests (tests/integration, which
# runs the conformance lab too) and the probe-port hostile suite again on the pure-Python engine
# (grpcio); tests/hostile/test_grpc_port.py runs both engines itself, side by side. The wheels are built
# first for tests/install's pip installation, and, when podman is installed, the images for the container
# tests (tests/install, tests/e2e/test_image.py) and the real node's smoke (tests/e2e/test_node_smoke.py);
# without podman those are skipped.
PODMAN := $(shell command -v podman 2>/dev/null)
test: build native-test wheels $(if $(PODMAN),image node-images)
	$(PY) -m pytest -q --durations=25 tests
	CA_EXTERNALGRPC_TEST_ENGINE=grpcio $(PY) -m pytest -q --durations=10 tests/integration tests/hostile/test_http_port.py tests/hostile/test_http_fuzz.py

# The replay of the CA's calls (Go load client) against our server and the upstream example, at
# 1,000 to 20,000 nodes (tests/bench/README.md).
bench: GO_BUILD_GROUPS = bench
bench: build
	$(PY) -m tests.bench.run $(BENCH_ARGS)

# The real cluster-autoscaler in the e2e control plane, talking to our server, then to the upstream
# example, at 1,000 and 5,000 nodes (tests/bench/README.md); tcpdump times the provider calls.
bench-ca: GO_BUILD_GROUPS = e2e bench
bench-ca: build
	$(PY) -m tests.bench.ca_run $(BENCH_CA_ARGS)

# What the Kubernetes features cost at cluster scale: our server with each feature set against a real
# kube-apiserver and etcd holding 1,000, 5,000 and 20,000 kubelet-shaped Nodes (tests/bench/README.md).
# make test runs a 40-node smoke of it (tests/kube/test_bench_kube_smoke.py).
bench-kube: GO_BUILD_GROUPS = e2e
bench-kube: build
	$(PY) -m tests.bench.kube_features $(BENCH_KUBE_ARGS)

# The randomized fault campaign (tests/e2e/chaos; tests/e2e/README.md, "The chaos campaign"): SEEDS seeds of
# MINUTES minutes each, every one the real CA 1.36.1 with two replicas of our server and both simulated
# clouds under a nemesis the seed drives; one line per seed, then the summary line "chaos: ...". SEED=n
# reruns that seed alone (with the same MINUTES, the same schedule). The defaults fit a 2-core CI machine
# (a seed takes its MINUTES and about a minute more: 5.4-6.4 min at MINUTES=5, docs/evidence/chaos.md);
# make test runs a one-seed smoke (tests/e2e/test_chaos.py).
SEEDS ?= 3
MINUTES ?= 3
chaos: GO_BUILD_GROUPS = e2e
chaos: build
	$(PY) -m tests.e2e.chaos.run $(if $(SEED),--seed $(SEED),--seeds $(SEEDS)) --minutes $(MINUTES) $(CHAOS_ARGS)

soak: install
	$(PY) -m pytest -q -m soak tests/reliability --soak-seconds=600

# Every fault an alert exists for, made for real against the server and the simulated cloud, timed by a
# real Prometheus (Debian's prometheus package) and Alertmanager with the shipped rules, ServiceMonitor
# settings and inhibitions: fault -> alert -> pending, firing and resolved times, checked against the
# times the docs state (tests/monitoring/alerts.py; about 22 minutes). make test runs its smoke
# (tests/monitoring/test_prometheus.py). ALERTS_ARGS='--scenarios wrong-key server-gone' runs some.
alerts: install
	$(PY) -m tests.monitoring.alerts $(ALERTS_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache dist

# The container image (deploy/Dockerfile) with podman: base images made from Debian packages with
# mmdebstrap (no image registry needed) and the native engine's wheel from make wheels, or with
# IMAGE_BASES=public the Dockerfile's public bases and its Rust stage. Prints the image's name, size,
# versions and what takes the space (tests/support/imagebuild.py; docs/how-to/install.md).
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= ca-externalgrpc-server:$(VERSION)
IMAGE_BASES ?= debian
image: wheels
	@$(PY) -m tests.support.imagebuild --image $(IMAGE) --bases $(IMAGE_BASES) $(IMAGE_ARGS)

# Known vulnerabilities of the locked runtime and development sets (pip-audit against PyPI's advisory
# data, else OSV's). Where no advisory source answers it says so in one line and succeeds; a known
# vulnerability fails it. AUDIT_ARGS='--ignore-vuln ID' accepts one that does not apply
# (tests/support/audit.py).
audit: install
	@$(PY) -m tests.support.audit $(AUDIT_ARGS)

# Two image builds from fresh clones of HEAD, a few minutes apart, without podman's layer cache: the same
# packages, versions and hashes, or a list of what differs (tests/support/reproduce.py; about 10 min).
reproduce: install
	@$(PY) -m tests.support.reproduce $(REPRODUCE_ARGS)

# A release from a clean commit: make release VERSION=x.y.z checks that every place names x.y.z, that
# CHANGELOG.md has its entry, the lock and a clean tree, then writes the wheels, the image archive, its
# bill of materials and SHA256SUMS into dist/release/x.y.z/ (tests/support/release.py;
# docs/how-to/release.md).
release: install
	@$(PY) -m tests.support.release --version "$(if $(filter command line,$(origin VERSION)),$(VERSION))" --image $(IMAGE) --bases $(IMAGE_BASES)

# Render the official cluster-autoscaler Helm chart (from the CA module) with deploy/helm's values and
# every kustomize tree, check what comes out and validate it offline (also part of make test).
deploy-check: GO_BUILD_GROUPS = deploy
deploy-check: build
	$(PY) -m pytest -q tests/deploy
