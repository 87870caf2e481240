package bench

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/sluice-dev/sluice/loadtest/report"
	"github.com/sluice-dev/sluice/shared/bucket"
)

// The rate-cap run: a subscriber at capRate with a backlog far beyond what
// capWindow lets through.
var capRate = bucket.Rate{PerSecond: 100, Burst: 20}

const (
	capWindow  = 10 * time.Second
	capBacklog = 2000
)

// rateCapResult is the rate-cap run.
type rateCapResult struct {
	Rate      bucket.Rate   `json:"rate"`
	Window    report.Millis `json:"window_ms"`
	BurstEnd  report.Millis `json:"burst_end_ms"` // after the first enqueue
	Delivered int           `json:"delivered_in_window"`
	Allowed   float64       `json:"allowed_in_window"`
	Accuracy  float64       `json:"accuracy"`
	MaxIn1s   int           `json:"max_1s_window"`
	Limit1s   int           `json:"limit_1s"`
}

// CapAccuracy judges a rate limiter from the sorted arrival times at its
// receiver: the burst is the first r.Burst arrivals, the window runs from
// the last of those (exclusive) for window (inclusive), and accuracy is
// the arrivals in it divided by what the rate allows there, r.PerSecond ×
// window. A limiter that keeps its rate exactly scores 1; above 1 it let
// more through than configured. ok is false when the burst never completed.
func CapAccuracy(arrivals []time.Time, r bucket.Rate, window time.Duration) (delivered int, accuracy float64, ok bool) {
	b := int(r.Burst)
	if b < 1 || len(arrivals) < b || r.PerSecond <= 0 {
		return 0, 0, false
	}
	from := arrivals[b-1]
	to := from.Add(window)
	end := sort.Search(len(arrivals), func(i int) bool { return arrivals[i].After(to) })
	delivered = end - b
	return delivered, float64(delivered) / (r.PerSecond * window.Seconds()), true
}

// runRateCap creates a subscriber at 100/s burst 20, enqueues a backlog of
// 2,000 events, and counts what arrives in the 10 s after the burst.
func runRateCap(ctx context.Context, o *Options) (sectionResult, error) {
	n, sk, stop, err := startWithSink(ctx, o, subscriber{ID: "capped", PerSecond: capRate.PerSecond, Burst: capRate.Burst})
	if err != nil {
		return sectionResult{}, err
	}
	defer stop()
	start := o.Now()
	if err := n.fire(ctx, "cap", 0, capBacklog); err != nil {
		return sectionResult{}, n.fail(err)
	}
	if err := sk.waitFor(ctx, int(capRate.Burst), 10*time.Second); err != nil {
		return sectionResult{}, n.fail(fmt.Errorf("the burst: %w", err))
	}
	arr, _, _ := sk.snapshot()
	burstEnd := arr[int(capRate.Burst)-1]
	// Wait out the window, and a little more for arrivals in flight.
	if err := sleep(ctx, burstEnd.Add(capWindow+300*time.Millisecond).Sub(o.Now())); err != nil {
		return sectionResult{}, err
	}
	arr, _, dups := sk.snapshot()
	got, acc, _ := CapAccuracy(arr, capRate, capWindow)
	maxIn1s, _ := report.MaxInWindow(arr, time.Second)
	r := rateCapResult{
		Rate: capRate, Window: report.Millis(capWindow), BurstEnd: report.Millis(burstEnd.Sub(start)),
		Delivered: got, Allowed: capRate.PerSecond * capWindow.Seconds(), Accuracy: acc,
		MaxIn1s: maxIn1s, Limit1s: report.Limit(capRate, time.Second, 0),
	}
	rows := []Row{{
		Metric: fmt.Sprintf("rate-cap accuracy, %g/s burst %g, 10 s after the burst", capRate.PerSecond, capRate.Burst),
		Value:  num(acc), Unit: "achieved/configured", Shown: fmt.Sprintf("%.3f (%d/%g)", acc, got, r.Allowed),
		Target: "0.97–1.00", Pass: mark(acc >= 0.97 && acc <= 1.0),
	}}
	notes := []string{fmt.Sprintf("rate cap: %s-event backlog; the window starts at the %gth arrival (t+%s) and holds %d arrivals; "+
		"busiest 1 s at the receiver %d (burst + rate = %d); %d duplicates",
		thousands(capBacklog), capRate.Burst, report.Short(burstEnd.Sub(start)), got, maxIn1s, r.Limit1s, dups)}
	return sectionResult{rows: rows, notes: notes, details: r}, nil
}
