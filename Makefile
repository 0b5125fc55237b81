# The one entry point: CI and hooks call these targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `make run` installs the runtime alone into the same .venv; `make venv` / `make test` add the
# dev tools on top (one venv: the runtime stamp is then already satisfied).
RUN_STAMP := $(VENV)/.runtime

.DEFAULT_GOAL := help
.PHONY: help venv lock dist run cluster cluster-ha down test test-rabbitmq4 rabbitmq4-chroot test-unit schema sdk-sync lint imports fmt typecheck docs docs-build check bench bench-compare soak screenshots clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-15s %s\n", $$1, $$2}'

# Debian's python3 makes no venv without python3-venv: devstack/packages.py installs it (stdlib only).
ENSURE_VENV := $(PYTHON) -c 'import ensurepip' 2>/dev/null || $(PYTHON) -m devstack.packages python

# The SDK first, from sdk/: the service depends on it and no index has it. Every install takes
# the versions constraints.txt pins (the ones the suite ran on); pip reads dependency groups
# (--group) from 25.1 on.
PIP_FOR_GROUPS := 'pip>=25.1'
$(STAMP): pyproject.toml sdk/pyproject.toml constraints.txt
	$(ENSURE_VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade $(PIP_FOR_GROUPS)
	$(BIN)/pip install -q -c constraints.txt -e ./sdk -e . --group dev
	touch $(STAMP)

venv: $(STAMP) ## create .venv and install the package with its dev tools

# Resolved unconstrained in a venv of its own, every dependency group, so that the lock pins
# whatever any target installs; the header (the file's leading comment lines) is kept.
LOCK_GROUPS = $(shell $(PYTHON) -c 'import tomllib; \
	print(*tomllib.load(open("pyproject.toml", "rb"))["dependency-groups"])')
lock: ## regenerate constraints.txt from the newest releases the ranges allow; then make test
	$(ENSURE_VENV)
	@set -euo pipefail; venv=$$(mktemp -d); trap 'rm -rf "$$venv"' EXIT; \
	$(PYTHON) -m venv "$$venv"; \
	"$$venv/bin/pip" install -q --upgrade $(PIP_FOR_GROUPS); \
	"$$venv/bin/pip" install -q -e ./sdk -e . $(addprefix --group ,$(LOCK_GROUPS)); \
	{ awk '!/^#/ { exit } { print }' constraints.txt; \
	  "$$venv/bin/pip" freeze --exclude-editable \
	    | grep -viE '^(pip|delay-dispatcher|delay-dispatcher-sdk)=='; } > "$$venv/lock.txt"; \
	cp "$$venv/lock.txt" constraints.txt; \
	echo "constraints.txt: $$(grep -c '==' constraints.txt) pins; read git diff, then make test"

DIST ?= dist
dist: $(STAMP) ## build the SDK's and the service's wheels and sdists into dist/ (DIST=folder)
	$(BIN)/python -m build -q -o $(DIST) sdk
	$(BIN)/python -m build -q -o $(DIST) .

$(RUN_STAMP): pyproject.toml sdk/pyproject.toml constraints.txt
	$(ENSURE_VENV)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade $(PIP_FOR_GROUPS)
	$(BIN)/pip install -q -c constraints.txt -e ./sdk -e .
	touch $(RUN_STAMP)

run: $(RUN_STAMP) ## install the runtime, start PostgreSQL + RabbitMQ, migrate, serve http://127.0.0.1:8080
	exec $(BIN)/python -m devstack serve

cluster: $(RUN_STAMP) ## ZooKeeper, PostgreSQL, RabbitMQ and three nodes in the background on 8081-8083
	$(BIN)/python -m devstack cluster

cluster-ha: $(RUN_STAMP) ## as cluster, every tier replicated: 3 RabbitMQ nodes, PostgreSQL + sync standby, 3 ZooKeeper
	$(BIN)/python -m devstack cluster-ha

down: ## stop the nodes and services 'make run', 'make cluster' or 'make cluster-ha' started
	$(BIN)/python -m devstack down

test: $(STAMP) ## the whole suite on RabbitMQ 3.x, then the broker-facing tests on RabbitMQ 4.x
	$(BIN)/python -m devstack ensure --browser --chroot --faults
	@# Every pass runs even after one failed, so that a red run shows all it found. The 4.x
	@# chroot (about 35 s to build on a fresh machine) is built at low priority while the first
	@# pass runs: only the last pass needs it.
	@failed=; mkdir -p $(JUNIT); \
	nice -n 19 $(MAKE) --no-print-directory rabbitmq4-chroot > $(JUNIT)/chroot.log 2>&1 & \
	chroot_build=$$!; \
	echo "--- the whole suite but the serial tests, on RabbitMQ 3.x"; \
	$(BIN)/pytest -q $(TEST_WORKERS) -m "not serial" --durations=25 \
		--junit-xml=$(JUNIT)/parallel.xml || failed="$$failed parallel"; \
	echo "--- the tests a loaded machine would skew, alone"; \
	wait $$chroot_build || { cat $(JUNIT)/chroot.log; failed="$$failed chroot"; }; \
	$(BIN)/pytest -q -m serial --junit-xml=$(JUNIT)/serial.xml || failed="$$failed serial"; \
	echo "--- the broker-facing tests again, on RabbitMQ 4.x"; \
	DISPATCHER_TEST_RABBITMQ=4 $(BIN)/pytest -q $(TEST_WORKERS) -p no:cacheprovider \
		--junit-xml=$(JUNIT)/rabbitmq4.xml $(RABBITMQ4_TESTS) || failed="$$failed rabbitmq4"; \
	if [ -n "$$failed" ]; then echo "--- failed:$$failed"; exit 1; fi

# Each pass's JUnit report (every test's outcome and time) for a run to be read afterwards.
JUNIT := test-artifacts/junit

# The suite mostly waits on services and processes: four workers (pytest-xdist, each with its
# own PostgreSQL and RabbitMQ, a file's tests on one worker) finish it in well under half the
# time even on two cores (a fourth took 9% off three's); the few marked serial run alone after
# them. TEST_WORKERS= runs it in one process.
TEST_WORKERS ?= -n 4 --dist loadfile

# The tests whose outcome depends on the broker (publishing, the SDK's retry and dead-letter
# queues, the dlq tool, events, broker outages and clusters) carry this marker; the 4.x pass
# runs those and no neighbour of theirs.
RABBITMQ4_TESTS := -m rabbitmq_version

rabbitmq4-chroot: $(STAMP) ## build (once) the Debian trixie chroot RabbitMQ 4.x runs from
	$(BIN)/python -m devstack ensure --chroot
	$(BIN)/python -m devstack.rabbitmq4 build

test-rabbitmq4: $(STAMP) rabbitmq4-chroot ## only the broker-facing tests, against RabbitMQ 4.x
	$(BIN)/python -m devstack ensure
	DISPATCHER_TEST_RABBITMQ=4 $(BIN)/pytest -q $(TEST_WORKERS) $(RABBITMQ4_TESTS)

test-unit: $(STAMP) ## the fast tests that need no service
	$(BIN)/pytest -q tests/unit

schema: $(STAMP) ## rewrite sql/schema.sql (the schema the migrations build) after a new migration
	DISPATCHER_WRITE_SCHEMA=1 $(BIN)/pytest -q -p no:randomly tests/integration/test_schema_file.py

# The sync client is written by a generator from the async one (stdlib only: no venv needed);
# tests/unit/test_unasync.py fails while the checked-in file differs from its output.
sdk-sync: ## rewrite consumers_sdk/sync_client.py from consumers_sdk/client.py (sdk/unasync.py)
	$(PYTHON) sdk/unasync.py

lint: $(STAMP) ## ruff check and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: $(STAMP) ## format and fix what ruff can
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: $(STAMP) ## mypy --strict on dispatcher, consumers_sdk, examples, devstack, the docs' hooks, sdk/unasync.py
	$(BIN)/mypy
	$(BIN)/mypy docs/hooks
	$(BIN)/mypy sdk/unasync.py

imports: $(STAMP) ## the layering rules: import-linter contracts (pyproject.toml)
	$(BIN)/lint-imports --no-logo

docs: $(STAMP) ## serve the documentation site on http://127.0.0.1:8000 (rebuilds on change)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve -a 127.0.0.1:8000

docs-build: $(STAMP) ## build the documentation site into .run/site; any warning fails (not -q: it hides them)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d .run/site

check: lint imports typecheck docs-build ## lint, layering rules, typecheck and the docs build

bench: $(STAMP) ## run the benchmarks against throwaway services; prints tables, writes bench/results/
	$(BIN)/pip install -q -c constraints.txt --group bench
	$(BIN)/python -m bench.run_all

# BASE=<commit> (default the one before HEAD): the end-to-end figures of both, alternating.
bench-compare: $(STAMP) ## the working tree against BASE in one sitting: CPU, WAL, rows and lateness per job, with ratios
	$(BIN)/pip install -q -c constraints.txt --group bench
	$(BIN)/python -m bench.compare --base $${BASE:-HEAD~1}

soak: $(STAMP) ## hold a steady load for 10 minutes: lost jobs, duplicates, lateness and RSS over time
	$(BIN)/python -m bench.soak --duration-s $${SOAK_S:-600} --rate $${SOAK_RATE:-500}

# The docs' pictures, made by the browser tests that assert what they show.
SCREENSHOTS := console.png rabbitmq-queues.png rabbitmq-dead-letter-queue.png
screenshots: $(STAMP) ## run the browser tests that take the docs' screenshots; copy them to docs/img/
	$(BIN)/python -m devstack ensure --browser
	rm -f $(addprefix test-artifacts/,$(SCREENSHOTS))
	$(BIN)/pytest -q tests/e2e/test_console.py tests/e2e/test_rabbitmq_ui.py
	mkdir -p docs/img
	cp $(addprefix test-artifacts/,$(SCREENSHOTS)) docs/img/

clean: ## remove the venv, caches and local service data
	@# Nothing may stay mounted under .run (the RabbitMQ 4 chroot) when rm walks it.
	awk '{print $$2}' /proc/self/mounts | grep '^$(CURDIR)/.run/' | sort -r | xargs -r umount -l
	rm -rf $(VENV) .run .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info
