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
# The policy pack's own virtualenv, as `pulumi up --policy-pack infra/policy_pack` makes it (tests/infra/test_policy_pack.py).
PACK_VENV := .venv-policy-pack
PACK_STAMP := $(PACK_VENV)/.installed

.PHONY: setup checkers policy-pack demo test test-fast lint typecheck plan cost-doc bench image requirements locks locks-check clean

setup: $(STAMP)

# Exactly the dev lock: every package with its hashes, nothing resolved here (docs/development.md). A changed lock
# rebuilds the virtualenv from nothing, so a package the lock dropped cannot linger (pip's cache makes it minutes).
$(STAMP): requirements/dev.lock package.json package-lock.json
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --require-hashes --no-deps -r requirements/dev.lock
	npm ci --silent --no-audit --no-fund
	touch $(STAMP)

checkers: $(CHECKERS_STAMP)

$(CHECKERS_STAMP): requirements/checkers.lock
	rm -rf $(CHECKERS_VENV)
	$(PYTHON) -m venv $(CHECKERS_VENV)
	$(CHECKERS_VENV)/bin/python -m pip install -q --require-hashes --no-deps -r requirements/checkers.lock
	touch $(CHECKERS_STAMP)

policy-pack: $(PACK_STAMP)

$(PACK_STAMP): requirements/policy-pack.lock
	rm -rf $(PACK_VENV)
	$(PYTHON) -m venv $(PACK_VENV)
	$(PACK_VENV)/bin/python -m pip install -q --require-hashes --no-deps -r requirements/policy-pack.lock
	touch $(PACK_STAMP)

demo: setup
	$(PY) -m workload run --config examples/demo.yaml

lint: setup
	$(PY) tools/pins.py --check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy workload infra monitoring tools

# Lint and types first (seconds), then the suite; Ray+vLLM tests hold 7-8 GiB each, so no parallel workers.
test: lint typecheck checkers policy-pack
	$(VENV)/bin/pytest

test-fast: setup
	$(VENV)/bin/pytest -m "not slow"

plan: setup
	$(PY) -m infra.plan $(STACK)

# docs/cost.md's figures from the estimate, every stack planned (tests/infra/test_cost_doc.py checks them).
cost-doc: setup
	$(PY) tools/cost_doc.py --write

bench: setup
	$(PY) -m workload bench --out out/bench

# The workload image's CPU build with podman (installs podman, runc and debootstrap with apt-get where missing;
# the base image and the build are cached). tests/workload/test_container.py builds and runs the same. docs/image.md
image: setup
	$(PY) -m tools.image

# The sets from pyproject.toml, then every lock from its set (network: the package index). docs/development.md
requirements:
	$(PYTHON) tools/pins.py

locks: setup requirements
	$(PY) tools/locks.py

# Does every lock still resolve to itself, and which pins have newer releases? Asks the index; the suite never does.
locks-check: setup
	$(PY) tools/locks.py --check

clean:
	rm -rf $(VENV) $(CHECKERS_VENV) node_modules .pytest_cache .mypy_cache .ruff_cache out
