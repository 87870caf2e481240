package scenario

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/loadtest/report"
)

// Result is one scenario run's outcome.
type Result struct {
	Scenario string        `json:"scenario"`
	Events   int           `json:"events"`
	Timeout  report.Millis `json:"timeout_ms"`
	// Fire is how long posting the burst took; Elapsed, from the burst's
	// start to the accounting.
	Fire    report.Millis `json:"fire_ms"`
	Elapsed report.Millis `json:"elapsed_ms"`
	// Jitter is the arrival spread each 1-second limit allows for.
	Jitter report.Millis `json:"jitter_ms"`
	Rows   []report.Row  `json:"subscribers"`
	Kills  []Kill        `json:"kills,omitempty"`
	// Failures are the broken promises; none means the run passed.
	Failures []string `json:"failures"`
	Pass     bool     `json:"pass"`
	Notes    []string `json:"notes,omitempty"`
}

// judge fills Failures and Pass from the rows.
func (r *Result) judge() {
	for _, row := range r.Rows {
		if why := row.Failed(); why != "" {
			r.Failures = append(r.Failures, row.Subscriber+": "+why)
		}
	}
	r.Pass = len(r.Failures) == 0
}

// Write prints the table and the verdict.
func (r *Result) Write(w io.Writer) error {
	title := fmt.Sprintf("%s: %d events", r.Scenario, r.Events)
	if r.Fire > 0 {
		title += fmt.Sprintf(", burst posted in %s", report.Short(time.Duration(r.Fire)))
	}
	title += fmt.Sprintf(", accounted after %s (timeout %s)", report.Short(time.Duration(r.Elapsed)), report.Short(time.Duration(r.Timeout)))
	if err := report.WriteTable(w, title, r.Rows); err != nil {
		return err
	}
	fmt.Fprintf(w, "  limit = burst + rate × (1s + %s allowed for arrival jitter); p50/p99 = enqueue → first accept\n",
		report.Short(time.Duration(r.Jitter)))
	for _, k := range r.Kills {
		fmt.Fprintf(w, "  kill -9 at t+%s: %d deliveries in flight, back in %s\n",
			report.Short(time.Duration(k.At)), k.Inflight, report.Short(time.Duration(k.Down)))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  %s\n", n)
	}
	verdict := "PASS: nothing lost, no advertised rate exceeded"
	if !r.Pass {
		verdict = "FAIL: " + strings.Join(r.Failures, "; ")
	}
	_, err := fmt.Fprintln(w, verdict)
	return err
}

// Canal is the seed's incident: Events (default 12,000) video.trending
// events in one burst to the five CanalSpecs subscribers through a real
// sluice, then up to Timeout (default 60s) for them to reach each partner or
// the dead letters. The 10/s partner needs 20 minutes for 12,000 events, so
// a bounded run reports its progress: an event counts as lost only when it
// is neither delivered, nor pending or in flight in sluice, nor dead.
func Canal(ctx context.Context, o Options) (*Result, error) {
	o.defaults(12000, 60*time.Second, CanalSpecs)
	e, err := newEnv(ctx, o, true)
	if err != nil {
		return nil, err
	}
	defer e.close()

	ids := eventIDs("canal", o.Events)
	start := o.Now()
	fmt.Fprintf(o.Log, "firing %d events\n", len(ids))
	if err := e.fire(ctx, ids, 0, false); err != nil {
		return nil, fmt.Errorf("%w\nsluice log:\n%s", err, e.sluiceTail())
	}
	fired := o.Now().Sub(start)
	lv := &live{w: o.Live, tty: o.LiveTTY}
	if _, err := e.waitSettled(ctx, start, start.Add(o.Timeout), len(ids), true, lv); err != nil {
		return nil, err
	}
	rows, err := e.account(ctx, ids, start)
	if err != nil {
		return nil, fmt.Errorf("accounting: %w\nsluice log:\n%s", err, e.sluiceTail())
	}
	res := &Result{
		Scenario: "canal", Events: len(ids), Timeout: report.Millis(o.Timeout),
		Jitter: report.Millis(o.Jitter),
		Fire:   report.Millis(fired), Elapsed: report.Millis(o.Now().Sub(start)), Rows: rows,
	}
	res.judge()
	return res, nil
}
