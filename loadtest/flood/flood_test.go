package flood_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/sluice-dev/sluice/loadtest/flood"
	"github.com/sluice-dev/sluice/loadtest/partner"
	"github.com/sluice-dev/sluice/loadtest/report"
	"github.com/sluice-dev/sluice/shared/bucket"
	"github.com/sluice-dev/sluice/shared/edgewire"
)

const secret = "whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"

func start(t *testing.T, cfg partner.Config) *partner.Partner {
	t.Helper()
	cfg.Secret = secret
	p, err := partner.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestFloodCountsEveryRequest(t *testing.T) {
	t.Parallel()
	// The default body, and one that names an id of its own: each request
	// gets its webhook-id as "id", so the partner takes it as that event.
	for _, body := range [][]byte{nil, []byte(`{"id":"mine","type":"t.x","ID":"theirs"}`)} {
		p := start(t, partner.Config{Name: "honest"})
		res, err := flood.Run(context.Background(), flood.Options{
			URL: p.URL(), Workers: 8, Duration: 30 * time.Second, MaxRequests: 200, Secret: secret, Body: body,
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.Requests != 200 || res.Accepted != 200 || res.Throttled+res.Rejected+res.Errors != 0 {
			t.Errorf("body %q: result %+v, want 200 requests all accepted", body, res)
		}
		if r := p.Report(nil); r.Delivered != 200 || r.BadSignatures != 0 || r.BadBodies != 0 {
			t.Errorf("body %q: partner saw %d deliveries, %d bad signatures, %d bad bodies; want 200, 0, 0", body, r.Delivered, r.BadSignatures, r.BadBodies)
		}
	}
}

// TestFloodShowsALimiterLimits is the seed's check: against a 10/s burst 20
// limiter the accepted count tracks the cap, not the offered load.
func TestFloodShowsALimiterLimits(t *testing.T) {
	t.Parallel()
	rate := bucket.Rate{PerSecond: 10, Burst: 20}
	p := start(t, partner.Config{Name: "limited", Advertised: rate, Enforce: true})
	res, err := flood.Run(context.Background(), flood.Options{
		URL: p.URL(), Workers: 8, Duration: 30 * time.Second, MaxRequests: 100, Secret: secret,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 100 || res.Errors != 0 {
		t.Fatalf("result %+v, want 100 answered requests", res)
	}
	// However slow the machine, no more than the burst plus the refill
	// over the run can be accepted, and the burst always is.
	most := report.Limit(rate, time.Duration(res.Elapsed), 0)
	if res.Accepted < 20 || res.Accepted > most {
		t.Errorf("accepted %d, want between the burst (20) and %d", res.Accepted, most)
	}
	if res.Throttled+res.Rejected != 100-res.Accepted {
		t.Errorf("throttled %d + rejected %d, want the other %d", res.Throttled, res.Rejected, 100-res.Accepted)
	}
}

func TestFloodRefusesNonLoopback(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"http://example.com/x", "http://10.0.0.1/x", "ftp://127.0.0.1/", "http://[::1]:9/x"} {
		err := flood.CheckLoopback(u)
		if want := u == "http://[::1]:9/x"; (err == nil) != want {
			t.Errorf("CheckLoopback(%s) = %v, want ok=%v", u, err, want)
		}
	}
}

// A Worker flood tells the Worker's answers from the subscriber's: the
// Worker's deferral is throttled, and for a delivery it made the
// subscriber's status decides, a 202 or a 429 of its own included. The
// Worker here is a stand-in that checks the request is one the real one
// takes (signed, delivery id = webhook-id) and answers from a script; the
// real Worker is flooded in edge/'s workerd tests.
func TestAWorkerFloodCountsTheSubscribersAnswer(t *testing.T) {
	t.Parallel()
	script := []string{`202 {"deferred":true,"retry_in_ms":50}`, `200 {"status":202}`, `200 {"status":429}`,
		`200 {"status":0,"error":"connection refused"}`, `503 {"error":{"code":"unavailable","message":"x"}}`, `200 not json`}
	var next atomic.Int64
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	worker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var dr edgewire.DeliverRequest
		if wh.Verify(body, r.Header) != nil || json.Unmarshal(body, &dr) != nil || dr.DeliveryID != r.Header.Get("webhook-id") || dr.Validate() != nil {
			http.Error(w, "bad request", http.StatusUnprocessableEntity)
			return
		}
		status, answer, _ := strings.Cut(script[int(next.Add(1)-1)%len(script)], " ")
		code, _ := strconv.Atoi(status)
		w.WriteHeader(code)
		io.WriteString(w, answer)
	}))
	t.Cleanup(worker.Close)
	res, err := flood.Run(context.Background(), flood.Options{
		URL: worker.URL + edgewire.DeliverPath, Secret: secret, Workers: 1, Duration: 30 * time.Second, MaxRequests: 6,
		Deliver: &flood.Deliver{SubscriberID: "sub", To: "http://127.0.0.1:9/hook", Rate: bucket.Rate{PerSecond: 10, Burst: 20}},
	})
	if err != nil {
		t.Fatal(err)
	}
	type counts struct{ Requests, Accepted, Throttled, Rejected, Unreached, Errors int }
	want := counts{Requests: 6, Accepted: 1, Throttled: 1, Rejected: 3, Unreached: 1}
	got := counts{res.Requests, res.Accepted, res.Throttled, res.Rejected, res.Unreached, res.Errors}
	if got != want {
		t.Errorf("counts %+v, want %+v", got, want)
	}
	if res.SubscriberStatuses[202] != 1 || res.SubscriberStatuses[429] != 1 || res.Statuses[200] != 4 || res.Statuses[202] != 1 {
		t.Errorf("subscriber statuses %v, the Worker's %v", res.SubscriberStatuses, res.Statuses)
	}
}
