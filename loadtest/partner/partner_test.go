package partner_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-dev/sluice/loadtest/partner"
	"github.com/sluice-dev/sluice/loadtest/report"
	"github.com/sluice-dev/sluice/shared/bucket"
	"github.com/sluice-dev/sluice/shared/fakeclock"
	"github.com/sluice-dev/sluice/shared/signature"
)

var secret = "whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldY" // base64 of 24 bytes

func newPartner(t *testing.T, cfg partner.Config) (*partner.Partner, *fakeclock.Clock) {
	t.Helper()
	clk := fakeclock.New(time.Date(2026, 7, 11, 8, 14, 2, 0, time.UTC))
	cfg.Secret = secret
	if cfg.Now == nil {
		cfg.Now = clk.Now
	}
	return partner.New(cfg), clk
}

// signed is a delivery of event id signed with key at now, as sluice sends it.
func signed(t *testing.T, key, id string, now time.Time) *http.Request {
	t.Helper()
	body := []byte(fmt.Sprintf(`{"id":%q,"type":"video.trending","sent_at":%q}`, id, now.Add(-time.Second).Format(time.RFC3339Nano)))
	s, err := signature.NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/hooks/p", bytes.NewReader(body))
	s.Set(req.Header, id, now, body)
	return req
}

func serve(p *partner.Partner, req *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, req)
	return rec
}

func TestLimitedPartnerEnforcesItsAdvertisedRate(t *testing.T) {
	t.Parallel()
	p, clk := newPartner(t, partner.Config{
		Advertised: bucket.Rate{PerSecond: 10, Burst: 20}, Enforce: true, BanAfter: 5,
	})
	for i := 1; i <= 20; i++ {
		if rec := serve(p, signed(t, secret, fmt.Sprintf("evt_%d", i), clk.Now())); rec.Code != http.StatusNoContent {
			t.Fatalf("request %d of the burst: %d, want 204", i, rec.Code)
		}
	}
	rec := serve(p, signed(t, secret, "evt_21", clk.Now()))
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("21st request in the same instant: %d Retry-After %q, want 429 with Retry-After 1", rec.Code, rec.Header().Get("Retry-After"))
	}
	// A client that waits as told finds the refilled tokens and no ban.
	clk.Advance(time.Second)
	for i := 22; i <= 31; i++ {
		if rec := serve(p, signed(t, secret, fmt.Sprintf("evt_%d", i), clk.Now())); rec.Code != http.StatusNoContent {
			t.Fatalf("request %d after waiting 1s: %d, want 204", i, rec.Code)
		}
	}
	r := p.Report(nil)
	if r.Delivered != 30 || r.Sent429 != 1 || r.Sent403 != 0 || r.Banned {
		t.Errorf("report: delivered %d, 429s %d, 403s %d, banned %v; want 30, 1, 0, false", r.Delivered, r.Sent429, r.Sent403, r.Banned)
	}
	// 31 requests in [t, t+1s]: the burst, the 429, and ten at t+1s, which
	// the half-open window starting at t does not hold.
	if r.MaxWindow != 21 || r.Limit != 30 || r.Violation {
		t.Errorf("window: %d of %d, violation %v; want 21 of 30, false", r.MaxWindow, r.Limit, r.Violation)
	}
}

func TestLimitedPartnerBansAClientThatIgnoresRetryAfter(t *testing.T) {
	t.Parallel()
	p, clk := newPartner(t, partner.Config{
		Advertised: bucket.Rate{PerSecond: 10, Burst: 20}, Enforce: true, BanAfter: 5, BanFor: time.Hour,
	})
	var codes []int
	for i := 1; i <= 30; i++ {
		codes = append(codes, serve(p, signed(t, secret, fmt.Sprintf("evt_%d", i), clk.Now())).Code)
		clk.Advance(10 * time.Millisecond)
	}
	// The burst of 20 plus the 2 tokens refilled over those 200 ms are
	// accepted; the 23rd is told to wait; four more within its second are
	// 429s, the fifth earns the ban, and everything after it is 403.
	want := slices.Repeat([]int{204}, 22)
	want = append(want, 429, 429, 429, 429, 429, 403, 403, 403)
	if !slices.Equal(codes, want) {
		t.Fatalf("codes = %v\nwant    %v", codes, want)
	}
	clk.Advance(30 * time.Minute)
	if rec := serve(p, signed(t, secret, "evt_later", clk.Now())); rec.Code != http.StatusForbidden {
		t.Errorf("30 min into the ban: %d, want 403", rec.Code)
	}
	r := p.Report(nil)
	if !r.Banned || r.Sent429 != 5 || r.Sent403 != 4 || r.Delivered != 22 {
		t.Errorf("report: banned %v, 429s %d, 403s %d, delivered %d; want true, 5, 4, 22", r.Banned, r.Sent429, r.Sent403, r.Delivered)
	}
	// A ban over by the time of the report still counts: the run met one.
	clk.Advance(time.Hour)
	if r := p.Report(nil); !r.Banned {
		t.Error("report after the ban ran out: banned false; want true")
	}
	if r.MaxWindow != 30 || r.Violation {
		t.Errorf("window %d (violation %v); want 30 requests in 300 ms, within 20 + 10", r.MaxWindow, r.Violation)
	}
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "banned") {
		t.Errorf("problems = %q, want one saying the client was banned", r.Problems)
	}
}

func TestPartnerRejectsBadSignatures(t *testing.T) {
	t.Parallel()
	p, clk := newPartner(t, partner.Config{})
	other, err := signature.NewSecret(bytes.NewReader(bytes.Repeat([]byte{7}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	tampered := signed(t, secret, "evt_t", clk.Now())
	tampered.Body = http.NoBody
	unsigned := httptest.NewRequest(http.MethodPost, "/hooks/p", strings.NewReader(`{"id":"evt_u"}`))
	stale := signed(t, secret, "evt_s", clk.Now().Add(-6*time.Minute))
	for name, req := range map[string]*http.Request{
		"wrong secret": signed(t, other, "evt_w", clk.Now()),
		"tampered":     tampered,
		"unsigned":     unsigned,
		"replayed":     stale,
	} {
		if rec := serve(p, req); rec.Code != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", name, rec.Code)
		}
	}
	if rec := serve(p, signed(t, secret, "evt_ok", clk.Now())); rec.Code != http.StatusNoContent {
		t.Errorf("good signature: %d, want 204", rec.Code)
	}
	r := p.Report([]string{"evt_ok"})
	if r.BadSignatures != 4 || r.Delivered != 1 || r.Requests != 5 || len(r.Missing) != 0 {
		t.Errorf("report: bad signatures %d, delivered %d, requests %d, missing %v; want 4, 1, 5, none",
			r.BadSignatures, r.Delivered, r.Requests, r.Missing)
	}
}

// TestPartnerVerifiesSharedVectors checks the partner against the Standard
// Webhooks vectors every part of sluice shares.
func TestPartnerVerifiesSharedVectors(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../shared/signature/testdata/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vectors []struct {
		Name, Secret, ID, Body, Signature string
		Timestamp                         int64
	}
	if err := json.Unmarshal(b, &vectors); err != nil {
		t.Fatal(err)
	}
	for _, v := range vectors {
		now := time.Unix(v.Timestamp, 0)
		p := partner.New(partner.Config{Secret: v.Secret, Now: func() time.Time { return now }})
		for _, sig := range []string{v.Signature, strings.Replace(v.Signature, "v1,", "v1,A", 1)} {
			req := httptest.NewRequest(http.MethodPost, "/hooks/p", strings.NewReader(v.Body))
			req.Header.Set("webhook-id", v.ID)
			req.Header.Set("webhook-timestamp", fmt.Sprint(v.Timestamp))
			req.Header.Set("webhook-signature", sig)
			// The vectors' bodies are not sluice events (their ids are not
			// the webhook-id), so a good signature gets past the check to
			// the body's: 400, not 401.
			rec := serve(p, req)
			if good := sig == v.Signature; good == (rec.Code == http.StatusUnauthorized) {
				t.Errorf("%s, signature %.20s… (good %v): %d", v.Name, sig, good, rec.Code)
			}
		}
	}
}

// A correctly signed delivery whose body is not the event its webhook-id
// names is refused and not counted as delivered.
func TestPartnerRefusesABodyThatIsNotTheEvent(t *testing.T) {
	t.Parallel()
	p, clk := newPartner(t, partner.Config{})
	s, err := signature.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{`not json at all`, `{"id":"evt_2","type":"video.trending"}`} {
		req := httptest.NewRequest(http.MethodPost, "/hooks/p", strings.NewReader(body))
		s.Set(req.Header, "evt_1", clk.Now(), []byte(body))
		if rec := serve(p, req); rec.Code != http.StatusBadRequest {
			t.Errorf("body %s for webhook-id evt_1: %d, want 400", body, rec.Code)
		}
	}
	// Events of any shape are taken when their exact "id" is the
	// webhook-id: an "ID" field is theirs, and sent_at need not be a time.
	for id, body := range map[string]string{
		"evt_a": `{"id":"evt_a","type":"order.paid","sent_at":1752221642}`,
		"evt_b": `{"id":"evt_b","type":"user.created","ID":"u-42"}`,
		"evt_c": `{"ID":"u-42","id":"evt_c","sent_at":"2026-07-11 08:14:02Z"}`,
	} {
		req := httptest.NewRequest(http.MethodPost, "/hooks/p", strings.NewReader(body))
		s.Set(req.Header, id, clk.Now(), []byte(body))
		if rec := serve(p, req); rec.Code != http.StatusNoContent {
			t.Errorf("body %s for webhook-id %s: %d, want 204", body, id, rec.Code)
		}
	}
	r := p.Report([]string{"evt_1", "evt_a", "evt_b", "evt_c"})
	if r.BadBodies != 2 || r.Delivered != 3 || r.Accepted != 3 || !slices.Equal(r.Missing, []string{"evt_1"}) {
		t.Errorf("report: bad bodies %d, delivered %d, accepted %d, missing %v; want 2, 3, 3, [evt_1]", r.BadBodies, r.Delivered, r.Accepted, r.Missing)
	}
}

func TestPartnerReportCountsDuplicatesMissingAndLatency(t *testing.T) {
	t.Parallel()
	p, clk := newPartner(t, partner.Config{Advertised: bucket.Rate{PerSecond: 2, Burst: 1}})
	for _, id := range []string{"a", "b", "a", "a"} {
		serve(p, signed(t, secret, id, clk.Now()))
		clk.Advance(200 * time.Millisecond)
	}
	r := p.Report([]string{"a", "b", "c"})
	if r.Delivered != 2 || r.Duplicates != 2 || !slices.Equal(r.Missing, []string{"c"}) {
		t.Errorf("delivered %d, duplicates %d, missing %v; want 2, 2, [c]", r.Delivered, r.Duplicates, r.Missing)
	}
	// Four requests 200 ms apart: all in one second, above 1 + 2 (the
	// partner does not enforce, it only reports).
	if r.MaxWindow != 4 || r.Limit != 3 || !r.Violation {
		t.Errorf("window %d of %d, violation %v; want 4 of 3, true", r.MaxWindow, r.Limit, r.Violation)
	}
	// Each body says it was sent 1 s before its signature's time.
	if r.P50 != report.Millis(time.Second) || r.P99 != report.Millis(time.Second) {
		t.Errorf("latency p50 %v p99 %v, want 1s", time.Duration(r.P50), time.Duration(r.P99))
	}
	if want := clk.Now().Add(-600 * time.Millisecond); !r.LastAccept.Equal(want) {
		t.Errorf("LastAccept = %v, want %v (b's arrival)", r.LastAccept, want)
	}
}

func TestSlowPartnerAnswersAfterItsDelay(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := partner.New(partner.Config{Secret: secret, Delay: 2 * time.Second})
		start := time.Now()
		rec := serve(p, signed(t, secret, "evt_slow", start))
		if rec.Code != http.StatusNoContent || time.Since(start) != 2*time.Second {
			t.Errorf("answered %d after %v, want 204 after 2s", rec.Code, time.Since(start))
		}
	})
}

func TestFlakyPartnerFaults(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		errs := partner.New(partner.Config{Secret: secret, Faults: partner.Faults{Error: 1}})
		if rec := serve(errs, signed(t, secret, "e", time.Now())); rec.Code != http.StatusInternalServerError {
			t.Errorf("Error 1: %d, want 500", rec.Code)
		}
		hold := partner.New(partner.Config{Secret: secret, Faults: partner.Faults{Timeout: 1, Hold: 5 * time.Second}})
		start := time.Now()
		if rec := serve(hold, signed(t, secret, "h", start)); rec.Code != http.StatusGatewayTimeout || time.Since(start) != 5*time.Second {
			t.Errorf("Timeout 1: %d after %v, want 504 after the 5s hold", rec.Code, time.Since(start))
		}
		if r := hold.Report(nil); r.Timeouts != 1 || r.Delivered != 0 {
			t.Errorf("timeouts %d, delivered %d; want 1, 0", r.Timeouts, r.Delivered)
		}
	})
}

// TestFlakyPartnerIsSeeded: the same seed and the same requests give the
// same faults, so a run can be replayed.
func TestFlakyPartnerIsSeeded(t *testing.T) {
	t.Parallel()
	outcomes := func(seed uint64) []int {
		p, clk := newPartner(t, partner.Config{Seed: seed, Faults: partner.Faults{Error: 0.3}})
		var codes []int
		for i := range 200 {
			codes = append(codes, serve(p, signed(t, secret, fmt.Sprint(i), clk.Now())).Code)
		}
		return codes
	}
	a, b, c := outcomes(42), outcomes(42), outcomes(43)
	if !slices.Equal(a, b) {
		t.Error("the same seed gave different faults")
	}
	if slices.Equal(a, c) {
		t.Error("different seeds gave the same faults")
	}
	if n := count(a, http.StatusInternalServerError); n != 70 {
		t.Errorf("seed 42: %d × 500 in 200 requests at odds 0.3, want 70", n)
	}
}

func count(codes []int, code int) int {
	n := 0
	for _, c := range codes {
		if c == code {
			n++
		}
	}
	return n
}

// TestServedPartnerGoesDownAndComesBack runs over 127.0.0.1: a reset, a
// refused connection, 503 with Retry-After, then service again.
func TestServedPartnerGoesDownAndComesBack(t *testing.T) {
	t.Parallel()
	p, err := partner.Start(partner.Config{Name: "outage", Secret: secret, DownRetryAfter: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	client := &http.Client{Timeout: 10 * time.Second}
	post := func(id string) (*http.Response, error) {
		req := signed(t, secret, id, time.Now())
		out, _ := http.NewRequest(http.MethodPost, p.URL(), req.Body)
		out.Header = req.Header
		resp, err := client.Do(out)
		if err == nil {
			resp.Body.Close()
		}
		return resp, err
	}
	if resp, err := post("up"); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("up: %v %v, want 204", resp, err)
	}
	if err := p.SetMode(partner.Unavailable); err != nil {
		t.Fatal(err)
	}
	if resp, err := post("503"); err != nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "2" {
		t.Fatalf("unavailable: %v %v, want 503 with Retry-After 2", resp, err)
	}
	if err := p.SetMode(partner.Refusing); err != nil {
		t.Fatal(err)
	}
	client.CloseIdleConnections()
	var opErr *net.OpError
	if _, err := post("refused"); !errors.As(err, &opErr) {
		t.Fatalf("refusing: %v, want a connection error", err)
	}
	if err := p.SetMode(partner.Up); err != nil {
		t.Fatal(err)
	}
	if resp, err := post("back"); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("back up: %v %v, want 204", resp, err)
	}
	reset := partner.New(partner.Config{Secret: secret, Faults: partner.Faults{Reset: 1}})
	srv := httptest.NewServer(reset)
	t.Cleanup(srv.Close)
	req := signed(t, secret, "rst", time.Now())
	out, _ := http.NewRequest(http.MethodPost, srv.URL+"/hooks/p", req.Body)
	out.Header = req.Header
	if resp, err := client.Do(out); err == nil {
		resp.Body.Close()
		t.Fatalf("reset fault answered %d, want a dropped connection", resp.StatusCode)
	}
	r := p.Report([]string{"up", "back"})
	if r.Delivered != 2 || r.Sent503 != 1 || len(r.Missing) != 0 {
		t.Errorf("report: delivered %d, 503s %d, missing %v; want 2, 1, none", r.Delivered, r.Sent503, r.Missing)
	}
}

// A partner down with a sub-second Retry-After rounds it up to the whole
// second the header carries: "0" would tell a client to come back at once.
func TestASubSecondRetryAfterIsRoundedUp(t *testing.T) {
	t.Parallel()
	p, clk := newPartner(t, partner.Config{DownRetryAfter: 500 * time.Millisecond})
	if err := p.SetMode(partner.Unavailable); err != nil {
		t.Fatal(err)
	}
	rec := serve(p, signed(t, secret, "evt_1", clk.Now()))
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("down with Retry-After 500ms: %d Retry-After %q, want 503 with Retry-After 1", rec.Code, rec.Header().Get("Retry-After"))
	}
}
