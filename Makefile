# Tasks for humans; CI runs .ci/run.
.PHONY: help run test test-pg lint generate bench bench-ledger load build plans torture screenshots console-bench

PG_URL ?= postgres://postgres@127.0.0.1:5432/test?sslmode=disable
LOAD_OUT ?= /tmp/nodeward-load

help: ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

run: ## serve the control plane on the embedded SQLite in ./data
	go run ./server

build: ## build bin/nodeward and bin/nodeward-agent
	go build -o bin/nodeward ./server
	go build -o bin/nodeward-agent ./agent

test: ## the whole suite on SQLite
	go test ./...

test-pg: ## the whole suite on SQLite and PostgreSQL, with -race
	NODEWARD_TEST_DATABASE_URL='$(PG_URL)' go test -race -count=1 ./...

lint: ## gofmt, go vet, generated code current
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	go vet ./...

generate: ## regenerate the console's templ code
	go tool templ generate

bench: ## Go benchmarks on both databases (see BENCHMARKS.md)
	NODEWARD_TEST_DATABASE_URL='$(PG_URL)' go test -run '^$$' -bench 'Enroll|Invite|Events|Renew|RoundTrip' -benchtime 100x -count 3 ./fleet ./handlers
	NODEWARD_TEST_DATABASE_URL='$(PG_URL)' go test -run '^$$' -bench 'HeartbeatCoalescing' -benchtime 3x -count 3 ./fleet

bench-ledger: ## the ledger benchmark with River and pgbench beside it (see BENCHMARKS.md)
	NODEWARD_TEST_DATABASE_URL='$(PG_URL)' loadtest/ledger-matrix.sh

load: ## every scale figure (issue 13) in one sitting, about 90 min on a quiet machine, into $(LOAD_OUT) (see BENCHMARKS.md)
	NODEWARD_TEST_DATABASE_URL='$(PG_URL)' loadtest/scale-matrix.sh $(LOAD_OUT) 3

plans: ## the ledger's query plans at a million operations, into docs/ledger-plans.md
	go run ./cmd/ledgerplans -database-url '$(PG_URL)' -out docs/ledger-plans.md

torture: ## the fault and attack suites at full size (about 30 min), into docs/reliability.md
	go run ./cmd/torture -cycles 50 -database-url '$(PG_URL)' -out docs/reliability.md

screenshots: ## every console page at laptop and phone width, into docs/screenshots (needs chromium)
	go run ./cmd/screenshots -out docs/screenshots

console-bench: ## every console page timed at 50,000 nodes and a million operations, into docs/console-timings.md
	go run ./cmd/consolebench -database-url '$(PG_URL)' -out docs/console-timings.md
