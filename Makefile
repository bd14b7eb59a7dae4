# One entry point for every task. `make run` and `make test` are the two commands of the README.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
GO_CACHE_DIR ?= $(HOME)/.cache/ca-externalgrpc-go

.PHONY: install protos protos-check run test unit integration conformance lint typecheck bench soak clean image deploy-check

# Quiet: pip says nothing unless something fails, and setuptools' notice that every editable install
# prints (a folder named like the package may shadow it) is filtered out; errors still show.
$(STAMP): pyproject.toml
	@$(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	@PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)
	@echo "installed into $(VENV): $(VENV)/bin/ca-externalgrpc --version prints $$($(VENV)/bin/ca-externalgrpc --version)"

install: $(STAMP)

# Regenerate the Python code from protos/*.proto (the only place generated code lives).
protos: $(STAMP)
	$(PY) -m server.protogen --write

protos-check: $(STAMP)
	$(PY) -m server.protogen --check

# The demo: our server in front of both simulated clouds. Other ports: make run LISTEN=... HTTP_LISTEN=...
LISTEN ?= 127.0.0.1:8086
HTTP_LISTEN ?= 127.0.0.1:8087
run: $(STAMP)
	@$(PY) -m devstack --listen $(LISTEN) --http-listen $(HTTP_LISTEN)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy server providers simulators devstack

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

integration: $(STAMP)
	$(PY) -m pytest -q tests/integration

conformance: $(STAMP)
	GO_CACHE_DIR=$(GO_CACHE_DIR) $(PY) -m tests.conformance.run

test: $(STAMP)
	$(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) -m tests.bench.run $(BENCH_ARGS)

soak: $(STAMP)
	$(PY) -m pytest -q -m soak tests/reliability --soak-seconds=600

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# Build the container image (needs docker or podman; see docs/operations.md for a daemonless build).
IMAGE ?= ca-externalgrpc-server:0.1.0
CONTAINER ?= $(shell command -v docker || command -v podman)
image:
	$(CONTAINER) build -f deploy/Dockerfile -t $(IMAGE) .

# Render every kustomize overlay and validate it offline (also part of make test).
deploy-check: $(STAMP)
	$(PY) -m pytest -q tests/deploy
