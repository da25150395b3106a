# jobq — every entry point. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The console's browser tests drive Debian's Chromium (make tools); Playwright never downloads one.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# `make k6` settings (see README "Load test with k6").
SCRIPT ?= submit
RATE ?= 50
DURATION ?= 30s
WORKERS ?= 2
BASE_URL ?=

# What `make run` exports to every process it starts (see README "Configuration").
RUN_ENV := LOG_FORMAT=text SMTP_HOST=127.0.0.1 SMTP_PORT=2525 WORKER_METRICS_HOST=127.0.0.1 \
	WEBHOOK_ALLOWED_HOSTS=localhost,127.0.0.1,::1 PATH="$(CURDIR)/$(BIN):$$PATH"
# The env file honcho reads for `make run`; its values win over everything above. honcho's
# default is `.env` in the checkout, so a stray one (say, written for compose) would silently
# change what runs: none is read unless named (`make run RUN_ENV_FILE=local.env`).
RUN_ENV_FILE ?= /dev/null

.PHONY: help
help: ## List every target
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-20s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml requirements-dev.lock
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "jobq needs Python 3.11+; found $$($(PYTHON) --version)"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --require-hashes \
		-r requirements-dev.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

.PHONY: install
install: $(STAMP) ## Create .venv with the development lock (requirements-dev.lock, hashed)

# The development lock is resolved first; the runtime lock (what the image installs) and the
# SMTP sink's lock take its versions, so the image runs exactly what the tests ran.
LOCK_ARGS := --universal --python-version 3.11 --generate-hashes --no-header --no-annotate --quiet

.PHONY: lock
lock: install ## Re-resolve requirements{,-dev,-smtp}.lock and benchmark/peers.lock (needs network)
	$(BIN)/uv pip compile pyproject.toml --extra dev $(LOCK_ARGS) -o requirements-dev.lock
	$(BIN)/uv pip compile pyproject.toml $(LOCK_ARGS) -c requirements-dev.lock -o requirements.lock
	$(BIN)/uv pip compile pyproject.toml --extra smtp $(LOCK_ARGS) -c requirements-dev.lock \
		-o requirements-smtp.lock
	$(BIN)/uv pip compile benchmark/peers.in $(LOCK_ARGS) -o benchmark/peers.lock

.PHONY: servers
servers: install ## Find or start PostgreSQL and Redis; print their URLs
	$(BIN)/python -m infra.servers env --database jobq

.PHONY: stop-servers
stop-servers: install ## Stop throwaway PostgreSQL/Redis that jobq started (never yours); data kept
	$(BIN)/python -m infra.servers stop

.PHONY: discard-servers
discard-servers: install ## Stop them and delete their data (/var/tmp/jobq-servers)
	$(BIN)/python -m infra.servers discard

.PHONY: migrate
migrate: install ## Apply the alembic migrations to DATABASE_URL (or the found server)
	@eval "$$($(BIN)/python -m infra.servers env --database jobq)" && export DATABASE_URL && \
		$(BIN)/alembic upgrade head

.PHONY: run
run: install ## Start PostgreSQL/Redis if needed, migrate, run queue, producer, SQS endpoint, 2 workers, SMTP sink
	@eval "$$($(BIN)/python -m infra.servers env --database jobq)" && \
		export DATABASE_URL REDIS_URL && $(BIN)/alembic upgrade head && \
		eval "$$($(BIN)/python -m infra.devkeys)" && \
		echo "jobq: producer http://127.0.0.1:8080  SQS http://127.0.0.1:9324  queue http://127.0.0.1:8081  workers' metrics :9101 :9102  (Ctrl-C stops)" && \
		echo "jobq: try  curl -s -X POST localhost:8080/jobs -H 'Authorization: Bearer $$JOBQ_KEY' -H 'Content-Type: application/json' -d '{\"taskType\":\"email\",\"payload\":{\"to\":\"a@example.com\",\"subject\":\"hi\"}}'" && \
		env $(RUN_ENV) $(BIN)/honcho --no-colour --env "$(RUN_ENV_FILE)" -d . -f infra/Procfile start; \
		status=$$?; [ $$status -eq 0 ] || [ $$status -eq 130 ]  # 130: stopped with Ctrl-C

.PHONY: test
test: install ## Run every test (unit, integration, e2e, fuzz) against real PostgreSQL and Redis
	$(BIN)/pytest $(PYTEST_ARGS)

.PHONY: lint
lint: install ## ruff lint and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

.PHONY: format
format: install ## Apply ruff fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

.PHONY: typecheck
typecheck: install ## mypy (strict) over common, services, jobq, infra, benchmark
	$(BIN)/mypy

.PHONY: boundaries
boundaries: install ## import-linter: services independent, only the queue touches the database
	$(BIN)/lint-imports

.PHONY: infra-check
infra-check: install tools ## compose schema (offline), hadolint, promtool on the Prometheus config and rules
	$(BIN)/check-jsonschema --builtin-schema vendor.compose-spec infra/compose.yml
	$(BIN)/hadolint infra/Dockerfile
	@promtool="$$($(BIN)/python -m infra.tools | sed -n 's/^promtool=//p')" && \
		"$$promtool" check config infra/prometheus/prometheus.yml && \
		"$$promtool" test rules infra/prometheus/tests/*.yml

.PHONY: tools
tools: install ## Fetch prometheus, promtool, postgres_exporter into .jobq/tools; install Debian's chromium (console tests) if missing; kubectl comes with install
	@$(BIN)/python -m infra.tools >/dev/null
	@$(BIN)/python -m infra.browser >/dev/null

.PHONY: dashboards
dashboards: install ## Regenerate infra/grafana/dashboards/*.json from infra/grafana/dashboard.py
	$(BIN)/python -m infra.grafana.dashboard

.PHONY: prometheus-config
prometheus-config: install ## Regenerate infra/prometheus/prometheus.yml from infra/prometheus_config.py
	$(BIN)/python -m infra.prometheus_config

.PHONY: k8s-generated
k8s-generated: install ## Regenerate infra/k8s's PrometheusRule and dashboard ConfigMap from infra/prometheus/rules and infra/grafana
	$(BIN)/python -m infra.kubernetes

# `make k8s` renders this overlay of infra/k8s/overlays.
OVERLAY ?= production

.PHONY: k8s
k8s: install ## Print what `kubectl apply -k infra/k8s/overlays/$(OVERLAY)` applies [OVERLAY=dev|production|production-postgresql|example-worker-groups]
	@$(BIN)/kubectl kustomize infra/k8s/overlays/$(OVERLAY)

.PHONY: k6
k6: install ## k6 load run on a fresh local stack: [SCRIPT=submit|mixed|burst] [RATE=50] [DURATION=30s] [WORKERS=2] [BASE_URL=…]
	$(BIN)/python -m benchmark.load --script $(SCRIPT) --rate $(RATE) --duration $(DURATION) \
		--workers $(WORKERS) $(if $(BASE_URL),--base-url $(BASE_URL))

# `make dashboard-snapshot` writes here (git-ignored); SNAPSHOT=docs/dashboard.png refreshes the
# README's picture.
SNAPSHOT ?= .jobq/dashboard.png

.PHONY: dashboard-snapshot
dashboard-snapshot: install tools ## k6 + Prometheus on a fresh stack; draw the dashboard into .jobq/dashboard.png [SNAPSHOT=…]
	$(BIN)/python -m benchmark.dashboard_snapshot --output $(SNAPSHOT)

.PHONY: compose-test
compose-test: ## infra/compose.yml on a real Docker engine (installs docker.io, Compose v2; ~9 min cold, ~4 warm)
	$(PYTHON) tests/compose/run.py

.PHONY: check
check: lint typecheck boundaries infra-check ## lint + typecheck + boundaries + infra-check

.PHONY: openapi
openapi: install ## Regenerate the committed OpenAPI documents in openapi/
	$(BIN)/python -m infra.openapi

.PHONY: keys
keys: ## Print the development API keys, internal token and AWS_* variables `make run` uses (no install needed)
	@$(PYTHON) -m infra.devkeys

.PHONY: bench
bench: install ## Whole benchmark suite with peers (~17 min): JSON+PNG in benchmark/results, table in benchmark/README.md
	$(BIN)/python -m benchmark --preset full

.PHONY: bench-sqs
bench-sqs: install ## SQS endpoint (boto3) vs jobq's own protocol side by side (~1 min): JSON+PNG in benchmark/results
	$(BIN)/python -m benchmark.sqs

.PHONY: bench-floor
FLOOR_RATE ?= 800

bench-floor: install ## The HTTP stack's CPU per request without jobq (raw ASGI, Litestar @asgi route, Litestar handler), 3 rounds (~3 min) [FLOOR_RATE=800]: JSON in benchmark/results
	$(BIN)/python -m benchmark.floor --rate $(FLOOR_RATE)

.PHONY: bench-quick
bench-quick: install ## Benchmark suite at smoke-test size (no peers, small N, ~1 min; what CI runs), not committed
	$(BIN)/python -m benchmark --preset quick

.PHONY: bench-autoscale
bench-autoscale: install tools ## KEDA scaling simulation (~7 min): bursty trace, scaled vs fixed workers; JSON+PNG in benchmark/results
	$(BIN)/python -m benchmark.autoscale

.PHONY: bench-console
bench-console: install ## The console's overview (100 queues) and jobs page (100 rows) with 1,000,000 finished jobs: p50/p95 JSON in benchmark/results
	$(BIN)/python -m benchmark.console

.PHONY: bench-waiters
bench-waiters: install ## 500 waiters (waitSeconds=20): commit → answer latency, idle CPU, the settle trigger's cost (~1 min); JSON in benchmark/results
	$(BIN)/python -m benchmark.waiters

BEFORE ?=
COMPARE_ARGS ?=
.PHONY: bench-compare
bench-compare: install ## Burn-down and submits of BEFORE=<rev> and this checkout side by side (COMPARE_ARGS="--tenants 20", "--limit-other", "--after-tracing")
	@test -n "$(BEFORE)" || { echo "usage: make bench-compare BEFORE=<commit> [COMPARE_ARGS=...]"; exit 2; }
	$(BIN)/python -m benchmark.compare --before $(BEFORE) $(COMPARE_ARGS)

STATEMENTS_ARGS ?=
.PHONY: bench-statements
bench-statements: install ## The claim statements of BEFORE=<rev> and this checkout, interleaved call by call on one backlog (~30 s; STATEMENTS_ARGS="--tenants 1"): JSON in benchmark/results
	@test -n "$(BEFORE)" || { echo "usage: make bench-statements BEFORE=<commit> [STATEMENTS_ARGS=...]"; exit 2; }
	$(BIN)/python -m benchmark.statements --before $(BEFORE) $(STATEMENTS_ARGS)

MINUTES ?= 30
SOAK_ARGS ?=
.PHONY: bench-soak
bench-soak: install ## Soak (~MINUTES per side): 1,000 jobs/s drained, retention in minutes, a 60 s snapshot; hot table, claim p99, WAL/job; JSON+PNG [MINUTES=30] [BEFORE=<rev>] [SOAK_ARGS=…]
	$(BIN)/python -m benchmark.soak --minutes $(MINUTES) $(if $(BEFORE),--before $(BEFORE)) $(SOAK_ARGS)

PROFILE_ARGS ?=
.PHONY: profile
profile: install ## One burn-down with py-spy on the queue service and workers: CPU µs per job by process, a worker's claim cycle split, top frames [PROFILE_ARGS="--jobs 150000"]
	$(BIN)/python -m benchmark.profile $(PROFILE_ARGS)

.PHONY: clean
clean: ## Remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
