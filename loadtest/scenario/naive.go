package scenario

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/loadtest/instance"
	"github.com/sluice-dev/sluice/loadtest/naive"
	"github.com/sluice-dev/sluice/loadtest/report"
)

// Naive runs the seed's naive loop (naive.Run with workers loops) against
// fresh partners built from the same specs as Canal, with the same burst,
// for at most Timeout. Whatever a partner refused is lost; whatever was
// still queued at the end counts as pending, although the loop keeps it
// only in memory.
func Naive(ctx context.Context, o Options, workers int) (*Result, error) {
	o.defaults(12000, 60*time.Second, CanalSpecs)
	e, err := newEnv(ctx, o, false)
	if err != nil {
		return nil, err
	}
	defer e.close()

	ids := eventIDs("naive", o.Events)
	start := o.Now()
	events := make([]naive.Event, len(ids))
	for i, id := range ids {
		events[i] = naive.Event{ID: id, Body: eventBody(id, i, start)}
	}
	targets := make([]naive.Target, len(o.Specs))
	for i, s := range o.Specs {
		targets[i] = naive.Target{ID: s.ID, URL: e.partners[i].URL(), Secret: e.partners[i].Config().Secret}
	}
	runCtx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	fmt.Fprintf(o.Log, "naive loop: %d events × %d subscribers, %d workers\n", len(ids), len(targets), workers)
	out, err := naive.Run(runCtx, naive.Options{Targets: targets, Events: events, Workers: workers, Now: o.Now})
	if err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	res := &Result{
		Scenario: "naive loop", Events: len(ids), Timeout: report.Millis(o.Timeout), Jitter: report.Millis(o.Jitter),
		Elapsed: report.Millis(o.Now().Sub(start)),
	}
	for i, s := range o.Specs {
		pr := e.partners[i].Report(ids)
		oc := out[s.ID]
		t := report.Tally{Expected: len(ids), Delivered: pr.Delivered, Pending: oc.Unsent}
		t.Lost = max(0, t.Expected-t.Delivered-t.Pending)
		row := e.row(s, pr, t, instance.SubscriberStats{}, start)
		row.Notes = append(row.Notes, fmt.Sprintf("%d POSTs, %d refused or failed and dropped", oc.Attempted, oc.Failed))
		res.Rows = append(res.Rows, row)
	}
	res.judge()
	return res, nil
}
