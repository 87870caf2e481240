package ledger

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/shared/fakeclock"
)

func TestLatencyBucketsAreWithinFivePercent(t *testing.T) {
	t.Parallel()
	for ms := int64(0); ms <= int64(31*24*time.Hour/time.Millisecond); ms += 1 + ms/50 {
		d := time.Duration(ms) * time.Millisecond
		b := latencyBucket(d)
		floor := bucketFloor(b)
		if floor > d {
			t.Fatalf("%v falls in bucket %d, whose floor %v is above it", d, b, floor)
		}
		if ms < linearMS && floor != d {
			t.Fatalf("%v reported as %v; below %d ms buckets are exact", d, floor, linearMS)
		}
		if float64(d-floor) > 0.05*float64(d) {
			t.Fatalf("%v reported as %v: more than 5%% off", d, floor)
		}
	}
	if b := latencyBucket(40 * 24 * time.Hour); b != latencySlots-1 {
		t.Fatalf("40 days in bucket %d, want the last (%d)", b, latencySlots-1)
	}
}

func TestWindowPercentilesAndExpiry(t *testing.T) {
	t.Parallel()
	var w windows
	var entries []windowEntry
	for i := 1; i <= 100; i++ { // 1..100 ms, one each
		entries = append(entries, windowEntry{subscriber: "s", attempt: true, success: true, delivered: true,
			latency: time.Duration(i) * time.Millisecond})
	}
	entries = append(entries, windowEntry{subscriber: "s", attempt: true}) // a failure
	w.add(t0, entries)
	w.add(t0.Add(-10*time.Minute), []windowEntry{{subscriber: "s", attempt: true, success: true}})

	out := map[string]*SubscriberStats{}
	w.fill(out, t0.Add(-5*time.Minute), t0)
	s := out["s"]
	if s == nil || s.Attempts != 101 || s.Successes != 100 || s.Delivered != 100 {
		t.Fatalf("window = %+v, want 101 attempts, 100 successes, 100 delivered (the 10-minute-old one left out)", s)
	}
	if s.P50 != 50*time.Millisecond {
		t.Fatalf("p50 = %v, want 50ms", s.P50)
	}
	if s.P99 < 94*time.Millisecond || s.P99 > 99*time.Millisecond {
		t.Fatalf("p99 = %v, want 99ms less at most 5%%", s.P99)
	}

	out = map[string]*SubscriberStats{}
	w.fill(out, t0.Add(time.Minute), t0.Add(6*time.Minute))
	if s := out["s"]; s != nil {
		t.Fatalf("six minutes later the window still holds %+v", s)
	}
	w.forget("s")
	if len(w.subs) != 0 {
		t.Fatal("forget left the subscriber's window")
	}
}

func TestQuietSubscribersLeaveTheWindows(t *testing.T) {
	t.Parallel()
	var w windows
	w.add(t0, []windowEntry{{subscriber: "quiet", attempt: true}, {subscriber: "busy", attempt: true}})
	for d := slotWidth; d <= maxWindow+slotWidth; d += slotWidth {
		w.add(t0.Add(d), []windowEntry{{subscriber: "busy", attempt: true}})
	}
	if _, ok := w.subs["quiet"]; ok {
		t.Fatal("a subscriber with nothing in the last 5 minutes still holds its slots")
	}
	if _, ok := w.subs["busy"]; !ok {
		t.Fatal("the busy subscriber's window was dropped")
	}
}

// Stats counts sent deliveries across a restart and the window of what
// this process recorded.
func TestStatsCountsSentAndTheWindow(t *testing.T) {
	t.Parallel()
	clock := fakeclock.New(t0)
	path := filepath.Join(t.TempDir(), "stats.db")
	l, err := Open(context.Background(), path, Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	addSubscriber(t, l, "s", "*")
	addSubscriber(t, l, "other", "*")
	var events []NewEvent
	for i := range 10 {
		events = append(events, NewEvent{ID: fmt.Sprintf("e%d", i), Type: "t", Body: []byte(`{}`)})
	}
	if _, err := l.Enqueue(ctx, events); err != nil {
		t.Fatal(err)
	}
	clock.Advance(30 * time.Millisecond)
	res, err := l.Claim(ctx, []ClaimRequest{{SubscriberID: "s", Max: 10, Now: clock.Now(), LeaseUntil: clock.Now().Add(time.Minute)}})
	if err != nil || len(res[0].Deliveries) != 10 {
		t.Fatalf("claim = %+v (%v)", res, err)
	}
	var results []Result
	for i, c := range res[0].Deliveries {
		r := Result{Seq: c.Seq, SubscriberID: "s", EnqueuedAt: c.CreatedAt,
			Attempt: &Attempt{Number: 1, At: clock.Now(), Lane: LaneOrigin, StatusCode: 204}, Status: StatusSent}
		if i >= 7 {
			r.Attempt.StatusCode, r.Status, r.NextAttemptAt = 503, StatusPending, clock.Now().Add(time.Second)
		}
		results = append(results, r)
	}
	if err := l.Record(ctx, results, nil); err != nil {
		t.Fatal(err)
	}
	st, err := l.Stats(ctx, clock.Now().Add(-5*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	s := st["s"]
	if s == nil || s.Sent != 7 || s.Pending != 3 || s.Attempts != 10 || s.Successes != 7 || s.Delivered != 7 || s.P50 != 30*time.Millisecond {
		t.Fatalf("stats of s = %+v, want 7 sent, 3 pending, 10 attempts, 7 successes, 7 delivered at p50 30ms", s)
	}
	if o := st["other"]; o == nil || o.Pending != 10 || o.Sent != 0 || o.Attempts != 0 {
		t.Fatalf("stats of other = %+v, want 10 pending and nothing else", o)
	}

	l.Close()
	if l, err = Open(ctx, path, Options{Now: clock.Now}); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	st, err = l.Stats(ctx, clock.Now().Add(-5*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if s := st["s"]; s == nil || s.Sent != 7 || s.Attempts != 0 || s.Delivered != 0 {
		t.Fatalf("after a restart: %+v, want the 7 sent counted and an empty window", s)
	}
	if err := l.DeleteSubscriber(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	st, err = l.Stats(ctx, clock.Now().Add(-5*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := st["s"]; ok {
		t.Fatalf("a deleted subscriber still has stats: %+v", s)
	}
}

// The totals' percentiles are over every subscriber's deliveries together:
// 99 fast ones at 10 ms and one slow subscriber's single 50 ms delivery
// make a p50 of 10 ms and a p99 of 10 ms, where averaging the subscribers'
// percentiles would give 30 ms; a 100th at 50 ms moves the p99 only.
func TestWindowTotalsPoolEverySubscriber(t *testing.T) {
	t.Parallel()
	var w windows
	var entries []windowEntry
	for range 98 {
		entries = append(entries, windowEntry{subscriber: "fast", attempt: true, success: true, delivered: true, latency: 10 * time.Millisecond})
	}
	entries = append(entries,
		windowEntry{subscriber: "slow", attempt: true, success: true, delivered: true, latency: 50 * time.Millisecond},
		windowEntry{subscriber: "slow", attempt: true}, // failed
		windowEntry{subscriber: "fast", attempt: true, success: true, delivered: true, latency: 10 * time.Millisecond})
	w.add(t0, entries)
	got := w.total(t0.Add(-5*time.Minute), t0)
	if got.Attempts != 101 || got.Successes != 100 || got.Delivered != 100 || got.P50 != 10*time.Millisecond || got.P99 != 10*time.Millisecond {
		t.Errorf("totals %+v; want 101 attempts, 100 ok and delivered, p50 and p99 10ms", got)
	}
	w.add(t0, []windowEntry{{subscriber: "slow", attempt: true, success: true, delivered: true, latency: 50 * time.Millisecond}})
	if got := w.total(t0.Add(-5*time.Minute), t0); got.P99 != 50*time.Millisecond || got.P50 != 10*time.Millisecond {
		t.Errorf("with a second slow delivery: p50 %v, p99 %v; want 10ms, 50ms", got.P50, got.P99)
	}
}
