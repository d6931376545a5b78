# inferrail: make demo, make test.
GO ?= go
BIN := bin/inferrail

.PHONY: all build test demo bench lint report clean

all: build

VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

build:
	$(GO) build -ldflags "-X main.buildVersion=$(VERSION)" -o $(BIN) ./cmd/inferrail

# The whole suite: vet, format check, tests (the router and fleet also under
# the race detector). No benchmarks, no timing assertions.
test:
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed on:"; gofmt -l .; exit 1; }
	$(GO) vet ./...
	$(GO) test -count=1 ./...
	$(GO) test -count=1 -race -short ./router/... ./fleet/...

# W1 on the default fleet under two baseline policies and cost_model.
demo: build
	@for p in round_robin least_request cost_model; do \
		./$(BIN) sim --workload w1 --policy $$p --requests 3000 --warmup 120s || exit 1; echo; \
	done

# Hot-path benchmarks (hashing, engine step, policies, summaries, workloads,
# whole simulations); see README "Performance".
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

lint:
	@test -z "$$(gofmt -l .)" || { gofmt -l .; exit 1; }
	$(GO) vet ./...

clean:
	rm -rf bin

# The committed benchmark reports, regenerated from scratch (about 4 minutes
# on 2 cores): every policy on W1 (with a load sweep), W2 and W6 over 3 seeds,
# the index-driven policies with the event-fed index on W1 and W2, and the
# replicas each policy needs on W1 and W2.
report: build
	rm -rf docs/benchmarks
	./$(BIN) compare --workload w1 --policies all --seeds 3 --rates 3.2,2.4,4,4.8 --out docs/benchmarks/w1 --title "W1: shared system prompts"
	./$(BIN) compare --workload w2 --policies all --seeds 3 --warmup 120s --out docs/benchmarks/w2 --title "W2: multi-turn chat"
	./$(BIN) compare --workload w6 --policies all --seeds 3 --out docs/benchmarks/w6 --title "W6: no shared prefixes"
	./$(BIN) compare --workload w1 --policies kv_aware,cost_model,llmd,sglang --index events --seeds 3 --out docs/benchmarks/w1-events --title "W1 with the event-fed KV index"
	./$(BIN) compare --workload w2 --policies kv_aware,cost_model,llmd,sglang --index events --seeds 3 --warmup 120s --out docs/benchmarks/w2-events --title "W2 with the event-fed KV index"
	./$(BIN) compare --workload w6 --policies cost_model,sglang --index events --seeds 3 --out docs/benchmarks/w6-events --title "W6 with the event-fed KV index"
	./$(BIN) capacity --workload w1 --policies all --seeds 3 --out docs/benchmarks/w1-capacity --title "W1: replicas needed at 6.4 req/s"
	./$(BIN) capacity --workload w2 --policies all --seeds 3 --requests 12000 --warmup 120s --out docs/benchmarks/w2-capacity --title "W2: replicas needed at 14 req/s"
