//go:build edge

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/sluice-dev/sluice/edge/worker"
	"github.com/sluice-dev/sluice/loadtest/flood"
	"github.com/sluice-dev/sluice/shared/bucket"
	"github.com/sluice-dev/sluice/shared/edgewire"
	"github.com/sluice-dev/sluice/shared/signature"
)

// partner is a subscriber's endpoint on 127.0.0.1. It verifies every request
// with the public Standard Webhooks library, counts them per path, and
// answers with respond (204 when nil).
type partner struct {
	*httptest.Server
	mu       sync.Mutex
	hits     map[string]int
	bodies   map[string]string
	verified map[string]error
	respond  func(w http.ResponseWriter, r *http.Request)
}

func newPartner(t *testing.T) *partner {
	t.Helper()
	p := &partner{hits: map[string]int{}, bodies: map[string]string{}, verified: map[string]error{}}
	wh, err := standardwebhooks.NewWebhook(subscriberSecret)
	if err != nil {
		t.Fatal(err)
	}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		p.mu.Lock()
		p.hits[r.URL.Path]++
		p.bodies[r.Header.Get("webhook-id")] = string(body)
		p.verified[r.Header.Get("webhook-id")] = wh.Verify(body, r.Header)
		respond := p.respond
		p.mu.Unlock()
		if respond != nil {
			respond(w, r)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(p.Close)
	return p
}

func (p *partner) Hits(path string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hits[path]
}

func (p *partner) setRespond(f func(w http.ResponseWriter, r *http.Request)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.respond = f
}

// request is a deliver request for subscriber sub, its headers signed with
// the subscriber's secret as the origin does; the partner path names sub.
func (p *partner) request(t testing.TB, deliveryID, sub string, r bucket.Rate) edgewire.DeliverRequest {
	t.Helper()
	eventID := "evt_" + deliveryID
	body := `{"type":"video.trending","id":"` + eventID + `","title":"ünïcode \u2028 and <html>"}`
	h := http.Header{}
	s, err := signature.NewSigner(subscriberSecret)
	if err != nil {
		t.Fatal(err)
	}
	s.Set(h, eventID, time.Now(), []byte(body))
	return edgewire.DeliverRequest{
		DeliveryID:   deliveryID,
		SubscriberID: sub,
		URL:          p.URL + "/hooks/" + sub,
		Headers: map[string]string{
			"webhook-id":        h.Get("webhook-id"),
			"webhook-timestamp": h.Get("webhook-timestamp"),
			"webhook-signature": h.Get("webhook-signature"),
			"content-type":      "application/json",
			"user-agent":        "sluice/test",
		},
		Body:      body,
		Rate:      r,
		TimeoutMS: 5000,
	}
}

// unique makes ids that no earlier run left in a Durable Object.
func unique(prefix string) string { return fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano()) }

func TestUnsignedAndStaleRequestsReachNoOne(t *testing.T) {
	t.Parallel()
	p := newPartner(t)
	sub := unique("sub_unsigned")
	// Burst 1: had any refused request spent the token, the last one would defer.
	dr := p.request(t, unique("dlv"), sub, bucket.Rate{PerSecond: 0.01, Burst: 1})
	body, _ := json.Marshal(dr)
	now := time.Now()
	tests := []struct {
		name   string
		id     string
		body   []byte
		secret string
		at     time.Time
	}{
		{"unsigned", dr.DeliveryID, body, "", now},
		{"signed with another secret", dr.DeliveryID, body, otherSecret, now},
		{"stale: 6 minutes old", dr.DeliveryID, body, edgeSecret, now.Add(-6 * time.Minute)},
		{"from 6 minutes ahead", dr.DeliveryID, body, edgeSecret, now.Add(6 * time.Minute)},
	}
	for _, tc := range tests {
		status, out := post(t, sharedEdge, tc.id, tc.body, tc.secret, tc.at)
		if status != http.StatusUnauthorized || !strings.Contains(string(out), `"code":"unauthorized"`) {
			t.Errorf("%s: %d %s, want 401 unauthorized", tc.name, status, out)
		}
	}
	// A body changed after signing.
	signed := http.Header{}
	s, _ := signature.NewSigner(edgeSecret)
	s.Set(signed, dr.DeliveryID, now, body)
	tampered := strings.Replace(string(body), "/hooks/", "/other/", 1)
	req, _ := http.NewRequest(http.MethodPost, sharedEdge.URL+edgewire.DeliverPath, strings.NewReader(tampered))
	req.Header = signed
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("tampered body: %d, want 401", resp.StatusCode)
	}
	// Not an open relay for any method or path either.
	for _, m := range []string{http.MethodGet, http.MethodPut} {
		req, _ := http.NewRequest(m, sharedEdge.URL+edgewire.DeliverPath+"?url="+p.URL, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s: %d, want 405", m, resp.StatusCode)
		}
	}

	// Signed, but past the send-by time the origin gave it: the Worker's
	// clock in workerd says so, and the subscriber is not called.
	late := dr
	late.SendByMS = time.Now().Add(-time.Second).UnixMilli()
	if status, out := deliver(t, sharedEdge, late); status != http.StatusRequestTimeout || !strings.Contains(string(out), `"code":"expired"`) {
		t.Errorf("past its send-by time: %d %s, want 408 expired", status, out)
	}

	if n := p.Hits("/hooks/" + sub); n != 0 {
		t.Fatalf("the partner got %d requests from refused ones", n)
	}
	// The same request, properly signed, goes through: the refusals spent nothing.
	if status, out := deliver(t, sharedEdge, dr); status != http.StatusOK {
		t.Fatalf("signed request after the refusals: %d %s", status, out)
	}
	if n := p.Hits("/hooks/" + sub); n != 1 {
		t.Fatalf("the partner got %d requests, want 1", n)
	}
}

func TestDeliversWhatTheSubscriberCanVerify(t *testing.T) {
	t.Parallel()
	p := newPartner(t)
	sub := unique("sub_verify")
	rate := bucket.Rate{PerSecond: 100, Burst: 100}

	dr := p.request(t, unique("dlv"), sub, rate)
	dr.Headers["x-marker"] = "header-marker-5e2"
	status, out := deliver(t, sharedEdge, dr)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, out)
	}
	var res edgewire.Result
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatal(err)
	}
	if res.Status != http.StatusNoContent || res.Error != "" || res.RetryAfterS != nil || res.DurationMS < 0 {
		t.Fatalf("result %+v, want 204 and no error", res)
	}
	if !strings.Contains(string(out), `"retry_after_s":null`) {
		t.Errorf("retry_after_s is not null in %s", out)
	}
	p.mu.Lock()
	got, verr := p.bodies[dr.Headers["webhook-id"]], p.verified[dr.Headers["webhook-id"]]
	p.mu.Unlock()
	if got != dr.Body {
		t.Errorf("partner got body %q, want %q byte for byte", got, dr.Body)
	}
	if verr != nil {
		t.Errorf("the Standard Webhooks library rejects what the Worker sent: %v", verr)
	}

	// Only delivery id, subscriber hash, status and timing reach the logs.
	logs := waitForLog(t, sharedEdge, `"delivery_id":"`+dr.DeliveryID+`"`)
	if !strings.Contains(logs, `"subscriber":"`+worker.SubscriberHash(sub)+`"`) {
		t.Errorf("no subscriber hash in the logs:\n%s", logs)
	}
	for _, leak := range []string{p.URL, "/hooks/", sub, "header-marker-5e2", "video.trending", dr.Headers["webhook-signature"], edgeSecret} {
		if strings.Contains(logs, leak) {
			t.Errorf("the Worker's output contains %q:\n%s", leak, logs)
		}
	}
}

// busyAnswer is longer than an attempt keeps.
var busyAnswer = `{"error":"slow down"}` + strings.Repeat(" ", 2*edgewire.ResponseSnippet)

func TestReportsSubscriberFailures(t *testing.T) {
	t.Parallel()
	p := newPartner(t)
	rate := bucket.Rate{PerSecond: 100, Burst: 100}
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	p.setRespond(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "_busy"):
			w.Header().Set("Retry-After", "42")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, busyAnswer)
		case strings.HasSuffix(r.URL.Path, "_slow"):
			select {
			case <-hang:
			case <-r.Context().Done():
			}
		case strings.HasSuffix(r.URL.Path, "_moved"):
			http.Redirect(w, r, "/hooks/elsewhere", http.StatusFound)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})

	dr := p.request(t, unique("dlv"), unique("sub")+"_busy", rate)
	if status, out := deliver(t, sharedEdge, dr); status != http.StatusOK || !strings.HasPrefix(string(out), `{"status":429,"retry_after_s":42,`) {
		t.Errorf("429 with Retry-After: %d %s", status, out)
	} else {
		// The attempt keeps the first bytes of the answer, read through fetch.
		var res edgewire.Result
		if err := json.Unmarshal(out, &res); err != nil || res.Response != busyAnswer[:edgewire.ResponseSnippet] {
			t.Errorf("429's response = %q (%v), want the first %d bytes of the answer", res.Response, err, edgewire.ResponseSnippet)
		}
	}

	dr = p.request(t, unique("dlv"), unique("sub")+"_moved", rate)
	if status, out := deliver(t, sharedEdge, dr); status != http.StatusOK || !strings.HasPrefix(string(out), `{"status":302,`) {
		t.Errorf("redirect: %d %s", status, out)
	}
	if n := p.Hits("/hooks/elsewhere"); n != 0 {
		t.Errorf("the Worker followed a redirect (%d hits)", n)
	}

	dr = p.request(t, unique("dlv"), unique("sub")+"_slow", rate)
	dr.TimeoutMS = 300
	start := time.Now()
	status, out := deliver(t, sharedEdge, dr)
	var res edgewire.Result
	_ = json.Unmarshal(out, &res)
	if status != http.StatusOK || res.Status != 0 || res.Error != "timeout after 300ms" {
		t.Errorf("slow subscriber: %d %s, want status 0 and a timeout", status, out)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the 300ms timeout took %v", took)
	}

	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	dr = p.request(t, unique("dlv"), unique("sub"), rate)
	dr.URL = closed.URL + "/hooks/gone"
	status, out = deliver(t, sharedEdge, dr)
	res = edgewire.Result{}
	_ = json.Unmarshal(out, &res)
	if status != http.StatusOK || res.Status != 0 || res.Error == "" {
		t.Errorf("refused connection: %d %s, want status 0 and an error", status, out)
	}
}

// A flood for one subscriber gets at most burst + rate·t through, while
// another subscriber on the same Worker gets everything it asks for.
func TestFloodIsCappedPerSubscriber(t *testing.T) {
	t.Parallel()
	p := newPartner(t)
	flooded, calm := unique("sub_flood"), unique("sub_calm")
	rate := bucket.Rate{PerSecond: 10, Burst: 20}

	const floodFor = 2 * time.Second
	var sent, delivered, deferred, other atomic.Int64
	var badRetry atomic.Value
	start := time.Now()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Since(start) < floodFor && i < 200; i++ {
				sent.Add(1)
				status, out, err := tryDeliver(sharedEdge, p.request(t, fmt.Sprintf("dlv_f%d_%d", w, i), flooded, rate))
				if err != nil {
					t.Error(err)
					return
				}
				switch status {
				case http.StatusOK:
					delivered.Add(1)
				case http.StatusAccepted:
					deferred.Add(1)
					var d edgewire.Deferred
					if err := json.Unmarshal(out, &d); err != nil || !d.Deferred || d.RetryInMS < 1 || d.RetryInMS > 100 {
						badRetry.Store(string(out))
					}
				default:
					other.Add(1)
					t.Errorf("flood: %d %s", status, out)
				}
			}
		}()
	}
	// The calm subscriber sends 15 over 1.5s, inside its own burst of 20.
	calmDelivered := 0
	for i := range 15 {
		status, out := deliver(t, sharedEdge, p.request(t, fmt.Sprintf("dlv_c%d", i), calm, rate))
		if status == http.StatusOK {
			calmDelivered++
		} else {
			t.Errorf("calm subscriber, request %d: %d %s", i, status, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	elapsed := time.Since(start)

	limit := rate.Burst + rate.PerSecond*elapsed.Seconds()
	t.Logf("flood: %d sent in %v, %d delivered (cap %.1f), %d deferred; calm: %d of 15 delivered",
		sent.Load(), elapsed.Round(time.Millisecond), delivered.Load(), limit, deferred.Load(), calmDelivered)
	if float64(delivered.Load()) > limit {
		t.Errorf("flooded subscriber got %d deliveries in %v, over burst + rate·t = %.1f", delivered.Load(), elapsed, limit)
	}
	if delivered.Load() < int64(rate.Burst) {
		t.Errorf("flooded subscriber got %d deliveries, fewer than its burst of %v", delivered.Load(), rate.Burst)
	}
	if deferred.Load() == 0 {
		t.Error("the flood was never deferred")
	}
	if v := badRetry.Load(); v != nil {
		t.Errorf("a deferral at 10/s said %s, want retry_in_ms in [1, 100]", v)
	}
	if n := p.Hits("/hooks/" + flooded); int64(n) != delivered.Load() {
		t.Errorf("the partner got %d requests for the flooded subscriber, the Worker reported %d", n, delivered.Load())
	}
	if calmDelivered != 15 || p.Hits("/hooks/"+calm) != 15 {
		t.Errorf("calm subscriber: %d delivered, %d received, want 15", calmDelivered, p.Hits("/hooks/"+calm))
	}
}

// The Durable Object writes the bucket before it answers, so a Worker that
// restarts on the same storage remembers what was spent.
func TestBucketSurvivesARestart(t *testing.T) {
	t.Parallel()
	p := newPartner(t)
	dir := t.TempDir()
	sub := unique("sub_restart")
	rate := bucket.Rate{PerSecond: 0.02, Burst: 3} // one token per 50s

	first, err := startEdge(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if status, out := deliver(t, first, p.request(t, fmt.Sprintf("dlv_r%d", i), sub, rate)); status != http.StatusOK {
			t.Fatalf("request %d of the burst: %d %s", i, status, out)
		}
	}
	status, out := deliver(t, first, p.request(t, "dlv_r3", sub, rate))
	if status != http.StatusAccepted {
		t.Fatalf("after the burst: %d %s, want 202", status, out)
	}
	if err := first.Stop(); err != nil {
		t.Fatal(err)
	}

	second, err := startEdge(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = second.Stop() })
	status, out = deliver(t, second, p.request(t, "dlv_r4", sub, rate))
	var d edgewire.Deferred
	if status != http.StatusAccepted || json.Unmarshal(out, &d) != nil || d.RetryInMS < 20_000 || d.RetryInMS > 50_000 {
		t.Fatalf("after the restart: %d %s, want 202 with most of the 50s still to wait", status, out)
	}
	if n := p.Hits("/hooks/" + sub); n != 3 {
		t.Fatalf("the partner got %d requests, want the 3 of the burst", n)
	}
	// The restarted Worker still serves a subscriber it has not seen.
	if status, out := deliver(t, second, p.request(t, "dlv_r5", unique("sub_fresh"), rate)); status != http.StatusOK {
		t.Fatalf("fresh subscriber after the restart: %d %s", status, out)
	}
}

// One Go instance serves every request of the isolate: a subscriber that
// takes two seconds holds its own request, not the others in flight with it.
func TestSlowSubscriberHoldsOnlyItself(t *testing.T) {
	t.Parallel()
	p := newPartner(t)
	slowIn := make(chan struct{}, 1)
	p.setRespond(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "_slow") {
			slowIn <- struct{}{}
			time.Sleep(2 * time.Second) // a partner that answers slowly
		}
		w.WriteHeader(http.StatusOK)
	})
	rate := bucket.Rate{PerSecond: 100, Burst: 100}
	slowDone := make(chan string, 1)
	go func() {
		status, out, err := tryDeliver(sharedEdge, p.request(t, unique("dlv"), unique("sub")+"_slow", rate))
		slowDone <- fmt.Sprintf("%d %s %v", status, out, err)
	}()
	<-slowIn // the slow one is at the partner
	start := time.Now()
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, out, err := tryDeliver(sharedEdge, p.request(t, fmt.Sprintf("dlv_fast%d", i), unique("sub_fast"), rate))
			if err != nil || status != http.StatusOK || !strings.HasPrefix(string(out), `{"status":200,`) {
				t.Errorf("fast delivery %d: %d %s %v", i, status, out, err)
			}
		}()
	}
	wg.Wait()
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Errorf("20 fast deliveries took %v beside a slow one; they waited for it", took)
	}
	select {
	case got := <-slowDone:
		t.Fatalf("the slow delivery finished before the fast ones were all done: %s", got)
	default:
	}
	if got := <-slowDone; !strings.HasPrefix(got, `200 {"status":200,`) {
		t.Fatalf("slow delivery: %s", got)
	}
}

// A Worker flood at a subscriber that does not answer counts no
// acceptance: the Worker's 200 carries the subscriber's failure.
func TestTheHarnessFloodCountsTheSubscribersAnswer(t *testing.T) {
	t.Parallel()
	res, err := flood.Run(context.Background(), flood.Options{
		URL: sharedEdge.URL + edgewire.DeliverPath, Secret: edgeSecret, Workers: 2, MaxRequests: 4, Duration: 10 * time.Second,
		Deliver: &flood.Deliver{SubscriberID: unique("sub_lt_nobody"), To: "http://127.0.0.1:1/hook", Rate: bucket.Rate{PerSecond: 100, Burst: 100}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Accepted != 0 || res.Unreached != 4 {
		t.Errorf("flood through the Worker at a closed port: %+v, want 4 unreached and nothing accepted", res)
	}
}

// The harness's flood, pointed at the Worker's deliver path, sees its
// limiter limit: past the subscriber's burst the Worker defers (counted as
// throttled), and what it delivers stays within burst + rate over the run,
// each delivery signed so the partner verifies it.
func TestTheHarnessFloodSeesTheWorkerDefer(t *testing.T) {
	t.Parallel()
	p := newPartner(t)
	rate := bucket.Rate{PerSecond: 10, Burst: 20}
	res, err := flood.Run(context.Background(), flood.Options{
		URL: sharedEdge.URL + edgewire.DeliverPath, Secret: edgeSecret, Workers: 4, Duration: time.Second,
		Deliver: &flood.Deliver{SubscriberID: unique("sub_lt_flood"), To: p.URL + "/hook", Rate: rate, SubscriberSecret: subscriberSecret},
	})
	if err != nil {
		t.Fatal(err)
	}
	limit := rate.Burst + rate.PerSecond*time.Duration(res.Elapsed).Seconds()
	t.Logf("flood: %d requests, %d delivered (cap %.1f), %d deferred, %d rejected, %d errors", res.Requests, res.Accepted, limit,
		res.Throttled, res.Rejected, res.Errors)
	if res.Throttled == 0 || float64(res.Accepted) > limit || res.Accepted < int(rate.Burst) || res.Rejected+res.Errors+res.Unreached > 0 {
		t.Errorf("flood through the Worker: %+v; want deferrals, between %v and %.1f delivered, nothing rejected", res, rate.Burst, limit)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// A delivery the run cut off after the Worker made it reached the
	// partner without flood counting it.
	if got := len(p.verified); got < res.Accepted || got > res.Accepted+res.Unanswered {
		t.Errorf("the partner got %d deliveries, flood counted %d accepted and %d unanswered", got, res.Accepted, res.Unanswered)
	}
	for id, err := range p.verified {
		if err != nil {
			t.Errorf("delivery %s: the partner could not verify it: %v", id, err)
		}
	}
}

// A body over the Worker's limit is refused before it is read: one that
// declares its size at once, without waiting for a byte of it (none is
// sent), and one sent in chunks as soon as it passes the limit. Nothing of
// it is buffered or copied into Go's memory ahead of the signature check.
func TestAnOversizedBodyIsRefusedBeforeItIsRead(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(sharedEdge.URL)
	if err != nil {
		t.Fatal(err)
	}
	// Declared: the headers alone, on a connection of our own, so the
	// answer is read while nothing more is written (a client still writing
	// meets the Worker's close as a reset and may lose the answer).
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(15 * time.Second))
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
		edgewire.DeliverPath, u.Host, 80<<20)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("declared 80 MiB: %v, want a 413 answer before any of the body", err)
	}
	checkTooLarge(t, "declared 80 MiB", resp)

	// Chunked: a little over the limit, then nothing more and no end: only
	// a Worker that refuses without reading the rest can answer.
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() })
	go func() {
		chunk := make([]byte, 64<<10)
		for sent := 0; sent <= edgewire.MaxRequestBytes+len(chunk); sent += len(chunk) {
			if _, err := pw.Write(chunk); err != nil {
				return
			}
		}
	}()
	req, err := http.NewRequest(http.MethodPost, sharedEdge.URL+edgewire.DeliverPath, pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = -1
	hc := &http.Client{Timeout: 15 * time.Second}
	resp, err = hc.Do(req)
	if err != nil {
		t.Fatalf("chunked: %v, want a 413 answer", err)
	}
	checkTooLarge(t, "chunked", resp)
}

func checkTooLarge(t *testing.T, name string, resp *http.Response) {
	t.Helper()
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(out), `"code":"too_large"`) {
		t.Errorf("%s: %d %s, want 413 too_large", name, resp.StatusCode, out)
	}
}
