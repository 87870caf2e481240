package ledger

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// Prune takes old events whose every delivery was sent (and old events no
// subscriber matched), with their deliveries and attempts; it leaves an old
// event with a delivery pending or dead, and everything younger than the
// cutoff. The sent totals drop by what it took.
func TestPruneTakesOnlyWhatWasDelivered(t *testing.T) {
	t.Parallel()
	l, clock, _ := open(t)
	ctx := context.Background()
	addSubscriber(t, l, "a", "t")
	addSubscriber(t, l, "b", "t")
	enqueue := func(id, typ string) {
		t.Helper()
		if _, err := l.Enqueue(ctx, []NewEvent{{ID: id, Type: typ, Body: []byte(`{}`)}}, false); err != nil {
			t.Fatal(err)
		}
	}
	// record claims every due delivery of sub and gives it status.
	record := func(sub string, status Status) {
		t.Helper()
		res, err := l.Claim(ctx, []ClaimRequest{{SubscriberID: sub, Max: 10, Now: clock.Now(), LeaseUntil: clock.Now().Add(time.Minute)}})
		if err != nil {
			t.Fatal(err)
		}
		var rs []Result
		for _, d := range res[0].Deliveries {
			code := 200
			if status != StatusSent {
				code = 500
			}
			rs = append(rs, Result{Seq: d.Seq, SubscriberID: sub, Status: status, NextAttemptAt: clock.Now().Add(time.Hour),
				Attempt: &Attempt{Number: d.Attempts + 1, At: clock.Now(), Lane: LaneOrigin, StatusCode: code}})
		}
		if err := l.Record(ctx, rs, nil); err != nil {
			t.Fatal(err)
		}
	}

	enqueue("sent-old", "t") // a and b both sent
	enqueue("nobody-old", "u")
	record("a", StatusSent)
	record("b", StatusSent)
	enqueue("half-old", "t") // a sent, b dead
	record("a", StatusSent)
	record("b", StatusDead)
	enqueue("pending-old", "t") // a sent, b retrying
	record("a", StatusSent)
	record("b", StatusPending)
	clock.Advance(48 * time.Hour)
	enqueue("sent-new", "t")
	record("a", StatusSent)

	before, err := l.sentCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pruned, more, err := l.Prune(ctx, clock.Now().Add(-24*time.Hour), 100)
	if err != nil || pruned != 2 || more {
		t.Fatalf("Prune = %d, more %v, %v; want sent-old and nobody-old, nothing more", pruned, more, err)
	}
	for id, gone := range map[string]bool{"sent-old": true, "nobody-old": true, "half-old": false, "pending-old": false, "sent-new": false} {
		_, ds, err := l.Event(ctx, id)
		switch {
		case gone && !errors.Is(err, ErrNotFound):
			t.Errorf("event %s: %v, want it pruned", id, err)
		case !gone && err != nil:
			t.Errorf("event %s: %v, want it kept", id, err)
		case !gone && id != "sent-new" && len(ds) != 2:
			t.Errorf("event %s kept %d deliveries, want both", id, len(ds))
		}
	}
	var attempts int
	if err := l.rdb.QueryRowContext(ctx, `SELECT count(*) FROM attempts WHERE delivery_seq NOT IN (SELECT seq FROM deliveries)`).Scan(&attempts); err != nil || attempts != 0 {
		t.Errorf("%d attempts left without their delivery (%v)", attempts, err)
	}
	after, err := l.sentCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after["a"] != before["a"]-1 || after["b"] != before["b"]-1 {
		t.Errorf("sent totals %v after pruning, want one fewer each than %v", after, before)
	}
	if err := l.recountSent(ctx, l.rdb); err != nil {
		t.Fatal(err)
	}
	if recount, _ := l.sentCounts(ctx); fmt.Sprint(recount) != fmt.Sprint(after) {
		t.Errorf("sent totals %v, but the rows say %v", after, recount)
	}

	// The id of a pruned event is free again.
	if res, err := l.Enqueue(ctx, []NewEvent{{ID: "sent-old", Type: "t", Body: []byte(`{}`)}}, false); err != nil || res.Events[0].Duplicate {
		t.Fatalf("enqueue of a pruned id = %+v, %v; want a new event", res, err)
	}
}

// Prune works through a long history max events a call, and reports more
// until it reaches the cutoff.
func TestPruneWalksInBatches(t *testing.T) {
	t.Parallel()
	l, clock, _ := open(t)
	ctx := context.Background()
	for i := range 25 {
		if _, err := l.Enqueue(ctx, []NewEvent{{ID: fmt.Sprint("e", i), Type: "t", Body: []byte(`{}`)}}, false); err != nil {
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
