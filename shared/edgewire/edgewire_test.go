package edgewire

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/shared/bucket"
)

// The JSON names are the contract in DESIGN.md ("The edge lane").
func TestWireNames(t *testing.T) {
	t.Parallel()
	req := DeliverRequest{
		DeliveryID: "dlv_1", SubscriberID: "sub_1", URL: "https://example.com/h",
		Headers: map[string]string{"webhook-id": "evt_1"}, Body: `{"type":"a"}`,
		Rate: bucket.Rate{PerSecond: 10, Burst: 20}, TimeoutMS: 5000,
	}
	checkJSON(t, req, `{"delivery_id":"dlv_1","subscriber_id":"sub_1","url":"https://example.com/h","headers":{"webhook-id":"evt_1"},"body":"{\"type\":\"a\"}","rate":{"per_second":10,"burst":20},"timeout_ms":5000}`)
	checkJSON(t, Deferred{Deferred: true, RetryInMS: 250}, `{"deferred":true,"retry_in_ms":250}`)
	checkJSON(t, Result{Status: 503}, `{"status":503,"retry_after_s":null,"duration_ms":0,"error":""}`)
	seven := int64(7)
	checkJSON(t, Result{Status: 429, RetryAfterS: &seven, DurationMS: 12}, `{"status":429,"retry_after_s":7,"duration_ms":12,"error":""}`)
	checkJSON(t, Result{Status: 400, Response: `{"why":"bad"}`}, `{"status":400,"retry_after_s":null,"duration_ms":0,"error":"","response":"{\"why\":\"bad\"}"}`)
	checkJSON(t, Error{Error: ErrorDetail{Code: "unauthorized", Message: "m"}}, `{"error":{"code":"unauthorized","message":"m"}}`)
}

func checkJSON(t *testing.T, v any, want string) {
	t.Helper()
	got, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("JSON = %s\nwant   %s", got, want)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	valid := func() DeliverRequest {
		return DeliverRequest{
			DeliveryID: "dlv_1", SubscriberID: "sub_1", URL: "http://127.0.0.1:9/h",
			Headers: map[string]string{"webhook-id": "evt_1", "content-type": "application/json"},
			Rate:    bucket.Rate{PerSecond: 1, Burst: 1}, Body: `{"type":"t"}`,
		}
	}
	r := valid()
	if err := r.Validate(); err != nil {
		t.Fatalf("valid request: %v", err)
	}
	if r.Timeout() != DefaultTimeoutMS {
		t.Errorf("Timeout() = %d, want the default %d", r.Timeout(), DefaultTimeoutMS)
	}
	for name, edit := range map[string]func(*DeliverRequest){
		"no delivery id":        func(r *DeliverRequest) { r.DeliveryID = "" },
		"long subscriber id":    func(r *DeliverRequest) { r.SubscriberID = strings.Repeat("s", 65) },
		"burst below one":       func(r *DeliverRequest) { r.Rate.Burst = 0.5 },
		"negative timeout":      func(r *DeliverRequest) { r.TimeoutMS = -1 },
		"timeout over max":      func(r *DeliverRequest) { r.TimeoutMS = MaxTimeoutMS + 1 },
		"negative send-by time": func(r *DeliverRequest) { r.SendByMS = -1 },
		"no body":               func(r *DeliverRequest) { r.Body = "" },
		"no scheme":             func(r *DeliverRequest) { r.URL = "example.com/h" },
		"credentials in url":    func(r *DeliverRequest) { r.URL = "https://u:p@example.com/h" },
		"header name":           func(r *DeliverRequest) { r.Headers["bad name"] = "v" },
		"header value with LF":  func(r *DeliverRequest) { r.Headers["x"] = "a\nb" },
		"non-ASCII value":       func(r *DeliverRequest) { r.Headers["x"] = "é" },
	} {
		r := valid()
		edit(&r)
		err := r.Validate()
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Validate = %v, want ErrInvalid", name, err)
		}
		if err != nil && strings.Contains(err.Error(), "example.com") {
			t.Errorf("%s: the error %q repeats the URL", name, err)
		}
	}
}

func TestSnippetKeepsTextUpToTheLimit(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", ResponseSnippet-1) + "é" // the rune crosses the limit
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{`{"ok":true}`, `{"ok":true}`},
		{long, strings.Repeat("a", ResponseSnippet-1)},
		{strings.Repeat("b", 1000), strings.Repeat("b", ResponseSnippet)},
		{"caf\xe9 ok", "caf ok"},
	} {
		if got := Snippet([]byte(c.in)); got != c.want {
			t.Errorf("Snippet(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
