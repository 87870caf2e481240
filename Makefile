# sluice — the two commands a newcomer needs are `make run` and `make test`.

GO      ?= go
BIN     := bin/sluice
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
# DB, when set (make run DB=… or in the environment), is passed as --db;
# otherwise serve reads SLUICE_DB or takes its default, ./data/sluice.db.
DB      ?=

.PHONY: build run test test-go test-deps vet fmt-check bench clean help

build: ## build the origin binary into bin/sluice (static, no cgo)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./origin/cmd/sluice

run: build ## build and serve on the embedded default (SQLite at ./data/sluice.db)
	$(BIN) serve $(if $(DB),--db $(DB))

help: ## list the targets and what each does
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## /\1\t/; s/[$$][$$]/$$/g' | \
		awk -F'\t' '{ printf "  %-12s %s\n", $$1, $$2 }'

# run-one runs the one test $(1), built with tag $(2), in package $(3), and
# fails when there is no such test: a renamed test must not pass by running
# nothing. grep reads the whole list (no -q): quitting early would kill
# `go test` with SIGPIPE before it removes its build directory.
define run-one
	$(GO) test -tags $(2) -list '^$(1)$$' $(3) | grep -x '$(1)' >/dev/null || { echo "no test $(1) in $(3)" >&2; exit 1; }
	$(GO) test -count=1 -tags $(2) -run '^$(1)$$' -v $(3)
endef

test: test-go test-deps ## everything CI checks: Go tests, the Worker in workerd, the status page in Chromium, the image
	$(MAKE) --no-print-directory edge-test
	$(call run-one,TestStatusPageInChromium,chromium,./origin/statuspage/)
	$(MAKE) --no-print-directory image

test-go: fmt-check vet ## the Go tests alone (no browser, no image; the quick loop)
	$(GO) test -count=1 ./...

test-deps: ## npm ci when needed; chromium and buildah when missing (Debian, as root)
	scripts/test-deps

vet: ## go vet, with the build tags and the js/wasm target too
	$(GO) vet ./...
	$(GO) vet -tags chromium ./origin/statuspage/
	$(GO) vet -tags edge ./edge/ ./loadtest/scenario/
	GOOS=js GOARCH=wasm $(GO) vet ./edge/... ./shared/...

fmt-check: ## fail when a Go file needs gofmt
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

bench: build ## this build's numbers on this machine against real sluice processes: one table, also bin/bench.json (~4 min)
	$(GO) build -o bin/loadtest ./loadtest
	bin/loadtest bench --sluice $(BIN) --json bin/bench.json

clean: ## remove bin/
	rm -rf bin

# --- edge: the Worker (edge/, wrangler.toml, package.json) ---------------------
# The integration tests and edge-dev need `npm ci` (wrangler, miniflare) first.

EDGE_OUT      := build/edge
EDGE_MAX_GZIP := 2097152

.PHONY: edge edge-dev edge-test bench-edge

edge: ## build the Worker into build/edge: app.wasm (Go, js/wasm), wasm_exec.js, worker.mjs
	@mkdir -p $(EDGE_OUT)
	GOOS=js GOARCH=wasm $(GO) build -trimpath -ldflags '-s -w' -o $(EDGE_OUT)/app.wasm ./edge
	cp "$$($(GO) env GOROOT)/lib/wasm/wasm_exec.js" edge/worker.mjs $(EDGE_OUT)/
	@raw=$$(wc -c < $(EDGE_OUT)/app.wasm); gz=$$(gzip -9 -c $(EDGE_OUT)/app.wasm | wc -c); \
	echo "edge: app.wasm $$raw bytes, $$gz gzipped (limit $(EDGE_MAX_GZIP))"; \
	if [ "$$gz" -gt $(EDGE_MAX_GZIP) ]; then echo "edge: app.wasm is over 2 MiB gzipped" >&2; exit 1; fi

edge-dev: ## serve the Worker in workerd on 127.0.0.1:$${EDGE_PORT:-8787}, secret from SLUICE_EDGE_SECRET
	scripts/edge-dev

edge-test: edge ## host tests, a wrangler deploy dry run, then the Worker in real workerd (needs npm ci)
	$(GO) test -count=1 ./edge/... ./shared/edgewire/...
	@out=$$(mktemp -d); scripts/wrangler deploy --dry-run --outdir "$$out"; rc=$$?; rm -rf "$$out"; exit $$rc
	$(GO) test -count=1 -tags edge -v ./edge/
	$(call run-one,TestCanalThroughTheEdge,edge,./loadtest/scenario/)

bench-edge: edge ## Worker + Durable Object overhead in local workerd, printed as a table
	$(GO) test -count=1 -tags edge -run '^$$' -bench . -benchtime 1x ./edge/

# The load and chaos harness (loadtest/): the seed's canal burst through a real sluice.
.PHONY: demo bench-canal

DEMO_TIMEOUT     ?= 60s
BENCH_CANAL_JSON ?= bin/bench-canal.json

demo: build ## the seed's canal burst through sluice with live per-subscriber progress, then the table (~1 min)
	$(GO) build -o bin/loadtest ./loadtest
	bin/loadtest scenario canal --sluice $(BIN) --live --timeout $(DEMO_TIMEOUT)

bench-canal: build ## the canal scenario and the seed's naive loop in the same run: both tables, and JSON
	$(GO) build -o bin/loadtest ./loadtest
	bin/loadtest scenario canal --sluice $(BIN) --naive --json $(BENCH_CANAL_JSON)

# --- container image (Dockerfile): FROM scratch, built offline with buildah -------
# Needs root and Debian's buildah. Containers cannot run on the build machines:
# scripts/image-check inspects the config and runs the entrypoint under chroot.
.PHONY: image

IMAGE       ?= sluice:latest
BUILDAH     ?= buildah --storage-driver vfs
IMAGE_STAGE := build/image

image: build ## build the origin's image (IMAGE, default sluice:latest) with buildah (offline, FROM scratch), then check it
	rm -rf $(IMAGE_STAGE)
	mkdir -p $(IMAGE_STAGE)/rootfs/etc/ssl/certs $(IMAGE_STAGE)/rootfs/tmp $(IMAGE_STAGE)/data
	chmod 1777 $(IMAGE_STAGE)/rootfs/tmp
	cp /etc/ssl/certs/ca-certificates.crt $(IMAGE_STAGE)/rootfs/etc/ssl/certs/
	printf 'root:x:0:0:root:/root:/sbin/nologin\nsluice:x:65532:65532:sluice:/data:/sbin/nologin\n' >$(IMAGE_STAGE)/rootfs/etc/passwd
	printf 'root:x:0:\nsluice:x:65532:\n' >$(IMAGE_STAGE)/rootfs/etc/group
	$(BUILDAH) build --format docker --isolation chroot --pull=never --build-arg VERSION=$(VERSION) -t $(IMAGE) -f Dockerfile .
	BUILDAH='$(BUILDAH)' scripts/image-check $(IMAGE)
