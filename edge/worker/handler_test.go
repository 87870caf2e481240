package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/shared/bucket"
	"github.com/sluice-dev/sluice/shared/edgewire"
	"github.com/sluice-dev/sluice/shared/fakeclock"
	"github.com/sluice-dev/sluice/shared/signature"
)

const (
	edgeSecret       = "whsec_AQgPFh0kKzI5QEdOVVxjanF4f4aNlJuiqbC3vsXM09o="
	otherSecret      = "whsec_ZGtyeYCHjpWco6qxuL/GzdTb4unw9/4FDBMaISgvNj0="
	subscriberSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
)

// memBuckets is the Durable Objects' logic without the objects: one Stored
// per subscriber behind a mutex, on the fake clock.
type memBuckets struct {
	mu    sync.Mutex
	now   func() time.Time
	state map[string]*Stored
	calls int
	err   error
	then  func() // runs after each Take, as its answer comes back
}

func (b *memBuckets) Take(_ context.Context, id string, r bucket.Rate) (Grant, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.then != nil {
		defer b.then()
	}
	b.calls++
	if b.err != nil {
		return Grant{}, b.err
	}
	next, g := TakeToken(b.state[id], r, b.now())
	b.state[id] = &next
	return g, nil
}

func (b *memBuckets) Calls() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls
}

// received is one request a receiver got.
type received struct {
	header http.Header
	body   []byte
}

// receiver is a subscriber's endpoint: it records what it gets and answers
// with respond (204 when nil).
type receiver struct {
	*httptest.Server
	mu      sync.Mutex
	got     []received
	respond http.HandlerFunc
}

func (rc *receiver) Got() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.got...)
}

// syncBuffer collects log output written from the handler's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

type bundle struct {
	clock   *fakeclock.Clock
	buckets *memBuckets
	rcv     *receiver
	edge    *httptest.Server
	logs    *syncBuffer
}

// setup serves a Handler over real HTTP with in-memory buckets, a fake clock
// and one receiver; cfg tweaks the Config before the handler is built.
func setup(t *testing.T, cfg func(*Config)) *bundle {
	t.Helper()
	b := &bundle{clock: fakeclock.New(time.Unix(1_780_000_000, 0)), logs: &syncBuffer{}}
	b.buckets = &memBuckets{now: b.clock.Now, state: map[string]*Stored{}}
	b.rcv = &receiver{}
	b.rcv.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		b.rcv.mu.Lock()
		b.rcv.got = append(b.rcv.got, received{header: r.Header.Clone(), body: body})
		respond := b.rcv.respond
		b.rcv.mu.Unlock()
		if respond == nil {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		respond(w, r)
	}))
	t.Cleanup(b.rcv.Close)
	c := Config{
		Secrets: []string{edgeSecret},
		Buckets: b.buckets,
		Client: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}},
		Now:    b.clock.Now,
		Logger: slog.New(slog.NewJSONHandler(b.logs, nil)),
	}
	if cfg != nil {
		cfg(&c)
	}
	b.edge = httptest.NewServer(Handler(c))
	t.Cleanup(b.edge.Close)
	return b
}

// deliverRequest is a valid request for subscriber sub to the receiver, its
// headers signed with the subscriber's secret as the origin would.
func (b *bundle) deliverRequest(t *testing.T, id, sub string) edgewire.DeliverRequest {
	t.Helper()
	body := `{"type":"video.trending","id":"evt_` + id + `","title":"ünïcode \u2028 <b>"}`
	h := http.Header{}
	s, err := signature.NewSigner(subscriberSecret)
	if err != nil {
		t.Fatal(err)
	}
	s.Set(h, "evt_"+id, b.clock.Now(), []byte(body))
	return edgewire.DeliverRequest{
		DeliveryID:   id,
		SubscriberID: sub,
		URL:          b.rcv.URL + "/hooks/private-path",
		Headers: map[string]string{
			"webhook-id":        h.Get("webhook-id"),
			"webhook-timestamp": h.Get("webhook-timestamp"),
			"webhook-signature": h.Get("webhook-signature"),
			"content-type":      "application/json",
			"user-agent":        "sluice/test",
		},
		Body:      body,
		Rate:      bucket.Rate{PerSecond: 2, Burst: 1},
		TimeoutMS: 2000,
	}
}

// post signs body as the origin does (webhook-id = id) and sends it.
func (b *bundle) post(t *testing.T, id string, body []byte, secret string, at time.Time) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.edge.URL+edgewire.DeliverPath, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if secret != "" {
		s, err := signature.NewSigner(secret)
		if err != nil {
			t.Fatal(err)
		}
		s.Set(req.Header, id, at, body)
	}
	return do(t, req)
}

func (b *bundle) deliver(t *testing.T, dr edgewire.DeliverRequest) (int, []byte) {
	t.Helper()
	body, err := json.Marshal(dr)
	if err != nil {
		t.Fatal(err)
	}
	return b.post(t, dr.DeliveryID, body, edgeSecret, b.clock.Now())
}

func do(t *testing.T, req *http.Request) (int, []byte) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	return resp.StatusCode, body
}

func decode[T any](t *testing.T, body []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("answer %q: %v", body, err)
	}
	return v
}

func TestDeliverCallsTheSubscriberAndReports(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.rcv.respond = func(w http.ResponseWriter, r *http.Request) {
		b.clock.Advance(120 * time.Millisecond) // the subscriber takes 120ms
		w.WriteHeader(http.StatusOK)
	}
	dr := b.deliverRequest(t, "dlv_1", "sub_a")
	status, body := b.deliver(t, dr)
	if status != http.StatusOK {
		t.Fatalf("status %d, body %s", status, body)
	}
	if want := `{"status":200,"retry_after_s":null,"duration_ms":120,"error":""}` + "\n"; string(body) != want {
		t.Errorf("answer = %s, want %s", body, want)
	}

	got := b.rcv.Got()
	if len(got) != 1 {
		t.Fatalf("receiver got %d requests, want 1", len(got))
	}
	if string(got[0].body) != dr.Body {
		t.Errorf("receiver got body %q, want %q byte for byte", got[0].body, dr.Body)
	}
	for name, value := range dr.Headers {
		if g := got[0].header.Get(name); g != value {
			t.Errorf("receiver got %s: %q, want %q", name, g, value)
		}
	}
	// What arrives still verifies with the subscriber's secret.
	if err := signature.Verify(got[0].header, got[0].body, b.clock.Now(), subscriberSecret); err != nil {
		t.Errorf("subscriber cannot verify what the edge forwarded: %v", err)
	}
}

func TestRefusesWhatTheOriginDidNotSign(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	dr := b.deliverRequest(t, "dlv_1", "sub_a")
	good, err := json.Marshal(dr)
	if err != nil {
		t.Fatal(err)
	}
	now := b.clock.Now()
	tests := []struct {
		name   string
		id     string
		body   []byte
		secret string
		at     time.Time
		edit   func(http.Header)
		reason string
	}{
		{name: "unsigned", id: "dlv_1", body: good, reason: "unsigned"},
		{name: "other secret", id: "dlv_1", body: good, secret: otherSecret, at: now, reason: "bad_signature"},
		{name: "stale", id: "dlv_1", body: good, secret: edgeSecret, at: now.Add(-signature.Tolerance - time.Second), reason: "outside_window"},
		{name: "from the future", id: "dlv_1", body: good, secret: edgeSecret, at: now.Add(signature.Tolerance + time.Second), reason: "outside_window"},
		{name: "signature lifted onto another id", id: "dlv_1", body: good, secret: edgeSecret, at: now,
			edit: func(h http.Header) { h.Set("webhook-id", "dlv_2") }, reason: "bad_signature"},
		{name: "tampered body", id: "dlv_1", body: good, secret: edgeSecret, at: now,
			edit: func(h http.Header) {}, reason: "bad_signature"},
		{name: "timestamp not a number", id: "dlv_1", body: good, secret: edgeSecret, at: now,
			edit: func(h http.Header) { h.Set("webhook-timestamp", "soon") }, reason: "bad_headers"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, b.edge.URL+edgewire.DeliverPath, bytes.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if tc.secret != "" {
				s, _ := signature.NewSigner(tc.secret)
				s.Set(req.Header, tc.id, tc.at, tc.body)
			}
			if tc.edit != nil {
				tc.edit(req.Header)
			}
			if tc.name == "tampered body" {
				tampered := bytes.Replace(tc.body, []byte("private-path"), []byte("elsewhere-xx"), 1)
				req.Body = io.NopCloser(bytes.NewReader(tampered))
			}
			status, body := do(t, req)
			if status != http.StatusUnauthorized {
				t.Fatalf("status %d, body %s; want 401", status, body)
			}
			if e := decode[edgewire.Error](t, body); e.Error.Code != "unauthorized" {
				t.Errorf("error = %+v", e)
			}
			if !strings.Contains(b.logs.String(), `"reason":"`+tc.reason+`"`) {
				t.Errorf("no log line with reason %q in %s", tc.reason, b.logs.String())
			}
		})
	}
	if n := len(b.rcv.Got()); n != 0 {
		t.Errorf("the receiver got %d requests; an unsigned one must reach no one", n)
	}
	if n := b.buckets.Calls(); n != 0 {
		t.Errorf("%d bucket takes; an unsigned request must not spend tokens", n)
	}
}

func TestEmptyBucketDefers(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	if status, body := b.deliver(t, b.deliverRequest(t, "dlv_1", "sub_a")); status != http.StatusOK {
		t.Fatalf("first delivery: %d %s", status, body)
	}
	// Burst 1 at 2/s: the next token is 500ms away.
	status, body := b.deliver(t, b.deliverRequest(t, "dlv_2", "sub_a"))
	if status != http.StatusAccepted || string(body) != `{"deferred":true,"retry_in_ms":500}`+"\n" {
		t.Fatalf("second delivery: %d %s, want 202 deferred for 500ms", status, body)
	}
	// Another subscriber has its own bucket.
	if status, body := b.deliver(t, b.deliverRequest(t, "dlv_3", "sub_b")); status != http.StatusOK {
		t.Fatalf("other subscriber: %d %s", status, body)
	}
	b.clock.Advance(500 * time.Millisecond)
	if status, body := b.deliver(t, b.deliverRequest(t, "dlv_2", "sub_a")); status != http.StatusOK {
		t.Fatalf("after waiting retry_in_ms: %d %s", status, body)
	}
	if n := len(b.rcv.Got()); n != 3 {
		t.Errorf("receiver got %d requests, want 3 (a deferral sends nothing)", n)
	}
}

func TestReportsWhatTheSubscriberAnswered(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	future := b.clock.Now().Add(30 * time.Second).UTC().Format(http.TimeFormat)
	tests := []struct {
		name       string
		respond    http.HandlerFunc
		status     int
		retryAfter string // JSON
		response   string // the first bytes of the answer
	}{
		{"429 with delta-seconds", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusTooManyRequests)
		}, 429, "7", ""},
		{"503 with an HTTP date", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", future)
			w.WriteHeader(http.StatusServiceUnavailable)
		}, 503, "30", ""},
		{"500 without Retry-After", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusInternalServerError)
		}, 500, "null", ""},
		{"a redirect is an answer, not followed", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		}, 302, "null", ""},
		{"a large body is not waited for", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(bytes.Repeat([]byte("x"), 1<<20))
		}, 200, "null", strings.Repeat("x", edgewire.ResponseSnippet)},
		{"a refusal with its reason", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte("unknown event type"))
		}, 400, "null", "unknown event type"},
	}
	for i, tc := range tests {
		b.rcv.mu.Lock()
		b.rcv.respond = tc.respond
		b.rcv.mu.Unlock()
		id := "dlv_" + strconv.Itoa(i)
		dr := b.deliverRequest(t, id, "sub_"+strconv.Itoa(i))
		status, body := b.deliver(t, dr)
		want := `{"status":` + strconv.Itoa(tc.status) + `,"retry_after_s":` + tc.retryAfter + `,"duration_ms":0,"error":""`
		if tc.response != "" {
			want += `,"response":"` + tc.response + `"`
		}
		want += "}\n"
		if status != http.StatusOK || string(body) != want {
			t.Errorf("%s: %d %s, want 200 %s", tc.name, status, body, want)
		}
	}
	if n := len(b.rcv.Got()); n != len(tests) {
		t.Errorf("receiver got %d requests, want %d (no redirect followed)", n, len(tests))
	}
}

func TestTimeoutAndRefusedConnectionAreResults(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.rcv.respond = func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answers in time
	}
	dr := b.deliverRequest(t, "dlv_1", "sub_a")
	dr.TimeoutMS = 50
	status, body := b.deliver(t, dr)
	if res := decode[edgewire.Result](t, body); status != http.StatusOK || res.Status != 0 || res.Error != "timeout after 50ms" {
		t.Fatalf("slow subscriber: %d %s, want 200 with status 0 and a timeout", status, body)
	}

	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	dr = b.deliverRequest(t, "dlv_2", "sub_b")
	dr.URL = gone.URL + "/hooks/private-path"
	status, body = b.deliver(t, dr)
	res := decode[edgewire.Result](t, body)
	if status != http.StatusOK || res.Status != 0 || !strings.HasPrefix(res.Error, "request failed: ") {
		t.Fatalf("refused connection: %d %s, want 200 with status 0 and an error", status, body)
	}
	if strings.Contains(res.Error, "private-path") {
		t.Errorf("error %q repeats the URL", res.Error)
	}
}

func TestRefusesRequestsItCannotUse(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	valid := func() edgewire.DeliverRequest { return b.deliverRequest(t, "dlv_1", "sub_a") }
	signed := func(dr edgewire.DeliverRequest, id string) (int, []byte) {
		body, _ := json.Marshal(dr)
		return b.post(t, id, body, edgeSecret, b.clock.Now())
	}
	check := func(name string, status int, body []byte, wantStatus int, wantCode string) {
		t.Helper()
		if status != wantStatus {
			t.Errorf("%s: status %d (%s), want %d", name, status, body, wantStatus)
			return
		}
		if e := decode[edgewire.Error](t, body); e.Error.Code != wantCode || e.Error.Message == "" {
			t.Errorf("%s: error %+v, want code %q", name, e, wantCode)
		}
	}

	req, _ := http.NewRequest(http.MethodGet, b.edge.URL+edgewire.DeliverPath, nil)
	status, body := do(t, req)
	check("GET", status, body, http.StatusMethodNotAllowed, "method_not_allowed")
	req, _ = http.NewRequest(http.MethodPost, b.edge.URL+"/v1/other", nil)
	status, body = do(t, req)
	check("unknown path", status, body, http.StatusNotFound, "not_found")

	status, body = b.post(t, "dlv_1", []byte(`{"delivery_id":`), edgeSecret, b.clock.Now())
	check("bad JSON", status, body, http.StatusBadRequest, "bad_json")
	status, body = b.post(t, "dlv_1", []byte(`{"delivery_id":"dlv_1","timeout_ms":"5"}`), edgeSecret, b.clock.Now())
	check("timeout_ms a string", status, body, http.StatusBadRequest, "bad_json")
	if msg := decode[edgewire.Error](t, body).Error.Message; !strings.Contains(msg, "timeout_ms must be a whole number") {
		t.Errorf("timeout_ms a string: message %q does not name the field and what it must be", msg)
	}

	for name, edit := range map[string]func(*edgewire.DeliverRequest){
		"zero rate":            func(d *edgewire.DeliverRequest) { d.Rate = bucket.Rate{} },
		"bad subscriber id":    func(d *edgewire.DeliverRequest) { d.SubscriberID = "a b" },
		"relative url":         func(d *edgewire.DeliverRequest) { d.URL = "/hooks" },
		"ftp url":              func(d *edgewire.DeliverRequest) { d.URL = "ftp://example.com/x" },
		"header with CRLF":     func(d *edgewire.DeliverRequest) { d.Headers["x-a"] = "1\r\nx-b: 2" },
		"timeout too long":     func(d *edgewire.DeliverRequest) { d.TimeoutMS = edgewire.MaxTimeoutMS + 1 },
		"id is not webhook-id": func(d *edgewire.DeliverRequest) { d.DeliveryID = "dlv_other" },
		"no body":              func(d *edgewire.DeliverRequest) { d.Body = "" },
	} {
		dr := valid()
		edit(&dr)
		status, body := signed(dr, "dlv_1")
		check(name, status, body, http.StatusUnprocessableEntity, "invalid")
	}

	big := valid()
	big.Body = strings.Repeat("x", edgewire.MaxRequestBytes)
	status, body = signed(big, "dlv_1")
	check("too large", status, body, http.StatusRequestEntityTooLarge, "too_large")

	if n := len(b.rcv.Got()); n != 0 {
		t.Errorf("receiver got %d requests, want none", n)
	}
	if n := b.buckets.Calls(); n != 0 {
		t.Errorf("%d bucket takes, want none", n)
	}
	// Each refusal is a log line too: GET, path, two bad JSONs, 8 invalid, too large.
	if n := strings.Count(b.logs.String(), `"outcome":"refused"`); n != 13 {
		t.Errorf("%d refusal log lines, want 13:\n%s", n, b.logs.String())
	}
}

func TestWithoutAValidSecretNothingPasses(t *testing.T) {
	t.Parallel()
	for name, secrets := range map[string][]string{
		"none": nil, "invalid": {"whsec_short"},
		// Valid base64 of 32 bytes, but not in the whsec_ form the origin requires.
		"without its prefix": {strings.TrimPrefix(edgeSecret, "whsec_")},
	} {
		b := setup(t, func(c *Config) { c.Secrets = secrets })
		status, body := b.deliver(t, b.deliverRequest(t, "dlv_1", "sub_a"))
		if status != http.StatusInternalServerError || decode[edgewire.Error](t, body).Error.Code != "edge_misconfigured" {
			t.Errorf("%s: %d %s, want 500 edge_misconfigured", name, status, body)
		}
		if n := len(b.rcv.Got()); n != 0 {
			t.Errorf("%s: receiver got %d requests", name, n)
		}
	}
}

func TestRotationAcceptsEitherSecret(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Secrets = []string{otherSecret, edgeSecret} })
	if status, body := b.deliver(t, b.deliverRequest(t, "dlv_1", "sub_a")); status != http.StatusOK {
		t.Fatalf("signed by the second secret: %d %s", status, body)
	}
}

func TestBucketFailureChargesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.buckets.err = errors.New("durable object overloaded")
	status, body := b.deliver(t, b.deliverRequest(t, "dlv_1", "sub_a"))
	if status != http.StatusServiceUnavailable || decode[edgewire.Error](t, body).Error.Code != "bucket_unavailable" {
		t.Fatalf("%d %s, want 503 bucket_unavailable", status, body)
	}
	if n := len(b.rcv.Got()); n != 0 {
		t.Errorf("receiver got %d requests", n)
	}
}

// A request whose send-by time has passed, when it arrives or when its
// bucket answers, is refused (408) without calling the subscriber: the
// origin has stopped waiting and sends the delivery again itself.
func TestARequestPastItsSendByTimeCallsNoOne(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	dr := b.deliverRequest(t, "dlv_1", "sub_a")
	dr.SendByMS = b.clock.Now().UnixMilli() // the last moment has come
	status, body := b.deliver(t, dr)
	if status != http.StatusRequestTimeout || decode[edgewire.Error](t, body).Error.Code != "expired" || b.buckets.Calls() != 0 {
		t.Fatalf("%d %s, %d bucket calls; want 408 expired before the bucket", status, body, b.buckets.Calls())
	}
	dr.SendByMS = b.clock.Now().Add(time.Second).UnixMilli()
	if status, body := b.deliver(t, dr); status != http.StatusOK {
		t.Fatalf("within its send-by time: %d %s, want 200", status, body)
	}

	slow := setup(t, nil)
	slow.buckets.then = func() { slow.clock.Advance(2 * time.Second) } // a Durable Object that answered late
	dr = slow.deliverRequest(t, "dlv_2", "sub_b")
	dr.SendByMS = slow.clock.Now().Add(time.Second).UnixMilli()
	status, body = slow.deliver(t, dr)
	if status != http.StatusRequestTimeout || len(slow.rcv.Got()) != 0 {
		t.Errorf("a bucket that answered after the send-by time: %d %s, %d calls; want 408 and none", status, body, len(slow.rcv.Got()))
	}
	if n := len(b.rcv.Got()); n != 1 {
		t.Errorf("the receiver got %d calls, want the one within its time", n)
	}
}

// quoter fails the way workerd's fetch can: with a message naming the URL.
type quoter struct{}

func (quoter) Do(r *http.Request) (*http.Response, error) {
	return nil, errors.New("TypeError: Fetch API cannot load: " + r.URL.String() + " (" + r.URL.Hostname() + ")")
}

func TestFailedFetchNamesNoEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Client = quoter{} })
	dr := b.deliverRequest(t, "dlv_quoted", "sub_a")
	status, body := b.deliver(t, dr)
	res := decode[edgewire.Result](t, body)
	host := strings.TrimPrefix(b.rcv.URL, "http://")
	if status != http.StatusOK || !strings.HasPrefix(res.Error, "request failed: TypeError: Fetch API cannot load") {
		t.Fatalf("%d %s, want 200 and the fetch error's words", status, body)
	}
	for _, leak := range []string{"/hooks/private-path", host, "127.0.0.1"} {
		if strings.Contains(string(body), leak) {
			t.Errorf("the answer names the endpoint (%q): %s", leak, body)
		}
	}
}

type panicker struct{}

func (panicker) Do(*http.Request) (*http.Response, error) { panic("boom") }

func TestAPanicFailsOneRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Client = panicker{} })
	status, body := b.deliver(t, b.deliverRequest(t, "dlv_1", "sub_a"))
	if status != http.StatusInternalServerError || decode[edgewire.Error](t, body).Error.Code != "internal" {
		t.Fatalf("%d %s, want 500 internal", status, body)
	}
}

func TestLogsNoURLHeaderOrBody(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	dr := b.deliverRequest(t, "dlv_logged", "acme-corp")
	dr.Body = `{"type":"a","secret_marker":"body-marker-7f3"}`
	dr.Headers["x-marker"] = "header-marker-9c1"
	b.deliver(t, dr)
	b.deliver(t, dr) // deferred
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	refused := b.deliverRequest(t, "dlv_refused", "acme-corp-2")
	refused.URL = gone.URL + "/hooks/private-path"
	b.deliver(t, refused)
	logs := b.logs.String()
	for _, want := range []string{`"delivery_id":"dlv_logged"`, `"subscriber":"` + SubscriberHash("acme-corp") + `"`, `"outcome":"sent"`, `"outcome":"deferred"`, `"status":204`, `"failure":"request_failed"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s:\n%s", want, logs)
		}
	}
	for _, secret := range []string{"private-path", b.rcv.URL, strings.TrimPrefix(gone.URL, "http://"), "body-marker-7f3", "header-marker-9c1", "acme-corp", dr.Headers["webhook-signature"]} {
		if strings.Contains(logs, secret) {
			t.Errorf("logs contain %q:\n%s", secret, logs)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 7, 11, 8, 0, 0, 0, time.UTC)
	ptr := func(n int64) *int64 { return &n }
	tests := []struct {
		in   string
		want *int64
	}{
		{"", nil},
		{"  ", nil},
		{"0", ptr(0)},
		{"120", ptr(120)},
		{"-5", nil},
		{"+5", nil},
		{"99999999999999999999999", ptr(int64(math.Ceil(time.Duration(math.MaxInt64).Seconds())))}, // the longest wait; the origin caps it
		{"soon", nil},
		{"Sat, 11 Jul 2026 08:01:30 GMT", ptr(90)},    // RFC 1123
		{"Saturday, 11-Jul-26 08:00:10 GMT", ptr(10)}, // RFC 850
		{"Sat Jul 11 08:00:05 2026", ptr(5)},          // asctime
		{"Sat, 11 Jul 2026 07:00:00 GMT", ptr(0)},     // in the past
	}
	for _, tc := range tests {
		got := RetryAfter(tc.in, now)
		if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
			t.Errorf("RetryAfter(%q) = %v, want %v", tc.in, fmtPtr(got), fmtPtr(tc.want))
		}
	}
}

func fmtPtr(p *int64) string {
	if p == nil {
		return "nil"
	}
	return strconv.FormatInt(*p, 10)
}
