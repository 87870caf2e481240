package scenario

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/loadtest/partner"
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
	title += fmt.Sprintf(", accounted after %s (the drain waited up to --timeout %s)", report.Short(time.Duration(r.Elapsed)), report.Short(time.Duration(r.Timeout)))
	if err := report.WriteTable(w, title, r.Rows); err != nil {
		return err
	}
	fmt.Fprintf(w, "  limit = burst + rate × (1s + %s allowed for arrival jitter); p50/p99 = enqueue → first accept;\n"+
		"  drain = time to deliver them all, or (n%%) delivered when the run ended, the rest still pending, not lost\n",
		report.Short(time.Duration(r.Jitter)))
	for _, k := range r.Kills {
		fmt.Fprintf(w, "  kill -9 at t+%s: %d deliveries in flight, back in %s\n",
			report.Short(time.Duration(k.At)), k.Inflight, report.Short(time.Duration(k.Down)))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  %s\n", n)
	}
	verdict := "PASS: nothing lost, no advertised rate exceeded, no ban"
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
// is neither delivered, nor pending or in flight in sluice, nor dead. With
// Edge, the burst also carries a video.view_milestone event after every
// four video.trending ones, through a local edge Worker, and every
// subscriber receives both types, so both lanes run at once.
func Canal(ctx context.Context, o Options) (*Result, error) {
	o.defaults(12000, 60*time.Second, CanalSpecs)
	if o.Edge {
		w, args, err := startWorker(ctx, o.Root, o.Log)
		if err != nil {
			return nil, fmt.Errorf("the edge Worker: %w", err)
		}
		defer w.Stop()
		o.ServeArgs = append(slices.Clone(o.ServeArgs), args...)
	}
	e, err := newEnv(ctx, o, true)
	if err != nil {
		return nil, err
	}
	defer e.close()

	expected := eventIDs("canal", o.Events)
	milestones := 0
	if o.Edge {
		expected, milestones = withMilestones(expected)
	}
	start := o.Now()
	fmt.Fprintf(o.Log, "firing %d events\n", len(expected))
	if err := e.fire(ctx, expected, 0, false); err != nil {
		return nil, fmt.Errorf("%w\nsluice log:\n%s", err, e.sluiceTail())
	}
	fired := o.Now().Sub(start)
	lv := &live{w: o.Live, tty: o.LiveTTY, width: o.LiveWidth, edge: o.Edge}
	if _, err := e.waitSettled(ctx, start, start.Add(o.Timeout), len(expected), true, lv); err != nil {
		return nil, err
	}
	rows, err := e.account(ctx, expected, start)
	if err != nil {
		return nil, fmt.Errorf("accounting: %w\nsluice log:\n%s", err, e.sluiceTail())
	}
	res := &Result{
		Scenario: "canal", Events: len(expected), Timeout: report.Millis(o.Timeout),
		Jitter: report.Millis(o.Jitter),
		Fire:   report.Millis(fired), Elapsed: report.Millis(o.Now().Sub(start)), Rows: rows,
	}
	res.judge()
	if o.Edge {
		res.judgeEdge(e.partners, milestones)
	}
	return res, nil
}

// withMilestones puts a milestone event after every four of ids, and returns
// the mixed list and how many milestones it holds.
func withMilestones(ids []string) ([]string, int) {
	n := max(1, len(ids)/4)
	milestones := eventIDs(milestonePrefix, n)
	out := make([]string, 0, len(ids)+n)
	for i, id := range ids {
		out = append(out, id)
		if (i+1)%4 == 0 && (i+1)/4 <= n {
			out = append(out, milestones[(i+1)/4-1])
		}
	}
	if len(ids) < 4 {
		out = append(out, milestones[0])
	}
	return out, n
}

// judgeEdge notes how much came through the edge Worker, and fails a run
// whose milestone events never went that way.
func (r *Result) judgeEdge(partners []*partner.Partner, milestones int) {
	via := 0
	for _, p := range partners {
		via += p.Report(nil).ViaWorker
	}
	r.Notes = append(r.Notes, fmt.Sprintf("edge: %d %s events went through a local Worker in workerd; %d requests reached the partners through it",
		milestones, milestoneType, via))
	if via == 0 {
		r.Failures = append(r.Failures, "edge: no request reached a partner through the Worker")
		r.Pass = false
	}
}
