# Conflux developer commands. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RUNTIME := .runtime
# The profile's Dagster instance (pipelines/profiles.py): SQLite locally; on the cluster profile
# PostgreSQL, whose password Dagster's processes read from the file PGPASSFILE names.
ifeq ($(CONFLUX_PROFILE),cluster)
export DAGSTER_HOME := $(CURDIR)/$(RUNTIME)/dagster-cluster
export PGPASSFILE := $(CURDIR)/$(RUNTIME)/postgres/pgpass
else
export DAGSTER_HOME := $(CURDIR)/$(RUNTIME)/dagster
endif
PYTEST_ARGS ?=
# Installs the project's Python dependencies (pinned in pyproject.toml): twice as fast as pip's
# resolver on a fresh machine (33 s against 68 s, bench/HISTORY.md), the same versions.
UV := uv==0.13.9
# The suite runs on every core (pytest-xdist); each test module stays in one worker process, and
# modules go out in the order tests/conftest.py sorts them (heaviest first, a package at a time).
PYTEST_PARALLEL ?= -n auto --dist loadfile --no-loadscope-reorder

.PHONY: help setup jars browser postgres-install dagster-home broker-start broker-stop broker-status \
	s3-start s3-stop s3-status cluster-start cluster-stop cluster-status postgres-start postgres-stop \
	postgres-status connect-start connect-stop connect-status demo demo-cdc demo-s3 demo-cluster demo-steps ui test test-unit \
	test-integration test-e2e project-bytecode chaos lint format typecheck bench bench-quick jvm-archive clean

help: ## List every target
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-18s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Conflux needs Python 3.11"' \
		|| { echo "error: $(PYTHON) is not Python 3.11: set PYTHON=/path/to/python3.11"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(UV)
	$(VENV)/bin/uv pip install --quiet --python $(PY) -e '.[dev]'
	@touch $@

# Every installed package's Python bytecode, compiled once per venv (~15 s on two cores). Where
# PYTHONDONTWRITEBYTECODE is set, as on this project's CI machines, nothing else writes it, and
# every Python process compiled each module it imported again: `dagster definitions validate`
# 6.2 s, 2.8 s with it; tests/e2e/test_definitions.py 29.6 s, 14.0 s (bench/HISTORY.md).
# compileall -q prints only the files it could not compile.
BYTECODE := $(VENV)/.bytecode
$(BYTECODE): $(STAMP)
	$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
		|| echo "warning: the modules above did not compile; Python compiles them at each import"
	@touch $@

# The project's own modules too (a second when up to date): each test starts dozens of Python
# processes that import them. (pytest compiles the test modules itself.)
project-bytecode: $(STAMP) ## Compile the project's own modules' bytecode (the test, chaos and bench targets do)
	@$(PY) -m compileall -q -j 0 pipelines assets quality bench platform || true

setup: $(STAMP) $(BYTECODE) jars jvm-archive dagster-home browser postgres-install ## Create the venv, install Python deps, fetch the pinned jars once
	@echo "setup done: runtime folder $(RUNTIME)/, Dagster home $(DAGSTER_HOME)"

jars: $(STAMP) ## Fetch the pinned JVM jars from Maven Central (skipped when up to date)
	$(PY) platform/jvm/fetch_jars.py

jvm-archive: jars ## Build the JVM class archive that cuts Spark's start-up (skipped when up to date)
	$(PY) platform/jvm/class_archive.py

browser: ## Install Debian's chromium for the browser tests (once; as root or with sudo)
	@command -v chromium >/dev/null && exit 0; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; \
	else echo "warning: no chromium and no root: install Debian's chromium package for the UI tests"; exit 0; fi; \
	$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null \
		|| echo "warning: could not install chromium: the UI tests will fail until it is installed"

postgres-install: ## Install Debian's PostgreSQL for the cluster profile's Dagster (once; as root or with sudo)
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 && exit 0; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; \
	else echo "warning: no PostgreSQL and no root: install Debian's postgresql package for the cluster profile"; exit 0; fi; \
	$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq postgresql >/dev/null \
		|| echo "warning: could not install postgresql: the cluster profile's tests will fail until it is installed"

dagster-home: ## Create the local Dagster instance from platform/dagster/dagster.yaml (the cluster's: postgres-start)
	@mkdir -p $(RUNTIME)/dagster
	@cp platform/dagster/dagster.yaml $(RUNTIME)/dagster/dagster.yaml

broker-start: setup ## Start the local Kafka broker (KRaft) on 127.0.0.1
	$(PY) platform/kafka/broker.py start

broker-stop: ## Stop the local Kafka broker
	$(PY) platform/kafka/broker.py stop

broker-status: ## Show the local Kafka broker's state and health
	$(PY) platform/kafka/broker.py status

s3-start: setup ## Start the local S3-compatible store (s3proxy) on 127.0.0.1, bucket "conflux"
	$(PY) platform/s3/store.py start

s3-stop: ## Stop the local S3 store (its objects stay under .runtime/s3/data)
	$(PY) platform/s3/store.py stop

s3-status: ## Show the local S3 store's state and health
	$(PY) platform/s3/store.py status

cluster-start: setup ## Start the local Spark standalone cluster (a master, two workers that cannot see the driver's disk)
	$(PY) platform/spark/cluster.py start

cluster-stop: ## Stop the local Spark cluster (its executors with it)
	$(PY) platform/spark/cluster.py stop

cluster-status: ## Show the local Spark cluster's state: master, workers, executors now running
	$(PY) platform/spark/cluster.py status

postgres-start: setup ## Start the local PostgreSQL (Dagster's storage on the cluster profile; wal_level=logical for CDC) on 127.0.0.1
	$(PY) platform/postgres/server.py start

postgres-stop: ## Stop the local PostgreSQL (its data stays under .runtime/postgres)
	$(PY) platform/postgres/server.py stop

postgres-status: ## Show the local PostgreSQL's state and health
	$(PY) platform/postgres/server.py status

connect-start: broker-start postgres-start ## Start the local Kafka Connect worker with Debezium's PostgreSQL connector (REST on 127.0.0.1)
	$(PY) platform/connect/worker.py start

connect-stop: ## Stop the Connect worker; drop every connector's replication slot and publication in PostgreSQL
	$(PY) platform/connect/worker.py stop

connect-status: ## Show the Connect worker's state and its connectors' task states
	$(PY) platform/connect/worker.py status

demo: broker-start ## Run the demo: events to Kafka + files, through bronze, silver and gold by Dagster; then a real PostgreSQL through Debezium
	@$(MAKE) --no-print-directory demo-steps
	@echo; echo "== PostgreSQL and a Kafka Connect worker with Debezium's PostgreSQL connector start"
	@$(PY) platform/postgres/server.py start > /dev/null && $(PY) platform/connect/worker.py start > /dev/null
	@SPARK_LOCAL_IP=127.0.0.1 $(PY) platform/demo/cdc/run.py

demo-s3: broker-start s3-start ## The demo with every table, checkpoint, lease and status file on the local S3 store
	@echo "== the same flows, with every table, checkpoint, lease and status file on the local S3 store"
	@eval "$$($(PY) platform/s3/store.py env)" \
		&& export CONFLUX_LAKE_ROOT=s3a://conflux/demo/lake CONFLUX_CHECKPOINTS_ROOT=s3a://conflux/demo/checkpoints \
		&& $(MAKE) --no-print-directory demo-steps && $(PY) platform/demo/show_store.py

demo-cluster: broker-start s3-start postgres-start cluster-start ## The demo's Kafka flows on the Spark cluster, tables on the S3 store, Dagster on PostgreSQL
	@CONFLUX_PROFILE=cluster $(MAKE) --no-print-directory demo-cluster-steps

demo-cluster-steps: ## The cluster demo's steps (make demo-cluster runs them with CONFLUX_PROFILE=cluster)
	@echo "== the cluster profile: Spark at $$($(PY) -c 'from pipelines.settings import load_settings as l; print(l().spark_master)'), tables and state on s3a://conflux, Dagster on PostgreSQL ($$DAGSTER_HOME)"
	$(PY) platform/demo/produce_sample.py
	@set -o pipefail; for flow in customers payments orders; do \
		echo; echo "== Dagster runs flow $$flow on the cluster"; \
		$(VENV)/bin/dagster job execute -m assets.definitions -a defs -j run_$$flow 2>&1 \
			| { grep -E "conflux: (application|started)|RUN_SUCCESS|RUN_FAILURE|Finished execution" || true; } \
			| sed 's/^.* - //' || exit 1; \
	done
	@echo; echo "== the flow with a local landing folder is refused before Spark starts"; \
		$(VENV)/bin/conflux run orders_files --once || true
	@echo; $(PY) platform/demo/show_cluster.py

STEP = $(PY) platform/demo/step.py
demo-steps: ## The demo's steps on the configured lake (make demo: local disk; make demo-s3: the S3 store)
	@$(PY) platform/demo/produce_sample.py
	@$(STEP) "Dagster runs every flow (job ingest_incremental): Kafka and files -> bronze -> silver -> gold" \
		ingest -- $(VENV)/bin/dagster job execute -m assets.definitions -a defs -j ingest_incremental
	@echo; echo "== late orders and payments (two days ago) arrive; the gold watermarks send them to the late tables"
	@$(PY) platform/demo/produce_sample.py --late 5
	@$(STEP) "conflux run payments orders --once: the late rows go to the late-data tables" \
		late -- $(VENV)/bin/conflux run payments orders --once
	@$(STEP) "backfill of their day, as the Dagster assets backfill/revenue_10m and backfill/order_payments" \
		backfill -- $(VENV)/bin/dagster asset materialize -m assets.definitions -a defs \
		--select backfill/revenue_10m,backfill/order_payments \
		--partition $$($(PY) platform/demo/produce_sample.py --late-day)
	@SPARK_LOCAL_IP=127.0.0.1 $(PY) platform/demo/show_tables.py
	@echo; SPARK_LOCAL_IP=127.0.0.1 $(PY) platform/demo/show_orchestration.py
	@echo; echo "== conflux flows"; $(VENV)/bin/conflux flows
	@echo; echo "== conflux status orders"; $(VENV)/bin/conflux status orders
	@echo; echo "== conflux catalog orders: every table and piece of state the flow owns"; \
		$(VENV)/bin/conflux catalog orders
	@SPARK_LOCAL_IP=127.0.0.1 $(PY) platform/demo/outage.py
	@echo; echo "Open the UI with: make ui   (then http://127.0.0.1:3000)"

demo-cdc: connect-start ## The CDC demo: Debezium reads a real PostgreSQL table's changes, Conflux lands them in silver, the current state equals SELECT *
	@SPARK_LOCAL_IP=127.0.0.1 $(PY) platform/demo/cdc/run.py

ui: broker-start ## Start the Dagster UI and daemon on http://127.0.0.1:3000
	$(VENV)/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

test: setup project-bytecode ## Run the whole test suite (unit, integration, end-to-end) on every core
	$(VENV)/bin/pytest $(PYTEST_PARALLEL) $(PYTEST_ARGS)

test-unit: setup project-bytecode ## Run the unit tests only (no JVM)
	$(VENV)/bin/pytest tests/unit $(PYTEST_ARGS)

test-integration: setup project-bytecode ## Run the integration tests (real Spark, Delta, Kafka)
	$(VENV)/bin/pytest tests/integration $(PYTEST_ARGS)

test-e2e: setup project-bytecode ## Run the end-to-end tests (Dagster launching real Spark jobs)
	$(VENV)/bin/pytest tests/e2e $(PYTEST_ARGS)

lint: $(STAMP) ## Ruff lint and format check, then the type checker
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(MAKE) typecheck

format: $(STAMP) ## Apply ruff's formatter and autofixes
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: $(STAMP) ## Run mypy on the packages
	$(VENV)/bin/mypy pipelines assets quality

chaos: setup project-bytecode ## Full-scale kill -9 runs of bronze, silver (local disk and S3 store), gold and the cluster's executor / worker / driver, every kill of each schedule (KILL_SEED=N replays one), a 5-minute broker outage under conflux run, and a PostgreSQL workload through Debezium with its Connect worker and Spark killed
	CHAOS_FULL_SCHEDULE=1 CHAOS_RECORDS=$${CHAOS_RECORDS:-100000} SILVER_KILL_KEYS=$${SILVER_KILL_KEYS:-10000} \
		SILVER_CHAOS_KEYS=$${SILVER_CHAOS_KEYS:-10000} CLUSTER_FAULT_KEYS=$${CLUSTER_FAULT_KEYS:-2000} \
		GOLD_CHAOS_RECORDS=$${GOLD_CHAOS_RECORDS:-100000} BROKER_OUTAGE_SECONDS=$${BROKER_OUTAGE_SECONDS:-300} \
		CDC_CHAOS_CHANGES=$${CDC_CHAOS_CHANGES:-3000} CDC_SNAPSHOT_ROWS=$${CDC_SNAPSHOT_ROWS:-20000} \
		$(VENV)/bin/pytest -s $(PYTEST_ARGS) \
		tests/integration/test_bronze_exactly_once.py \
		tests/integration/test_source_faults.py::TestBrokerRestart \
		tests/integration/test_silver.py::TestSilverExactlyOnce \
		tests/integration/test_silver.py::TestSilverCurrentState \
		tests/integration/test_gold.py::test_gold_is_exact_after_kills_during_stateful_batches \
		tests/e2e/test_cluster.py::test_executor_worker_and_driver_killed_mid_batch_lose_nothing \
		tests/integration/test_debezium_source.py::test_kills_of_the_worker_and_of_spark_lose_and_double_nothing

bench: setup project-bytecode ## Full benchmark run (~3.5 h: bronze, silver freshness beside a hand-written MERGE job bare and with the same exactly-once writes, MERGE at 10M keys): regenerates BENCHMARKS.md
	$(PY) bench/run.py --write-benchmarks

bench-quick: setup project-bytecode ## Smoke run of every benchmark (~7 min), then the harness's check (~6 min, not in make test): the throughput and latency runners on one small topic hold the same rows and offsets
	$(PY) bench/run.py --quick
	$(VENV)/bin/pytest -m bench tests/integration/test_bench_quick.py $(PYTEST_ARGS)

clean: connect-stop broker-stop s3-stop cluster-stop postgres-stop ## Stop every local service, delete the runtime folder (keeps the venv)
	rm -rf $(RUNTIME)
