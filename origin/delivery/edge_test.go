package delivery

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/edge/worker"
	"github.com/sluice-dev/sluice/origin/edgeclient"
	"github.com/sluice-dev/sluice/origin/ledger"
	"github.com/sluice-dev/sluice/shared/bucket"
	"github.com/sluice-dev/sluice/shared/edgewire"
	"github.com/sluice-dev/sluice/shared/signature"
)

const edgeSecret = "whsec_ZWRnZS1zZWNyZXQtZm9yLXRlc3RzLW9ubHktMzI="

// memBuckets stands in for the Durable Objects on the host: the same
// TakeToken decision, kept in a map, recording the rates it was asked for.
type memBuckets struct {
	mu    sync.Mutex
	state map[string]*worker.Stored
	rates map[string]bucket.Rate
	clock func() time.Time // the Worker's clock too; time.Now until useClock
}

func (m *memBuckets) Take(_ context.Context, sub string, r bucket.Rate) (worker.Grant, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	next, g := worker.TakeToken(m.state[sub], r, m.clock())
	m.state[sub], m.rates[sub] = &next, r
	return g, nil
}

func (m *memBuckets) now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.clock()
}

// useClock puts the Worker and its buckets on the dispatcher's fake clock.
func (m *memBuckets) useClock(now func() time.Time) {
	m.mu.Lock()
	m.clock = now
	m.mu.Unlock()
}

// startWorker serves the real Worker handler on 127.0.0.1.
func startWorker(t *testing.T) (*httptest.Server, *memBuckets) {
	t.Helper()
	mb := &memBuckets{state: map[string]*worker.Stored{}, rates: map[string]bucket.Rate{}, clock: time.Now}
	srv := httptest.NewServer(worker.Handler(worker.Config{
		Secrets: []string{edgeSecret}, Buckets: mb, Now: mb.now, Client: &http.Client{
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}))
	t.Cleanup(srv.Close)
	return srv, mb
}

// setupOnFakeClock is a bundle on the fake clock whose edge lane, for
// video.view_milestone, is the Worker at url, put on the same clock as the
// dispatcher along with its buckets mb.
func setupOnFakeClock(t *testing.T, url string, mb *memBuckets) *bundle {
	t.Helper()
	b := setup(t, true, withEdge(url, "video.view_milestone"))
	mb.useClock(b.fake.Now)
	return b
}

func withEdge(url string, types ...string) option {
	return func(c *Config) {
		ec, err := edgeclient.New(url, edgeSecret, nil, c.Clock.Now)
		if err != nil {
			panic(err)
		}
		c.Edge, c.EdgeTypes = ec, types
	}
}

func waitSent(t *testing.T, b *bundle, ids ...string) []ledger.Delivery {
	t.Helper()
	var out []ledger.Delivery
	waitFor(t, 10*time.Second, "deliveries sent", func() bool {
		out = out[:0]
		for _, id := range ids {
			_, ds, err := b.l.Event(context.Background(), id)
			if err != nil || len(ds) != 1 || ds[0].Status != ledger.StatusSent {
				return false
			}
			d, err := b.l.Delivery(context.Background(), ds[0].ID)
			if err != nil {
				return false
			}
			out = append(out, d)
		}
		return true
	})
	return out
}

func TestEdgeTypesGoThroughTheWorkerSignedForTheSubscriber(t *testing.T) {
	t.Parallel()
	w, mb := startWorker(t)
	b := setup(t, false, withEdge(w.URL, "video.view_milestone"))
	var mu sync.Mutex
	var verified int
	rc := newReceiver(t, b.clock, func(r *http.Request, _ int) (int, http.Header) {
		body, _ := io.ReadAll(r.Body)
		if signature.Verify(r.Header, body, time.Now(), "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw") == nil {
			mu.Lock()
			verified++
			mu.Unlock()
		}
		return http.StatusOK, nil
	})
	b.subscriber("both", rc.URL, func(s *ledger.Subscriber) { s.Rate = ledger.Rate{PerSecond: 1000, Burst: 100, EdgeShare: 0.25} })
	b.send("m", "video.view_milestone", 5)
	b.send("t", "video.trending", 5)
	for _, d := range waitSent(t, b, "m-0", "m-1", "m-2", "m-3", "m-4") {
		if len(d.History) != 1 || d.History[0].Lane != ledger.LaneEdge || d.History[0].StatusCode != http.StatusOK {
			t.Fatalf("milestone delivery history %+v, want one edge attempt answered 200", d.History)
		}
	}
	for _, d := range waitSent(t, b, "t-0", "t-1", "t-2", "t-3", "t-4") {
		if len(d.History) != 1 || d.History[0].Lane != ledger.LaneOrigin {
			t.Fatalf("trending delivery history %+v, want one origin attempt", d.History)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if verified != 10 {
		t.Fatalf("%d of 10 requests verified with the subscriber's secret", verified)
	}
	// A subscriber of both lanes has its rate split: a quarter at the edge.
	mb.mu.Lock()
	defer mb.mu.Unlock()
	if got := mb.rates["both"]; got.PerSecond != 250 || got.Burst != 25 {
		t.Fatalf("edge rate %+v, want 250/s burst 25 (edge_share 0.25 of 1000/s burst 100)", got)
	}
	b.d.mu.Lock()
	s := b.d.subs["both"]
	origin := bucket.Refill(s.bucket, s.originRate, b.clock.Now()).Tokens
	b.d.mu.Unlock()
	if origin > 75 {
		t.Fatalf("origin bucket holds %.1f tokens, above its share of the burst (75)", origin)
	}
	if snap := b.d.Snapshot()["both"]; snap.Tokens > 100 {
		t.Fatalf("the snapshot shows %.1f tokens over both lanes, above the burst (100)", snap.Tokens)
	}
}

// An edge attempt keeps the first bytes of the subscriber's answer, as an
// origin attempt does.
func TestAnEdgeAttemptKeepsTheAnswersFirstBytes(t *testing.T) {
	t.Parallel()
	w, _ := startWorker(t)
	b := setup(t, false, withEdge(w.URL, "video.view_milestone"))
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(`{"queued":true}`))
	}))
	t.Cleanup(rc.Close)
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) { s.EventTypes = []string{"video.view_milestone"} })
	b.send("m", "video.view_milestone", 1)
	d := waitSent(t, b, "m-0")[0]
	if len(d.History) != 1 || d.History[0].Lane != ledger.LaneEdge || d.History[0].Response != `{"queued":true}` {
		t.Fatalf("history %+v, want one edge attempt with the answer {\"queued\":true}", d.History)
	}
}

// A burst of one cannot be split into two whole tokens: giving each lane one
// would double it. Such a subscriber sends everything by the origin lane.
func TestABurstTooSmallToSplitStaysAtTheOrigin(t *testing.T) {
	t.Parallel()
	w, mb := startWorker(t)
	b := setup(t, false, withEdge(w.URL, "video.view_milestone"))
	rc := newReceiver(t, b.clock, nil)
	b.subscriber("narrow", rc.URL, func(s *ledger.Subscriber) { s.Rate = ledger.Rate{PerSecond: 1000, Burst: 1, EdgeShare: 0.5} })
	b.send("m", "video.view_milestone", 2)
	b.send("t", "video.trending", 2)
	for _, d := range waitSent(t, b, "m-0", "m-1", "t-0", "t-1") {
		if len(d.History) != 1 || d.History[0].Lane != ledger.LaneOrigin {
			t.Fatalf("delivery %s history %+v, want one origin attempt", d.ID, d.History)
		}
	}
	mb.mu.Lock()
	defer mb.mu.Unlock()
	if r, asked := mb.rates["narrow"]; asked {
		t.Fatalf("the Worker was asked for a token at %+v", r)
	}
}

func TestEdgeDeferralIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	w, mb := startWorker(t)
	b := setup(t, false, withEdge(w.URL, "video.view_milestone"))
	rc := newReceiver(t, b.clock, nil)
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) {
		s.EventTypes, s.Rate = []string{"video.view_milestone"}, ledger.Rate{PerSecond: 5, Burst: 2}
	})
	// The Worker's bucket is empty, though the origin's copy is full: the
	// first try is deferred and must cost nothing.
	mb.mu.Lock()
	mb.state["s"] = &worker.Stored{Tokens: 0, LastMS: time.Now().UnixMilli()}
	mb.mu.Unlock()
	// Several events: after a deferral the last queued delivery must still
	// go out when its token comes, with nothing else to wake the dispatcher.
	b.send("m", "video.view_milestone", 8)
	deferrals := 0
	for _, d := range waitSent(t, b, "m-0", "m-1", "m-2", "m-3", "m-4", "m-5", "m-6", "m-7") {
		deferrals += d.Deferrals
		if len(d.History) != 1 || d.Attempts != 1 || d.History[0].Lane != ledger.LaneEdge || d.History[0].StatusCode != http.StatusOK {
			t.Fatalf("history %+v (count %d): a deferral must not be an attempt", d.History, d.Attempts)
		}
	}
	if deferrals < 1 {
		t.Fatalf("deferrals = %d, want at least 1", deferrals)
	}
}

func TestAFailingWorkerIsNeverChargedAndTheOriginTakesOver(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close() // nothing listens: every edge call is refused
	b := setup(t, false, withEdge(dead, "video.view_milestone"))
	rc := newReceiver(t, b.clock, nil)
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) { s.MaxAttempts = 1 })
	b.send("m", "video.view_milestone", 6)
	for _, d := range waitSent(t, b, "m-0", "m-1", "m-2", "m-3", "m-4", "m-5") {
		// max_attempts 1: a lane failure counted as an attempt would have
		// dead-lettered the delivery.
		if len(d.History) != 1 || d.History[0].Lane != ledger.LaneOrigin {
			t.Fatalf("history %+v, want a single origin-lane attempt", d.History)
		}
	}
	if st := b.d.Snapshot()["s"].Breaker.State; st != "closed" {
		t.Fatalf("breaker %s after lane failures, want closed", st)
	}
}

// A subscriber of both lanes has half its rate at each: a backlog of one
// lane's type must not hold the other lane's half idle. Five trending
// events need 4 s at the origin lane's 1/s; the milestone behind them goes
// at once through the edge lane's own token.
func TestOneLanesBacklogDoesNotHoldTheOtherLane(t *testing.T) {
	t.Parallel()
	w, mb := startWorker(t)
	b := setupOnFakeClock(t, w.URL, mb)
	rc := newReceiver(t, b.clock, nil)
	b.subscriber("both", rc.URL, func(s *ledger.Subscriber) { s.Rate = ledger.Rate{PerSecond: 2, Burst: 2, EdgeShare: 0.5} })
	b.send("t", "video.trending", 5)
	b.send("m", "video.view_milestone", 1)
	// The clock stands still: only the tokens held at the start are spent.
	if d := waitSent(t, b, "m-0")[0]; d.History[0].Lane != ledger.LaneEdge {
		t.Fatalf("the milestone went by the %s lane, want the edge lane's own token", d.History[0].Lane)
	}
	if d := deliveryOf(t, b, "t-1"); d.Status == ledger.StatusSent {
		t.Fatalf("a second trending event went at once: the origin lane's one token was spent twice")
	}
}

// Saved buckets go on only for the lanes they were kept for: an edge-only
// subscriber's origin bucket is never spent while the Worker sends, so a
// start without the edge lane must not find it full and add a burst to what
// the Worker just sent.
func TestSavedBucketsNeedTheSameLanes(t *testing.T) {
	t.Parallel()
	w, mb := startWorker(t)
	b := setupOnFakeClock(t, w.URL, mb)
	rc := newReceiver(t, b.clock, nil)
	b.subscriber("edgy", rc.URL, func(s *ledger.Subscriber) {
		s.EventTypes, s.Rate = []string{"video.view_milestone"}, ledger.Rate{PerSecond: 1, Burst: 5}
	})
	b.send("a", "video.view_milestone", 5)
	b.settle()
	if n := rc.count(); n != 5 {
		t.Fatalf("%d sent through the Worker, want its burst of 5", n)
	}
	b.stop()
	b.start() // no edge lane now: the same events go by the origin
	b.send("b", "video.view_milestone", 5)
	b.settle()
	if n := rc.count(); n != 5 {
		t.Fatalf("%d delivered at once after a start without the edge lane, want still 5 (an empty origin bucket)", n)
	}
}

// While the Worker is out of use the origin sends an edge-only subscriber's
// deliveries at its whole rate; when the Worker comes back, the edge lane
// must not add a burst to what the origin just sent. Every arrival, across
// both lanes, is checked against one bucket of the subscriber's rate.
func TestTheWorkersReturnAddsNoBurst(t *testing.T) {
	t.Parallel()
	w, mb := startWorker(t)
	var failing atomic.Bool
	failing.Store(true)
	gate := gatedWorker(t, w, failing.Load)
	b := setupOnFakeClock(t, gate.URL, mb)
	rc := newReceiver(t, b.clock, nil)
	rate := ledger.Rate{PerSecond: 2, Burst: 2, EdgeShare: 0.5}
	b.subscriber("edgy", rc.URL, func(s *ledger.Subscriber) {
		s.EventTypes, s.Rate = []string{"video.view_milestone"}, rate
	})
	b.send("m", "video.view_milestone", 16)
	wentDown := false
	for range 120 { // 6 s of 50 ms steps
		b.step(50*time.Millisecond, 50*time.Millisecond)
		b.d.mu.Lock()
		down := b.d.edge.downUntil.After(b.fake.Now())
		b.d.mu.Unlock()
		if down && failing.Load() {
			wentDown = true
			failing.Store(false) // back in use when the lane's pause ends
		}
	}
	if !wentDown {
		t.Fatal("the failing Worker was never taken out of use")
	}
	var viaEdge, viaOrigin int
	for i := range 16 {
		d := deliveryOf(t, b, fmt.Sprintf("m-%d", i))
		if d.Status != ledger.StatusSent {
			continue
		}
		if d.History[len(d.History)-1].Lane == ledger.LaneEdge {
			viaEdge++
		} else {
			viaOrigin++
		}
	}
	if viaEdge == 0 || viaOrigin == 0 {
		t.Fatalf("%d sent through the Worker and %d through the origin, want both", viaEdge, viaOrigin)
	}
	one := bucket.Full(rate.Bucket(), t0)
	for i, at := range rc.times() {
		var ok bool
		if one, ok = bucket.Take(one, rate.Bucket(), at, 1); !ok {
			t.Fatalf("arrival %d at +%v found the subscriber's one bucket empty (%.2f tokens): both lanes together went over 2/s burst 2\n%v",
				i+1, at.Sub(t0), bucket.Refill(one, rate.Bucket(), at).Tokens, rc.times())
		}
	}
}

// A subscriber whose types change to edge types alone has its whole rate at
// the edge; deliveries of its old origin types still in its backlog must not
// go by the origin lane beside them, at the origin bucket's whole rate too.
func TestAChangeOfTypesDoesNotDoubleTheRate(t *testing.T) {
	t.Parallel()
	w, mb := startWorker(t)
	b := setupOnFakeClock(t, w.URL, mb)
	rc := newReceiver(t, b.clock, nil)
	rate := ledger.Rate{PerSecond: 2, Burst: 4, EdgeShare: 0.5}
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) {
		s.EventTypes, s.Rate, s.Paused = []string{"video.trending", "video.view_milestone"}, rate, true
	})
	b.send("t", "video.trending", 20)
	b.send("m", "video.view_milestone", 20)
	b.update("s", func(s *ledger.Subscriber) {
		s.EventTypes, s.Paused = []string{"video.view_milestone"}, false
	})
	const seconds = 5
	b.step(seconds*time.Second, 50*time.Millisecond)
	if n, most := rc.count(), int(rate.Burst+rate.PerSecond*seconds); n > most || n < most-2 {
		t.Fatalf("%d delivered in %ds at %v/s with a burst of %v, want at most %d (and close to it)", n, seconds, rate.PerSecond, rate.Burst, most)
	}
	if d := deliveryOf(t, b, "t-0"); d.Status != ledger.StatusSent || d.History[0].Lane != ledger.LaneEdge {
		t.Errorf("t-0: %s, history %+v; want sent by the edge lane", d.Status, d.History)
	}
}

// --edge-types may name a prefix: a subscriber of one type under it, or of
// a narrower prefix, uses the edge lane for it like a subscriber of "*".
func TestAnEdgePrefixCoversNarrowerSubscribers(t *testing.T) {
	t.Parallel()
	w, _ := startWorker(t)
	b := setup(t, false, withEdge(w.URL, "video.*"))
	rc := newReceiver(t, b.clock, nil)
	for id, types := range map[string][]string{"one": {"video.view_milestone"}, "narrower": {"video.view.*"}, "all": {"*"}} {
		b.subscriber(id, rc.URL, func(s *ledger.Subscriber) { s.EventTypes = types })
	}
	b.send("m", "video.view.milestone", 1)
	b.send("v", "video.view_milestone", 1)
	_, ds, err := b.l.Event(context.Background(), "m-0")
	if err != nil {
		t.Fatal(err)
	}
	_, more, err := b.l.Event(context.Background(), "v-0")
	if err != nil {
		t.Fatal(err)
	}
	if got := len(ds) + len(more); got != 4 { // m-0 to narrower and all, v-0 to one and all
		t.Fatalf("%d deliveries, want 4", got)
	}
	for _, d := range append(ds, more...) {
		waitFor(t, 10*time.Second, "delivery "+d.ID+" sent", func() bool {
			got, err := b.l.Delivery(context.Background(), d.ID)
			return err == nil && got.Status == ledger.StatusSent
		})
		got, _ := b.l.Delivery(context.Background(), d.ID)
		if len(got.History) != 1 || got.History[0].Lane != ledger.LaneEdge {
			t.Errorf("%s to %s: history %+v, want one edge-lane attempt", d.ID, d.SubscriberID, got.History)
		}
	}
}

// A delivery the edge lane refuses for itself (too large for the Worker)
// goes through the origin at once: it is not offered to the Worker again and
// again (not even once: it would be refused unread), and it does not count
// against the Worker, whose lane stays in use for the rest.
func TestADeliveryTheWorkerRefusesGoesByTheOrigin(t *testing.T) {
	t.Parallel()
	w, _ := startWorker(t)
	var calls atomic.Int32
	counted := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Config.Handler.ServeHTTP(rw, r)
	}))
	t.Cleanup(counted.Close)
	b := setup(t, false, withEdge(counted.URL, "video.view_milestone"))
	rc := newReceiver(t, b.clock, nil)
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) { s.EventTypes = []string{"video.view_milestone"} })
	body := fmt.Appendf(nil, `{"id":"big","type":"video.view_milestone","pad":%q}`, strings.Repeat("x", edgewire.MaxRequestBytes))
	res, err := b.l.Enqueue(context.Background(), []ledger.NewEvent{{ID: "big", Type: "video.view_milestone", Body: body}})
	if err != nil {
		t.Fatal(err)
	}
	for sub := range res.Subscribers {
		b.d.Notify(b.clock.Now(), sub)
	}
	d := waitSent(t, b, "big")[0]
	if len(d.History) != 1 || d.History[0].Lane != ledger.LaneOrigin || d.Attempts != 1 {
		t.Fatalf("history %+v (count %d), want one origin-lane attempt", d.History, d.Attempts)
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("the Worker was asked %d times, want never", n)
	}
	b.d.mu.Lock()
	failures, down := b.d.edge.failures, b.d.edge.downUntil
	b.d.mu.Unlock()
	if failures != 0 || !down.IsZero() {
		t.Errorf("after the refusal: %d lane failures, out of use until %v; want none", failures, down)
	}
	b.send("m", "video.view_milestone", 1)
	if d := waitSent(t, b, "m-0")[0]; d.History[0].Lane != ledger.LaneEdge {
		t.Errorf("the next delivery went by the %s lane, want the edge", d.History[0].Lane)
	}
}

// A Worker's 422 refuses that request alone: the delivery goes through the
// origin, and the Worker's failure count, which the refusal says nothing
// about, is left as it was.
func TestARefusalLeavesTheWorkersFailureCount(t *testing.T) {
	t.Parallel()
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		w.Write([]byte(`{"error":{"code":"invalid_value","message":"refused"}}`))
	}))
	t.Cleanup(refusing.Close)
	b := setup(t, false, withEdge(refusing.URL, "video.view_milestone"))
	rc := newReceiver(t, b.clock, nil)
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) { s.EventTypes = []string{"video.view_milestone"} })
	b.d.mu.Lock()
	b.d.edge.failures = edgeFailLimit - 1 // one more lane failure would take the Worker out of use
	b.d.mu.Unlock()
	b.send("m", "video.view_milestone", 1)
	if d := waitSent(t, b, "m-0")[0]; len(d.History) != 1 || d.History[0].Lane != ledger.LaneOrigin {
		t.Fatalf("history %+v, want one origin-lane attempt", d.History)
	}
	b.d.mu.Lock()
	failures, down := b.d.edge.failures, b.d.edge.downUntil
	b.d.mu.Unlock()
	if failures != edgeFailLimit-1 || !down.IsZero() {
		t.Fatalf("after a refusal: %d lane failures, out of use until %v; want %d and in use", failures, down, edgeFailLimit-1)
	}
}

// A deferral that comes back after its subscriber was removed is not
// counted: the subscriber's series went with it.
func TestARemovedSubscribersLateDeferralIsNotObserved(t *testing.T) {
	t.Parallel()
	asked := make(chan struct{}, 1)
	release := make(chan struct{})
	deferring := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		asked <- struct{}{}
		<-release
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		w.Write([]byte(`{"deferred":true,"retry_in_ms":60000}`))
	}))
	t.Cleanup(deferring.Close)
	obs := &observations{got: map[string]int{}}
	b := setup(t, false, withEdge(deferring.URL, "video.view_milestone"), func(c *Config) { c.Observer = obs })
	rc := newReceiver(t, b.clock, nil)
	b.subscriber("gone", rc.URL, func(s *ledger.Subscriber) { s.EventTypes = []string{"video.view_milestone"} })
	b.send("m", "video.view_milestone", 1)
	<-asked
	b.removeWhileOut("gone", release)
	if n := obs.count("deferral gone"); n != 0 {
		t.Fatalf("%d deferrals of the removed subscriber observed, want none", n)
	}
}

// emptyWorkerBucket spends the Worker's bucket for subscriber sub at now.
func emptyWorkerBucket(mb *memBuckets, sub string, now time.Time) {
	mb.mu.Lock()
	mb.state[sub] = &worker.Stored{Tokens: 0, LastMS: now.UnixMilli()}
	mb.mu.Unlock()
}

// After a deferral the origin sends again when the Worker said its token
// comes, not a whole token's refill later.
func TestADeferralHoldsTheEdgeLaneOnlyUntilTheWorkersTime(t *testing.T) {
	t.Parallel()
	w, mb := startWorker(t)
	b := setupOnFakeClock(t, w.URL, mb)
	rc := newReceiver(t, b.clock, nil)
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) {
		s.EventTypes, s.Rate = []string{"video.view_milestone"}, ledger.Rate{PerSecond: 0.5, Burst: 1}
	})
	emptyWorkerBucket(mb, "s", b.fake.Now()) // its next token comes in 2 s
	start := b.fake.Now()
	b.send("m", "video.view_milestone", 1)
	b.step(100*time.Millisecond, 50*time.Millisecond)
	// Deferred: the API shows the Worker's time as the soonest it can go.
	if held := b.d.HeldUntil([]Held{{"s", "video.view_milestone"}})[0].Sub(start); held < 1900*time.Millisecond || held > 2*time.Second {
		t.Errorf("after the deferral the snapshot holds it until +%v; want the Worker's +2s", held)
	}
	b.step(5*time.Second, 50*time.Millisecond)
	times := rc.times()
	if len(times) != 1 {
		t.Fatalf("%d arrivals, want 1", len(times))
	}
	if d := deliveryOf(t, b, "m-0"); d.Deferrals != 1 || d.Attempts != 1 {
		t.Fatalf("m-0: %d deferrals, %d attempts; want one of each", d.Deferrals, d.Attempts)
	}
	if took := times[0].Sub(start); took < 2*time.Second || took > 2100*time.Millisecond {
		t.Errorf("sent %v after the event; the Worker's token came at 2s", took)
	}
}

// A deferred delivery goes out before the subscriber's newer ones, not
// behind its whole backlog.
func TestADeferredDeliveryKeepsItsPlace(t *testing.T) {
	t.Parallel()
	w, mb := startWorker(t)
	b := setupOnFakeClock(t, w.URL, mb)
	rc := newReceiver(t, b.clock, nil)
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) {
		s.EventTypes, s.Rate = []string{"video.view_milestone"}, ledger.Rate{PerSecond: 2, Burst: 1}
	})
	emptyWorkerBucket(mb, "s", b.fake.Now())
	b.send("m", "video.view_milestone", 1)
	b.step(100*time.Millisecond, 50*time.Millisecond) // m-0 tried and deferred
	if d := deliveryOf(t, b, "m-0"); d.Deferrals != 1 || d.Status != ledger.StatusPending {
		t.Fatalf("m-0: %s with %d deferrals; want pending after one", d.Status, d.Deferrals)
	}
	b.send("n", "video.view_milestone", 6)
	b.step(5*time.Second, 50*time.Millisecond)
	first := deliveryOf(t, b, "m-0")
	if first.SentAt == nil {
		t.Fatalf("m-0 was not sent: %s", first.Status)
	}
	for i := range 6 {
		d := deliveryOf(t, b, fmt.Sprintf("n-%d", i))
		if d.SentAt != nil && d.SentAt.Before(*first.SentAt) {
			t.Errorf("n-%d, enqueued after m-0 was deferred, was sent at %v, before m-0 at %v", i, d.SentAt, first.SentAt)
		}
	}
}

// Moving a subscriber from one lane to the other by a change of its types
// moves what it has spent: the lane it leaves idle kept a full bucket, and
// must not add that burst to the one just spent.
func TestMovingASubscriberBetweenLanesKeepsItsRate(t *testing.T) {
	t.Parallel()
	w, mb := startWorker(t)
	b := setupOnFakeClock(t, w.URL, mb)
	rc := newReceiver(t, b.clock, nil)
	rate := ledger.Rate{PerSecond: 1, Burst: 5}
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) {
		s.EventTypes, s.Rate = []string{"video.trending"}, rate
	})
	move := func(types ...string) {
		b.update("s", func(s *ledger.Subscriber) { s.EventTypes = types })
	}
	b.send("o", "video.trending", 5) // the origin lane spends the burst
	b.step(200*time.Millisecond, 50*time.Millisecond)
	move("video.view_milestone")
	b.send("e", "video.view_milestone", 5)
	b.step(2*time.Second, 50*time.Millisecond)
	move("video.trending")
	b.send("p", "video.trending", 5)
	b.step(3*time.Second, 50*time.Millisecond)
	if n := rc.count(); n < 8 {
		t.Fatalf("%d delivered, want the rate's worth at least", n)
	}
	withinRate(t, rc.times(), rate)
}

// The tokens the stats show are the ones the subscriber can spend: an
// edge-only subscriber's are its edge bucket's, not the full origin bucket
// it keeps for when the Worker is down.
func TestTheSnapshotsTokensAreTheLanesItSendsBy(t *testing.T) {
	t.Parallel()
	w, mb := startWorker(t)
	b := setupOnFakeClock(t, w.URL, mb)
	rc := newReceiver(t, b.clock, nil)
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) {
		s.EventTypes, s.Rate = []string{"video.view_milestone"}, ledger.Rate{PerSecond: 0.1, Burst: 2}
	})
	b.send("m", "video.view_milestone", 3)
	b.step(500*time.Millisecond, 50*time.Millisecond)
	if n := rc.count(); n != 2 {
		t.Fatalf("%d delivered, want the burst of 2", n)
	}
	if got := b.d.Snapshot()["s"].Tokens; got >= 1 {
		t.Errorf("snapshot shows %.2f tokens; the edge burst is spent", got)
	}
}

// A subscriber created while the Worker is out of use sends by the origin
// lane from its origin bucket; its edge bucket must not also start full,
// or the Worker's return adds a second burst.
func TestASubscriberCreatedDuringAnOutageGetsOneBurst(t *testing.T) {
	t.Parallel()
	w, mb := startWorker(t)
	var failing atomic.Bool
	failing.Store(true)
	gate := gatedWorker(t, w, failing.Load)
	b := setupOnFakeClock(t, gate.URL, mb)
	other := newReceiver(t, b.clock, nil)
	b.subscriber("first", other.URL, func(s *ledger.Subscriber) { s.EventTypes = []string{"video.view_milestone"} })
	b.send("x", "video.view_milestone", 3) // three lane failures take the Worker out of use
	waitFor(t, 5*time.Second, "the lane to be taken out of use", func() bool {
		b.d.mu.Lock()
		defer b.d.mu.Unlock()
		return b.d.edge.downUntil.After(b.fake.Now())
	})
	failing.Store(false) // back when the lane's pause ends
	rc := newReceiver(t, b.clock, nil)
	rate := ledger.Rate{PerSecond: 1, Burst: 5}
	b.subscriber("late", rc.URL, func(s *ledger.Subscriber) { s.EventTypes, s.Rate = []string{"video.view_milestone"}, rate })
	b.send("m", "video.view_milestone", 12)
	b.step(4*time.Second, 50*time.Millisecond)
	at := rc.times()
	if len(at) < 5 {
		t.Fatalf("%d delivered, want the burst at least", len(at))
	}
	withinRate(t, at, rate)
}

// withinRate fails t when any window of 1, 2 or 3 s holds more arrivals
// than burst + rate·w: the subscriber's rate over both lanes (the receiver
// stamps an arrival up to a clock step after the send, so a strict bucket
// replay would be too strict).
func withinRate(t *testing.T, at []time.Time, rate ledger.Rate) {
	t.Helper()
	for _, w := range []int{1, 2, 3} {
		most := int(rate.Burst + rate.PerSecond*float64(w))
		for i := range at {
			n := 0
			for j := i; j < len(at) && at[j].Sub(at[i]) < time.Duration(w)*time.Second; j++ {
				n++
			}
			if n > most {
				t.Fatalf("%d arrivals in the %ds from +%v, at most %d at %v/s burst %v over both lanes\n%v",
					n, w, at[i].Sub(t0), most, rate.PerSecond, rate.Burst, at)
			}
		}
	}
}

// A subscriber of both lanes: a deferred edge delivery shows the Worker's
// time even while the origin lane has a token for its other types.
func TestHeldUntilIsPerLane(t *testing.T) {
	t.Parallel()
	w, mb := startWorker(t)
	b := setupOnFakeClock(t, w.URL, mb)
	rc := newReceiver(t, b.clock, nil)
	b.subscriber("both", rc.URL, func(s *ledger.Subscriber) { s.Rate = ledger.Rate{PerSecond: 2, Burst: 2, EdgeShare: 0.5} })
	emptyWorkerBucket(mb, "both", b.fake.Now()) // its next edge token in 1 s
	start := b.fake.Now()
	b.send("m", "video.view_milestone", 1)
	b.step(100*time.Millisecond, 50*time.Millisecond)
	if d := deliveryOf(t, b, "m-0"); d.Deferrals != 1 {
		t.Fatalf("m-0: %d deferrals, want 1", d.Deferrals)
	}
	if held := b.d.HeldUntil([]Held{{"both", "video.view_milestone"}})[0].Sub(start); held < 900*time.Millisecond || held > time.Second {
		t.Errorf("the deferred milestone is held until +%v; want the Worker's +1s", held)
	}
	if held := b.d.HeldUntil([]Held{{"both", "video.trending"}})[0]; !held.IsZero() {
		t.Errorf("a trending delivery is held until %v; the origin lane has its token", held.Sub(start))
	}
}

// A delivery whose edge request failed goes back due as it was: ahead of
// the subscriber's backlog, not behind it.
func TestALaneFailureKeepsTheDeliverysPlace(t *testing.T) {
	t.Parallel()
	w, mb := startWorker(t)
	var calls atomic.Int32
	fail := make(chan struct{})
	gate := gatedWorker(t, w, func() bool {
		if calls.Add(1) == 1 { // the first request fails, when the test says
			<-fail
			return true
		}
		return false
	})
	b := setupOnFakeClock(t, gate.URL, mb)
	rc := newReceiver(t, b.clock, nil)
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) {
		s.EventTypes, s.Rate = []string{"video.view_milestone"}, ledger.Rate{PerSecond: 2, Burst: 1}
	})
	b.send("m", "video.view_milestone", 8)
	waitFor(t, 5*time.Second, "the first request to reach the Worker", func() bool { return calls.Load() == 1 })
	b.fake.Advance(100 * time.Millisecond) // the failure comes after the backlog fell due
	close(fail)
	b.step(6*time.Second, 50*time.Millisecond)
	first := deliveryOf(t, b, "m-0")
	if first.SentAt == nil {
		t.Fatalf("m-0 is %s", first.Status)
	}
	for i := 1; i < 8; i++ {
		if d := deliveryOf(t, b, fmt.Sprintf("m-%d", i)); d.SentAt != nil && d.SentAt.Before(*first.SentAt) {
			t.Errorf("m-%d went at +%v, before m-0 at +%v, whose lane request had failed", i, d.SentAt.Sub(t0), first.SentAt.Sub(t0))
		}
	}
}

// The requests in flight when the Worker stalls all fail together: that is
// one outage, taken out of use once for the shortest while, not once per
// three of them with the while doubling each time.
func TestOneOutageTakesTheLaneOutOnce(t *testing.T) {
	t.Parallel()
	w, mb := startWorker(t)
	var failing atomic.Bool
	hold := make(chan struct{})
	var held atomic.Int32
	gate := gatedWorker(t, w, func() bool {
		if !failing.Load() {
			return false
		}
		held.Add(1)
		<-hold // every request out when it stalls fails at once
		return true
	})
	t.Cleanup(func() { close(hold) })
	b := setupOnFakeClock(t, gate.URL, mb)
	rc := newReceiver(t, b.clock, nil)
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) {
		s.EventTypes, s.Rate = []string{"video.view_milestone"}, ledger.Rate{PerSecond: 1000, Burst: 100}
	})
	b.send("first", "video.view_milestone", 1) // an answer lifts the start's cap of two in flight
	waitFor(t, 5*time.Second, "the first delivery", func() bool { return rc.count() == 1 })
	failing.Store(true)
	b.send("x", "video.view_milestone", 9)
	waitFor(t, 5*time.Second, "nine requests at the stalled Worker", func() bool { return held.Load() == 9 })
	hold <- struct{}{} // three fail first: the lane goes out of use
	hold <- struct{}{}
	hold <- struct{}{}
	waitFor(t, 5*time.Second, "the lane to be taken out of use", func() bool {
		b.d.mu.Lock()
		defer b.d.mu.Unlock()
		return b.d.edge.downs == 1
	})
	for range 6 { // then the other six
		hold <- struct{}{}
	}
	b.settle()
	b.d.mu.Lock()
	downs, until := b.d.edge.downs, b.d.edge.downUntil
	b.d.mu.Unlock()
	if downs != 1 || !until.Equal(b.fake.Now().Add(edgeDownMin)) {
		t.Fatalf("after one outage of nine requests: taken out %d times, until +%v; want once, for %v", downs, until.Sub(b.fake.Now()), edgeDownMin)
	}
	// Tried again and still failing, it goes out for twice as long.
	b.step(edgeDownMin+100*time.Millisecond, 50*time.Millisecond)
	// Some of the nine may have waited out the while and gone back to the
	// Worker too: count from here.
	before := held.Load()
	b.send("y", "video.view_milestone", 3)
	waitFor(t, 5*time.Second, "three requests at the Worker tried again", func() bool { return held.Load() >= before+3 })
	waitFor(t, 5*time.Second, "the lane to be taken out again", func() bool {
		select {
		case hold <- struct{}{}: // one more held request fails
		default:
		}
		b.d.mu.Lock()
		defer b.d.mu.Unlock()
		return b.d.edge.downs == 2
	})
	b.d.mu.Lock()
	until = b.d.edge.downUntil
	b.d.mu.Unlock()
	if !until.Equal(b.fake.Now().Add(2 * edgeDownMin)) {
		t.Errorf("failing again after its return: out until +%v, want %v", until.Sub(b.fake.Now()), 2*edgeDownMin)
	}
}

// gatedWorker is a gate in front of the Worker at w: a request for which
// fails says true is answered 502, as a failing lane would; the others
// pass through.
func gatedWorker(t *testing.T, w *httptest.Server, fails func() bool) *httptest.Server {
	t.Helper()
	target, err := url.Parse(w.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	gate := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if fails() {
			http.Error(rw, `{"error":{"code":"down","message":"down"}}`, http.StatusBadGateway)
			return
		}
		proxy.ServeHTTP(rw, r)
	}))
	t.Cleanup(gate.Close)
	return gate
}

// A subscriber just given edge types has an empty edge bucket, and admits a
// new milestone on its origin tokens: handed over in flight at the enqueue,
// which then notifies nobody, the delivery must still go when the edge
// lane's token comes.
func TestAHandedOverDeliveryGoesWhenItsLanesTokenComes(t *testing.T) {
	t.Parallel()
	w, mb := startWorker(t)
	b := setupOnFakeClock(t, w.URL, mb)
	rc := newReceiver(t, b.clock, nil)
	b.subscriber("partner", rc.URL, func(s *ledger.Subscriber) {
		s.EventTypes, s.Rate = []string{"video.trending"}, ledger.Rate{PerSecond: 10, Burst: 20, EdgeShare: 0.5}
	})
	b.update("partner", func(s *ledger.Subscriber) {
		s.EventTypes = []string{"video.trending", "video.view_milestone"}
	})
	b.settle()
	b.send("m", "video.view_milestone", 1)
	b.settle()
	if n := rc.count(); n != 0 {
		t.Fatalf("%d delivered before the edge lane had a token", n)
	}
	b.fake.Advance(time.Second) // the edge lane refills at 5/s
	waitFor(t, 5*time.Second, "the milestone's delivery", func() bool { return rc.count() == 1 })
	if d := waitSent(t, b, "m-0")[0]; len(d.History) != 1 || d.History[0].Lane != ledger.LaneEdge {
		t.Fatalf("history %+v, want one edge attempt", d.History)
	}
}
