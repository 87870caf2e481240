//go:build edge

package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/shared/bucket"
	"github.com/sluice-dev/sluice/shared/edgewire"
)

// BenchmarkEdgeOverhead measures, in local workerd, what the Worker and the
// Durable Object add to a delivery, and prints one table (make bench-edge;
// BENCH_PERSIST=dir keeps the objects' storage on disk).
// Each figure is client-side latency over loopback:
//
//   - Worker only: a 404 from Go, no Durable Object: Miniflare's routing and
//     the crossing into Go;
//   - deferred: signature check + Durable Object take (empty bucket) + answer,
//     no subscriber call: the Worker + DO overhead on its own;
//   - delivered: the same plus the call to a partner that answers at once,
//     with the partner's own time (duration_ms as the Worker measured it)
//     subtracted, sequentially and then 8 at a time;
//   - direct: the same partner called straight from Go, for scale.
//
// The cold start is a fresh Worker's first request: the Go instance starting
// in a new isolate, paid once per isolate rather than once per request.
func BenchmarkEdgeOverhead(b *testing.B) {
	const n = 1000
	p := newBenchPartner(b)
	var rows [][]string
	add := func(name string, lat []time.Duration, note string) {
		slices.Sort(lat)
		rows = append(rows, []string{name, fmt.Sprint(len(lat)), ms(pct(lat, 50)), ms(pct(lat, 99)), ms(lat[len(lat)-1]), note})
	}

	// Cold start: a fresh Worker's first request starts the Go instance.
	fresh, err := startEdge(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	deliver(b, fresh, p.request(b, "dlv_cold", unique("sub_cold"), bucket.Rate{PerSecond: 1, Burst: 1}))
	cold := time.Since(t0)
	_ = fresh.Stop()

	// Durable Object storage in memory unless BENCH_PERSIST names a folder:
	// local disk is neither what production has nor what the code costs.
	persist := os.Getenv("BENCH_PERSIST")
	e, err := startEdge(persist)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Stop()
	warm := p.request(b, "dlv_warm", unique("sub_warm"), bucket.Rate{PerSecond: 1e6, Burst: 1e6})
	for range 50 {
		deliver(b, e, warm)
	}

	// The Worker alone: Go answers 404 without a Durable Object.
	var lat []time.Duration
	for range n {
		start := time.Now()
		resp, err := client.Post(e.URL+"/nowhere", "application/json", nil)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		lat = append(lat, time.Since(start))
	}
	add("Worker only (404)", lat, "Go, no Durable Object")

	// Deferred: a subscriber whose bucket is always empty.
	empty := p.request(b, "dlv_empty", unique("sub_empty"), bucket.Rate{PerSecond: 1e-6, Burst: 1})
	deliver(b, e, empty) // spends the only token
	lat = lat[:0]
	for range n {
		start := time.Now()
		if status, out := deliver(b, e, empty); status != http.StatusAccepted {
			b.Fatalf("deferred path: %d %s", status, out)
		}
		lat = append(lat, time.Since(start))
	}
	add("deferred (Worker + DO)", lat, "no subscriber call")

	// Delivered, sequential.
	lat = lat[:0]
	var over []time.Duration
	for range n {
		start := time.Now()
		status, out := deliver(b, e, warm)
		took := time.Since(start)
		var res edgewire.Result
		if status != http.StatusOK || json.Unmarshal(out, &res) != nil || res.Status != http.StatusNoContent {
			b.Fatalf("delivered path: %d %s", status, out)
		}
		lat = append(lat, took)
		over = append(over, took-time.Duration(res.DurationMS)*time.Millisecond)
	}
	add("delivered, total", lat, "incl. partner")
	add("delivered, overhead", over, "total − duration_ms")

	// Delivered, 8 at a time, each for its own subscriber.
	var mu sync.Mutex
	lat = lat[:0]
	var wg sync.WaitGroup
	start := time.Now()
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dr := p.request(b, fmt.Sprintf("dlv_par%d", w), unique(fmt.Sprintf("sub_par%d", w)), bucket.Rate{PerSecond: 1e6, Burst: 1e6})
			for range n / 8 {
				s := time.Now()
				if status, out := deliver(b, e, dr); status != http.StatusOK {
					b.Errorf("parallel: %d %s", status, out)
					return
				}
				d := time.Since(s)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	perSec := float64(len(lat)) / time.Since(start).Seconds()
	add("delivered, 8 concurrent", lat, fmt.Sprintf("%.0f deliveries/s", perSec))

	// Direct: Go to the partner, no Worker.
	lat = lat[:0]
	for range n {
		req, _ := http.NewRequest(http.MethodPost, warm.URL, bytes.NewReader([]byte(warm.Body)))
		s := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		lat = append(lat, time.Since(s))
	}
	add("direct to partner", lat, "baseline")

	raw, gz := wasmSize(b)
	storage := "in memory"
	if persist != "" {
		storage = "persisted in " + persist
	}
	fmt.Printf("\nedge overhead in local workerd (Miniflare), %d requests per row, Durable Object storage %s\n\n", n, storage)
	fmt.Printf("%-26s %6s %9s %9s %9s  %s\n", "path", "n", "p50 ms", "p99 ms", "max ms", "")
	for _, r := range rows {
		fmt.Printf("%-26s %6s %9s %9s %9s  %s\n", r[0], r[1], r[2], r[3], r[4], r[5])
	}
	fmt.Printf("\ncold start (first request, Go instance start): %s ms\n", ms(cold))
	fmt.Printf("app.wasm: %.2f MiB raw, %.2f MiB gzipped (limit 2 MiB)\n\n", float64(raw)/(1<<20), float64(gz)/(1<<20))
	b.ReportMetric(float64(pct(over, 50).Microseconds())/1000, "overhead-p50-ms")
	b.ReportMetric(float64(pct(over, 99).Microseconds())/1000, "overhead-p99-ms")
}

// newBenchPartner is a partner that answers 204 at once and checks nothing,
// so its own time is the network's.
func newBenchPartner(b *testing.B) *partner {
	p := &partner{Server: httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))}
	b.Cleanup(p.Close)
	return p
}

func pct(sorted []time.Duration, q int) time.Duration {
	i := (len(sorted)*q + 99) / 100
	return sorted[max(i-1, 0)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000) }

func wasmSize(b *testing.B) (raw, gz int) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "build", "edge", "app.wasm"))
	if err != nil {
		b.Fatal(err)
	}
	var buf bytes.Buffer
	w, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	w.Write(data)
	w.Close()
	return len(data), buf.Len()
}
