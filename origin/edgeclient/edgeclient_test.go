package edgeclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/edge/worker"
	"github.com/sluice-dev/sluice/shared/bucket"
	"github.com/sluice-dev/sluice/shared/edgewire"
)

const secret = "whsec_ZWRnZS1zZWNyZXQtZm9yLXRlc3RzLW9ubHktMzI="

type oneToken struct{ used atomic.Bool }

func (o *oneToken) Take(context.Context, string, bucket.Rate) (worker.Grant, error) {
	if o.used.Swap(true) {
		return worker.Grant{RetryIn: 1500}, nil // 1.5 µs
	}
	return worker.Grant{OK: true}, nil
}

func TestDeliverReadsEachAnswerOfTheWorker(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	sub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer sub.Close()
	edge := httptest.NewServer(worker.Handler(worker.Config{Secrets: []string{secret}, Buckets: &oneToken{}, Client: http.DefaultClient}))
	defer edge.Close()
	req := edgewire.DeliverRequest{DeliveryID: "dlv_1", SubscriberID: "s", URL: sub.URL, Body: `{}`,
		Headers: map[string]string{"content-type": "application/json"}, Rate: bucket.Rate{PerSecond: 1, Burst: 1}}

	c, err := New(edge.URL, secret, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	deferFor, res, err := c.Deliver(context.Background(), req)
	if err != nil || deferFor != 0 || res.Status != http.StatusTooManyRequests || res.RetryAfterS == nil || *res.RetryAfterS != 7 {
		t.Fatalf("first answer = %v, %+v, %v; want the subscriber's 429 with Retry-After 7", deferFor, res, err)
	}
	if deferFor, _, err = c.Deliver(context.Background(), req); err != nil || deferFor <= 0 {
		t.Fatalf("second answer = %v, %v; want a deferral", deferFor, err)
	}

	wrong, _ := New(edge.URL, "whsec_d3Jvbmctc2VjcmV0LXdyb25nLXNlY3JldC0zMg==", nil, nil)
	if _, _, err := wrong.Deliver(context.Background(), req); !errors.Is(err, ErrLane) || errors.Is(err, edgewire.ErrRefused) {
		t.Fatalf("mis-signed request: %v, want ErrLane (the lane is misconfigured), not edgewire.ErrRefused", err)
	}
	bad := req
	bad.URL = "ftp://example.invalid/"
	if _, _, err := c.Deliver(context.Background(), bad); !errors.Is(err, edgewire.ErrRefused) || !errors.Is(err, ErrLane) || !errors.Is(err, edgewire.ErrInvalid) {
		t.Fatalf("invalid request: %v, want ErrLane and edgewire.ErrRefused, wrapping edgewire.ErrInvalid", err)
	}
	big := req
	big.Body = `"` + strings.Repeat("x", edgewire.MaxRequestBytes) + `"`
	if _, _, err := c.Deliver(context.Background(), big); !errors.Is(err, edgewire.ErrRefused) || !strings.Contains(err.Error(), "over the Worker's") {
		t.Fatalf("a request over the Worker's limit: %v, want edgewire.ErrRefused before it is sent", err)
	}
	if n := hits.Load(); n != 1 {
		t.Fatalf("the subscriber was called %d times, want once (deferred, mis-signed, invalid and oversized calls reach no one)", n)
	}
	// A 413 or 422 from the Worker is about that request; a 5xx, a 400 or
	// a 408 (past the send-by time: its clock and ours disagree, or it
	// stalled) is the lane's.
	for status, refused := range map[int]bool{413: true, 422: true, 400: false, 401: false, 408: false, 500: false, 503: false} {
		w := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(status)
			w.Write([]byte(`{"error":{"code":"x","message":"x"}}`))
		}))
		wc, _ := New(w.URL, secret, nil, nil)
		_, _, err := wc.Deliver(context.Background(), req)
		w.Close()
		if !errors.Is(err, ErrLane) || errors.Is(err, edgewire.ErrRefused) != refused {
			t.Errorf("the Worker answering %d: %v; want ErrLane, refused %v", status, err, refused)
		}
	}
	if _, err := New("127.0.0.1:8787", secret, nil, nil); err == nil {
		t.Fatal("an edge URL without a scheme was accepted")
	}
}

// A redirect from the edge URL would carry the signed request (the
// subscriber's URL, headers and body) to another host: it is a lane
// failure, and nothing follows it.
func TestARedirectIsALaneFailureAndNotFollowed(t *testing.T) {
	t.Parallel()
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		elsewhere.Add(1)
		w.WriteHeader(http.StatusOK)
		w.Write([]byte(`{"status":200}`))
	}))
	defer other.Close()
	for _, status := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		w := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+r.URL.Path, status)
		}))
		c, err := New(w.URL, secret, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = c.Deliver(context.Background(), edgewire.DeliverRequest{DeliveryID: "dlv_1", SubscriberID: "s",
			URL: "https://example.com/hook?token=abc", Body: `{}`, Rate: bucket.Rate{PerSecond: 1, Burst: 1}})
		w.Close()
		if !errors.Is(err, ErrLane) || !strings.Contains(err.Error(), fmt.Sprint(status)) {
			t.Errorf("the Worker answering %d: %v; want a lane failure naming it", status, err)
		}
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the redirect's target got %d requests, want none", n)
	}
}

// Each request tells the Worker when it may last start the call: the
// call's timeout later, its answer still has a second to come back before
// the origin stops waiting (the timeout and margin after sending).
func TestARequestCarriesItsSendByTime(t *testing.T) {
	t.Parallel()
	got := make(chan edgewire.DeliverRequest, 1)
	w := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var dr edgewire.DeliverRequest
		json.NewDecoder(r.Body).Decode(&dr)
		got <- dr
		rw.WriteHeader(http.StatusAccepted)
		rw.Write([]byte(`{"deferred":true,"retry_in_ms":5}`))
	}))
	defer w.Close()
	now := time.Unix(1_780_000_000, 0)
	c, err := New(w.URL, secret, nil, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	req := edgewire.DeliverRequest{DeliveryID: "dlv_1", SubscriberID: "s", URL: "http://127.0.0.1:9/", Body: `{}`,
		Rate: bucket.Rate{PerSecond: 1, Burst: 1}, TimeoutMS: 2000}
	if _, _, err := c.Deliver(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	dr := <-got
	if want := now.Add(margin - time.Second).UnixMilli(); dr.SendByMS != want {
		t.Errorf("send_by_ms %d, want %d (4 s after sending)", dr.SendByMS, want)
	}
}

// A Worker that answers "come back at once" or "in years" is held to the
// bounds: a deferral is at least 10 ms and at most an hour.
func TestADeferralIsBounded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		answer string
		want   time.Duration
	}{
		{`0`, 10 * time.Millisecond},
		{`-5`, 10 * time.Millisecond},
		{`-9223372036855`, 10 * time.Millisecond},
		{`250`, 250 * time.Millisecond},
		{`999999999999`, time.Hour},
		{`9223372036854775807`, time.Hour},
	} {
		w := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
			rw.WriteHeader(http.StatusAccepted)
			rw.Write([]byte(`{"deferred":true,"retry_in_ms":` + tc.answer + `}`))
		}))
		c, err := New(w.URL, secret, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		req := edgewire.DeliverRequest{DeliveryID: "dlv_1", SubscriberID: "s", URL: "http://127.0.0.1:9/", Body: `{}`,
			Rate: bucket.Rate{PerSecond: 1, Burst: 1}, TimeoutMS: 2000}
		got, _, err := c.Deliver(context.Background(), req)
		w.Close()
		if err != nil || got != tc.want {
			t.Errorf("retry_in_ms %s: deferred for %v (%v), want %v", tc.answer, got, err, tc.want)
		}
	}
}
