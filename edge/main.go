//go:build js && wasm

// Command edge is sluice's edge lane as a Cloudflare Worker: the handler of
// edge/worker served through github.com/syumai/workers, with each
// subscriber's token bucket in a Durable Object. This file and its js/wasm
// siblings are wiring only; worker.mjs is the entry module that starts this
// program once per isolate and holds the Durable Object class.
package main

import (
	"log/slog"
	"os"
	"strings"
	"syscall/js"
	"time"

	"github.com/syumai/workers"
	"github.com/syumai/workers/cloudflare"

	"github.com/sluice-dev/sluice/edge/worker"
	"github.com/sluice-dev/sluice/shared/edgewire"
)

// Names shared with worker.mjs and wrangler.toml.
const (
	secretVar     = "SLUICE_EDGE_SECRET"
	bucketBinding = "SLUICE_BUCKETS"
)

func main() {
	// worker.mjs starts this program from inside a request (or a Durable
	// Object) with the env in place, and keeps it for the isolate's life; a
	// secret change deploys a new version, hence a new isolate.
	h := worker.Handler(worker.Config{
		Secrets: strings.Fields(cloudflare.Getenv(secretVar)),
		Buckets: durableBuckets{binding: bucketBinding},
		Client:  fetchClient{},
		Now:     time.Now,
		Logger:  slog.New(slog.NewJSONHandler(os.Stdout, nil)),
	})
	binding := js.Global().Get("context").Get("binding")
	binding.Set("serve", serveFunc(h))
	binding.Set("takeToken", js.FuncOf(takeToken))
	binding.Set("maxRequestBytes", edgewire.MaxRequestBytes) // worker.mjs reads no more
	workers.Ready()
	// Stay alive between requests: the callbacks above are the program now.
	select {}
}
