# sluice — the two commands a newcomer needs are `make run` and `make test`.

GO      ?= go
BIN     := bin/sluice
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
DB      ?= ./data/sluice.db

.PHONY: build run test vet fmt-check bench clean

build: ## build the origin binary into bin/sluice (static, no cgo)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./origin/cmd/sluice

run: build ## build and serve on the embedded default (SQLite at ./data/sluice.db)
	$(BIN) serve --db $(DB)

test: fmt-check vet ## everything CI checks
	$(GO) test -count=1 ./...

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

bench: ## origin throughput and latency benchmarks (one run each; compare ratios within a run)
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 ./origin/api/

clean:
	rm -rf bin
