package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/origin/ledger"
	"github.com/sluice-dev/sluice/shared/fakeclock"
)

// serve's retention loop prunes at once on start, batch after batch: the
// 250 events enqueued two days ago are all gone under a 24 h retention (at
// 100 a batch, three batches), and the one enqueued now stays.
func TestRetainPrunesPastTheRetentionAtStart(t *testing.T) {
	t.Parallel()
	clock := fakeclock.New(time.Date(2026, 7, 11, 8, 14, 2, 0, time.UTC))
	l, err := ledger.Open(context.Background(), filepath.Join(t.TempDir(), "sluice.db"), ledger.Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var old []ledger.NewEvent
	for i := range 250 {
		old = append(old, ledger.NewEvent{ID: fmt.Sprint("old-", i), Type: "t", Body: []byte(`{}`)})
	}
	if _, err := l.Enqueue(ctx, old); err != nil {
		t.Fatal(err)
	}
	clock.Advance(48 * time.Hour)
	if _, err := l.Enqueue(ctx, []ledger.NewEvent{{ID: "new", Type: "t", Body: []byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		retain(ctx, l, 24*time.Hour, clock.Now, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	// retain runs on its own goroutine: wait (in real time) for its first pass.
	deadline := time.Now().Add(10 * time.Second)
	for _, e := range old {
		for {
			if _, _, err := l.Event(ctx, e.ID); errors.Is(err, ledger.ErrNotFound) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s is still there 10 s after retain started", e.ID)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	cancel()
	<-done
	if _, _, err := l.Event(context.Background(), "new"); err != nil {
		t.Fatalf("the new event: %v, want it kept", err)
	}
}
