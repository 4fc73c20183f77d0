# topoguard — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: help install test fuzz lint demo bench chart-lint screenshots e2e e2e-lossless e2e-full e2e-datapath oracle lock clean

help: ## list the targets
	@grep -E '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-12s %s\n", $$1, $$2}'

# Dependencies come only from the lock (exact versions, every file's hash), then topoguard itself without
# dependencies: a fresh machine installs exactly what CI tested. `make lock` writes the locks again.
LOCK := requirements/dev.lock

$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --require-hashes -r $(LOCK)
	$(BIN)/pip install -q --no-deps -e .
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

chart-lint: $(STAMP) ## helm lint --strict + template every ci/ values file + kubernetes-validate + promtool rule tests + dashboard-linter + chart tests
	@bash hack/chart-lint.sh

screenshots: $(STAMP) ## docs/audit-lab-{before,after}.png: `topoguard audit -o html` of the seed lab in headless chromium
	$(BIN)/python -m tests.browser screenshot tests/data/clusters/lab-audit-before.yaml tests/data/clusters/lab-config.yaml docs/audit-lab-before.png
	$(BIN)/python -m tests.browser screenshot tests/data/clusters/lab-audit-after.yaml tests/data/clusters/lab-config.yaml docs/audit-lab-after.png

e2e: $(STAMP) ## end-to-end against a real kube-apiserver + etcd built from Go modules
	@bash hack/e2e-apiserver.sh -m "not lossless"

e2e-lossless: $(STAMP) ## restarts, rotations and kills under load through the real apiserver (~7 min)
	@bash hack/e2e-apiserver.sh -m lossless

e2e-full: $(STAMP) ## end-to-end with the real scheduler, controller-manager and operators (JobSet, Trainer, Kueue, ...)
	@bash hack/e2e-full.sh

e2e-datapath: $(STAMP) ## the seed lab + reach cases on Cilium's real agent and CNI plugin (root; builds and caches them)
	@bash hack/e2e-datapath.sh

oracle: $(STAMP) ## differential test against Cilium v1.20.2's policy code (builds and caches hack/oracle)
	@bash hack/oracle.sh

lock: ## re-resolve requirements/dev.lock and runtime.lock from pyproject.toml (pip-tools, hashes)
	$(PYTHON) -m venv build/pip-tools && build/pip-tools/bin/pip install -q pip-tools
	build/pip-tools/bin/pip-compile -q --generate-hashes --strip-extras --allow-unsafe --extra dev -o requirements/dev.lock pyproject.toml
	build/pip-tools/bin/pip-compile -q --generate-hashes --strip-extras --allow-unsafe -o requirements/runtime.lock pyproject.toml

clean: ## remove the venv and build outputs
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
