# inferrail: make demo, make test.
GO ?= go
BIN := bin/inferrail

.PHONY: all build test demo bench lint policy-report clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/inferrail

# The whole suite: vet, format check, tests (the router and fleet also under
# the race detector). No benchmarks, no timing assertions.
test:
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed on:"; gofmt -l .; exit 1; }
	$(GO) vet ./...
	$(GO) test -count=1 ./...
	$(GO) test -count=1 -race ./router/... ./fleet/...

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

# Every policy on W1, W2, W6 over 3 seeds (about a minute on 2 cores);
# rewrites docs/routing-report.md.
policy-report:
	mkdir -p docs
	$(GO) run ./tools/policyreport --seeds 3 --out docs/routing-report.md
