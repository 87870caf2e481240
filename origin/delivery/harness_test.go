package delivery

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/origin/egress"
	"github.com/sluice-dev/sluice/origin/ledger"
	"github.com/sluice-dev/sluice/shared/fakeclock"
)

var t0 = time.Date(2026, 7, 11, 8, 14, 0, 0, time.UTC)

// bundle is a ledger and a running dispatcher over a real SQLite file.
type bundle struct {
	t     *testing.T
	l     *ledger.Ledger
	d     *Dispatcher
	clock Clock
	fake  *fakeclock.Clock // nil when running on the wall clock
	path  string           // the database file
	stop  func()
}

type option func(*Config)

func setup(t *testing.T, fake bool, opts ...option) *bundle {
	t.Helper()
	b := &bundle{t: t}
	var now func() time.Time
	if fake {
		b.fake = fakeclock.New(t0)
		b.clock, now = b.fake, b.fake.Now
	} else {
		b.clock, now = SystemClock{}, time.Now
	}
	b.path = filepath.Join(t.TempDir(), "sluice.db")
	l, err := ledger.Open(context.Background(), b.path, ledger.Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	b.l = l
	b.start(opts...)
	t.Cleanup(func() {
		b.stop()
		l.Close()
	})
	return b
}

func (b *bundle) start(opts ...option) {
	cfg := Config{
		Clock:        b.clock,
		Rand:         rand.New(rand.NewPCG(7, 11)),
		Client:       egress.Policy{AllowPrivate: true}.Client(),
		DrainTimeout: 200 * time.Millisecond,
		Logger:       slog.New(slog.DiscardHandler),
	}
	for _, o := range opts {
		o(&cfg)
	}
	b.d = New(b.l, cfg)
	if err := b.d.Load(context.Background()); err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.d.Run(ctx) }()
	b.stop = func() {
		cancel()
		if err := <-done; err != nil {
			b.t.Errorf("Run: %v", err)
		}
	}
}

func (b *bundle) subscriber(id, url string, change func(*ledger.Subscriber)) ledger.Subscriber {
	b.t.Helper()
	s := ledger.Subscriber{ID: id, URL: url, EventTypes: []string{"*"},
		Rate:        ledger.Rate{PerSecond: 1000, Burst: 1000, EdgeShare: 0.5},
		MaxAttempts: 8, TimeoutMS: 5000, Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}
	if change != nil {
		change(&s)
	}
	if err := b.l.CreateSubscriber(context.Background(), &s); err != nil {
		b.t.Fatal(err)
	}
	b.d.Upsert(s)
	return s
}

// update changes subscriber id in the ledger and tells the dispatcher, as
// the API's PATCH does.
func (b *bundle) update(id string, change func(*ledger.Subscriber)) {
	b.t.Helper()
	s, err := b.l.UpdateSubscriber(context.Background(), id, change)
	if err != nil {
		b.t.Fatal(err)
	}
	b.d.Upsert(s)
}

// send enqueues n events of type typ with ids prefix-0…n-1 and wakes the dispatcher.
func (b *bundle) send(prefix, typ string, n int) {
	b.t.Helper()
	events := make([]ledger.NewEvent, n)
	for i := range events {
		id := fmt.Sprintf("%s-%d", prefix, i)
		events[i] = ledger.NewEvent{ID: id, Type: typ, Body: fmt.Appendf(nil, `{"id":%q,"type":%q}`, id, typ)}
	}
	res, err := b.l.Enqueue(context.Background(), events)
	if err != nil {
		b.t.Fatal(err)
	}
	for sub := range res.Subscribers {
		b.d.Notify(b.clock.Now(), sub)
	}
}

// removeWhileOut deletes subscriber id, from the ledger and the dispatcher,
// while its answers are held; then lets them go with release and waits for
// the dispatcher to settle.
func (b *bundle) removeWhileOut(id string, release chan struct{}) {
	b.t.Helper()
	if err := b.l.DeleteSubscriber(context.Background(), id); err != nil {
		b.t.Fatal(err)
	}
	b.d.Remove(id)
	close(release)
	b.settle()
}

// settle waits until the dispatcher has done everything it can at the
// current time: real waiting on goroutines and sockets, never on the clock.
func (b *bundle) settle() {
	b.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !b.d.Quiet() {
		if time.Now().After(deadline) {
			b.t.Fatal("dispatcher did not settle within 10s")
		}
		runtime.Gosched()
		time.Sleep(100 * time.Microsecond)
	}
}

// looked waits until the dispatcher's loop has looked again at things as
// they are now and found nothing more it may claim or start.
func (b *bundle) looked() {
	idle := b.d.Idle()
	b.d.poke()
	<-idle
}

// claimedOnly checks, once the loop has looked again, that the ledger holds
// inflight deliveries of subscriber id in flight and pending ones pending:
// what it has not claimed stays pending.
func (b *bundle) claimedOnly(id string, inflight, pending int) {
	b.t.Helper()
	b.looked()
	stats, err := b.l.Counts(context.Background())
	if err != nil {
		b.t.Fatal(err)
	}
	if st := stats[id]; st == nil || st.Inflight != inflight || st.Pending != pending {
		b.t.Fatalf("subscriber %s: %+v, want %d in flight and %d pending", id, st, inflight, pending)
	}
}

// servedBeside creates subscriber id, answering at once, for events of type
// id, sends it n events and waits for all of them: the subscribers already
// there leave it workers.
func (b *bundle) servedBeside(id string, n int) {
	b.t.Helper()
	rc := newReceiver(b.t, b.clock, nil)
	b.subscriber(id, rc.URL, func(s *ledger.Subscriber) { s.EventTypes = []string{id} })
	b.send(id, id, n)
	waitFor(b.t, 3*time.Second, "the deliveries of "+id+" beside the others", func() bool { return rc.count() == n })
}

// step advances the fake clock by d in increments of tick, settling after each.
func (b *bundle) step(d, tick time.Duration) {
	b.t.Helper()
	for moved := time.Duration(0); moved < d; moved += tick {
		b.fake.Advance(tick)
		b.d.poke() // the loop may not have taken its timer yet
		b.settle()
	}
}

// receiver is a subscriber endpoint that records what it gets.
type receiver struct {
	*httptest.Server
	mu       sync.Mutex
	clock    Clock
	arrivals []time.Time
	ids      map[string]int
	answer   func(r *http.Request, n int) (status int, header http.Header)
}

func newReceiver(t *testing.T, clock Clock, answer func(r *http.Request, n int) (int, http.Header)) *receiver {
	rc := &receiver{clock: clock, ids: map[string]int{}, answer: answer}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc.mu.Lock()
		rc.arrivals = append(rc.arrivals, rc.clock.Now())
		rc.ids[r.Header.Get("webhook-id")]++
		n := len(rc.arrivals)
		rc.mu.Unlock()
		status, h := http.StatusOK, http.Header(nil)
		if rc.answer != nil {
			status, h = rc.answer(r, n)
		}
		for k, v := range h {
			w.Header()[k] = v
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(rc.Close)
	return rc
}

// heldReceiver is a receiver that answers 200 to each request once release
// is closed.
func heldReceiver(t *testing.T, clock Clock) (*receiver, chan struct{}) {
	release := make(chan struct{})
	return newReceiver(t, clock, func(*http.Request, int) (int, http.Header) {
		<-release
		return http.StatusOK, nil
	}), release
}

// phasedReceiver is a receiver that holds every request, answering 200 to
// the ones it holds when next is called and holding those after; held
// counts the requests it holds now.
type phasedReceiver struct {
	*receiver
	gate atomic.Pointer[chan struct{}]
	held atomic.Int64
}

func newPhasedReceiver(t *testing.T, clock Clock) *phasedReceiver {
	p := &phasedReceiver{}
	first := make(chan struct{})
	p.gate.Store(&first)
	p.receiver = newReceiver(t, clock, func(r *http.Request, _ int) (int, http.Header) {
		p.held.Add(1)
		defer p.held.Add(-1)
		select {
		case <-*p.gate.Load():
		case <-r.Context().Done():
		}
		return http.StatusOK, nil
	})
	t.Cleanup(func() { close(*p.gate.Load()) }) // before the receiver closes, which waits for its requests
	return p
}

// next answers the requests held now and holds the ones after.
func (p *phasedReceiver) next() {
	open := make(chan struct{})
	close(*p.gate.Swap(&open))
}

func (rc *receiver) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.arrivals)
}

func (rc *receiver) times() []time.Time {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := append([]time.Time(nil), rc.arrivals...)
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// gauge counts the requests a receiver holds open, and the most at once.
type gauge struct{ now, peak atomic.Int64 }

// hold keeps r open until release closes or the attempt gives up.
func (g *gauge) hold(r *http.Request, release <-chan struct{}) {
	c := g.now.Add(1)
	defer g.now.Add(-1)
	for m := g.peak.Load(); c > m && !g.peak.CompareAndSwap(m, c); m = g.peak.Load() {
	}
	select {
	case <-release:
	case <-r.Context().Done():
	}
}

// waitFor polls cond on the wall clock, for tests that run in real time.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
