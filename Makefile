# inferrail: make demo, make test.
GO ?= go
BIN := bin/inferrail

.PHONY: ab-live tail-cpu all build test demo bench bench-live overload-live lint report clean node-deps prometheus-deps redis-deps db-deps stress tokenize-fixtures chat-fixtures hostile stack stack-down image gateways-live isolation-live limits-live fidelity leaderboard reload-live cache-live

all: build

VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

build:
	$(GO) build -ldflags "-X main.buildVersion=$(VERSION)" -o $(BIN) ./cmd/inferrail

# The official OpenAI Node SDK, for the engine's SDK test, and PGlite (Postgres
# with pgvector in WASM behind the wire protocol) for the semantic cache's
# pgvector store test: installed once into .cache/node; skipped with a note
# where npm is missing.
NODE_PKGS := openai@7.59.0 @electric-sql/pglite@0.5.14 @electric-sql/pglite-pgvector@0.0.15 @electric-sql/pglite-socket@0.2.17
node-deps:
	@if [ -f .cache/node/node_modules/openai/package.json ] && [ -f .cache/node/node_modules/@electric-sql/pglite/package.json ] && \
	   [ -f .cache/node/node_modules/@electric-sql/pglite-pgvector/package.json ] && [ -f .cache/node/node_modules/@electric-sql/pglite-socket/package.json ]; then :; \
	elif command -v npm >/dev/null 2>&1; then \
		echo "installing $(NODE_PKGS) into .cache/node"; \
		npm install --silent --no-audit --no-fund --save-exact --prefix .cache/node $(NODE_PKGS) >/dev/null || exit 1; \
	else echo "npm not found: the OpenAI SDK test will be skipped, the PGlite tests fail where node is installed"; fi

# Debian's prometheus, for the dashboard test and make stack (installed once).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_INSTALL := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends
prometheus-deps:
	@if [ -x /usr/bin/prometheus ]; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's prometheus"; \
		$(APT_INSTALL) prometheus >/dev/null 2>&1 || \
		{ $(SUDO) apt-get update -q >/dev/null && $(APT_INSTALL) prometheus >/dev/null; } || exit 1; \
	else echo "prometheus-deps: /usr/bin/prometheus is missing and apt-get is unavailable: install Debian's prometheus package"; exit 1; fi

# Debian's redis-server for tenancy/limit and internal/testredis (installed
# once, only when missing; the tests start their own server on a unix socket).
redis-deps:
	@if [ -x /usr/bin/redis-server ]; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's redis-server"; \
		$(APT_INSTALL) redis-server >/dev/null 2>&1 || \
		{ $(SUDO) apt-get update -q >/dev/null && $(APT_INSTALL) redis-server >/dev/null; } || exit 1; \
	else echo "redis-deps: /usr/bin/redis-server is missing and apt-get is unavailable: install Debian's redis-server package"; exit 1; fi

# Debian's postgresql server binaries for the store tests (internal/testpg
# starts its own server from them on a unix socket); installed only when missing.
db-deps:
	@if ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's postgresql (for the store tests)"; \
		$(APT_INSTALL) postgresql >/dev/null 2>&1 || \
		{ $(SUDO) apt-get update -q >/dev/null && $(APT_INSTALL) postgresql >/dev/null; } || exit 1; \
	else echo "db-deps: postgresql is missing and apt-get is unavailable: install Debian's postgresql package, or run go test -short"; exit 1; fi

# staticcheck, installed once into .cache/bin at a pinned version.
STATICCHECK_VERSION := v0.8.2
STATICCHECK := .cache/bin/staticcheck-$(STATICCHECK_VERSION)
$(STATICCHECK):
	@mkdir -p .cache/bin
	GOBIN=$(CURDIR)/.cache/tmp-bin $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv .cache/tmp-bin/staticcheck $@ && rmdir .cache/tmp-bin

# The whole suite: format check, vet, staticcheck, tests (the router, fleet, engine (its
# steps hand work to another goroutine in a simulation on two cores), engine
# server and bench also under the race detector). No benchmarks, no timing
# assertions.
test: node-deps prometheus-deps redis-deps db-deps $(STATICCHECK)
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed on:"; gofmt -l .; exit 1; }
	$(GO) vet ./...
	$(STATICCHECK) ./...
	$(GO) test -count=1 ./...
	$(GO) test -count=1 -race -short ./router/... ./fleet/... ./engine ./engine/server/... ./engine/kvevents/... ./bench/... ./live/... ./internal/h1

# W1 on the default fleet under two baseline policies and cost_model.
demo: build
	@./$(BIN) sim --workload w1 --policy round_robin,least_request,cost_model --requests 3000 --warmup 120s

# Hot-path benchmarks (hashing, engine step, policies, summaries, workloads,
# whole simulations); see README "Performance".
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# The simulator's fidelity on every real vLLM log in ../shared/traces/vllm-logs:
# each fitted on its first half and scored on the second, beside the two
# baselines, across runs of one setup, by phase and by load
# (docs/fidelity.md). --gpu fills in the GPU for logs whose meta.json names
# none (the RTX PRO 6000 run, per its SOURCES.md entry).
VLLM_LOGS ?= $(wildcard ../shared/traces/vllm-logs/*)
fidelity: build
	@test -n "$(VLLM_LOGS)" || { echo "fidelity: no logs in ../shared/traces/vllm-logs (set VLLM_LOGS=dir1 dir2 ...)"; exit 1; }
	./$(BIN) calibrate --fidelity docs/fidelity.md --gpu RTXPRO6000 $(foreach d,$(VLLM_LOGS),--from-log $(d))

# Every policy on W1-W7, the Mooncake conversation trace and generated
# long-prompt traces, at four profiles, three seeds, the default rate and
# 1.3x, and capacity on W1 and W2: docs/benchmarks/leaderboard/leaderboard.md
# (scripts/leaderboard.sh says how to narrow it; the whole takes about
# 22 minutes on 2 cores).
leaderboard: build
	scripts/leaderboard.sh

lint: $(STATICCHECK)
	@test -z "$$(gofmt -l .)" || { gofmt -l .; exit 1; }
	$(GO) vet ./...
	$(STATICCHECK) ./...

clean:
	rm -rf bin

# The committed benchmark reports, regenerated from scratch (about 10 minutes
# on 2 cores): every policy on W1 (with a load sweep), W2 and W6 over 3 seeds,
# the index-driven policies with the event-fed index on W1 and W2, the
# replicas each policy needs on W1 and W2, and (scripts/pd-report.sh, about 7
# minutes) P/D and tiered KV: docs/benchmarks/pd, docs/benchmarks/tiered-kv.
report: build
	rm -rf docs/benchmarks/w1 docs/benchmarks/w2 docs/benchmarks/w6 docs/benchmarks/w1-events docs/benchmarks/w2-events docs/benchmarks/w6-events docs/benchmarks/w1-capacity docs/benchmarks/w2-capacity docs/benchmarks/w7-overload docs/benchmarks/w7-gateways
	./$(BIN) compare --workload w1 --policies all --seeds 3 --rates 3.2,2.4,4,4.8 --out docs/benchmarks/w1 --title "W1: shared system prompts"
	./$(BIN) compare --workload w2 --policies all --seeds 3 --warmup 120s --out docs/benchmarks/w2 --title "W2: multi-turn chat"
	./$(BIN) compare --workload w6 --policies all --seeds 3 --out docs/benchmarks/w6 --title "W6: no shared prefixes"
	./$(BIN) compare --workload w1 --policies kv_aware,cost_model,llmd,sglang --index events --seeds 3 --out docs/benchmarks/w1-events --title "W1 with the event-fed KV index"
	./$(BIN) compare --workload w2 --policies kv_aware,cost_model,llmd,sglang --index events --seeds 3 --warmup 120s --out docs/benchmarks/w2-events --title "W2 with the event-fed KV index"
	./$(BIN) compare --workload w6 --policies cost_model,sglang --index events --seeds 3 --out docs/benchmarks/w6-events --title "W6 with the event-fed KV index"
	./$(BIN) capacity --workload w1 --policies all --seeds 3 --out docs/benchmarks/w1-capacity --title "W1: replicas needed at 6.4 req/s"
	./$(BIN) capacity --workload w2 --policies all --seeds 3 --duration 1500s --warmup 300s --out docs/benchmarks/w2-capacity --title "W2: replicas needed at 14 req/s"
	./$(BIN) compare --workload w7 --policies cost_model --admissions all --seeds 3 --out docs/benchmarks/w7-overload --title "W7: overload bursts, every admission mode"
	./$(BIN) compare --workload w7 --policies cost_model --admission kv --gateways 3 --ledgers shared,independent --seeds 3 --out docs/benchmarks/w7-gateways --title "W7: three gateways, shared or independent ledgers"
	BIN=$(BIN) scripts/pd-report.sh

# Live overload on wall-clock time: one burst of 200 heavy requests at about
# 6x the KV capacity of three inferrail engine replicas, through live with kv
# admission and with none (about 2 minutes; scripts/overload-live.sh).
overload-live: build
	scripts/overload-live.sh

# The OCI image, built in Go from scratch (deploy/image): no container
# engine, nothing pulled. Tagged inferrail:<the chart's appVersion> so the
# chart's default image.tag names it; reproducible (SOURCE_DATE_EPOCH, else
# the commit time). Load it with podman load -i / docker load -i.
IMAGE_VERSION ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' charts/inferrail/Chart.yaml)
image:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.buildVersion=$(VERSION)" -o bin/inferrail-static ./cmd/inferrail
	$(GO) run ./deploy/image/build -binary bin/inferrail-static -version $(IMAGE_VERSION) -out bin/inferrail-image.tar

# Three engines, the gateway and Prometheus on loopback (state in
# runs/stack/; FAULTS=1 makes replica c fail); make stack-down stops them.
stack: build prometheus-deps
	scripts/stack.sh

stack-down:
	scripts/stack-down.sh

# Three gateways in front of three engines under one burst at about 6x
# their KV capacity, with the KV ledger shared through Redis and with one
# ledger each (about 3 minutes; scripts/gateways-live.sh).
gateways-live: build redis-deps
	scripts/gateways-live.sh

# Tenant isolation through live with keys: three quiet tenants and one at
# 10x its RPM limit, with and without it (about 5 minutes).
isolation-live: build
	scripts/isolation-live.sh

# One key's RPM and TPM limits across three live processes sharing one
# Redis, 64 closed-loop clients (about 1 minute per run).
limits-live: build redis-deps
	scripts/limits-live.sh

# Real-time checks, too slow or too timing-sensitive for make test: the mock
# engine against its own model on wall-clock time, thousands of concurrent
# streams and disconnects over TCP, bench's send lag at 300 req/s and its CPU at 900.
stress:
	INFERRAIL_STRESS=1 $(GO) test -count=1 -run Stress -v ./engine/server/ ./bench/

# Regenerate router/tokenize/testdata from the reference tokenizers library
# (needs node, npm and ../shared).
tokenize-fixtures:
	scripts/tokenize-fixtures/run.sh

# Regenerate router/tokenize/chat golden files (needs python3-jinja2 and ../shared).
chat-fixtures:
	scripts/chat-fixtures/run.sh

# Gateway overhead against nginx at 1,000 and 3,000 req/s, and a 50,000-request
# soak of inferrail live (about 3 minutes; installs nginx-light when run as
# root). Writes runs/bench-live/results.md.
bench-live:
	scripts/bench-live.sh

# Hot reload under 1,000 req/s in bench-live's setup: 10 reloads (SIGHUP and
# the file watch) and a rejected broken file during 30 s of w1; failed
# requests, the hit rate before and after, the reload counters (about 45 s).
# Writes runs/reload-live/results.md.
reload-live:
	scripts/reload-live.sh

# What a hit of the exact response cache costs through inferrail live at
# 1,000 req/s (deterministic requests over 20 prompts, all hits after a
# warm-up), against live without the cache and the engines directly,
# alternately 3 times (about 2 minutes). Writes runs/cache-live/results.md.
cache-live:
	scripts/cache-live.sh

# inferrail live against hostile clients (huge bodies, h2c streams that never
# read, 20,000 stalled connections, dead, killed and stopped engines, the
# cache-oracle header, huge request ids), each scenario on its own engines
# and proxy (about 1.5 minutes). Writes runs/hostile/results.md.
# Two builds of live in turn on the same engines and load (BASE=<git rev>;
# RATE, ROUNDS): CPU per request and TTFT; see README, overhead.
ab-live:
	scripts/ab-live.sh

# live's TTFT tail against a bare Go proxy made to spend the same CPU per
# request (BURN, RATE, ROUNDS; about 3 minutes): see README, overhead.
# Writes runs/tail-cpu/results.md.
tail-cpu:
	scripts/tail-cpu.sh

hostile:
	scripts/hostile.sh
