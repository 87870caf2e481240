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

// fastRate is the rate of a subscriber the limiter should never hold back
// (the API's maximum).
const fastRate = 1_000_000

// throughputResult is the end-to-end delivery run.
type throughputResult struct {
	Events     int           `json:"events"`
	Enqueue    report.Millis `json:"enqueue_ms"` // first batch sent → last batch answered
	Elapsed    report.Millis `json:"elapsed_ms"` // first batch sent → last arrival
	PerSec     float64       `json:"deliveries_per_s"`
	Duplicates int           `json:"duplicates"`
}

// runThroughput enqueues Backlog events in batches of 1,000, one after the
// other, for one subscriber with a very high rate whose endpoint is the
// loopback sink, and times the first enqueue to the last arrival.
func runThroughput(ctx context.Context, o *Options) (sectionResult, error) {
	n, sk, stop, err := startWithSink(ctx, o, subscriber{ID: "sink", PerSecond: fastRate, Burst: fastRate})
	if err != nil {
		return sectionResult{}, err
	}
	defer stop()
	m0 := n.cpuMark()
	start := m0.at
	if err := n.fire(ctx, "tput", 0, o.Backlog); err != nil {
		return sectionResult{}, n.fail(err)
	}
	fired := o.Now().Sub(start)
	if err := sk.waitFor(ctx, o.Backlog, 2*time.Minute); err != nil {
		return sectionResult{}, n.fail(err)
	}
	m1 := n.cpuMark()
	arr, _, dups := sk.snapshot()
	elapsed := arr[len(arr)-1].Sub(start)
	r := throughputResult{
		Events: o.Backlog, Enqueue: report.Millis(fired), Elapsed: report.Millis(elapsed),
		PerSec: report.Rate(o.Backlog, elapsed), Duplicates: dups,
	}
	rows := []Row{{
		Metric: fmt.Sprintf("deliveries/s end to end (%s backlog, loopback receiver)", thousands(float64(o.Backlog))),
		Value:  num(r.PerSec), Unit: "deliveries/s", Shown: thousands(r.PerSec) + "/s",
		Target: "≥ 10,000/s", Pass: mark(r.PerSec >= 10000),
	}}
	notes := []string{fmt.Sprintf("throughput: one subscriber at %s/s to a receiver that answers 204 at once (signatures not checked); "+
		"%s events enqueued in batches of 1,000 in %s, the last delivered %s after the first enqueue; %d duplicates; %s",
		thousands(fastRate), thousands(float64(o.Backlog)), report.Short(fired), report.Short(elapsed), dups, cpuText(m0, m1))}
	return sectionResult{rows: rows, notes: notes, details: r}, nil
}

// latencyResult is the fixed-load latency run.
type latencyResult struct {
	Offered   float64       `json:"offered_per_s"` // target
	Achieved  float64       `json:"achieved_per_s"`
	Sent      int           `json:"sent"`
	Measured  int           `json:"measured"` // after the warm-up
	Failed    int           `json:"failed_posts"`
	Late      int           `json:"late_sends"` // sent more than 5 ms behind schedule
	P50       report.Millis `json:"p50_ms"`
	P99       report.Millis `json:"p99_ms"`
	Max       report.Millis `json:"max_ms"`
	WarmUp    report.Millis `json:"warm_up_ms"`
	PostClock report.Millis `json:"post_p99_ms"` // POST /v1/events round trip
}

// latencyClients are the senders pacing the fixed load.
const latencyClients = 64

// latencyWarmUp is sent at the same rate before the measured part, so
// connections and caches are warm.
const latencyWarmUp = time.Second

// runLatency offers LatencyRate single-event POSTs per second for a 1 s
// warm-up plus LatencyFor, each event carrying the time it was sent, and
// reports the enqueue→delivery percentiles the sink saw for events sent
// after the warm-up. Then it offers the same load to a bare relay process
// with no ledger (when Options.Relay is set) and straight to a sink, and
// reports their percentiles beside sluice's: the floors this machine sets
// under that load for sluice's two hops and for one.
func runLatency(ctx context.Context, o *Options) (sectionResult, error) {
	steady := probeSteadiness(ctx, steadyFor, steadyWindow, o.Now)
	if ctx.Err() != nil {
		return sectionResult{}, ctx.Err()
	}
	r, note, err := latencyOfSluice(ctx, o)
	if err != nil {
		return sectionResult{}, err
	}
	label := fmt.Sprintf("at %s/s offered (%s achieved)", thousands(r.Offered), thousands(r.Achieved))
	rows := []Row{
		{
			Metric: "p50 enqueue→delivery " + label, Value: num(time.Duration(r.P50).Seconds() * 1000), Unit: "ms",
			Shown: report.Short(time.Duration(r.P50)),
		},
		{
			Metric: "p99 enqueue→delivery " + label, Value: num(time.Duration(r.P99).Seconds() * 1000), Unit: "ms",
			Shown: report.Short(time.Duration(r.P99)), Target: "≤ 10ms", Pass: mark(time.Duration(r.P99) <= 10*time.Millisecond),
		},
	}
	notes := []string{"latency: " + note}
	details := map[string]any{"sluice": r}
	// floor adds a row, a note and details for a run of the same load
	// through something lighter than sluice.
	floor := func(key, what, note string, f latencyResult, fnote string) {
		rows = append(rows, Row{
			Metric: fmt.Sprintf("  the floor: %s at %s/s, p50 / p99", what, thousands(f.Achieved)),
			Value:  num(time.Duration(f.P99).Seconds() * 1000), Unit: "ms",
			Shown: report.Short(time.Duration(f.P50)) + " / " + report.Short(time.Duration(f.P99)),
		})
		notes = append(notes, note+fnote)
		details[key] = f
	}
	if o.Relay != "" {
		f, fnote, err := latencyOfRelay(ctx, o)
		if err != nil {
			return sectionResult{}, fmt.Errorf("the bare relay: %w", err)
		}
		floor("relay", "a bare relay (no ledger)", "floor: `loadtest relay` in its own process answers 202 at once and forwards each body "+
			"to the same kind of sink, with nothing durable and no signature; the same clients offer it the same load: ", f, fnote)
	}
	f, fnote, err := latencyOfOneHop(ctx, o)
	if err != nil {
		return sectionResult{}, fmt.Errorf("one hop: %w", err)
	}
	floor("one_hop", "one HTTP hop, the clients straight to the sink", "one hop: the same clients POST each event straight to the same "+
		"kind of sink, through Go's http.Client as sluice's own deliveries go; sluice's path has two such hops and a commit between them: ", f, fnote)
	rows = append(rows, Row{
		Metric: fmt.Sprintf("  the machine: %s windows on %d idle CPUs, doing fixed work at under half speed", report.Short(steadyWindow), steady.CPUs),
		Value:  num(float64(steady.Slow) / float64(max(steady.Windows, 1)) * 100), Unit: "%",
		Shown: steady.text(),
	})
	notes = append(notes, fmt.Sprintf("the machine: before the runs, one thread per CPU repeated a fixed computation for %s and counted how many "+
		"it finished in each %s; a window with under half its CPU's best count is time the host slowed this machine down, which the "+
		"steal figure does not show. Every process's latency stretches in such windows, the floors' as well as sluice's",
		report.Short(steadyFor), report.Short(steadyWindow)))
	details["steadiness"] = steady
	return sectionResult{rows: rows, notes: notes, details: details}, nil
}

// steadyFor and steadyWindow size the probe of the machine's steadiness.
const (
	steadyFor    = 3 * time.Second
	steadyWindow = 50 * time.Millisecond
)

// latencyOfSluice offers the fixed load to a fresh sluice with one fast
// subscriber whose endpoint is the sink.
func latencyOfSluice(ctx context.Context, o *Options) (latencyResult, string, error) {
	n, sk, stop, err := startWithSink(ctx, o, subscriber{ID: "sink", PerSecond: fastRate, Burst: fastRate})
	if err != nil {
		return latencyResult{}, "", err
	}
	defer stop()
	r, note, err := offerLoad(ctx, o, n.postOne, sk, n.cpuMark, "sluice")
	if err != nil {
		return r, note, n.fail(err)
	}
	return r, note, nil
}

// latencyOfRelay offers the fixed load to a bare relay forwarding to a sink.
func latencyOfRelay(ctx context.Context, o *Options) (latencyResult, string, error) {
	sk, err := startSink(o.Now)
	if err != nil {
		return latencyResult{}, "", err
	}
	defer sk.close()
	rl, err := startRelay(ctx, o.Relay, sk.url)
	if err != nil {
		return latencyResult{}, "", err
	}
	defer rl.close()
	return offerLoad(ctx, o, rl.post, sk, func() cpuMark { return markCPU(o.Now, rl.pid()) }, "the relay")
}

// latencyOfOneHop offers the fixed load straight to a sink: what one
// http.Client round trip costs on this machine under this load.
func latencyOfOneHop(ctx context.Context, o *Options) (latencyResult, string, error) {
	sk, err := startSink(o.Now)
	if err != nil {
		return latencyResult{}, "", err
	}
	defer sk.close()
	hc := newClient()
	defer hc.CloseIdleConnections()
	post := func(ctx context.Context, body []byte) error {
		return postEvent(ctx, hc, sk.url, body, http.StatusNoContent)
	}
	return offerLoad(ctx, o, post, sk, func() cpuMark { return markCPU(o.Now, 0) }, "")
}

// offerLoad runs the paced clients against post and reads the sink.
func offerLoad(ctx context.Context, o *Options, post func(context.Context, []byte) error, sk *sink,
	cpu func() cpuMark, name string) (latencyResult, string, error) {
	total := int(float64(o.LatencyRate) * (latencyWarmUp + o.LatencyFor).Seconds())
	m0 := cpu()
	interval := time.Second / time.Duration(o.LatencyRate)
	start := o.Now().Add(50 * time.Millisecond)
	var (
		next                atomic.Int64
		mu                  sync.Mutex
		failed, late        int
		firstSent, lastSent time.Time
		posts               []time.Duration
		wg                  sync.WaitGroup
		firstErr            error
		lateBy              = 5 * time.Millisecond
		measuredFrom        = start.Add(latencyWarmUp)
		count               int
	)
	for range latencyClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= total {
					return
				}
				due := start.Add(time.Duration(i) * interval)
				if sleep(ctx, due.Sub(o.Now())) != nil {
					return
				}
				sent := o.Now()
				err := post(ctx, eventBody(nil, "lat", i, sent))
				took := o.Now().Sub(sent)
				mu.Lock()
				count++
				posts = append(posts, took)
				if firstSent.IsZero() || sent.Before(firstSent) {
					firstSent = sent
				}
				if sent.After(lastSent) {
					lastSent = sent
				}
				if sent.Sub(due) > lateBy {
					late++
				}
				if err != nil {
					failed++
					if firstErr == nil {
						firstErr = err
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return latencyResult{}, "", ctx.Err()
	}
	waitErr := sk.waitFor(ctx, total-failed, time.Minute)
	m1 := cpu()
	_, samples, _ := sk.snapshot()
	lat := latenciesFrom(samples, measuredFrom)
	if len(lat) == 0 {
		return latencyResult{}, "", fmt.Errorf("no delivery of an event sent after the warm-up arrived (%v; first POST error: %v)", waitErr, firstErr)
	}
	slices.Sort(posts)
	r := latencyResult{
		Offered: float64(o.LatencyRate), Sent: count, Measured: len(lat), Failed: failed, Late: late,
		Achieved: report.Rate(count-1, lastSent.Sub(firstSent)),
		P50:      report.Millis(report.Percentile(lat, 0.50)), P99: report.Millis(report.Percentile(lat, 0.99)),
		Max: report.Millis(lat[len(lat)-1]), WarmUp: report.Millis(latencyWarmUp),
		PostClock: report.Millis(report.Percentile(posts, 0.99)),
	}
	note := fmt.Sprintf("%d clients pace single-event POSTs on a fixed schedule; each body carries its send time, the receiver "+
		"subtracts it on arrival (nearest-rank percentiles of %s events sent after a %s warm-up; max %s); %d sends were more than %s late, "+
		"%d POSTs failed, POST p99 %s; %s",
		latencyClients, thousands(float64(r.Measured)), report.Short(latencyWarmUp), report.Short(time.Duration(r.Max)),
		late, report.Short(lateBy), failed, report.Short(time.Duration(r.PostClock)), cpuTextOf(name, m0, m1))
	if waitErr != nil {
		note += fmt.Sprintf("; NOT all arrived: %v", waitErr)
	}
	return r, note, nil
}

// latenciesFrom returns, sorted, the latencies of the samples sent at or
// after from.
func latenciesFrom(samples []sample, from time.Time) []time.Duration {
	var out []time.Duration
	for _, s := range samples {
		if !s.Sent.Before(from) {
			out = append(out, s.Latency)
		}
	}
	slices.Sort(out)
	return out
}
