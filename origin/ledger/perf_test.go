package ledger

import (
	"context"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// admitAll is an Admitter that takes every new delivery in flight.
type admitAll struct {
	mu      sync.Mutex
	claimed []Claimed
}

func (a *admitAll) Admit(_ string, n int, now time.Time) (int, time.Time) {
	return n, now.Add(time.Minute)
}
func (a *admitAll) Unadmit(map[string]int) {}
func (a *admitAll) Handoff(c []Claimed) {
	a.mu.Lock()
	a.claimed = append(a.claimed, c...)
	a.mu.Unlock()
}

// BenchmarkEnqueueAndRecord is the ledger's share of one delivery on the
// hot path: 32 concurrent single-event enqueues, each handed to the
// dispatcher in flight, then their outcomes recorded as sent in batches,
// as the API and the recorder do. ns/op is per delivery.
func BenchmarkEnqueueAndRecord(b *testing.B) {
	l, err := Open(context.Background(), filepath.Join(b.TempDir(), "bench.db"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	a := &admitAll{}
	l.SetAdmitter(a)
	s := &Subscriber{ID: "s", URL: "http://127.0.0.1:1/s", EventTypes: []string{"*"},
		Rate: Rate{PerSecond: 1e6, Burst: 1e6}, MaxAttempts: 3, TimeoutMS: 1000, Secret: "whsec_x"}
	if err := l.CreateSubscriber(context.Background(), s); err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"id":"x","type":"bench.one","data":{"clip":"c-1","views":1200}}`)
	const clients = 32
	var next sync.WaitGroup
	per := b.N/clients + 1
	b.ResetTimer()
	for c := range clients {
		next.Add(1)
		go func() {
			defer next.Done()
			for i := range per {
				id := "e" + strconv.Itoa(c) + "-" + strconv.Itoa(i)
				if _, err := l.Enqueue(context.Background(), []NewEvent{{ID: id, Type: "bench.one", Body: body}}); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	var recorded sync.WaitGroup
	recorded.Add(1)
	go func() {
		defer recorded.Done()
		for {
			a.mu.Lock()
			batch := a.claimed
			a.claimed = nil
			a.mu.Unlock()
			if len(batch) == 0 {
				select {
				case <-done:
					return
				case <-time.After(100 * time.Microsecond):
					continue
				}
			}
			rs := make([]Result, len(batch))
			now := time.Now()
			for i, c := range batch {
				rs[i] = Result{Seq: c.Seq, SubscriberID: c.SubscriberID, Status: StatusSent,
					Attempt: &Attempt{Number: 1, At: now, Lane: LaneOrigin, StatusCode: 204, DurationMS: 1}}
			}
			if err := l.Record(context.Background(), rs, nil); err != nil {
				b.Error(err)
				return
			}
		}
	}()
	next.Wait()
	close(done)
	recorded.Wait()
}

// BenchmarkClaim claims 64 deliveries at a time from a backlog of 200,000
// pending ones. ns/op is per claimed delivery.
func BenchmarkClaim(b *testing.B) {
	l, err := Open(context.Background(), filepath.Join(b.TempDir(), "bench.db"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	s := &Subscriber{ID: "s", URL: "http://127.0.0.1:1/s", EventTypes: []string{"*"},
		Rate: Rate{PerSecond: 1e6, Burst: 1e6}, MaxAttempts: 3, TimeoutMS: 1000, Secret: "whsec_x"}
	if err := l.CreateSubscriber(context.Background(), s); err != nil {
		b.Fatal(err)
	}
	const backlog, batch, per = 200_000, 1000, 64
	body := []byte(`{"id":"x","type":"bench.one","data":{"clip":"c-1","views":1200}}`)
	for i := 0; i < backlog; i += batch {
		events := make([]NewEvent, batch)
		for j := range events {
			events[j] = NewEvent{ID: "e" + strconv.Itoa(i+j), Type: "bench.one", Body: body}
		}
		if _, err := l.Enqueue(context.Background(), events); err != nil {
			b.Fatal(err)
		}
	}
	if b.N > backlog {
		b.N = backlog
	}
	b.ResetTimer()
	for done := 0; done < b.N; done += per {
		now := time.Now()
		res, err := l.Claim(context.Background(), []ClaimRequest{{SubscriberID: "s", Max: per, Now: now, LeaseUntil: now.Add(time.Minute)}})
		if err != nil {
			b.Fatal(err)
		}
		if len(res[0].Deliveries) != per {
			b.Fatalf("claimed %d, want %d", len(res[0].Deliveries), per)
		}
	}
}
