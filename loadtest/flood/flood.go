// Package flood is the seed's hostile client, generalised: N workers hammer
// one loopback URL for a bounded time and count what came back, so you can
// see whether a limiter limits.
package flood

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/loadtest/report"
	"github.com/sluice-dev/sluice/shared/bucket"
	"github.com/sluice-dev/sluice/shared/edgewire"
	"github.com/sluice-dev/sluice/shared/signature"
)

// Options are one flood.
type Options struct {
	URL         string        // a loopback http URL
	Workers     int           // concurrent clients (default 64)
	Duration    time.Duration // how long to flood (default 10s)
	MaxRequests int           // stop after this many requests in all (default 1,000,000)
	Timeout     time.Duration // per request (default 5s)
	// Secret, when set, signs each request the Standard Webhooks way with a
	// fresh webhook-id, so a partner accepts it; otherwise requests are bare.
	Secret string
	// Body is each request's body (default a small video.trending event).
	Body []byte
	// Deliver, when set, makes each request a deliver request to the edge
	// Worker, whose deliver path URL is, with Secret the origin↔edge
	// secret: for one subscriber, metered at its rate, the event its body.
	// The Worker's 202 deferral (its bucket was empty) counts as throttled;
	// when it called the subscriber, the subscriber's answer decides
	// accepted (2xx), rejected (any other, its 429 included) or unreached
	// (no answer), and is tallied in SubscriberStatuses.
	Deliver *Deliver
	Now     func() time.Time // default time.Now

	runID string // prefixes the ids, so two floods at one partner are no duplicates of each other
}

// Deliver is the subscriber a Worker flood is for.
type Deliver struct {
	SubscriberID string
	To           string      // the subscriber's URL, which the Worker calls (loopback)
	Rate         bucket.Rate // its edge rate
	// SubscriberSecret, when set, signs each event for the subscriber, so a
	// partner behind the Worker accepts it.
	SubscriberSecret string
}

// Result is what came back.
type Result struct {
	Requests  int `json:"requests"`
	Accepted  int `json:"accepted"`  // 2xx
	Throttled int `json:"throttled"` // 429; in a Worker flood, the Worker's 202 deferral
	Rejected  int `json:"rejected"`  // any other status
	Errors    int `json:"errors"`    // no answer: refused, reset or timed out
	// Unanswered were still waiting for their answer when the run ended.
	Unanswered int `json:"unanswered"`
	// Unreached, in a Worker flood, the Worker carried out but the
	// subscriber did not answer; SubscriberStatuses are the answers it did
	// give, as the Worker reported them (Statuses are the Worker's own).
	Unreached          int           `json:"unreached,omitempty"`
	SubscriberStatuses map[int]int   `json:"subscriber_statuses,omitempty"`
	Elapsed            report.Millis `json:"elapsed_ms"`
	// Achieved is accepted per second; Offered is answered requests per second.
	Achieved float64       `json:"achieved_per_s"`
	Offered  float64       `json:"offered_per_s"`
	P50      report.Millis `json:"p50_ms"`
	P99      report.Millis `json:"p99_ms"`
	Statuses map[int]int   `json:"statuses"`
}

// CheckLoopback refuses any URL whose host is not a loopback address: the
// harness never sends load off the machine.
func CheckLoopback(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%s: want an http URL", raw)
	}
	host := u.Hostname()
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%s: the harness only sends to loopback addresses (127.0.0.1, ::1, localhost)", raw)
}

// Run floods until Duration passes, MaxRequests were sent or ctx ends.
func Run(ctx context.Context, o Options) (Result, error) {
	if err := CheckLoopback(o.URL); err != nil {
		return Result{}, err
	}
	var subSigner *signature.Signer
	if d := o.Deliver; d != nil {
		if err := CheckLoopback(d.To); err != nil {
			return Result{}, err
		}
		if o.Secret == "" {
			return Result{}, errors.New("a Worker flood needs the origin↔edge secret: the Worker refuses unsigned requests")
		}
		if d.SubscriberSecret != "" {
			var err error
			if subSigner, err = signature.NewSigner(d.SubscriberSecret); err != nil {
				return Result{}, err
			}
		}
	}
	if o.Workers <= 0 {
		o.Workers = 64
	}
	if o.Duration <= 0 {
		o.Duration = 10 * time.Second
	}
	if o.MaxRequests <= 0 {
		o.MaxRequests = 1_000_000
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	o.runID = "flood_" + strconv.FormatInt(o.Now().UnixNano(), 36)
	var signer *signature.Signer
	if o.Secret != "" {
		var err error
		if signer, err = signature.NewSigner(o.Secret); err != nil {
			return Result{}, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	client := &http.Client{
		Timeout:   o.Timeout,
		Transport: &http.Transport{MaxIdleConnsPerHost: o.Workers, MaxConnsPerHost: o.Workers},
	}
	defer client.CloseIdleConnections()

	var (
		mu       sync.Mutex
		res      = Result{Statuses: map[int]int{}}
		lat      []time.Duration
		issued   int
		issuedMu sync.Mutex
		wg       sync.WaitGroup
	)
	// take hands out request numbers until the budget is spent.
	take := func() (int, bool) {
		issuedMu.Lock()
		defer issuedMu.Unlock()
		if issued >= o.MaxRequests || ctx.Err() != nil {
			return 0, false
		}
		issued++
		return issued, true
	}
	start := o.Now()
	for range o.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n, ok := take()
				if !ok {
					return
				}
				a, err := one(ctx, client, o, signer, subSigner, n)
				mu.Lock()
				res.Requests++
				switch {
				case err != nil && ctx.Err() != nil:
					res.Unanswered++ // cut off by the end of the run
				case err != nil:
					res.Errors++
				case a.carried:
					if res.SubscriberStatuses == nil {
						res.SubscriberStatuses = map[int]int{}
					}
					switch {
					case a.subscriber == 0:
						res.Unreached++
					case a.subscriber/100 == 2:
						res.Accepted++
					default:
						res.Rejected++
					}
					if a.subscriber != 0 {
						res.SubscriberStatuses[a.subscriber]++
					}
				case a.status == http.StatusTooManyRequests, o.Deliver != nil && a.status == http.StatusAccepted:
					res.Throttled++
				case o.Deliver == nil && a.status/100 == 2:
					res.Accepted++
				default:
					res.Rejected++
				}
				if err == nil {
					res.Statuses[a.status]++
					lat = append(lat, a.took)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := o.Now().Sub(start)
	slices.Sort(lat)
	res.Elapsed = report.Millis(elapsed)
	res.Achieved = report.Rate(res.Accepted, elapsed)
	res.Offered = report.Rate(len(lat), elapsed)
	res.P50 = report.Millis(report.Percentile(lat, 0.50))
	res.P99 = report.Millis(report.Percentile(lat, 0.99))
	return res, nil
}

var defaultBody = []byte(`{"type":"video.trending","video_id":"vv_9f31c2","region":"NL","velocity":224.0}`)

// answer is what one request got back.
type answer struct {
	status int // flood's own: the Worker's, in a Worker flood
	took   time.Duration
	// carried: a Worker flood's request the Worker carried out, and
	// subscriber the subscriber's status it reported (0: no answer).
	carried    bool
	subscriber int
}

func one(ctx context.Context, client *http.Client, o Options, signer, subSigner *signature.Signer, n int) (answer, error) {
	body := o.Body
	if body == nil {
		body = defaultBody
	}
	id := o.runID + "_" + strconv.Itoa(n)
	if signer != nil {
		body = withID(body, id)
	}
	t0 := o.Now()
	if d := o.Deliver; d != nil {
		var err error
		if body, err = deliverBody(d, subSigner, id, body, t0); err != nil {
			return answer{}, err
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.URL, bytes.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if signer != nil {
		signer.Set(req.Header, id, t0, body)
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	out, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10)) // a Worker's answer is small
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body) // the rest, so the connection is reused
	}
	resp.Body.Close()
	if err != nil && !errors.Is(err, context.Canceled) {
		return answer{}, err
	}
	a := answer{status: resp.StatusCode, took: o.Now().Sub(t0)}
	if o.Deliver != nil && resp.StatusCode == http.StatusOK {
		// The Worker called the subscriber: what counts is its answer. A
		// 200 that does not read as one is the Worker's fault: rejected.
		var r edgewire.Result
		if json.Unmarshal(out, &r) == nil {
			a.carried, a.subscriber = true, r.Status
		}
	}
	return a, nil
}

// deliverBody wraps the event in a deliver request whose delivery id is the
// request's webhook-id, as the Worker requires, signed for the subscriber
// when subSigner is set.
func deliverBody(d *Deliver, subSigner *signature.Signer, id string, event []byte, now time.Time) ([]byte, error) {
	headers := map[string]string{"content-type": "application/json"}
	if subSigner != nil {
		h := http.Header{}
		subSigner.Set(h, id, now, event)
		for _, k := range []string{signature.HeaderID, signature.HeaderTimestamp, signature.HeaderSignature} {
			headers[k] = h.Get(k)
		}
	}
	return json.Marshal(edgewire.DeliverRequest{DeliveryID: id, SubscriberID: d.SubscriberID, URL: d.To,
		Headers: headers, Body: string(event), Rate: d.Rate, TimeoutMS: edgewire.DefaultTimeoutMS})
}

// withID sets "id" in a JSON object body, so the body names the same event
// as its webhook-id; a body that is not an object goes as it is.
func withID(body []byte, id string) []byte {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil || obj == nil {
		return body
	}
	obj["id"], _ = json.Marshal(id)
	out, err := json.Marshal(obj)
	if err != nil {
		return body
	}
	return out
}
