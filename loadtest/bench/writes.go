package bench

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/sluice-dev/sluice/loadtest/report"
)

// The row-writes run: a subscriber throttled to writesRate with a backlog
// of writesBacklog, measured over writesWindow once the burst is spent;
// then throttled so hard (idleRate) that nothing is due for a while.
const (
	writesRate    = 50
	writesBacklog = 10_000
	writesSettle  = 2 * time.Second
	writesWindow  = 5 * time.Second
	idleRate      = 0.1
	idleSettle    = 1500 * time.Millisecond
	idleWindow    = 4 * time.Second
)

// counters is what one scrape says about writes and deliveries.
type counters struct {
	Writes    float64 // sluice_ledger_row_writes_total
	Successes float64 // sluice_attempts_total{outcome="success"}
	Attempts  float64 // sluice_attempts_total
	Delivered int     // distinct arrivals at the sink
	Quiet     bool    // read when nothing was claimed and not yet recorded
}

func (n *node) counters(ctx context.Context, sk *sink) (counters, error) {
	sc, err := n.scrape(ctx)
	if err != nil {
		return counters{}, err
	}
	var c counters
	var ok bool
	if c.Writes, ok = sc.Value("sluice_ledger_row_writes_total", nil); !ok {
		return c, fmt.Errorf("no sluice_ledger_row_writes_total in /metrics")
	}
	c.Successes, _ = sc.Value("sluice_attempts_total", map[string]string{"outcome": "success"})
	c.Attempts, _ = sc.Value("sluice_attempts_total", nil)
	c.Delivered = sk.count()
	return c, nil
}

// quietCounters reads the counters at a quiet moment: just after an
// arrival at the sink, between two tokens, when every delivery claimed has
// been attempted and recorded (sluice's attempt count equals the sink's
// arrivals). A window whose ends cut through a delivery would count its
// claim on one side and its attempt on the other. After tries it takes
// what it has (a window with a delivery cut at an end is off by a write or
// two, and the note shows both counts).
func (n *node) quietCounters(ctx context.Context, sk *sink, tries int) (counters, error) {
	if tries <= 0 {
		return n.counters(ctx, sk)
	}
	var c counters
	for range tries {
		seen := sk.count()
		deadline := n.now().Add(time.Second)
		for sk.count() == seen && n.now().Before(deadline) {
			if err := sleep(ctx, time.Millisecond); err != nil {
				return c, err
			}
		}
		// Long enough for the arrival's outcome to be recorded, short of
		// the next token (20 ms apart at 50/s).
		if err := sleep(ctx, 8*time.Millisecond); err != nil {
			return c, err
		}
		var err error
		if c, err = n.counters(ctx, sk); err != nil {
			return c, err
		}
		if c.Attempts == float64(c.Delivered) && sk.count() == c.Delivered {
			c.Quiet = true
			return c, nil
		}
	}
	return c, nil
}

// writesWindowResult is one measured window.
type writesWindowResult struct {
	Window    report.Millis `json:"window_ms"`
	Writes    float64       `json:"row_writes"`
	Delivered float64       `json:"delivered"` // successful attempts
	Attempts  float64       `json:"attempts"`
	Arrived   int           `json:"arrived"` // at the receiver, a cross-check
	PerEvent  *float64      `json:"writes_per_delivery"`
	// Quiet says both ends were read with no delivery between its claim
	// and its recorded outcome.
	Quiet bool `json:"quiet_ends"`
}

// WritesPerDelivery is row writes divided by deliveries in a window, NaN
// when nothing was delivered.
func WritesPerDelivery(writes, delivered float64) float64 {
	if delivered <= 0 {
		return math.NaN()
	}
	return writes / delivered
}

func window(before, after counters, d time.Duration) writesWindowResult {
	w := writesWindowResult{
		Window: report.Millis(d), Writes: after.Writes - before.Writes,
		Delivered: after.Successes - before.Successes, Attempts: after.Attempts - before.Attempts,
		Arrived: after.Delivered - before.Delivered, Quiet: before.Quiet && after.Quiet,
	}
	w.PerEvent = num(WritesPerDelivery(w.Writes, w.Delivered))
	return w
}

// runWrites enqueues 10,000 events for a subscriber at 50/s, reads the
// ledger's row-write counter before and after a 5 s window once the burst
// is spent, and divides by the deliveries in it; then lowers the rate to
// 0.1/s and reads the counter across a 4 s window in which nothing should
// be delivered, and nothing written.
func runWrites(ctx context.Context, o *Options) (sectionResult, error) {
	n, sk, stop, err := startWithSink(ctx, o, subscriber{ID: "throttled", PerSecond: writesRate, Burst: writesRate})
	if err != nil {
		return sectionResult{}, err
	}
	defer stop()
	if err := n.fire(ctx, "wr", 0, writesBacklog); err != nil {
		return sectionResult{}, n.fail(err)
	}
	measure := func(settle, d time.Duration, quietTries int) (writesWindowResult, error) {
		if err := sleep(ctx, settle); err != nil {
			return writesWindowResult{}, err
		}
		before, err := n.quietCounters(ctx, sk, quietTries)
		if err != nil {
			return writesWindowResult{}, n.fail(err)
		}
		began := o.Now()
		if err := sleep(ctx, d); err != nil {
			return writesWindowResult{}, err
		}
		after, err := n.quietCounters(ctx, sk, quietTries)
		if err != nil {
			return writesWindowResult{}, n.fail(err)
		}
		return window(before, after, o.Now().Sub(began)), nil
	}
	busy, err := measure(writesSettle, writesWindow, 20)
	if err != nil {
		return sectionResult{}, err
	}
	if err := n.patch(ctx, "throttled", map[string]any{"rate": map[string]float64{"per_second": idleRate, "burst": 1}}); err != nil {
		return sectionResult{}, n.fail(err)
	}
	idle, err := measure(idleSettle, idleWindow, 0) // nothing arrives to wait for
	if err != nil {
		return sectionResult{}, err
	}

	perEvent := WritesPerDelivery(busy.Writes, busy.Delivered)
	rows := []Row{
		{
			Metric: fmt.Sprintf("row writes per delivered event, %d/s with a %s backlog", writesRate, thousands(writesBacklog)),
			Value:  num(perEvent), Unit: "writes/delivery", Shown: fmt.Sprintf("%.2f (%s writes / %s delivered)", perEvent, thousands(busy.Writes), thousands(busy.Delivered)),
			Target: "≤ 3", Pass: mark(perEvent <= 3),
		},
	}
	idleRow := Row{
		Metric: fmt.Sprintf("row writes while throttled with nothing due (%gs at %g/s)", idleWindow.Seconds(), idleRate),
		Value:  num(idle.Writes), Unit: "writes", Target: "0",
	}
	if idle.Delivered == 0 {
		idleRow.Shown = fmt.Sprintf("%s (0 delivered)", thousands(idle.Writes))
		idleRow.Pass = mark(idle.Writes == 0)
	} else {
		// A token came due inside the window: a delivery's own writes are
		// allowed, so this window cannot show idle writes.
		idleRow.Shown = fmt.Sprintf("%s (%s delivered: inconclusive)", thousands(idle.Writes), thousands(idle.Delivered))
	}
	rows = append(rows, idleRow)
	notes := []string{fmt.Sprintf("row writes: sluice_ledger_row_writes_total (SQLite total_changes) and sluice_attempts_total{outcome=success} "+
		"read in one scrape before and after each window; busy window %s after the enqueue (%s arrived at the receiver, %s attempts), "+
		"its ends read %s; then PATCH rate to %g/s burst 1 and a %s window after %s",
		report.Short(writesSettle), thousands(float64(busy.Arrived)), thousands(busy.Attempts), quietText(busy.Quiet),
		idleRate, report.Short(idleWindow), report.Short(idleSettle))}
	return sectionResult{rows: rows, notes: notes, details: map[string]writesWindowResult{"throttled": busy, "nothing_due": idle}}, nil
}

func quietText(quiet bool) string {
	if quiet {
		return "just after an arrival, with every claimed delivery attempted and recorded"
	}
	return "without finding a quiet moment (a delivery cut at an end moves the count by a write or two)"
}
