// Package edgewire is the origin↔edge wire protocol: what the origin sends to
// the Worker's DeliverPath for one attempt, and the two answers the Worker
// gives. Both halves import it, so a field renamed here breaks the build on
// both sides rather than silently on the wire.
//
// The origin signs each request with the origin↔edge secret the Standard
// Webhooks way (shared/signature), with webhook-id set to the DeliveryID.
// The Worker answers:
//
//   - 200 with a Result when it called the subscriber (whatever the
//     subscriber answered, including a timeout or a refused connection);
//   - 202 with a Deferred when the subscriber's bucket at the edge is empty:
//     nothing was sent and no attempt was spent;
//   - an Error with a 4xx or 5xx status otherwise (401 unsigned, mis-signed
//     or stale; 400/422 a request it cannot use; 408 one it got, or came
//     back to, after its SendByMS; 5xx the Worker failed). Then the
//     subscriber was not called and must not be charged.
package edgewire

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/shared/bucket"
	"github.com/sluice-dev/sluice/shared/event"
)

// DeliverPath is the Worker's one route: POST <edge-url>/v1/deliver.
const DeliverPath = "/v1/deliver"

// Limits the Worker enforces on a DeliverRequest.
const (
	// MaxRequestBytes is the largest signed request body the Worker reads;
	// it leaves room for a 256 KiB event escaped inside a JSON string.
	MaxRequestBytes = 2 << 20
	// DefaultTimeoutMS is the subscriber timeout when TimeoutMS is zero.
	DefaultTimeoutMS = 5000
	// MaxTimeoutMS is the longest subscriber timeout the Worker accepts;
	// the origin delivers slower subscribers through its own lane.
	MaxTimeoutMS = 60_000
)

// DeliverRequest is the JSON body of POST DeliverPath: one attempt to deliver
// Body to URL with Headers, metered by the subscriber's edge Rate.
type DeliverRequest struct {
	// DeliveryID is the origin's delivery id; it must equal the request's
	// webhook-id, so a signature cannot be lifted onto another delivery.
	DeliveryID   string `json:"delivery_id"`
	SubscriberID string `json:"subscriber_id"`
	URL          string `json:"url"`
	// Headers are sent to the subscriber as they are: the webhook-* headers
	// the origin signed with the subscriber's secret, content-type and
	// user-agent.
	Headers map[string]string `json:"headers"`
	// Body is the event JSON exactly as the subscriber must receive it.
	Body string `json:"body"`
	// Rate is the subscriber's edge share of its rate (see bucket.Rate.Scale).
	Rate bucket.Rate `json:"rate"`
	// TimeoutMS bounds the call to the subscriber; zero means DefaultTimeoutMS.
	TimeoutMS int64 `json:"timeout_ms"`
	// SendByMS (Unix milliseconds) is when the Worker may last start the
	// call: the origin stops waiting for the answer the call's timeout
	// later, and then delivers again. A Worker that stalled and comes back
	// must not send what the origin has given up on. Zero: no bound.
	SendByMS int64 `json:"send_by_ms,omitempty"`
}

// Expired reports whether the Worker may no longer start r's call at now.
func (r *DeliverRequest) Expired(now time.Time) bool {
	return r.SendByMS > 0 && now.UnixMilli() >= r.SendByMS
}

// Deferred is the 202 answer: the bucket is empty, try again in RetryInMS.
// It is not an attempt: the origin reschedules without spending one.
type Deferred struct {
	Deferred  bool  `json:"deferred"`
	RetryInMS int64 `json:"retry_in_ms"`
}

// Result is the 200 answer: what the subscriber did with the attempt, to be
// recorded as if the origin had made it.
type Result struct {
	// Status is the subscriber's HTTP status, or 0 when no response came
	// (timeout, connection refused); Error then says which.
	Status int `json:"status"`
	// RetryAfterS is the subscriber's Retry-After in seconds (delta-seconds
	// or an HTTP date, made relative to the Worker's clock), or null.
	RetryAfterS *int64 `json:"retry_after_s"`
	// DurationMS is how long the subscriber took, as the Worker measured it.
	DurationMS int64 `json:"duration_ms"`
	// Error is empty when the subscriber answered, whatever its status.
	Error string `json:"error"`
	// Response is the first bytes of the subscriber's answer, at most
	// ResponseSnippet, for the attempt's history; absent when empty.
	Response string `json:"response,omitempty"`
}

// ResponseSnippet is how much of a subscriber's answer an attempt keeps, in
// either lane.
const ResponseSnippet = 256

// Snippet is what an attempt keeps of an answer that began with b: at most
// ResponseSnippet bytes, without the bytes that are not UTF-8 (a cut rune at
// the end, or a binary answer), so it can be stored and shown as text.
func Snippet(b []byte) string {
	return strings.ToValidUTF8(string(b[:min(len(b), ResponseSnippet)]), "")
}

// Error is the body of every 4xx and 5xx answer, in the API's error shape:
// {"error": {"code": "…", "message": "…"}}.
type Error struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of an Error.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ErrInvalid is wrapped by every error Validate returns.
var ErrInvalid = errors.New("edgewire: invalid deliver request")

// ErrRefused marks an edge lane failure that concerns one request alone:
// the Worker refused it as too large or invalid, or it could not be made,
// while the Worker itself is fine. Sending it again would fail again; the
// origin lane can take it.
var ErrRefused = errors.New("edgewire: request refused")

// Validate reports the first field of r that the Worker cannot use, so the
// origin can check a request before it signs it and the Worker refuses it
// before it spends a token.
func (r *DeliverRequest) Validate() error {
	switch {
	case !event.ValidID(r.DeliveryID):
		return fmt.Errorf("%w: delivery_id must be 1 to 64 characters of A-Z a-z 0-9 _ . : -", ErrInvalid)
	case !event.ValidID(r.SubscriberID):
		return fmt.Errorf("%w: subscriber_id must be 1 to 64 characters of A-Z a-z 0-9 _ . : -", ErrInvalid)
	case !r.Rate.Valid():
		return fmt.Errorf("%w: rate needs per_second > 0 and burst >= 1", ErrInvalid)
	case r.TimeoutMS < 0 || r.TimeoutMS > MaxTimeoutMS:
		return fmt.Errorf("%w: timeout_ms must be 0 to %d", ErrInvalid, MaxTimeoutMS)
	case r.SendByMS < 0:
		return fmt.Errorf("%w: send_by_ms must be a Unix time in milliseconds, or 0 for none", ErrInvalid)
	case r.Body == "":
		// An event is a JSON object: an empty body is a request gone wrong.
		return fmt.Errorf("%w: body must hold the event's JSON", ErrInvalid)
	}
	u, err := url.Parse(r.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		// The URL itself stays out of the message: errors end up in logs.
		return fmt.Errorf("%w: url must be an absolute http or https URL without credentials", ErrInvalid)
	}
	for name, value := range r.Headers {
		if !validHeaderName(name) || !validHeaderValue(value) {
			return fmt.Errorf("%w: headers hold an invalid name or value", ErrInvalid)
		}
	}
	return nil
}

// Timeout is r's subscriber timeout in milliseconds, with the default applied.
func (r *DeliverRequest) Timeout() int64 {
	if r.TimeoutMS == 0 {
		return DefaultTimeoutMS
	}
	return r.TimeoutMS
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
			continue
		}
		switch c {
		case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
			continue
		}
		return false
	}
	return true
}

// validHeaderValue refuses control characters (CR and LF above all), which
// would split a header, and non-ASCII, which fetch refuses to send.
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c >= 0x7f {
			return false
		}
	}
	return true
}
