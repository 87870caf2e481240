//go:build edge

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/sluice-dev/sluice/loadtest/localedge"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/sluice-dev/sluice/origin/delivery"
	"github.com/sluice-dev/sluice/origin/edgeclient"
	"github.com/sluice-dev/sluice/origin/ledger"
	"github.com/sluice-dev/sluice/origin/origintest"
	"github.com/sluice-dev/sluice/shared/bucket"
	"github.com/sluice-dev/sluice/shared/edgewire"
	"github.com/sluice-dev/sluice/shared/signature"
)

// These tests run a whole origin in-process (ledger file, dispatcher, API)
// with its edge lane pointed at the Worker in real workerd, as
// `sluice serve --edge-url … --edge-types video.view_milestone` would.

const (
	edgeType    = "video.view_milestone"
	originToken = "edge-test-token-0123456789"
)

// origin is one real sluice origin whose edge lane is the Worker at e.
type origin struct {
	l    *ledger.Ledger
	disp *delivery.Dispatcher
	api  *httptest.Server
}

func startOrigin(t *testing.T, e *localedge.Worker) *origin {
	t.Helper()
	ec, err := edgeclient.New(e.URL, edgeSecret, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := origintest.Start(t, originToken, origintest.Options{Delivery: func(c *delivery.Config) {
		c.Edge, c.EdgeTypes, c.UserAgent = ec, []string{edgeType}, "sluice/edge-test"
		// Errors only: the fallback test makes every lane failure a warning.
		c.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	}})
	srv := httptest.NewServer(o.API)
	t.Cleanup(srv.Close)
	return &origin{l: o.Ledger, disp: o.Dispatcher, api: srv}
}

// call sends a JSON request to the API and decodes the answer into out.
func (o *origin) call(t *testing.T, method, path string, in, out any) int {
	t.Helper()
	body, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(method, o.api.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+originToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, raw, err)
		}
	}
	return resp.StatusCode
}

// subscribe creates a subscriber to the edge type, signed with subscriberSecret.
func (o *origin) subscribe(t *testing.T, id, url string, rate bucket.Rate, maxAttempts int) {
	t.Helper()
	in := map[string]any{
		"id": id, "url": url, "event_types": []string{edgeType}, "secret": subscriberSecret,
		"rate":         map[string]float64{"per_second": rate.PerSecond, "burst": rate.Burst},
		"max_attempts": maxAttempts, "timeout_ms": 2000,
	}
	var out map[string]any
	if status := o.call(t, http.MethodPost, "/v1/subscribers", in, &out); status != http.StatusCreated {
		t.Fatalf("create subscriber: %d %v", status, out)
	}
}

// send enqueues events of the edge type with the given ids in one batch.
func (o *origin) send(t *testing.T, ids []string) {
	t.Helper()
	events := make([]map[string]any, len(ids))
	for i, id := range ids {
		events[i] = map[string]any{"id": id, "type": edgeType, "views": 1000 * (i + 1)}
	}
	var out struct{ Accepted, Duplicates, Deliveries int }
	status := o.call(t, http.MethodPost, "/v1/events/batch", map[string]any{"events": events}, &out)
	if status != http.StatusAccepted || out.Accepted != len(ids) || out.Deliveries != len(ids) {
		t.Fatalf("batch of %d: %d %+v", len(ids), status, out)
	}
}

// deliveries returns every delivery of a subscriber with its attempt history.
func (o *origin) deliveries(t *testing.T, sub string) []ledger.Delivery {
	t.Helper()
	ctx := context.Background()
	page, _, err := o.l.Deliveries(ctx, ledger.DeliveryFilter{SubscriberID: sub, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]ledger.Delivery, 0, len(page))
	for _, d := range page {
		full, err := o.l.Delivery(ctx, d.ID)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, full)
	}
	return out
}

// waitSettled polls until none of sub's n deliveries is pending or in
// flight, and returns the counts.
func (o *origin) waitSettled(t *testing.T, sub string, n int, within time.Duration) ledger.SubscriberStats {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		stats, err := o.l.Stats(context.Background(), time.Now().Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		var s ledger.SubscriberStats
		if p := stats[sub]; p != nil {
			s = *p
		}
		if s.Pending == 0 && s.Inflight == 0 && s.Sent+s.Dead == n {
			return s
		}
		if time.Now().After(deadline) {
			var stuck []string
			for _, d := range o.deliveries(t, sub) {
				if d.Status == ledger.StatusPending || d.Status == ledger.StatusInflight {
					stuck = append(stuck, fmt.Sprintf("%s (event %s) %s: %d attempts, %d deferrals, next attempt %v",
						d.ID, d.EventID, d.Status, d.Attempts, d.Deferrals, d.NextAttemptAt.Format("15:04:05.000")))
				}
			}
			t.Fatalf("after %v: %d pending, %d in flight, %d sent, %d dead of %d; not done at %v:\n%s",
				within, s.Pending, s.Inflight, s.Sent, s.Dead, n, time.Now().Format("15:04:05.000"), strings.Join(stuck, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// endpoint is a subscriber's receiver on 127.0.0.1: it verifies every
// request with the public Standard Webhooks library and notes when each
// event id arrived.
type endpoint struct {
	*httptest.Server
	mu         sync.Mutex
	arrivals   []time.Time
	ids        map[string]int
	first      map[string]time.Time
	unverified []string
	cut        []string // requests whose body never arrived whole
}

func newEndpoint(t *testing.T) *endpoint {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(subscriberSecret)
	if err != nil {
		t.Fatal(err)
	}
	ep := &endpoint{ids: map[string]int{}, first: map[string]time.Time{}}
	ep.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		id := r.Header.Get("webhook-id")
		body, err := io.ReadAll(r.Body)
		if err != nil {
			// The sender died mid-request (the killed Worker): nothing was
			// delivered, and it answers no one.
			ep.mu.Lock()
			ep.cut = append(ep.cut, id)
			ep.mu.Unlock()
			return
		}
		verr := wh.Verify(body, r.Header)
		ep.mu.Lock()
		if _, ok := ep.first[id]; !ok {
			ep.first[id] = at
		}
		ep.arrivals = append(ep.arrivals, at)
		ep.ids[id]++
		if verr != nil {
			ep.unverified = append(ep.unverified, fmt.Sprintf("%s: %v", id, verr))
		}
		ep.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(ep.Close)
	return ep
}

func (ep *endpoint) distinct() int {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return len(ep.ids)
}

// checkRate fails if the arrivals ever exceed burst + rate·t, over every
// window between two arrivals, with slack for the jitter between the
// Worker's grant of a token and the request's arrival here.
func checkRate(t *testing.T, arrivals []time.Time, r bucket.Rate, slack float64) {
	t.Helper()
	sorted := append([]time.Time(nil), arrivals...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Before(sorted[j]) })
	worst, worstAt := 0.0, ""
	for i := range sorted {
		for j := i; j < len(sorted); j++ {
			span := sorted[j].Sub(sorted[i])
			over := float64(j-i+1) - (r.Burst + r.PerSecond*span.Seconds())
			if over > worst {
				worst, worstAt = over, fmt.Sprintf("%d arrivals in %v", j-i+1, span.Round(time.Millisecond))
			}
		}
	}
	if worst > slack {
		t.Errorf("the receiver got %s: %.2f over burst + rate·t (%v/s, burst %v)", worstAt, worst, r.PerSecond, r.Burst)
	}
	// Also per 1-second window from each arrival, as a partner would count.
	for i := range sorted {
		n := sort.Search(len(sorted), func(k int) bool { return !sorted[k].Before(sorted[i].Add(time.Second)) }) - i
		if float64(n) > r.Burst+r.PerSecond+slack {
			t.Errorf("%d arrivals in the second from %v, over burst + rate = %v", n, sorted[i].Format("15:04:05.000"), r.Burst+r.PerSecond)
		}
	}
}

// spendEdgeBucket empties the Worker's bucket for sub as another origin
// sharing the Worker would: signed deliveries to url until the Worker defers
// one. It returns how many the Worker delivered.
func spendEdgeBucket(t *testing.T, e *localedge.Worker, sub, url string, r bucket.Rate) int {
	t.Helper()
	s, err := signature.NewSigner(subscriberSecret)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		eventID := fmt.Sprintf("evt_spend_%d", i)
		body := fmt.Sprintf(`{"id":%q,"type":%q}`, eventID, edgeType)
		h := http.Header{}
		s.Set(h, eventID, time.Now(), []byte(body))
		status, out := deliver(t, e, edgewire.DeliverRequest{
			DeliveryID: fmt.Sprintf("dlv_spend_%d", i), SubscriberID: sub, URL: url,
			Headers: map[string]string{
				"webhook-id":        h.Get("webhook-id"),
				"webhook-timestamp": h.Get("webhook-timestamp"),
				"webhook-signature": h.Get("webhook-signature"),
				"content-type":      "application/json",
			},
			Body: body, Rate: r, TimeoutMS: 2000,
		})
		switch status {
		case http.StatusAccepted:
			return i
		case http.StatusOK:
		default:
			t.Fatalf("spending the Worker's bucket: %d %s", status, out)
		}
	}
	t.Fatal("the Worker never deferred: its bucket is not being spent")
	return 0
}

func TestOriginDeliversEdgeTypesThroughTheWorker(t *testing.T) {
	t.Parallel()
	o := startOrigin(t, sharedEdge)
	ep := newEndpoint(t)
	sub := unique("sub_origin")
	rate := bucket.Rate{PerSecond: 5, Burst: 2}
	o.subscribe(t, sub, ep.URL+"/hooks", rate, 8)

	// The origin's copy of the edge bucket is full; the Worker's, which is
	// the truth, is spent just before the events come: the first tries are
	// deferred.
	spent := spendEdgeBucket(t, sharedEdge, sub, ep.URL+"/hooks", rate)
	ids := make([]string, 12)
	for i := range ids {
		ids[i] = fmt.Sprintf("evt_milestone_%02d", i)
	}
	start := time.Now()
	o.send(t, ids)
	stats := o.waitSettled(t, sub, len(ids), 10*time.Second)
	t.Logf("%d events sent in %v after %d spent at the Worker", stats.Sent, time.Since(start).Round(time.Millisecond), spent)
	if stats.Sent != len(ids) {
		t.Fatalf("%d sent, %d dead of %d", stats.Sent, stats.Dead, len(ids))
	}

	deferrals := 0
	for _, d := range o.deliveries(t, sub) {
		deferrals += d.Deferrals
		// A deferral is not an attempt: one attempt each, however many times
		// the Worker said "not yet".
		if d.Attempts != 1 || len(d.History) != 1 {
			t.Errorf("%s (%d deferrals): %d attempts, history %+v; want exactly one", d.ID, d.Deferrals, d.Attempts, d.History)
			continue
		}
		if a := d.History[0]; a.Lane != ledger.LaneEdge || a.StatusCode != http.StatusOK || a.Error != "" {
			t.Errorf("%s: attempt %+v, want lane edge, status 200", d.ID, a)
		}
	}
	if deferrals == 0 {
		t.Error("no delivery was deferred though the Worker's bucket was spent")
	}

	ep.mu.Lock()
	defer ep.mu.Unlock()
	if len(ep.unverified) > 0 {
		t.Errorf("the Standard Webhooks library rejected %d requests: %v", len(ep.unverified), ep.unverified)
	}
	for _, id := range ids {
		if n := ep.ids[id]; n != 1 {
			t.Errorf("%s arrived %d times, want once", id, n)
		}
	}
	if want := spent + len(ids); len(ep.arrivals) != want {
		t.Errorf("the receiver got %d requests, want %d (%d spent + %d events)", len(ep.arrivals), want, spent, len(ids))
	}
	t.Logf("%d deferrals over %d deliveries", deferrals, len(ids))
	// The spending requests count too: they went through the same bucket.
	checkRate(t, ep.arrivals, rate, 1)
}

func TestOriginFallsBackWhenTheWorkerIsKilled(t *testing.T) {
	t.Parallel()
	e, err := startEdge("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop() })
	o := startOrigin(t, e)
	ep := newEndpoint(t)
	sub := unique("sub_fallback")
	// max_attempts 1: a lane failure charged as an attempt would dead-letter
	// the delivery.
	o.subscribe(t, sub, ep.URL+"/hooks", bucket.Rate{PerSecond: 100, Burst: 10}, 1)

	ids := make([]string, 200)
	for i := range ids {
		ids[i] = fmt.Sprintf("evt_fallback_%03d", i)
	}
	start := time.Now()
	o.send(t, ids)

	deadline := time.Now().Add(10 * time.Second)
	for ep.distinct() < 30 {
		if time.Now().After(deadline) {
			t.Fatalf("the receiver got %d events in 10s through the Worker", ep.distinct())
		}
		time.Sleep(5 * time.Millisecond)
	}
	killStart := time.Now()
	e.Kill()
	select {
	case <-e.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the Worker did not exit within 10s of SIGKILL")
	}
	killEnd := time.Now()
	seenBefore := ep.distinct()

	stats := o.waitSettled(t, sub, len(ids), 20*time.Second)
	t.Logf("killed the Worker after %v with %d events received; all settled after %v",
		killStart.Sub(start).Round(time.Millisecond), seenBefore, time.Since(start).Round(time.Millisecond))
	if stats.Sent != len(ids) || stats.Dead != 0 {
		t.Errorf("%d sent, %d dead of %d; want all sent", stats.Sent, stats.Dead, len(ids))
	}

	byLane := map[ledger.Lane]int{}
	for _, d := range o.deliveries(t, sub) {
		if d.Status != ledger.StatusSent || d.Attempts != 1 || len(d.History) != 1 {
			t.Errorf("%s: %s after %d attempts, history %+v; want sent on one attempt (lane failures are not charged)",
				d.ID, d.Status, d.Attempts, d.History)
			continue
		}
		a := d.History[0]
		byLane[a.Lane]++
		if a.StatusCode != http.StatusOK || a.Error != "" {
			t.Errorf("%s: attempt %+v, want status 200", d.ID, a)
		}
		// Attempt times are stored to the millisecond.
		switch a.Lane {
		case ledger.LaneEdge:
			if a.At.UnixMilli() > killEnd.UnixMilli() {
				t.Errorf("%s: edge attempt at %v, after the Worker was dead (%v)", d.ID, a.At, killEnd)
			}
		case ledger.LaneOrigin:
			if a.At.UnixMilli() < killStart.UnixMilli() {
				t.Errorf("%s: origin attempt at %v, before the Worker was killed (%v)", d.ID, a.At, killStart)
			}
		default:
			t.Errorf("%s: attempt on lane %q", d.ID, a.Lane)
		}
	}
	t.Logf("attempts by lane: %v", byLane)
	if byLane[ledger.LaneEdge] == 0 || byLane[ledger.LaneOrigin] == 0 {
		t.Errorf("attempts by lane %v, want the edge before the kill and the origin after", byLane)
	}
	if st := o.disp.Snapshot()[sub].Breaker.State; st != "closed" {
		t.Errorf("breaker %s after the Worker died, want closed: the subscriber did nothing wrong", st)
	}

	ep.mu.Lock()
	defer ep.mu.Unlock()
	if len(ep.unverified) > 0 {
		t.Errorf("the Standard Webhooks library rejected %d requests: %v", len(ep.unverified), ep.unverified)
	}
	missing, dup, lead := 0, 0, time.Duration(0)
	for _, id := range ids {
		switch n := ep.ids[id]; {
		case n == 0:
			missing++
		case n > 1:
			// At least once: the Worker died after calling the receiver,
			// before its answer reached the origin, which sent it again.
			dup++
			lead = max(lead, killStart.Sub(ep.first[id]))
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d accepted events never reached the receiver", missing, len(ids))
	}
	t.Logf("%d events received twice (the earliest first came %v before the kill); %d requests cut short by it",
		dup, lead.Round(time.Millisecond), len(ep.cut))
}
