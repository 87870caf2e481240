package delivery

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/edge/worker"
	"github.com/sluice-dev/sluice/origin/edgeclient"
	"github.com/sluice-dev/sluice/origin/ledger"
	"github.com/sluice-dev/sluice/shared/bucket"
	"github.com/sluice-dev/sluice/shared/signature"
)

const edgeSecret = "whsec_ZWRnZS1zZWNyZXQtZm9yLXRlc3RzLW9ubHktMzI="

// memBuckets stands in for the Durable Objects on the host: the same
// TakeToken decision, kept in a map, recording the rates it was asked for.
type memBuckets struct {
	mu    sync.Mutex
	state map[string]*worker.Stored
	rates map[string]bucket.Rate
}

func (m *memBuckets) Take(_ context.Context, sub string, r bucket.Rate) (worker.Grant, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	next, g := worker.TakeToken(m.state[sub], r, time.Now())
	m.state[sub], m.rates[sub] = &next, r
	return g, nil
}

// startWorker serves the real Worker handler on 127.0.0.1.
func startWorker(t *testing.T) (*httptest.Server, *memBuckets) {
	t.Helper()
	mb := &memBuckets{state: map[string]*worker.Stored{}, rates: map[string]bucket.Rate{}}
	srv := httptest.NewServer(worker.Handler(worker.Config{
		Secrets: []string{edgeSecret}, Buckets: mb, Client: &http.Client{
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}))
	t.Cleanup(srv.Close)
	return srv, mb
}

func withEdge(url string, types ...string) option {
	return func(c *Config) {
		ec, err := edgeclient.New(url, edgeSecret, nil, nil)
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
		body := make([]byte, r.ContentLength)
		_, _ = r.Body.Read(body)
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
	if snap := b.d.Snapshot()["both"]; snap.Tokens > 75 {
		t.Fatalf("origin bucket holds %.1f tokens, above its share of the burst (75)", snap.Tokens)
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
	w, _ := startWorker(t)
	b := setup(t, false, withEdge(w.URL, "video.view_milestone"))
	rc := newReceiver(t, b.clock, nil)
	b.subscriber("both", rc.URL, func(s *ledger.Subscriber) { s.Rate = ledger.Rate{PerSecond: 2, Burst: 2, EdgeShare: 0.5} })
	b.send("t", "video.trending", 5)
	b.send("m", "video.view_milestone", 1)
	start := time.Now()
	d := waitSent(t, b, "m-0")[0]
	if took := time.Since(start); took > 2*time.Second || d.History[0].Lane != ledger.LaneEdge {
		t.Fatalf("the milestone went by %s after %v, want the edge lane within 2 s", d.History[0].Lane, took)
	}
	if last := deliveryOf(t, b, "t-4"); last.Status == ledger.StatusSent {
		t.Fatalf("the last trending event was sent before the milestone; the lanes did not run side by side")
	}
}

// Saved buckets go on only for the lanes they were kept for: an edge-only
// subscriber's origin bucket is never spent while the Worker sends, so a
// start without the edge lane must not find it full and add a burst to what
// the Worker just sent.
func TestSavedBucketsNeedTheSameLanes(t *testing.T) {
	t.Parallel()
	w, _ := startWorker(t)
	b := setup(t, true, withEdge(w.URL, "video.view_milestone"))
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
