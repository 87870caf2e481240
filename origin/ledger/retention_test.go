package ledger

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/shared/fakeclock"
)

// prunePlay is a ledger with subscribers a and b (type "t") and helpers to
// enqueue and to settle what a claim of a subscriber returns.
type prunePlay struct {
	t     *testing.T
	l     *Ledger
	clock *fakeclock.Clock
}

func newPrunePlay(t *testing.T) *prunePlay {
	l, clock, _ := open(t)
	addSubscriber(t, l, "a", "t")
	addSubscriber(t, l, "b", "t")
	return &prunePlay{t: t, l: l, clock: clock}
}

func (p *prunePlay) enqueue(id, typ string) {
	p.t.Helper()
	if _, err := p.l.Enqueue(context.Background(), []NewEvent{{ID: id, Type: typ, Body: []byte(`{}`)}}); err != nil {
		p.t.Fatal(err)
	}
}

// settle claims every due delivery of sub and records status for each; a
// zero status leaves them in flight.
func (p *prunePlay) settle(sub string, status Status) {
	p.t.Helper()
	ctx, now := context.Background(), p.clock.Now()
	res, err := p.l.Claim(ctx, []ClaimRequest{{SubscriberID: sub, Max: 10, Now: now, LeaseUntil: now.Add(time.Minute)}})
	if err != nil {
		p.t.Fatal(err)
	}
	if status == "" {
		return
	}
	var rs []Result
	for _, d := range res[0].Deliveries {
		code := 200
		if status != StatusSent {
			code = 500
		}
		rs = append(rs, Result{Seq: d.Seq, SubscriberID: sub, Status: status, NextAttemptAt: now.Add(1000 * time.Hour),
			Attempt: &Attempt{Number: d.Attempts + 1, At: now, Lane: LaneOrigin, StatusCode: code}})
	}
	if err := p.l.Record(ctx, rs, nil); err != nil {
		p.t.Fatal(err)
	}
}

// kept reports which of ids are still in the ledger.
func (p *prunePlay) kept(ids ...string) map[string]bool {
	p.t.Helper()
	out := map[string]bool{}
	for _, id := range ids {
		_, _, err := p.l.Event(context.Background(), id)
		if err != nil && !errors.Is(err, ErrNotFound) {
			p.t.Fatal(err)
		}
		out[id] = err == nil
	}
	return out
}

// Prune takes old events whose every delivery was sent long enough ago (and
// old events no subscriber matched), with their deliveries and attempts; it
// leaves an old event with a delivery pending, in flight or dead, one sent
// again after a recovery too recently, and every young one. The sent totals
// drop by what it took.
func TestPruneTakesOnlyWhatWasDelivered(t *testing.T) {
	t.Parallel()
	p := newPrunePlay(t)
	ctx := context.Background()
	p.enqueue("sent-old", "t")
	p.enqueue("nobody-old", "u")
	p.settle("a", StatusSent)
	p.settle("b", StatusSent)
	p.enqueue("dead-old", "t")
	p.settle("a", StatusSent)
	p.settle("b", StatusDead)
	p.enqueue("pending-old", "t")
	p.settle("a", StatusSent)
	p.settle("b", StatusPending) // next attempt in 1000 h
	p.enqueue("inflight-old", "t")
	p.settle("a", StatusSent)
	p.settle("b", "")
	p.enqueue("recovered-old", "t")
	p.settle("a", StatusSent)
	p.settle("b", StatusDead)
	p.clock.Advance(48 * time.Hour)
	if _, err := p.l.Requeue(ctx, DeliveryID(p.deliveryOf("recovered-old", "b"))); err != nil {
		t.Fatal(err)
	}
	p.settle("b", StatusSent) // recovered-old's, sent now
	p.enqueue("sent-new", "t")
	p.enqueue("nobody-new", "u")
	p.settle("a", StatusSent)
	p.settle("b", StatusSent)

	before, err := p.l.sentCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pruned, more, err := p.l.Prune(ctx, p.clock.Now().Add(-24*time.Hour), 100)
	if err != nil || pruned != 2 || more {
		t.Fatalf("Prune = %d, more %v, %v; want sent-old and nobody-old, nothing more", pruned, more, err)
	}
	want := map[string]bool{"sent-old": false, "nobody-old": false, "dead-old": true, "pending-old": true,
		"inflight-old": true, "recovered-old": true, "sent-new": true, "nobody-new": true}
	if got := p.kept("sent-old", "nobody-old", "dead-old", "pending-old", "inflight-old", "recovered-old", "sent-new", "nobody-new"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("kept after Prune: %v, want %v", got, want)
	}
	var orphans int
	if err := p.l.rdb.QueryRowContext(ctx, `SELECT count(*) FROM attempts WHERE delivery_seq NOT IN (SELECT seq FROM deliveries)`).Scan(&orphans); err != nil || orphans != 0 {
		t.Errorf("%d attempts left without their delivery (%v)", orphans, err)
	}
	after, err := p.l.sentCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after["a"] != before["a"]-1 || after["b"] != before["b"]-1 {
		t.Errorf("sent totals %v after pruning, want one fewer each than %v", after, before)
	}
	if err := p.l.recountSent(ctx, p.l.rdb); err != nil {
		t.Fatal(err)
	}
	if recount, _ := p.l.sentCounts(ctx); fmt.Sprint(recount) != fmt.Sprint(after) {
		t.Errorf("sent totals %v, but the rows say %v", after, recount)
	}

	// The id of a pruned event is free again.
	if res, err := p.l.Enqueue(ctx, []NewEvent{{ID: "sent-old", Type: "t", Body: []byte(`{}`)}}); err != nil || res.Events[0].Duplicate {
		t.Fatalf("enqueue of a pruned id = %+v, %v; want a new event", res, err)
	}
}

// deliveryOf is the seq of event id's delivery to sub.
func (p *prunePlay) deliveryOf(id, sub string) int64 {
	p.t.Helper()
	_, ds, err := p.l.Event(context.Background(), id)
	if err != nil {
		p.t.Fatal(err)
	}
	for _, d := range ds {
		if d.SubscriberID == sub {
			return d.seq
		}
	}
	p.t.Fatalf("event %s has no delivery to %s", id, sub)
	return 0
}

// Prune does not read again what it passed over until its hourly rescan,
// and then takes an event that became prunable meanwhile.
func TestPruneComesBackForWhatItPassed(t *testing.T) {
	t.Parallel()
	p := newPrunePlay(t)
	ctx := context.Background()
	p.enqueue("late", "t")
	p.settle("a", StatusSent)
	p.settle("b", StatusPending) // next attempt in 1000 h
	p.clock.Advance(48 * time.Hour)
	if n, _, err := p.l.Prune(ctx, p.clock.Now(), 100); err != nil || n != 0 {
		t.Fatalf("Prune with b pending = %d, %v; want 0", n, err)
	}
	if _, err := p.l.Requeue(ctx, DeliveryID(p.deliveryOf("late", "b"))); err != nil {
		t.Fatal(err)
	}
	p.settle("b", StatusSent)
	p.clock.Advance(time.Minute)
	if n, _, err := p.l.Prune(ctx, p.clock.Now(), 100); err != nil || n != 0 {
		t.Fatalf("Prune a minute later = %d, %v; want 0: the cursor is past it until the rescan", n, err)
	}
	p.clock.Advance(pruneRescan)
	if n, _, err := p.l.Prune(ctx, p.clock.Now(), 100); err != nil || n != 1 || p.kept("late")["late"] {
		t.Fatalf("Prune after the rescan = %d, %v; want the event gone", n, err)
	}
}

// Prune works through a long history max events a call, and reports more
// until it reaches the cutoff.
func TestPruneWalksInBatches(t *testing.T) {
	t.Parallel()
	l, clock, _ := open(t)
	ctx := context.Background()
	for i := range 25 {
		if _, err := l.Enqueue(ctx, []NewEvent{{ID: fmt.Sprint("e", i), Type: "t", Body: []byte(`{}`)}}); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(time.Hour)
	var calls, total int
	for more := true; more; calls++ {
		n, m, err := l.Prune(ctx, clock.Now(), 10)
		if err != nil {
			t.Fatal(err)
		}
		total, more = total+n, m
	}
	if total != 25 || calls != 3 {
		t.Fatalf("pruned %d events in %d calls, want 25 in 3", total, calls)
	}
}
