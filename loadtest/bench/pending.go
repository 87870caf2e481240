package bench

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/loadtest/report"
)

// pendingClients post the backlog's batches side by side.
const pendingClients = 4

// pendingResult is the memory and claim run.
type pendingResult struct {
	Pending       int           `json:"pending"`
	Enqueue       report.Millis `json:"enqueue_ms"`
	EnqueuePerSec float64       `json:"enqueue_events_per_s"`
	PendingGauge  float64       `json:"pending_gauge"` // sluice_deliveries_pending after the enqueue
	// RSSIdle is VmRSS 1 s after the enqueue; RSS, after one /metrics
	// scrape and one /v1/stats read as well, as a watched sluice would be.
	RSSIdle   int64         `json:"rss_idle_bytes"`
	RSS       int64         `json:"rss_bytes"`
	MetricRSS float64       `json:"process_resident_memory_bytes"`
	GoHeap    float64       `json:"go_heap_inuse_bytes"`
	Scrape    report.Millis `json:"scrape_ms"` // GET /metrics with the backlog
	Stats     report.Millis `json:"stats_ms"`  // GET /v1/stats with the backlog
	ClaimFor  report.Millis `json:"claim_for_ms"`
	Claims    float64       `json:"claims"`
	ClaimP50  float64       `json:"-"` // interpolated in the histogram's buckets; NaN without claims
	ClaimP99  float64       `json:"-"`
	ClaimMean float64       `json:"claim_mean_s"`
	// The quantiles again for JSON, which has no NaN: null without claims.
	ClaimP50JSON *float64  `json:"claim_p50_s"`
	ClaimP99JSON *float64  `json:"claim_p99_s"`
	Claim        Histogram `json:"claim_histogram"` // observed while claiming
	Delivered    int       `json:"delivered_while_claiming"`
	// RSSClaiming is VmRSS at the end of the claiming; PeakRSS, VmHWM then:
	// the most sluice was resident at any moment of the run.
	RSSClaiming int64 `json:"rss_claiming_bytes"`
	PeakRSS     int64 `json:"peak_rss_bytes"`
}

const claimHistogram = "sluice_claim_duration_seconds"

// runPending enqueues Pending events (batches of 1,000 from 4 clients) for
// one subscriber created paused, reads sluice's RSS with them all pending,
// then unpauses it — a very high rate, a loopback receiver — and reads the
// claim-latency histogram's growth over ClaimFor.
func runPending(ctx context.Context, o *Options) (sectionResult, error) {
	n, sk, stop, err := startWithSink(ctx, o, subscriber{ID: "backlog", PerSecond: fastRate, Burst: fastRate, Paused: true})
	if err != nil {
		return sectionResult{}, err
	}
	defer stop()
	r := pendingResult{Pending: o.Pending}
	m0 := n.cpuMark()
	start := m0.at
	if err := n.fireParallel(ctx, "pend", o.Pending, pendingClients); err != nil {
		return sectionResult{}, n.fail(err)
	}
	m1 := n.cpuMark()
	r.Enqueue = report.Millis(m1.at.Sub(start))
	r.EnqueuePerSec = report.Rate(o.Pending, time.Duration(r.Enqueue))
	fmt.Fprintf(o.Progress, "bench:   %s events enqueued in %s\n", thousands(float64(o.Pending)), report.Short(time.Duration(r.Enqueue)))
	if err := sleep(ctx, time.Second); err != nil {
		return sectionResult{}, err
	}
	r.RSSIdle, _ = n.rss()
	began := o.Now()
	before, err := n.scrape(ctx)
	if err != nil {
		return sectionResult{}, n.fail(err)
	}
	r.Scrape = report.Millis(o.Now().Sub(began))
	began = o.Now()
	if _, err := n.expect(ctx, http.MethodGet, "/v1/stats", nil, http.StatusOK); err != nil {
		return sectionResult{}, n.fail(err)
	}
	r.Stats = report.Millis(o.Now().Sub(began))
	r.RSS, _ = n.rss()
	r.PendingGauge, _ = before.Value("sluice_deliveries_pending", nil)
	r.MetricRSS, _ = before.Value("process_resident_memory_bytes", nil)
	r.GoHeap, _ = before.Value("go_memstats_heap_inuse_bytes", nil)
	h0, err := before.Histogram(claimHistogram)
	if err != nil {
		return sectionResult{}, err
	}

	if err := n.patch(ctx, "backlog", map[string]any{"paused": false}); err != nil {
		return sectionResult{}, n.fail(err)
	}
	m2 := n.cpuMark()
	began = m2.at
	if err := sleep(ctx, o.ClaimFor); err != nil {
		return sectionResult{}, err
	}
	after, err := n.scrape(ctx)
	if err != nil {
		return sectionResult{}, n.fail(err)
	}
	m3 := n.cpuMark()
	r.ClaimFor = report.Millis(o.Now().Sub(began))
	r.Delivered = sk.count()
	r.RSSClaiming, r.PeakRSS = n.rss()
	h1, err := after.Histogram(claimHistogram)
	if err != nil {
		return sectionResult{}, err
	}
	r.Claim = h1.Sub(h0)
	r.Claims = r.Claim.Count()
	r.ClaimP50, r.ClaimP99 = r.Claim.Quantile(0.50), r.Claim.Quantile(0.99)
	r.ClaimP50JSON, r.ClaimP99JSON = num(r.ClaimP50), num(r.ClaimP99)
	if r.Claims > 0 {
		r.ClaimMean = r.Claim.Sum / r.Claims
	}

	mib := func(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }
	label := thousands(float64(o.Pending))
	rows := []Row{
		{
			Metric: fmt.Sprintf("RSS with %s deliveries pending (paused; after a scrape)", label),
			Value:  num(float64(r.RSS) / (1 << 20)), Unit: "MiB", Shown: mib(r.RSS),
			Target: "≤ 200 MiB", Pass: mark(r.RSS > 0 && r.RSS <= 200<<20),
		},
		{
			Metric: "peak RSS (VmHWM) over enqueue, reads and claiming",
			Value:  num(float64(r.PeakRSS) / (1 << 20)), Unit: "MiB", Shown: mib(r.PeakRSS),
			Target: "≤ 200 MiB", Pass: mark(r.PeakRSS > 0 && r.PeakRSS <= 200<<20),
		},
		{
			Metric: fmt.Sprintf("p99 claim with %s pending (%s claims in %s)", label, thousands(r.Claims), report.Short(time.Duration(r.ClaimFor))),
			Value:  num(r.ClaimP99 * 1000), Unit: "ms", Shown: ms(r.ClaimP99),
			Target: "≤ 5ms", Pass: mark(r.ClaimP99 <= 0.005),
		},
	}
	notes := []string{
		fmt.Sprintf("pending: %s events enqueued in %s (%s events/s, %d clients × batches of 1,000) for a subscriber created paused; "+
			"%s; sluice_deliveries_pending %s; RSS = VmRSS from /proc/<pid>/status: %s 1 s after the enqueue, %s after GET /metrics (%s) "+
			"and GET /v1/stats (%s); process_resident_memory_bytes %s, Go heap in use %s (the rest is mostly SQLite's page caches)",
			label, report.Short(time.Duration(r.Enqueue)), thousands(r.EnqueuePerSec), pendingClients, cpuText(m0, m1), thousands(r.PendingGauge),
			mib(r.RSSIdle), mib(r.RSS), report.Short(time.Duration(r.Scrape)), report.Short(time.Duration(r.Stats)),
			mib(int64(r.MetricRSS)), mib(int64(r.GoHeap))),
		fmt.Sprintf("claim: unpaused (%s/s, loopback receiver) for %s: %s claims, p50 %s p99 %s mean %s — quantiles interpolated linearly "+
			"inside the buckets of %s (as histogram_quantile does: estimates between bucket bounds); %s delivered meanwhile; RSS then %s; %s",
			thousands(fastRate), report.Short(time.Duration(r.ClaimFor)), thousands(r.Claims), ms(r.ClaimP50), ms(r.ClaimP99), ms(r.ClaimMean),
			claimHistogram, thousands(float64(r.Delivered)), mib(r.RSSClaiming), cpuText(m2, m3)),
	}
	return sectionResult{rows: rows, notes: notes, details: r}, nil
}

// fireParallel posts count events in batches of 1,000 from clients side by
// side; the first failure stops the rest.
func (n *node) fireParallel(ctx context.Context, prefix string, count, clients int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches := (count + batchSize - 1) / batchSize
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				b := int(next.Add(1)) - 1
				if b >= batches {
					return
				}
				lo := b * batchSize
				hi := min(lo+batchSize, count)
				if err := n.postBatch(ctx, batchBody(prefix, lo, hi, n.now())); err != nil {
					once.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}
