package bench

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/loadtest/report"
)

// Bounds on the ingest runs besides their duration.
const (
	maxSingleEvents = 1_000_000
	maxBatches      = 2_000
)

// ingestResult is one ingest measurement.
type ingestResult struct {
	Clients  int           `json:"clients"`
	Events   int           `json:"events"` // accepted
	Requests int           `json:"requests"`
	Failed   int           `json:"failed"` // not 202, or no answer
	Elapsed  report.Millis `json:"elapsed_ms"`
	PerSec   float64       `json:"events_per_s"`
	P50      report.Millis `json:"request_p50_ms"`
	P99      report.Millis `json:"request_p99_ms"`
	FirstErr string        `json:"first_error,omitempty"`
}

// runIngest measures POST /v1/events from 64 concurrent clients, then POST
// /v1/events/batch (1,000 events a batch) from a few, each for IngestFor,
// against one sluice with one matching subscriber that is paused: every
// event also writes its delivery row, and no delivery competes for the CPU.
func runIngest(ctx context.Context, o *Options) (sectionResult, error) {
	n, _, stop, err := startWithSink(ctx, o, subscriber{ID: "held", PerSecond: 1000, Burst: 1000, Paused: true})
	if err != nil {
		return sectionResult{}, err
	}
	defer stop()

	m0 := n.cpuMark()
	single := ingestLoop(ctx, o, o.IngestClients, maxSingleEvents, func(ctx context.Context, i int) (int, error) {
		return 1, n.postOne(ctx, eventBody(nil, "single", i, o.Now()))
	})
	m1 := n.cpuMark()
	batch := ingestLoop(ctx, o, o.BatchClients, maxBatches, func(ctx context.Context, i int) (int, error) {
		return batchSize, n.postBatch(ctx, batchBody(fmt.Sprintf("batch%d", i), 0, batchSize, o.Now()))
	})
	m2 := n.cpuMark()
	if ctx.Err() != nil {
		return sectionResult{}, ctx.Err()
	}
	for _, r := range []ingestResult{single, batch} {
		if r.Events == 0 {
			return sectionResult{}, n.fail(fmt.Errorf("no event accepted: %s", r.FirstErr))
		}
	}
	rows := []Row{
		{
			Metric: fmt.Sprintf("ingest, single-event POSTs (%d clients)", single.Clients),
			Value:  num(single.PerSec), Unit: "events/s", Shown: thousands(single.PerSec) + " events/s",
			Target: "≥ 8,000/s", Pass: mark(single.PerSec >= 8000 && single.Failed == 0),
		},
		{
			Metric: fmt.Sprintf("ingest, batches of 1,000 (%d clients)", batch.Clients),
			Value:  num(batch.PerSec), Unit: "events/s", Shown: thousands(batch.PerSec) + " events/s",
			Target: "≥ 40,000/s", Pass: mark(batch.PerSec >= 40000 && batch.Failed == 0),
		},
	}
	notes := []string{fmt.Sprintf("ingest: %s each, fresh sluice, one paused subscriber matching every event (so each event also writes "+
		"its delivery row); single: %s events, request p50 %s p99 %s, %d failed, %s; batch: %s events, request p50 %s p99 %s, %d failed, %s",
		report.Short(o.IngestFor), thousands(float64(single.Events)), report.Short(time.Duration(single.P50)), report.Short(time.Duration(single.P99)), single.Failed, cpuText(m0, m1),
		thousands(float64(batch.Events)), report.Short(time.Duration(batch.P50)), report.Short(time.Duration(batch.P99)), batch.Failed, cpuText(m1, m2))}
	return sectionResult{rows: rows, notes: notes, details: map[string]ingestResult{"single": single, "batch": batch}}, nil
}

// ingestLoop runs clients that each call send with the next request number
// until IngestFor has passed or limit requests were made, and counts what
// was accepted.
func ingestLoop(ctx context.Context, o *Options, clients, limit int, send func(ctx context.Context, i int) (int, error)) ingestResult {
	var (
		next     atomic.Int64
		mu       sync.Mutex
		res      = ingestResult{Clients: clients}
		lat      []time.Duration
		wg       sync.WaitGroup
		start    = o.Now()
		deadline = start.Add(o.IngestFor)
	)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && o.Now().Before(deadline) {
				i := int(next.Add(1)) - 1
				if i >= limit {
					return
				}
				t0 := o.Now()
				k, err := send(ctx, i)
				d := o.Now().Sub(t0)
				mu.Lock()
				res.Requests++
				lat = append(lat, d)
				if err != nil {
					res.Failed++
					if res.FirstErr == "" {
						res.FirstErr = err.Error()
					}
				} else {
					res.Events += k
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := o.Now().Sub(start)
	res.Elapsed = report.Millis(elapsed)
	res.PerSec = report.Rate(res.Events, elapsed)
	slices.Sort(lat)
	res.P50 = report.Millis(report.Percentile(lat, 0.50))
	res.P99 = report.Millis(report.Percentile(lat, 0.99))
	return res
}

// postOne posts one event to POST /v1/events; anything but 202 fails.
func (n *node) postOne(ctx context.Context, body []byte) error {
	status, out, err := n.do(ctx, http.MethodPost, "/v1/events", body)
	if err != nil {
		return err
	}
	if status != http.StatusAccepted {
		return fmt.Errorf("POST /v1/events: status %d: %.300s", status, out)
	}
	return nil
}
