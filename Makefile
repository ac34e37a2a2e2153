# envbuild developer tasks. `make help` lists them.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST := $(PY) -m pytest
# pytest exits 5 when it collected nothing; that must fail loudly, never pass.
define run_pytest
	$(PYTEST) $(1) || { rc=$$?; [ $$rc -eq 5 ] && echo "pytest collected no tests: failing" >&2; exit $$rc; }
endef

.PHONY: help install engine run test e2e check lint typecheck golden bench bench-cli bench-lock bench-build bench-smoke bench-reuse bench-lock-speed reliability host-smoke compat-refresh clean

help: ## List the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@# an editable install leaves src/ uncompiled and PYTHONDONTWRITEBYTECODE (set on CI machines)
	@# stops Python caching it: every command would recompile envbuild first (~40 ms)
	$(PY) -m compileall -q src/envbuild
	touch $@

install: $(VENV)/.installed ## Create .venv with envbuild and the dev tools

engine: ## Install and start a real Docker engine, the registry binary and the test base image
	bash scripts/setup-engine.sh

run: install engine ## Set up everything, then the main job: validate the matrix and build + smoke-test cpu-py311
	$(VENV)/bin/envbuild validate --all
	@# A wheelhouse is a shortcut when this machine has one, never a requirement: without it the
	@# torch wheel comes from the index the lockfile records.
	links=(); if [ -d "$${PIP_FIND_LINKS:-}" ]; then links=(--find-links "$$PIP_FIND_LINKS"); fi; \
	$(VENV)/bin/envbuild build cpu-py311 --base envbuild-test/debian:bookworm \
	  --ca-bundle /etc/ssl/certs/ca-certificates.crt "$${links[@]}"

test: install ## Fast unit suite (no engine needed)
	$(call run_pytest,-q -m "not e2e" tests/unit)

e2e: install engine ## End-to-end suite: real engine, real registry, real builds
	$(call run_pytest,-q -m e2e tests/e2e)

lint: install ## ruff and hadolint-clean templates
	$(VENV)/bin/ruff check src tests benchmarks scripts
	$(VENV)/bin/ruff format --check src tests benchmarks scripts
	$(VENV)/bin/lint-imports

typecheck: install ## mypy --strict
	$(VENV)/bin/mypy

check: lint typecheck test e2e ## Everything CI runs: lint, types, unit and e2e

golden: install ## Regenerate tests/golden from the shipped profiles (review the diff!)
	$(PY) scripts/regen_golden.py

reliability: install ## Write docs/RELIABILITY.md from the last hardening run's figures
	$(PY) scripts/reliability.py

host-smoke: install ## Smoke checks on this machine's torch (TORCH_PYTHON=its python); report in .envbuild/host-smoke
	$(PY) scripts/host_smoke.py run --out .envbuild/host-smoke --torch-python "$${TORCH_PYTHON:-python3}"

compat-refresh: install ## Re-read the PyPI-derived compat columns (needs PyPI)
	$(PY) scripts/refresh_compat.py

bench: install engine ## All benchmarks; writes docs/BENCHMARKS.md
	$(PY) benchmarks/run.py --all

bench-cli: install ## CLI start-up benchmark only
	$(PY) benchmarks/run.py cli

bench-lock: install ## Lock benchmark only
	$(PY) benchmarks/run.py lock

bench-build: install engine ## Build benchmark only
	$(PY) benchmarks/run.py build

bench-smoke: install engine ## Smoke benchmark only
	$(PY) benchmarks/run.py smoke

bench-reuse: install engine ## Layers, first rebuild, re-lock rebuild and registry bytes only
	$(PY) benchmarks/run.py reuse

bench-lock-speed: install ## lock vs raw uv, and the whole matrix from a cold cache, only
	$(PY) benchmarks/run.py lock-speed

clean: ## Remove build folders and caches
	rm -rf .envbuild build dist .pytest_cache .mypy_cache .ruff_cache
