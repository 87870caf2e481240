package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/origin/ledger"
	"github.com/sluice-dev/sluice/shared/fakeclock"
)

// serve's retention loop prunes at once on start: an event enqueued two
// days ago (on the ledger's clock) is gone under --retention 24h, and one
// enqueued now stays.
func TestRetainPrunesPastTheRetentionAtStart(t *testing.T) {
	t.Parallel()
	clock := fakeclock.New(time.Now().Add(-48 * time.Hour))
	l, err := ledger.Open(context.Background(), filepath.Join(t.TempDir(), "sluice.db"), ledger.Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	enqueue := func(id string) {
		t.Helper()
		if _, err := l.Enqueue(ctx, []ledger.NewEvent{{ID: id, Type: "t", Body: []byte(`{}`)}}, false); err != nil {
			t.Fatal(err)
		}
	}
	enqueue("old")
	clock.Advance(48 * time.Hour)
	enqueue("new")

	done := make(chan struct{})
	go func() {
		defer close(done)
		retain(ctx, l, 24*time.Hour, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, _, err := l.Event(ctx, "old"); errors.Is(err, ledger.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the old event is still there 10 s after retain started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if _, _, err := l.Event(context.Background(), "new"); err != nil {
		t.Fatalf("the new event: %v, want it kept", err)
	}
}
