# topoguard — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: help install test fuzz lint demo bench chart-lint e2e oracle clean

help: ## list the targets
	@grep -E '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install topoguard with its dev extras

test: $(STAMP) ## unit + integration tests (real uvicorn + TLS on 127.0.0.1)
	$(BIN)/pytest -q

fuzz: $(STAMP) ## the property tests with fresh random examples (test runs them derandomized)
	TOPOGUARD_HYPOTHESIS_PROFILE=fuzz $(BIN)/pytest -q -p no:cacheprovider -m "not e2e" $$(grep -rl "from hypothesis" tests/unit tests/integration)

lint: $(STAMP) ## ruff, mypy --strict on app/, import-linter layer contracts
	$(BIN)/ruff check app tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

demo: $(STAMP) ## explain + review the seed lab's PyTorchJob against the bundled snapshot
	@bash hack/demo.sh

bench: $(STAMP) ## policy, decision and HTTP benchmarks (prints the numbers)
	@bash hack/bench.sh

chart-lint: $(STAMP) ## helm lint --strict + template every ci/ values file + kubernetes-validate + chart tests
	@bash hack/chart-lint.sh

e2e: $(STAMP) ## end-to-end against a real kube-apiserver + etcd built from Go modules
	@bash hack/e2e-apiserver.sh

oracle: $(STAMP) ## differential test against Cilium v1.20.2's policy code (builds and caches hack/oracle)
	@bash hack/oracle.sh

clean: ## remove the venv and build outputs
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
