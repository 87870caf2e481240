package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/sluice-dev/sluice/loadtest/report"
	"github.com/sluice-dev/sluice/loadtest/scenario"
)

// naiveLoops is the naive loop's concurrency, sluice's default --workers.
const naiveLoops = 64

// runCanal runs the canal scenario through sluice, then the seed's naive
// loop against fresh partners with the same burst and bound, and puts each
// subscriber's drain times side by side.
func runCanal(ctx context.Context, o *Options) (sectionResult, error) {
	so := scenario.Options{
		Sluice: o.Sluice, Events: o.CanalEvents, Timeout: o.CanalTimeout,
		ServeArgs: append([]string{"--log-level", "warn"}, o.ServeArgs...),
		Log:       io.Discard, Now: o.Now,
	}
	canal, err := scenario.Canal(ctx, so)
	if err != nil {
		return sectionResult{}, fmt.Errorf("canal: %w", err)
	}
	fmt.Fprintf(o.Progress, "bench:   canal accounted after %s; the naive loop next (up to %s)\n",
		report.Short(time.Duration(canal.Elapsed)), report.Short(o.CanalTimeout))
	naive, err := scenario.Naive(ctx, so, naiveLoops)
	if err != nil {
		return sectionResult{}, fmt.Errorf("naive loop: %w", err)
	}
	naiveRows := map[string]report.Row{}
	for _, r := range naive.Rows {
		naiveRows[r.Subscriber] = r
	}
	slow := map[string]bool{}
	for _, s := range scenario.CanalSpecs() {
		slow[s.ID] = s.SlowToDrain
	}
	var rows []Row
	for _, r := range canal.Rows {
		nr := naiveRows[r.Subscriber]
		row := Row{
			Metric: fmt.Sprintf("canal drain %s (%s)", r.Subscriber, r.Role),
			Unit:   "ms",
			Shown:  fmt.Sprintf("sluice %s · naive %s", drainText(r), drainText(nr)),
		}
		if r.Drained {
			row.Value = num(time.Duration(r.Drain).Seconds() * 1000)
		}
		ok := r.Failed() == ""
		if slow[r.Subscriber] {
			// Too slow to drain in a bounded run: it must be served at its
			// advertised rate and never above it.
			row.Shown += fmt.Sprintf("; busiest 1 s sluice %d · naive %d (limit %d)", r.MaxWindow, nr.MaxWindow, r.Limit)
			row.Target = "served, ≤ its cap, 0 lost"
			ok = ok && r.Delivered > 0
		} else {
			row.Target = "drains, 0 lost, ≤ cap"
			ok = ok && r.Drained
		}
		row.Pass = mark(ok)
		rows = append(rows, row)
	}
	lost := func(res *scenario.Result) int {
		n := 0
		for _, r := range res.Rows {
			n += r.Lost
		}
		return n
	}
	notes := []string{fmt.Sprintf("canal: the scenario package's burst of %s events to its five partners, then the naive loop against fresh ones, "+
		"each bounded at %s (the canal run waits the whole bound for its two slow subscribers); drain = first byte of the burst → "+
		"last owed event accepted, (n%%) = share delivered when the bound ran out; sluice %s, %d lost; naive loop (%d loops, no limiter, "+
		"no retries) %d lost%s",
		thousands(float64(o.CanalEvents)), report.Short(o.CanalTimeout), verdict(canal), lost(canal), naiveLoops, lost(naive), bannedText(naive))}
	return sectionResult{rows: rows, notes: notes, details: map[string]*scenario.Result{"canal": canal, "naive": naive}}, nil
}

func drainText(r report.Row) string {
	if r.Expected == 0 {
		return "-"
	}
	if r.Drained {
		return report.Short(time.Duration(r.Drain))
	}
	return fmt.Sprintf("(%d%%)", r.Delivered*100/r.Expected)
}

func verdict(r *scenario.Result) string {
	if r.Pass {
		return "passed"
	}
	return fmt.Sprintf("FAILED (%v)", r.Failures)
}

func bannedText(r *scenario.Result) string {
	for _, row := range r.Rows {
		if row.Banned {
			return fmt.Sprintf(", banned by %s", row.Subscriber)
		}
	}
	return ""
}
