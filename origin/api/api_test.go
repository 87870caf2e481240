package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/sluice-dev/sluice/origin/api"
	"github.com/sluice-dev/sluice/origin/breaker"
	"github.com/sluice-dev/sluice/origin/delivery"
	"github.com/sluice-dev/sluice/origin/egress"
	"github.com/sluice-dev/sluice/origin/ledger"
	"github.com/sluice-dev/sluice/origin/origintest"
	"github.com/sluice-dev/sluice/shared/event"
	"github.com/sluice-dev/sluice/shared/fakeclock"
)

const testToken = "test-token-0123456789"

// waitLimit bounds every wait for an asynchronous delivery.
const waitLimit = 10 * time.Second

// bundle is one real sluice origin: ledger file, running dispatcher, API.
type bundle struct {
	ledger *ledger.Ledger
	disp   *delivery.Dispatcher
	srv    *httptest.Server
	clock  *fakeclock.Clock // the API's: it stands still unless a test moves it
	cfg    api.Config
}

// setup builds a fresh bundle. opts adjust the API's config (egress policy,
// body limit) before the server starts.
func setup(t *testing.T, opts ...func(*api.Config)) *bundle {
	t.Helper()
	return setupWith(t, nil, opts...)
}

// setupWith is setup with the dispatcher's config changed by dopt.
func setupWith(t *testing.T, dopt func(*delivery.Config), opts ...func(*api.Config)) *bundle {
	t.Helper()
	clk := fakeclock.New(time.Now().Truncate(time.Millisecond))
	o := origintest.Start(t, testToken, origintest.Options{API: func(c *api.Config) {
		c.Now = clk.Now
		for _, o := range opts {
			o(c)
		}
	}, Delivery: dopt})
	srv := httptest.NewServer(o.API)
	t.Cleanup(srv.Close)
	return &bundle{ledger: o.Ledger, disp: o.Dispatcher, srv: srv, clock: clk, cfg: o.Config}
}

func denyPrivate(c *api.Config) { c.Egress = egress.Policy{AllowPrivate: false} }

// response is an API answer, read whole.
type response struct {
	status int
	header http.Header
	body   []byte
}

// call sends one request. hdr holds extra headers; an "Authorization" entry
// in it (even empty) replaces the default bearer token.
func (b *bundle) call(t *testing.T, method, path, body string, hdr map[string]string) response {
	t.Helper()
	req := origintest.NewRequest(t, method, b.srv.URL+path, testToken, body)
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := b.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: raw}
}

// do sends a request with the token, asserts the status and decodes the
// JSON answer into out (when out is not nil).
func (b *bundle) do(t *testing.T, method, path, body string, want int, out any) response {
	t.Helper()
	r := b.call(t, method, path, body, nil)
	if r.status != want {
		t.Fatalf("%s %s: status %d, want %d; body: %s", method, path, r.status, want, r.body)
	}
	if out != nil {
		if err := json.Unmarshal(r.body, out); err != nil {
			t.Fatalf("%s %s: decode %s: %v", method, path, r.body, err)
		}
	}
	return r
}

type rateJSON struct {
	PerSecond float64 `json:"per_second"`
	Burst     float64 `json:"burst"`
}

type subscriberJSON struct {
	ID                      string     `json:"id"`
	URL                     string     `json:"url"`
	EventTypes              []string   `json:"event_types"`
	Rate                    rateJSON   `json:"rate"`
	MaxAttempts             int        `json:"max_attempts"`
	TimeoutMS               int        `json:"timeout_ms"`
	Secret                  string     `json:"secret"`
	Paused                  bool       `json:"paused"`
	UpdatedAt               time.Time  `json:"updated_at"`
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
}

type attemptJSON struct {
	Number     int       `json:"number"`
	At         time.Time `json:"at"`
	Lane       string    `json:"lane"`
	StatusCode int       `json:"status_code"`
	Error      string    `json:"error"`
	DurationMS *int64    `json:"duration_ms"`
	Response   string    `json:"response"`
}

type deliveryJSON struct {
	ID           string        `json:"id"`
	EventID      string        `json:"event_id"`
	EventType    string        `json:"event_type"`
	SubscriberID string        `json:"subscriber_id"`
	Status       string        `json:"status"`
	AttemptCount int           `json:"attempt_count"`
	UpdatedAt    time.Time     `json:"updated_at"`
	NextAttempt  *time.Time    `json:"next_attempt_at"`
	LastError    string        `json:"last_error"`
	Attempts     []attemptJSON `json:"attempts"`
}

type eventJSON struct {
	ID         string          `json:"id"`
	Type       string          `json:"type"`
	Body       json.RawMessage `json:"body"`
	Deliveries []deliveryJSON  `json:"deliveries"`
}

type enqueuedJSON struct {
	ID         string `json:"id"`
	Deliveries int    `json:"deliveries"`
	Duplicate  bool   `json:"duplicate"`
}

type batchJSON struct {
	Accepted   int `json:"accepted"`
	Duplicates int `json:"duplicates"`
	Deliveries int `json:"deliveries"`
}

func (b *bundle) createSubscriber(t *testing.T, body string) subscriberJSON {
	t.Helper()
	var s subscriberJSON
	b.do(t, "POST", "/v1/subscribers", body, http.StatusCreated, &s)
	return s
}

func (b *bundle) postEvent(t *testing.T, body string, want int) enqueuedJSON {
	t.Helper()
	var e enqueuedJSON
	b.do(t, "POST", "/v1/events", body, want, &e)
	return e
}

func (b *bundle) event(t *testing.T, id string) eventJSON {
	t.Helper()
	var e eventJSON
	b.do(t, "GET", "/v1/events/"+id, "", http.StatusOK, &e)
	return e
}

func (b *bundle) delivery(t *testing.T, id string) deliveryJSON {
	t.Helper()
	var d deliveryJSON
	b.do(t, "GET", "/v1/deliveries/"+id, "", http.StatusOK, &d)
	return d
}

// deliveries walks every page of GET /v1/deliveries?query.
func (b *bundle) deliveries(t *testing.T, query string) []deliveryJSON {
	t.Helper()
	var all []deliveryJSON
	cursor := ""
	for page := 0; ; page++ {
		if page > 10_000 {
			t.Fatalf("GET /v1/deliveries?%s: more than 10000 pages", query)
		}
		path := "/v1/deliveries?limit=1000"
		if query != "" {
			path += "&" + query
		}
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		var p struct {
			Data       []deliveryJSON `json:"data"`
			NextCursor string         `json:"next_cursor"`
		}
		b.do(t, "GET", path, "", http.StatusOK, &p)
		all = append(all, p.Data...)
		if p.NextCursor == "" {
			return all
		}
		cursor = p.NextCursor
	}
}

// waitFor polls cond every few milliseconds until it holds, failing with
// what and cond's last explanation after waitLimit.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; last seen: %s", waitLimit, what, last)
		}
		<-tick.C
	}
}

// waitStatus waits until the delivery has the status and returns it.
func (b *bundle) waitStatus(t *testing.T, id, status string) deliveryJSON {
	t.Helper()
	var d deliveryJSON
	waitFor(t, "delivery "+id+" to be "+status, func() (bool, string) {
		d = b.delivery(t, id)
		return d.Status == status, fmt.Sprintf("status %q after %d attempts (%s)", d.Status, d.AttemptCount, d.LastError)
	})
	return d
}

// quiesce returns once the dispatcher has run a whole planning pass that
// started after every change made before the call, and gone idle.
func (b *bundle) quiesce(t *testing.T, subscriberIDs ...string) {
	t.Helper()
	// Twice: the first idle may belong to a pass that began before the
	// caller's change; the second pass begins after the first idle.
	for range 2 {
		idle := b.disp.Idle()
		b.disp.Notify(time.Now(), subscriberIDs...)
		select {
		case <-idle:
		case <-time.After(waitLimit):
			t.Fatalf("dispatcher did not go idle within %s", waitLimit)
		}
	}
}

// received is one request a receiver got.
type received struct {
	header http.Header
	body   []byte
}

// receiver is a subscriber endpoint that records what it gets.
type receiver struct {
	srv *httptest.Server
	got chan received

	mu     sync.Mutex
	status int
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	r := &receiver{got: make(chan received, 1024), status: http.StatusOK}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		select {
		case r.got <- received{header: req.Header.Clone(), body: body}:
		default: // a test that floods its receiver has already failed
		}
		r.mu.Lock()
		status := r.status
		r.mu.Unlock()
		w.WriteHeader(status)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) setStatus(code int) {
	r.mu.Lock()
	r.status = code
	r.mu.Unlock()
}

func (r *receiver) url() string { return r.srv.URL + "/hook" }

// next waits for the receiver's next request.
func (r *receiver) next(t *testing.T) received {
	t.Helper()
	select {
	case got := <-r.got:
		return got
	case <-time.After(waitLimit):
		t.Fatalf("receiver got nothing within %s", waitLimit)
		return received{}
	}
}

// none asserts the receiver has got nothing more so far.
func (r *receiver) none(t *testing.T) {
	t.Helper()
	select {
	case got := <-r.got:
		t.Fatalf("receiver got an unexpected request: webhook-id %q body %s", got.header.Get("webhook-id"), got.body)
	default:
	}
}

func verify(t *testing.T, secret string, got received) {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatalf("standardwebhooks.NewWebhook: %v", err)
	}
	if err := wh.Verify(got.body, got.header); err != nil {
		t.Errorf("public library rejects webhook-id %q: %v (webhook-signature %q)",
			got.header.Get("webhook-id"), err, got.header.Get("webhook-signature"))
	}
}

func TestHealthzNeedsNoToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.call(t, "GET", "/healthz", "", map[string]string{"Authorization": ""})
	if r.status != http.StatusOK {
		t.Fatalf("GET /healthz without token: status %d, want 200; body %s", r.status, r.body)
	}
	var body map[string]string
	if err := json.Unmarshal(r.body, &body); err != nil || body["status"] != "ok" {
		t.Errorf("GET /healthz body %s, want {\"status\":\"ok\"} (%v)", r.body, err)
	}
	if r := b.call(t, "HEAD", "/healthz", "", map[string]string{"Authorization": ""}); r.status != http.StatusOK || len(r.body) != 0 {
		t.Errorf("HEAD /healthz: status %d with %d body bytes, want 200 and none", r.status, len(r.body))
	}
}

// The bearer scheme's name is case-insensitive, as HTTP has it.
func TestBearerSchemeIgnoresCase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, scheme := range []string{"Bearer", "bearer", "BEARER"} {
		r := b.call(t, "GET", "/v1/subscribers", "", map[string]string{"Authorization": scheme + " " + testToken})
		if r.status != http.StatusOK {
			t.Errorf("%s scheme: status %d, want 200", scheme, r.status)
		}
	}
}

func TestSubscriberDefaults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t)
	s := b.createSubscriber(t, fmt.Sprintf(`{"url":%q}`, rcv.url()))

	if !regexp.MustCompile(`^sub_[0-9a-hjkmnp-tv-z]{26}$`).MatchString(s.ID) {
		t.Errorf("generated subscriber id %q, want sub_ and 26 Crockford base32 characters", s.ID)
	}
	if got, want := s.ID[:14], event.NewID("sub", b.clock.Now(), bytes.NewReader(make([]byte, 16)))[:14]; got != want {
		t.Errorf("subscriber id %q starts %q, want the API clock's time %q", s.ID, got, want)
	}
	if !strings.HasPrefix(s.Secret, "whsec_") {
		t.Errorf("generated secret %q lacks the whsec_ prefix", s.Secret)
	}
	if _, err := standardwebhooks.NewWebhook(s.Secret); err != nil {
		t.Errorf("generated secret is not a Standard Webhooks secret: %v", err)
	}
	if s.URL != rcv.url() || !slices.Equal(s.EventTypes, []string{"*"}) ||
		s.Rate != (rateJSON{PerSecond: 50, Burst: 100}) || s.MaxAttempts != 8 || s.TimeoutMS != 5000 || s.Paused {
		t.Errorf("defaults: got %+v, want url %s, types [*], rate 50/100, 8 attempts, 5000 ms, not paused", s, rcv.url())
	}

	var got subscriberJSON
	b.do(t, "GET", "/v1/subscribers/"+s.ID, "", http.StatusOK, &got)
	if got.ID != s.ID || got.Secret != s.Secret || got.URL != s.URL {
		t.Errorf("GET /v1/subscribers/%s = %+v, want what POST answered %+v", s.ID, got, s)
	}
	var list struct {
		Data []subscriberJSON `json:"data"`
	}
	b.do(t, "GET", "/v1/subscribers", "", http.StatusOK, &list)
	if len(list.Data) != 1 || list.Data[0].ID != s.ID {
		t.Errorf("GET /v1/subscribers = %+v, want just %s", list.Data, s.ID)
	}

	// A rate without a burst gets twice the rate, never more than a burst may be.
	for _, tc := range []struct{ rate, burst float64 }{{10, 20}, {0.2, 1}, {600_000, 1_000_000}} {
		got := b.createSubscriber(t, fmt.Sprintf(`{"url":%q,"rate":{"per_second":%v}}`, rcv.url(), tc.rate))
		if got.Rate != (rateJSON{PerSecond: tc.rate, Burst: tc.burst}) {
			t.Errorf("rate %v without a burst: got %+v, want burst %v", tc.rate, got.Rate, tc.burst)
		}
	}
}

func TestGeneratedEventID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t)
	b.createSubscriber(t, fmt.Sprintf(`{"id":"s1","url":%q}`, rcv.url()))

	// Odd spacing on purpose: every byte after the brace must reach the
	// receiver unchanged.
	body := "{ \"type\" : \"video.trending\",\n  \"data\": {\"views\": 1e3, \"tags\": [\"a\", \"é\"]} }"
	e := b.postEvent(t, body, http.StatusAccepted)
	if !regexp.MustCompile(`^evt_[0-9a-hjkmnp-tv-z]{26}$`).MatchString(e.ID) {
		t.Fatalf("generated event id %q, want evt_ and 26 Crockford base32 characters", e.ID)
	}
	if got, want := e.ID[:14], event.NewID("evt", b.clock.Now(), bytes.NewReader(make([]byte, 16)))[:14]; got != want {
		t.Errorf("event id %q starts %q, want the API clock's time %q", e.ID, got, want)
	}
	if e.Deliveries != 1 || e.Duplicate {
		t.Errorf("POST /v1/events = %+v, want 1 delivery, not a duplicate", e)
	}

	got := rcv.next(t)
	want := `{"id":"` + e.ID + `",` + body[1:]
	if string(got.body) != want {
		t.Errorf("receiver body:\n got %q\nwant %q", got.body, want)
	}
	if id := got.header.Get("webhook-id"); id != e.ID {
		t.Errorf("webhook-id %q, want %q", id, e.ID)
	}
	// The API shows the stored body re-encoded (compacted) inside its
	// answer; what it holds must still be the same JSON.
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(want)); err != nil {
		t.Fatal(err)
	}
	stored := b.event(t, e.ID)
	if string(stored.Body) != compact.String() || stored.Type != "video.trending" {
		t.Errorf("GET /v1/events/%s: type %q body %s, want video.trending and %s", e.ID, stored.Type, stored.Body, compact.String())
	}
}

func TestIdempotentEnqueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t)
	// Paused: this test is about the ledger, not about sending.
	b.createSubscriber(t, fmt.Sprintf(`{"id":"a","url":%q,"paused":true}`, rcv.url()))
	b.createSubscriber(t, fmt.Sprintf(`{"id":"b","url":%q,"paused":true}`, rcv.url()))

	first := b.postEvent(t, `{"id":"e1","type":"order.created"}`, http.StatusAccepted)
	if first != (enqueuedJSON{ID: "e1", Deliveries: 2}) {
		t.Errorf("first POST = %+v, want {e1 2 false}", first)
	}
	// Same id, different body: still a duplicate, nothing new, and the
	// answer says so: deliveries counts what this call enqueued, as the
	// batch route's does.
	again := b.postEvent(t, `{"id":"e1","type":"order.created","n":2}`, http.StatusOK)
	if again != (enqueuedJSON{ID: "e1", Deliveries: 0, Duplicate: true}) {
		t.Errorf("second POST = %+v, want {e1 0 true}", again)
	}
	for _, sub := range []string{"a", "b"} {
		if ds := b.deliveries(t, "subscriber_id="+sub); len(ds) != 1 || ds[0].EventID != "e1" {
			t.Errorf("deliveries of %s after a duplicate POST: %+v, want exactly one for e1", sub, ds)
		}
	}
	if e := b.event(t, "e1"); string(e.Body) != `{"id":"e1","type":"order.created"}` {
		t.Errorf("the duplicate replaced the stored body: %s", e.Body)
	}

	// e2 twice inside the batch, e1 already stored, one without an id.
	var res batchJSON
	b.do(t, "POST", "/v1/events/batch", `{"events":[
		{"id":"e2","type":"order.created"},
		{"id":"e3","type":"order.created"},
		{"id":"e2","type":"order.created"},
		{"id":"e1","type":"order.created"},
		{"type":"order.created"}
	]}`, http.StatusAccepted, &res)
	if res != (batchJSON{Accepted: 3, Duplicates: 2, Deliveries: 6}) {
		t.Errorf("batch = %+v, want accepted 3, duplicates 2, deliveries 6", res)
	}
	for _, id := range []string{"e1", "e2", "e3"} {
		if e := b.event(t, id); len(e.Deliveries) != 2 {
			t.Errorf("event %s has %d deliveries, want 2", id, len(e.Deliveries))
		}
	}
	if all := b.deliveries(t, ""); len(all) != 8 {
		t.Errorf("%d deliveries in all, want 8 (4 events × 2 subscribers)", len(all))
	}

	// The same batch again is all duplicates.
	b.do(t, "POST", "/v1/events/batch", `{"events":[{"id":"e2","type":"order.created"},{"id":"e3","type":"order.created"}]}`,
		http.StatusAccepted, &res)
	if res != (batchJSON{Accepted: 0, Duplicates: 2, Deliveries: 0}) {
		t.Errorf("repeated batch = %+v, want accepted 0, duplicates 2, deliveries 0", res)
	}
}

// --max-body limits each event of a batch, not the batch: twenty events
// just under a 1 KiB limit go in together. The whole body has its own
// bound, 16 MiB here.
func TestBatchLimitsEachEventNotTheWhole(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *api.Config) { c.MaxBody = 1024 })
	events := make([]string, 20)
	for i := range events {
		events[i] = fmt.Sprintf(`{"id":"big-%02d","type":"t.x","pad":%q}`, i, strings.Repeat("x", 900))
	}
	var res batchJSON
	b.do(t, "POST", "/v1/events/batch", `{"events":[`+strings.Join(events, ",")+`]}`, http.StatusAccepted, &res)
	if res.Accepted != 20 {
		t.Errorf("batch = %+v, want 20 accepted", res)
	}

	// Whitespace around one small event: just under 16 MiB goes in, 17 MiB
	// does not.
	nearly := `{"events":[{"id":"nearly","type":"t.x"}` + strings.Repeat(" ", 16<<20-64) + `]}`
	b.do(t, "POST", "/v1/events/batch", nearly, http.StatusAccepted, &res)
	if res.Accepted != 1 {
		t.Errorf("a batch just under 16 MiB = %+v, want 1 accepted", res)
	}
	huge := `{"events":[{"id":"huge","type":"t.x"}` + strings.Repeat(" ", 17<<20) + `]}`
	r := b.call(t, "POST", "/v1/events/batch", huge, nil)
	if r.status != http.StatusRequestEntityTooLarge || !strings.Contains(string(r.body), "too_large") {
		t.Errorf("a 17 MiB batch: %d %s, want 413 too_large", r.status, r.body)
	}
	if got := b.call(t, "GET", "/v1/events/huge", "", nil); got.status != http.StatusNotFound {
		t.Errorf("the refused batch stored its event: GET answered %d", got.status)
	}
}

// --max-body is the largest event: a small one does not refuse a
// subscriber whose many event types make a larger body.
func TestMaxBodyLeavesSubscribersAlone(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *api.Config) { c.MaxBody = 1024 })
	types := make([]string, 80)
	for i := range types {
		types[i] = fmt.Sprintf("%q", fmt.Sprintf("video.kind_%02d", i))
	}
	body := `{"id":"many","url":"http://127.0.0.1:9/hook","event_types":[` + strings.Join(types, ",") + `]}`
	if len(body) <= 1024 {
		t.Fatalf("the body is %d bytes, not above the limit", len(body))
	}
	b.createSubscriber(t, body)
	b.do(t, "PATCH", "/v1/subscribers/many", `{"event_types":[`+strings.Join(types[1:], ",")+`],"max_attempts":3}`, http.StatusOK, nil)
}

func TestFanOutByEventType(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t)
	for id, types := range map[string]string{
		"exact":    `["video.trending"]`,
		"all":      `["*"]`,
		"prefix":   `["video.*"]`,
		"invoices": `["invoice.paid"]`,
	} {
		b.createSubscriber(t, fmt.Sprintf(`{"id":%q,"url":%q,"event_types":%s,"paused":true}`, id, rcv.url(), types))
	}

	cases := []struct {
		id, typ string
		subs    []string
	}{
		{"v1", "video.trending", []string{"all", "exact", "prefix"}},
		{"v2", "video.uploaded", []string{"all", "prefix"}},
		{"i1", "invoice.paid", []string{"all", "invoices"}},
		{"o1", "videos.trending", []string{"all"}},
	}
	for _, c := range cases {
		e := b.postEvent(t, fmt.Sprintf(`{"id":%q,"type":%q}`, c.id, c.typ), http.StatusAccepted)
		if e.Deliveries != len(c.subs) {
			t.Errorf("%s: POST answered %d deliveries, want %d", c.typ, e.Deliveries, len(c.subs))
		}
		stored := b.event(t, c.id)
		var got []string
		for _, d := range stored.Deliveries {
			got = append(got, d.SubscriberID)
			if d.EventID != c.id || d.EventType != c.typ || d.Status != "pending" {
				t.Errorf("%s: delivery %+v, want event %s of type %s, pending", c.typ, d, c.id, c.typ)
			}
		}
		sort.Strings(got)
		if !slices.Equal(got, c.subs) {
			t.Errorf("%s: deliveries go to %v, want %v", c.typ, got, c.subs)
		}
	}
}

func TestDeliveryEndToEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t)
	other := newReceiver(t)
	b.createSubscriber(t, fmt.Sprintf(`{"id":"s1","url":%q}`, rcv.url()))
	b.createSubscriber(t, fmt.Sprintf(`{"id":"s2","url":%q}`, other.url()))

	e := b.postEvent(t, `{"id":"evt-1","type":"video.trending"}`, http.StatusAccepted)
	if e.Deliveries != 2 {
		t.Fatalf("POST /v1/events = %+v, want 2 deliveries", e)
	}
	rcv.next(t)
	other.next(t)

	var sent []deliveryJSON
	waitFor(t, "s1's delivery to be listed as sent", func() (bool, string) {
		sent = b.deliveries(t, "subscriber_id=s1&status=sent")
		return len(sent) == 1, fmt.Sprintf("%+v", sent)
	})
	d := sent[0]
	if d.EventID != "evt-1" || d.SubscriberID != "s1" || d.Status != "sent" || d.AttemptCount != 1 {
		t.Errorf("listed delivery %+v, want evt-1 to s1, sent after 1 attempt", d)
	}
	if ds := b.deliveries(t, "subscriber_id=s1&status=pending"); len(ds) != 0 {
		t.Errorf("s1 still has pending deliveries: %+v", ds)
	}

	full := b.delivery(t, d.ID)
	if len(full.Attempts) != 1 {
		t.Fatalf("GET /v1/deliveries/%s: attempts %+v, want exactly one", d.ID, full.Attempts)
	}
	a := full.Attempts[0]
	if a.Number != 1 || a.Lane != "origin" || a.StatusCode != 200 || a.Error != "" {
		t.Errorf("attempt %+v, want number 1, lane origin, status 200, no error", a)
	}
	if a.DurationMS == nil || *a.DurationMS < 0 {
		t.Errorf("attempt duration_ms = %v, want a number ≥ 0", a.DurationMS)
	}
	if a.At.IsZero() || time.Since(a.At) > time.Minute {
		t.Errorf("attempt at %v, want about now", a.At)
	}

	// A sent delivery cannot be retried.
	r := b.call(t, "POST", "/v1/deliveries/"+d.ID+"/retry", "", nil)
	if r.status != http.StatusConflict {
		t.Errorf("retry of a sent delivery: status %d, want 409; body %s", r.status, r.body)
	}
}

func TestDeliveriesPagination(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t)
	b.createSubscriber(t, fmt.Sprintf(`{"id":"s1","url":%q,"paused":true}`, rcv.url()))
	b.createSubscriber(t, fmt.Sprintf(`{"id":"s2","url":%q,"paused":true}`, rcv.url()))
	const n = 7
	var events []string
	for i := range n {
		events = append(events, fmt.Sprintf(`{"id":"e%d","type":"t.x"}`, i))
	}
	var res batchJSON
	b.do(t, "POST", "/v1/events/batch", `{"events":[`+strings.Join(events, ",")+`]}`, http.StatusAccepted, &res)
	if res != (batchJSON{Accepted: n, Deliveries: 2 * n}) {
		t.Fatalf("batch = %+v, want %d accepted, %d deliveries", res, n, 2*n)
	}

	seen := map[string]bool{}
	var order []string
	cursor := ""
	for page := 1; ; page++ {
		if page > n+1 {
			t.Fatalf("more than %d pages of one delivery for %d deliveries", n+1, n)
		}
		path := "/v1/deliveries?subscriber_id=s1&limit=1"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		r := b.do(t, "GET", path, "", http.StatusOK, nil)
		var p struct {
			Data       []deliveryJSON   `json:"data"`
			NextCursor *json.RawMessage `json:"next_cursor"`
		}
		if err := json.Unmarshal(r.body, &p); err != nil {
			t.Fatalf("page %d: %v", page, err)
		}
		if len(p.Data) != 1 {
			t.Fatalf("page %d: %d deliveries, want 1: %s", page, len(p.Data), r.body)
		}
		d := p.Data[0]
		if d.SubscriberID != "s1" {
			t.Errorf("page %d: delivery of %s in a list filtered to s1", page, d.SubscriberID)
		}
		if seen[d.ID] {
			t.Fatalf("page %d repeats %s", page, d.ID)
		}
		seen[d.ID] = true
		order = append(order, d.EventID)
		if page == n {
			if p.NextCursor != nil {
				t.Errorf("last page has next_cursor %s, want none: %s", *p.NextCursor, r.body)
			}
			break
		}
		if p.NextCursor == nil {
			t.Fatalf("page %d of %d has no next_cursor", page, n)
		}
		if err := json.Unmarshal(*p.NextCursor, &cursor); err != nil || cursor == "" {
			t.Fatalf("page %d: next_cursor %s is not a non-empty string", page, *p.NextCursor)
		}
	}
	want := []string{"e6", "e5", "e4", "e3", "e2", "e1", "e0"}
	if !slices.Equal(order, want) {
		t.Errorf("pages walked events %v, want newest first %v", order, want)
	}

	// A limit larger than what is left answers everything, without a cursor.
	r := b.do(t, "GET", "/v1/deliveries?limit=50", "", http.StatusOK, nil)
	var all map[string]json.RawMessage
	if err := json.Unmarshal(r.body, &all); err != nil {
		t.Fatal(err)
	}
	if _, ok := all["next_cursor"]; ok {
		t.Errorf("single page answers next_cursor: %s", r.body)
	}
	var data []deliveryJSON
	json.Unmarshal(all["data"], &data)
	if len(data) != 2*n {
		t.Errorf("GET /v1/deliveries?limit=50: %d deliveries, want %d", len(data), 2*n)
	}
}

func TestSignatureVerifiedByPublicLibrary(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t)
	s := b.createSubscriber(t, fmt.Sprintf(`{"url":%q}`, rcv.url()))

	ids := []string{"sig-1", "sig-2", "sig-3"}
	for _, id := range ids {
		b.postEvent(t, fmt.Sprintf(`{"id":%q,"type":"video.trending","data":{"n":%q}}`, id, id), http.StatusAccepted)
	}
	var got []string
	for range ids {
		r := rcv.next(t)
		verify(t, s.Secret, r)
		h := r.header
		id := h.Get("webhook-id")
		got = append(got, id)
		if want := fmt.Sprintf(`{"id":%q,"type":"video.trending","data":{"n":%q}}`, id, id); string(r.body) != want {
			t.Errorf("body for %s: %s, want %s", id, r.body, want)
		}
		if ua := h.Get("User-Agent"); !strings.HasPrefix(ua, "sluice/") {
			t.Errorf("user-agent %q, want sluice/<version>", ua)
		}
		if ct := h.Get("Content-Type"); ct != "application/json" {
			t.Errorf("content-type %q, want application/json", ct)
		}
		if sig := h.Get("webhook-signature"); strings.Count(sig, "v1,") != 1 || strings.Contains(sig, " ") {
			t.Errorf("webhook-signature %q, want a single v1 signature", sig)
		}
		if ts := h.Get("webhook-timestamp"); ts == "" {
			t.Errorf("no webhook-timestamp")
		}
		// A receiver holding another secret must reject it.
		wrong, _ := standardwebhooks.NewWebhook("whsec_" + strings.Repeat("A", 44))
		if err := wrong.Verify(r.body, h); err == nil {
			t.Errorf("a wrong secret verifies %s", id)
		}
	}
	sort.Strings(got)
	if !slices.Equal(got, ids) {
		t.Errorf("webhook-ids %v, want the event ids %v", got, ids)
	}
}

func TestSecretRotation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t)
	old := b.createSubscriber(t, fmt.Sprintf(`{"id":"s1","url":%q}`, rcv.url()))

	b.postEvent(t, `{"id":"before","type":"t.x"}`, http.StatusAccepted)
	first := rcv.next(t)
	if sig := first.header.Get("webhook-signature"); strings.Contains(sig, " ") {
		t.Errorf("before rotation webhook-signature %q has more than one signature", sig)
	}
	verify(t, old.Secret, first)

	var rotated subscriberJSON
	b.do(t, "POST", "/v1/subscribers/s1/rotate-secret", "", http.StatusOK, &rotated)
	if rotated.Secret == old.Secret || !strings.HasPrefix(rotated.Secret, "whsec_") {
		t.Fatalf("rotate-secret answered secret %q (old %q), want a new whsec_ secret", rotated.Secret, old.Secret)
	}
	if want := b.clock.Now().Add(24 * time.Hour); rotated.PreviousSecretExpiresAt == nil || !rotated.PreviousSecretExpiresAt.Equal(want) {
		t.Errorf("previous_secret_expires_at = %v, want %v (API clock + 24 h)", rotated.PreviousSecretExpiresAt, want)
	}
	var stored subscriberJSON
	b.do(t, "GET", "/v1/subscribers/s1", "", http.StatusOK, &stored)
	if stored.Secret != rotated.Secret {
		t.Errorf("GET after rotation shows secret %q, want %q", stored.Secret, rotated.Secret)
	}

	b.postEvent(t, `{"id":"after","type":"t.x"}`, http.StatusAccepted)
	got := rcv.next(t)
	if id := got.header.Get("webhook-id"); id != "after" {
		t.Fatalf("receiver got %q, want the event posted after the rotation", id)
	}
	sigs := strings.Split(got.header.Get("webhook-signature"), " ")
	if len(sigs) != 2 || !strings.HasPrefix(sigs[0], "v1,") || !strings.HasPrefix(sigs[1], "v1,") || sigs[0] == sigs[1] {
		t.Errorf("webhook-signature %q, want two different space-separated v1 signatures", got.header.Get("webhook-signature"))
	}
	verify(t, old.Secret, got)
	verify(t, rotated.Secret, got)

	// A second rotation, to a secret the client gives, leaves both earlier
	// secrets signing out their own grace periods.
	given := "whsec_" + base64.StdEncoding.EncodeToString([]byte("a secret the client chose, 32 b."))
	b.clock.Advance(time.Hour)
	var again subscriberJSON
	b.do(t, "POST", "/v1/subscribers/s1/rotate-secret", `{"secret":"`+given+`"}`, http.StatusOK, &again)
	if again.Secret != given {
		t.Fatalf("rotate-secret with a secret answered %q, want the given %q", again.Secret, given)
	}
	if want := b.clock.Now().Add(24 * time.Hour); again.PreviousSecretExpiresAt == nil || !again.PreviousSecretExpiresAt.Equal(want) {
		t.Errorf("previous_secret_expires_at = %v, want the last rotation's end %v", again.PreviousSecretExpiresAt, want)
	}
	b.postEvent(t, `{"id":"twice","type":"t.x"}`, http.StatusAccepted)
	got = rcv.next(t)
	if n := len(strings.Fields(got.header.Get("webhook-signature"))); n != 3 {
		t.Errorf("webhook-signature %q after two rotations, want three signatures", got.header.Get("webhook-signature"))
	}
	for _, secret := range []string{old.Secret, rotated.Secret, given} {
		verify(t, secret, got)
	}
}

func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t)
	b.createSubscriber(t, fmt.Sprintf(`{"id":"s1","url":%q}`, rcv.url()))

	var s subscriberJSON
	b.do(t, "PATCH", "/v1/subscribers/s1", `{"paused":true}`, http.StatusOK, &s)
	if !s.Paused {
		t.Fatalf("PATCH paused:true answered %+v", s)
	}
	e := b.postEvent(t, `{"id":"held","type":"t.x"}`, http.StatusAccepted)
	if e.Deliveries != 1 {
		t.Fatalf("a paused subscriber still gets deliveries enqueued: %+v", e)
	}
	b.quiesce(t, "s1")
	held := b.event(t, "held")
	if len(held.Deliveries) != 1 || held.Deliveries[0].Status != "pending" || held.Deliveries[0].AttemptCount != 0 {
		t.Fatalf("while paused, deliveries are %+v, want one pending with no attempt", held.Deliveries)
	}
	rcv.none(t)

	b.do(t, "PATCH", "/v1/subscribers/s1", `{"paused":false}`, http.StatusOK, &s)
	if s.Paused {
		t.Fatalf("PATCH paused:false answered %+v", s)
	}
	got := rcv.next(t)
	if id := got.header.Get("webhook-id"); id != "held" {
		t.Errorf("after resume the receiver got %q, want held", id)
	}
	b.waitStatus(t, held.Deliveries[0].ID, "sent")

	// Other fields change too, and the change is validated and stored.
	b.do(t, "PATCH", "/v1/subscribers/s1", `{"event_types":["video.*"],"rate":{"per_second":5,"burst":7},"max_attempts":3,"timeout_ms":250}`,
		http.StatusOK, &s)
	b.do(t, "GET", "/v1/subscribers/s1", "", http.StatusOK, &s)
	if !slices.Equal(s.EventTypes, []string{"video.*"}) || s.Rate != (rateJSON{5, 7}) || s.MaxAttempts != 3 || s.TimeoutMS != 250 {
		t.Errorf("after PATCH the subscriber is %+v", s)
	}
	if e := b.postEvent(t, `{"id":"skip","type":"t.x"}`, http.StatusAccepted); e.Deliveries != 0 {
		t.Errorf("after narrowing event_types, t.x still fans out to s1: %+v", e)
	}

	// A PATCH that changes nothing writes nothing: updated_at stays.
	b.clock.Advance(time.Minute)
	for _, same := range []string{`{}`, `{"paused":false,"max_attempts":3}`} {
		var again subscriberJSON
		b.do(t, "PATCH", "/v1/subscribers/s1", same, http.StatusOK, &again)
		if !again.UpdatedAt.Equal(s.UpdatedAt) {
			t.Errorf("PATCH %s moved updated_at from %v to %v", same, s.UpdatedAt, again.UpdatedAt)
		}
	}
}

func TestPatchAndDeleteUnknownAndDeleted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t)
	b.createSubscriber(t, fmt.Sprintf(`{"id":"s1","url":%q}`, rcv.url()))

	assertError(t, b.call(t, "PATCH", "/v1/subscribers/ghost", `{"paused":true}`, nil), http.StatusNotFound)
	assertError(t, b.call(t, "POST", "/v1/subscribers/ghost/rotate-secret", "", nil), http.StatusNotFound)

	r := b.call(t, "DELETE", "/v1/subscribers/s1", "", nil)
	if r.status != http.StatusNoContent || len(r.body) != 0 {
		t.Fatalf("DELETE: status %d body %q, want 204 and no body", r.status, r.body)
	}
	assertError(t, b.call(t, "GET", "/v1/subscribers/s1", "", nil), http.StatusNotFound)
	assertError(t, b.call(t, "DELETE", "/v1/subscribers/s1", "", nil), http.StatusNotFound)
	assertError(t, b.call(t, "PATCH", "/v1/subscribers/s1", `{"paused":false}`, nil), http.StatusNotFound)
	if e := b.postEvent(t, `{"id":"gone","type":"t.x"}`, http.StatusAccepted); e.Deliveries != 0 {
		t.Errorf("an event fans out to a deleted subscriber: %+v", e)
	}
	// The id is free again.
	b.createSubscriber(t, fmt.Sprintf(`{"id":"s1","url":%q}`, rcv.url()))
}

// PATCHes of different fields at the same time each keep their change, and
// the dispatcher ends on the ledger's version, not on whichever answered last.
func TestConcurrentPatchesKeepEveryChange(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t)
	for round := range 20 {
		id := fmt.Sprintf("s%d", round)
		b.createSubscriber(t, fmt.Sprintf(`{"id":%q,"url":%q}`, id, rcv.url()))
		var wg sync.WaitGroup
		for _, patch := range []string{`{"paused":true}`, `{"rate":{"per_second":7,"burst":9}}`, `{"max_attempts":3}`, `{"timeout_ms":1234}`} {
			wg.Go(func() { b.do(t, "PATCH", "/v1/subscribers/"+id, patch, http.StatusOK, nil) })
		}
		wg.Wait()
		var got subscriberJSON
		b.do(t, "GET", "/v1/subscribers/"+id, "", http.StatusOK, &got)
		if !got.Paused || got.Rate.PerSecond != 7 || got.Rate.Burst != 9 || got.MaxAttempts != 3 || got.TimeoutMS != 1234 {
			t.Fatalf("round %d: after four concurrent PATCHes the subscriber is %+v, want every change", round, got)
		}
		snap := b.disp.Snapshot()[id]
		if !snap.Paused || snap.Rate.PerSecond != 7 || snap.Rate.Burst != 9 {
			t.Fatalf("round %d: the dispatcher holds paused=%v rate=%+v, the ledger paused and 7/9", round, snap.Paused, snap.Rate)
		}
	}
}

func TestRetryAndRecoverDeadDeliveries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t)
	rcv.setStatus(http.StatusInternalServerError)
	b.createSubscriber(t, fmt.Sprintf(`{"id":"s1","url":%q,"max_attempts":1}`, rcv.url()))

	since := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	b.postEvent(t, `{"id":"d1","type":"t.x"}`, http.StatusAccepted)
	b.postEvent(t, `{"id":"d2","type":"t.x"}`, http.StatusAccepted)
	id1 := b.event(t, "d1").Deliveries[0].ID
	id2 := b.event(t, "d2").Deliveries[0].ID
	dead := b.waitStatus(t, id1, "dead")
	b.waitStatus(t, id2, "dead")
	if len(dead.Attempts) != 1 || dead.Attempts[0].StatusCode != 500 || dead.AttemptCount != 1 {
		t.Fatalf("dead delivery %+v, want one attempt answered 500", dead)
	}
	if ds := b.deliveries(t, "status=dead&subscriber_id=s1"); len(ds) != 2 {
		t.Errorf("status=dead lists %d deliveries, want 2", len(ds))
	}

	rcv.setStatus(http.StatusOK)
	var requeued deliveryJSON
	b.do(t, "POST", "/v1/deliveries/"+id1+"/retry", "", http.StatusOK, &requeued)
	// attempt_count keeps counting attempts made; the fresh budget shows
	// in the next attempt being made at all (max_attempts is 1).
	if requeued.ID != id1 || requeued.Status != "pending" || requeued.AttemptCount != 1 {
		t.Errorf("retry answered %+v, want %s pending, 1 attempt made so far", requeued, id1)
	}
	sent := b.waitStatus(t, id1, "sent")
	// The history keeps the failure and the retry's success.
	if len(sent.Attempts) != 2 || sent.Attempts[0].Number != 1 || sent.Attempts[0].StatusCode != 500 ||
		sent.Attempts[1].Number != 2 || sent.Attempts[1].StatusCode != 200 || sent.AttemptCount != 2 {
		t.Errorf("after retry, %s has attempts %+v, want the 500 then the 200", id1, sent.Attempts)
	}

	var rec map[string]int
	b.do(t, "POST", "/v1/subscribers/s1/recover", fmt.Sprintf(`{"since":%q}`, since), http.StatusOK, &rec)
	if rec["requeued"] != 1 {
		t.Errorf("recover answered %v, want requeued 1 (only d2 is still dead)", rec)
	}
	b.waitStatus(t, id2, "sent")

	// Nothing dead is left.
	b.do(t, "POST", "/v1/subscribers/s1/recover", fmt.Sprintf(`{"since":%q}`, since), http.StatusOK, &rec)
	if rec["requeued"] != 0 {
		t.Errorf("second recover answered %v, want requeued 0", rec)
	}
}

// An operator's retry, or recover, after fixing an endpoint goes now: the
// breaker's cooldown is sluice's guess at when the subscriber is back, and
// the retry is its probe. A new URL starts without the old one's failures.
func TestARetryProbesAnOpenBreakerNow(t *testing.T) {
	t.Parallel()
	b := setupWith(t, func(c *delivery.Config) { c.Breaker = breaker.Settings{Threshold: 1, Cooldown: time.Hour} })
	rcv := newReceiver(t)
	rcv.setStatus(http.StatusInternalServerError)
	b.createSubscriber(t, fmt.Sprintf(`{"id":"s1","url":%q,"max_attempts":1}`, rcv.url()))
	breakerOf := func() string {
		var s struct {
			Breaker struct {
				State string `json:"state"`
			} `json:"breaker"`
		}
		b.do(t, "GET", "/v1/subscribers/s1", "", http.StatusOK, &s)
		return s.Breaker.State
	}

	b.postEvent(t, `{"id":"d1","type":"t.x"}`, http.StatusAccepted)
	id1 := b.event(t, "d1").Deliveries[0].ID
	b.waitStatus(t, id1, "dead")
	if st := breakerOf(); st != "open" {
		t.Fatalf("breaker %q after the failure, want open for an hour", st)
	}
	rcv.setStatus(http.StatusOK)
	b.do(t, "POST", "/v1/deliveries/"+id1+"/retry", "", http.StatusOK, nil)
	b.waitStatus(t, id1, "sent")
	if st := breakerOf(); st != "closed" {
		t.Errorf("breaker %q after the retry's probe succeeded, want closed", st)
	}

	since := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	rcv.setStatus(http.StatusInternalServerError)
	b.postEvent(t, `{"id":"d2","type":"t.x"}`, http.StatusAccepted)
	id2 := b.event(t, "d2").Deliveries[0].ID
	b.waitStatus(t, id2, "dead")
	rcv.setStatus(http.StatusOK)
	b.do(t, "POST", "/v1/subscribers/s1/recover", fmt.Sprintf(`{"since":%q}`, since), http.StatusOK, nil)
	b.waitStatus(t, id2, "sent")

	rcv.setStatus(http.StatusInternalServerError)
	b.postEvent(t, `{"id":"d3","type":"t.x"}`, http.StatusAccepted)
	b.waitStatus(t, b.event(t, "d3").Deliveries[0].ID, "dead")
	if st := breakerOf(); st != "open" {
		t.Fatalf("breaker %q after the third failure, want open", st)
	}
	moved := newReceiver(t)
	b.do(t, "PATCH", "/v1/subscribers/s1", fmt.Sprintf(`{"url":%q}`, moved.url()), http.StatusOK, nil)
	if st := breakerOf(); st != "closed" {
		t.Errorf("breaker %q after the URL changed, want closed", st)
	}
	b.postEvent(t, `{"id":"d4","type":"t.x"}`, http.StatusAccepted)
	b.waitStatus(t, b.event(t, "d4").Deliveries[0].ID, "sent")
}

// A subscriber of a server without an edge lane reads its default rate as
// the contract gives it, {"per_second": 50, "burst": 100}; edge_share shows
// where it can matter: with an edge lane, or set away from its default.
func TestEdgeShareShowsWhereItMatters(t *testing.T) {
	t.Parallel()
	rateOf := func(b *bundle, body string) string {
		var s struct {
			Rate json.RawMessage `json:"rate"`
		}
		b.do(t, "POST", "/v1/subscribers", body, http.StatusCreated, &s)
		return string(s.Rate)
	}
	plain := setup(t)
	if got := rateOf(plain, `{"url":"http://127.0.0.1:9/a"}`); got != `{"per_second":50,"burst":100}` {
		t.Errorf("default rate without an edge lane = %s", got)
	}
	if got := rateOf(plain, `{"url":"http://127.0.0.1:9/a","rate":{"per_second":10,"edge_share":0.25}}`); got != `{"per_second":10,"burst":20,"edge_share":0.25}` {
		t.Errorf("rate with edge_share 0.25 set, without an edge lane = %s", got)
	}
	edge := setup(t, func(c *api.Config) { c.EdgeLane = true })
	if got := rateOf(edge, `{"url":"http://127.0.0.1:9/a"}`); got != `{"per_second":50,"burst":100,"edge_share":0.5}` {
		t.Errorf("default rate with an edge lane = %s", got)
	}
}

// A body that stops arriving until the server's read timeout is a 408 in
// JSON, not a 400 blaming what the client sent.
func TestABodyThatStopsArrivingIs408(t *testing.T) {
	t.Parallel()
	o := origintest.Start(t, testToken, origintest.Options{})
	srv := httptest.NewUnstartedServer(o.API)
	srv.Config.ReadTimeout = 300 * time.Millisecond
	srv.Start()
	t.Cleanup(srv.Close)
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
		"Content-Length: 1000\r\n\r\n{\"type\":", testToken)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	code, _ := assertError(t, response{status: resp.StatusCode, header: resp.Header, body: raw}, http.StatusRequestTimeout)
	if code != "timeout" {
		t.Errorf("code %q, want timeout", code)
	}
}

// assertError checks that r is status with a JSON body of exactly
// {"error":{"code":"…","message":"…"}}, both non-empty, and returns them.
func assertError(t *testing.T, r response, status int) (code, message string) {
	t.Helper()
	if r.status != status {
		t.Errorf("status %d, want %d; body %s", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("content-type %q, want application/json", ct)
	}
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	var body struct {
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := dec.Decode(&body); err != nil {
		t.Errorf("error body %s is not {\"error\":{\"code\",\"message\"}}: %v", r.body, err)
		return "", ""
	}
	if body.Error == nil || body.Error.Code == "" || body.Error.Message == "" {
		t.Errorf("error body %s lacks a non-empty code and message", r.body)
		return "", ""
	}
	return body.Error.Code, body.Error.Message
}

// An id in a path may be percent-encoded, as encodeURIComponent and most
// HTTP libraries encode ":": it names the same resource.
func TestIDsInPathsMayBePercentEncoded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t)
	b.createSubscriber(t, `{"id":"crm:eu-1","url":"`+rc.url()+`"}`)
	b.postEvent(t, `{"id":"order:42","type":"t.a"}`, http.StatusAccepted)
	var s subscriberJSON
	b.do(t, "GET", "/v1/subscribers/crm%3Aeu-1", "", http.StatusOK, &s)
	if s.ID != "crm:eu-1" {
		t.Errorf("GET /v1/subscribers/crm%%3Aeu-1 answered subscriber %q", s.ID)
	}
	var e eventJSON
	b.do(t, "GET", "/v1/events/%6Frder%3A42", "", http.StatusOK, &e)
	if e.ID != "order:42" {
		t.Errorf("GET /v1/events/%%6Frder%%3A42 answered event %q", e.ID)
	}
	// An encoded slash is no separator: nothing is found, nothing else is routed.
	b.do(t, "GET", "/v1/subscribers/crm%2Feu-1", "", http.StatusNotFound, nil)
	b.do(t, "POST", "/v1/subscribers/crm:eu-1%2Frotate-secret", "", http.StatusMethodNotAllowed, nil) // one segment: no rotation
	b.do(t, "DELETE", "/v1%2Fsubscribers%2Fcrm:eu-1", "", http.StatusNotFound, nil)
	b.do(t, "PATCH", "/v1/subscribers/crm%3Aeu-1", `{"paused":true}`, http.StatusOK, nil)
	b.do(t, "DELETE", "/v1/subscribers/crm%3Aeu-1", "", http.StatusNoContent, nil)
}

// HEAD answers wherever GET does, with its status and headers and no body.
func TestHeadAnswersWhereGetDoes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createSubscriber(t, `{"id":"s1","url":"http://127.0.0.1:9/hook"}`)
	for _, path := range []string{"/v1/subscribers", "/v1/subscribers/s1", "/v1/stats", "/v1/deliveries", "/openapi.json"} {
		get := b.call(t, "GET", path, "", nil)
		head := b.call(t, "HEAD", path, "", nil)
		if head.status != get.status || len(head.body) != 0 || head.header.Get("Content-Type") != get.header.Get("Content-Type") {
			t.Errorf("HEAD %s: %d, %q, %d body bytes; GET answered %d, %q", path, head.status, head.header.Get("Content-Type"),
				len(head.body), get.status, get.header.Get("Content-Type"))
		}
	}
	if r := b.call(t, "HEAD", "/v1/subscribers/ghost", "", nil); r.status != http.StatusNotFound {
		t.Errorf("HEAD of a missing subscriber: %d, want 404", r.status)
	}
	if r := b.call(t, "HEAD", "/v1/events", "", nil); r.status != http.StatusMethodNotAllowed {
		t.Errorf("HEAD /v1/events (POST only): %d, want 405", r.status)
	}
}

// A PATCH may carry the id the subscriber already has, as a body built from
// a GET does; only another id is refused.
func TestPatchMayRepeatTheID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createSubscriber(t, `{"id":"same","url":"http://127.0.0.1:9/hook"}`)
	var s subscriberJSON
	b.do(t, "PATCH", "/v1/subscribers/same", `{"id":"same","timeout_ms":900}`, http.StatusOK, &s)
	if s.ID != "same" || s.TimeoutMS != 900 {
		t.Errorf("PATCH with its own id: %+v, want id same and timeout_ms 900", s)
	}
	b.do(t, "PATCH", "/v1/subscribers/same", `{"id":"other"}`, http.StatusBadRequest, nil)
}

// A PATCH that moves the rate without a burst gives it twice the new rate,
// as a create does, when the burst was never set: a subscriber moved from
// 50/s to 2/s keeps no burst of 100. One set on its own stays, even when it
// happens to be twice the rate.
func TestPatchedRateBringsItsBurst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createSubscriber(t, `{"id":"r","url":"http://127.0.0.1:9/hook"}`)
	var s subscriberJSON
	b.do(t, "PATCH", "/v1/subscribers/r", `{"rate":{"per_second":2}}`, http.StatusOK, &s)
	if s.Rate != (rateJSON{PerSecond: 2, Burst: 4}) {
		t.Errorf("after PATCH per_second 2: rate %+v, want 2/s with a burst of 4", s.Rate)
	}
	b.do(t, "PATCH", "/v1/subscribers/r", `{"rate":{"per_second":3,"burst":1}}`, http.StatusOK, &s)
	if s.Rate != (rateJSON{PerSecond: 3, Burst: 1}) {
		t.Errorf("after PATCH per_second 3, burst 1: rate %+v", s.Rate)
	}
	b.do(t, "PATCH", "/v1/subscribers/r", `{"rate":{"burst":7}}`, http.StatusOK, &s)
	if s.Rate != (rateJSON{PerSecond: 3, Burst: 7}) {
		t.Errorf("after PATCH burst 7: rate %+v, want the rate kept", s.Rate)
	}
	// A burst set on its own stays when only the rate moves.
	b.do(t, "PATCH", "/v1/subscribers/r", `{"rate":{"per_second":10}}`, http.StatusOK, &s)
	if s.Rate != (rateJSON{PerSecond: 10, Burst: 7}) {
		t.Errorf("after PATCH per_second 10 over a burst of 7 set on its own: rate %+v, want the burst kept", s.Rate)
	}
	// The rate a GET showed, sent back whole, changes nothing: the burst
	// still follows the rate.
	b.createSubscriber(t, `{"id":"echoed","url":"http://127.0.0.1:9/hook"}`)
	b.do(t, "PATCH", "/v1/subscribers/echoed", `{"rate":{"per_second":50,"burst":100,"edge_share":0.5},"max_attempts":3}`, http.StatusOK, nil)
	b.do(t, "PATCH", "/v1/subscribers/echoed", `{"rate":{"per_second":2}}`, http.StatusOK, &s)
	if s.Rate != (rateJSON{PerSecond: 2, Burst: 4}) {
		t.Errorf("after the GET's rate sent back, then PATCH per_second 2: rate %+v, want 2/s with a burst of 4", s.Rate)
	}
	// So does one sent back with only its edge_share changed, which applies.
	var share struct {
		Rate struct {
			EdgeShare float64 `json:"edge_share"`
		} `json:"rate"`
	}
	b.do(t, "PATCH", "/v1/subscribers/echoed", `{"rate":{"per_second":2,"burst":4,"edge_share":0.8}}`, http.StatusOK, &share)
	b.do(t, "PATCH", "/v1/subscribers/echoed", `{"rate":{"per_second":3}}`, http.StatusOK, &s)
	if s.Rate != (rateJSON{PerSecond: 3, Burst: 6}) || share.Rate.EdgeShare != 0.8 {
		t.Errorf("after the rate sent back with edge_share 0.8 (applied: %v), then PATCH per_second 3: rate %+v, want 3/s with a burst of 6",
			share.Rate.EdgeShare, s.Rate)
	}
	for _, c := range []struct{ create, patch string }{
		{`{"id":"given","url":"http://127.0.0.1:9/hook","rate":{"per_second":10,"burst":20}}`, ""},
		{`{"id":"patched","url":"http://127.0.0.1:9/hook"}`, `{"rate":{"burst":100}}`},
	} {
		var in subscriberJSON
		b.do(t, "POST", "/v1/subscribers", c.create, http.StatusCreated, &in)
		if c.patch != "" {
			b.do(t, "PATCH", "/v1/subscribers/"+in.ID, c.patch, http.StatusOK, &in)
		}
		b.do(t, "PATCH", "/v1/subscribers/"+in.ID, `{"rate":{"per_second":5}}`, http.StatusOK, &s)
		if s.Rate != (rateJSON{PerSecond: 5, Burst: in.Rate.Burst}) {
			t.Errorf("%s: a burst of %v set to twice the rate, then PATCH per_second 5: rate %+v, want the burst kept", in.ID, in.Rate.Burst, s.Rate)
		}
	}
}

// An operator's pause and resume leave a Retry-After pause where the
// subscriber put it: resuming a subscriber that answered 429 must not send
// it what it asked to wait for (that is how a partner bans a sender). So
// does a PATCH that carries "paused": false with other changes.
func TestResumeKeepsARetryAfterPause(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.Header().Set("Retry-After", "3600")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(srv.Close)
	b.createSubscriber(t, `{"id":"busy","url":"`+srv.URL+`/hook"}`)
	b.postEvent(t, `{"id":"first","type":"t.x"}`, http.StatusAccepted)
	var until any
	waitFor(t, "the Retry-After pause", func() (bool, string) {
		var s map[string]any
		b.do(t, "GET", "/v1/subscribers/busy", "", http.StatusOK, &s)
		until = s["paused_until"]
		return until != nil, fmt.Sprintf("subscriber %v", s)
	})
	b.postEvent(t, `{"id":"second","type":"t.x"}`, http.StatusAccepted)
	b.do(t, "PATCH", "/v1/subscribers/busy", `{"paused":true}`, http.StatusOK, nil)
	b.do(t, "PATCH", "/v1/subscribers/busy", `{"paused":false}`, http.StatusOK, nil)
	b.do(t, "PATCH", "/v1/subscribers/busy", `{"paused":false,"max_attempts":5}`, http.StatusOK, nil)

	var s map[string]any
	b.do(t, "GET", "/v1/subscribers/busy", "", http.StatusOK, &s)
	if s["paused_until"] != until {
		t.Errorf("after pause and resume the subscriber shows paused_until %v, want %v as its Retry-After set", s["paused_until"], until)
	}
	stored, err := b.ledger.Subscriber(context.Background(), "busy")
	if err != nil || stored.PausedUntil.IsZero() {
		t.Errorf("the ledger lost the Retry-After pause (%v): a resume let it go", err)
	}
	d := b.delivery(t, b.event(t, "second").Deliveries[0].ID)
	if want, _ := time.Parse(time.RFC3339Nano, until.(string)); d.NextAttempt == nil || d.NextAttempt.Before(want) {
		t.Errorf("the second delivery can go at %v, before the pause ends at %v", d.NextAttempt, want)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the subscriber got %d requests, want only the one it answered with Retry-After", n)
	}
}

// What a client sent comes back as sent: no HTML escaping of an event's
// body or a subscriber's URL, and an id in a 404 cut short.
func TestAnswersKeepTheClientsTextAndBoundIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t)
	sub := b.createSubscriber(t, fmt.Sprintf(`{"id":"a","url":%q,"paused":true}`, rcv.url()+"?q=1&r=<2>"))
	if !strings.HasSuffix(sub.URL, "?q=1&r=<2>") {
		t.Errorf("url read back as %q", sub.URL)
	}
	b.postEvent(t, `{"id":"h1","type":"t.x","html":"<a&b>"}`, http.StatusAccepted)
	r := b.do(t, "GET", "/v1/events/h1", "", http.StatusOK, nil)
	if !strings.Contains(string(r.body), `"html":"<a&b>"`) {
		t.Errorf("GET /v1/events/h1 = %s; want the body's <a&b> unescaped", r.body)
	}
	long := strings.Repeat("a", 5000)
	r = b.do(t, "GET", "/v1/events/"+long, "", http.StatusNotFound, nil)
	if len(r.body) > 300 || !strings.Contains(string(r.body), "not found") {
		t.Errorf("404 for a 5000-byte id: %d bytes, %.200s…; want a short not_found", len(r.body), r.body)
	}
}

// A delivery a Retry-After pause holds says when it can go, not the time,
// already past, at which it fell due; a retry makes it due, not free to go.
func TestAHeldDeliveryShowsWhenItCanGo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "120")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(busy.Close)
	b.createSubscriber(t, fmt.Sprintf(`{"id":"p","url":%q}`, busy.URL))
	b.postEvent(t, `{"id":"a","type":"t.x"}`, http.StatusAccepted)
	waitFor(t, "the 429 to be recorded", func() (bool, string) {
		d := b.event(t, "a").Deliveries[0]
		return d.AttemptCount == 1 && d.Status == "pending", d.Status
	})
	b.postEvent(t, `{"id":"b","type":"t.x"}`, http.StatusAccepted)
	type next struct {
		ID            string    `json:"id"`
		NextAttemptAt time.Time `json:"next_attempt_at"`
	}
	var ev struct{ Deliveries []next }
	b.do(t, "GET", "/v1/events/b", "", http.StatusOK, &ev)
	var one next
	b.do(t, "GET", "/v1/deliveries/"+ev.Deliveries[0].ID, "", http.StatusOK, &one)
	var list struct{ Data []next }
	b.do(t, "GET", "/v1/deliveries?status=pending&subscriber_id=p", "", http.StatusOK, &list)
	var retried next
	b.do(t, "POST", "/v1/deliveries/"+ev.Deliveries[0].ID+"/retry", "", http.StatusOK, &retried)
	soonest := time.Now().Add(100 * time.Second)
	for where, at := range map[string]time.Time{"the event": ev.Deliveries[0].NextAttemptAt, "the delivery": one.NextAttemptAt,
		"the retry's answer": retried.NextAttemptAt} {
		if at.Before(soonest) {
			t.Errorf("%s shows next_attempt_at %v; want the pause's end, about 120 s from now", where, at)
		}
	}
	for _, d := range list.Data {
		if d.NextAttemptAt.Before(soonest) {
			t.Errorf("the list shows %s next at %v; want the pause's end", d.ID, d.NextAttemptAt)
		}
	}
}

// since takes RFC 3339 as the RFC writes it, lower-case "t" and "z" and a
// space for the "T" included; anything else stays refused.
func TestParseTimeTakesRFC3339AsWritten(t *testing.T) {
	t.Parallel()
	want := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, s := range []string{"2020-01-02T03:04:05Z", "2020-01-02t03:04:05z", "2020-01-02 03:04:05Z", "2020-01-02T05:04:05+02:00",
		"2020-01-02t03:04:05.000z"} {
		if got, err := api.ParseTime(s); err != nil || !got.Equal(want) {
			t.Errorf("ParseTime(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "2020-01-02", "2020-01-02x03:04:05Z", "2020-01-02T03:04:05", "yesterday", "2020-01-02  03:04:05Z"} {
		if got, err := api.ParseTime(s); err == nil {
			t.Errorf("ParseTime(%q) = %v; want an error", s, got)
		}
	}
}

// A retry commits even when its caller has gone before the answer: the
// delivery, put back to run now, must still go, though the request failed
// reading it back.
func TestARetryWhoseCallerLeavesStillGoes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rcv := newReceiver(t)
	rcv.setStatus(http.StatusInternalServerError)
	b.createSubscriber(t, fmt.Sprintf(`{"id":"s1","url":%q,"max_attempts":1}`, rcv.url()))
	b.postEvent(t, `{"id":"d1","type":"t.x"}`, http.StatusAccepted)
	id := b.event(t, "d1").Deliveries[0].ID
	b.waitStatus(t, id, "dead")
	rcv.next(t)
	rcv.setStatus(http.StatusOK)
	b.quiesce(t)

	gone, cancel := context.WithCancel(context.Background())
	cancel() // the client hung up; the write, once submitted, commits anyway
	answered := 0
	for try := 0; b.delivery(t, id).Status == "dead"; try++ {
		if try == 200 {
			t.Fatal("the retry's write never went through")
		}
		req := origintest.NewRequest(t, "POST", "/v1/deliveries/"+id+"/retry", testToken, "").WithContext(gone)
		rec := httptest.NewRecorder()
		b.srv.Config.Handler.ServeHTTP(rec, req)
		answered = rec.Code
	}
	t.Logf("the committed retry answered %d", answered)
	b.waitStatus(t, id, "sent")
}
