// Package worker is the edge lane's HTTP handling as plain net/http code: the
// Worker's one route, POST /v1/deliver, and the token decision its Durable
// Objects make. The js/wasm wiring in edge/ supplies the Durable Object
// buckets, fetch and the clock; tests supply in-memory ones and httptest
// receivers.
package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/shared/bucket"
	"github.com/sluice-dev/sluice/shared/edgewire"
	"github.com/sluice-dev/sluice/shared/retryafter"
	"github.com/sluice-dev/sluice/shared/signature"
)

// Buckets hands out one subscriber's tokens; at the edge, each subscriber's
// Durable Object, which serializes the takes of that subscriber.
type Buckets interface {
	Take(ctx context.Context, subscriberID string, r bucket.Rate) (Grant, error)
}

// Doer sends the request to the subscriber. It must not follow redirects (a
// 3xx is the subscriber's answer) and must give up at the request context's
// deadline with an error wrapping context.DeadlineExceeded.
type Doer interface {
	Do(*http.Request) (*http.Response, error)
}

// Config is what Handler needs.
type Config struct {
	// Secrets are the origin↔edge secrets (whsec_…); a request signed by any
	// of them passes, so a rotation can hold the old and the new. With none,
	// or an invalid one, every request is refused: never an open relay.
	Secrets []string
	Buckets Buckets
	Client  Doer
	// Now is the clock for the replay window and timings; nil is time.Now.
	Now func() time.Time
	// Logger receives one line per request: delivery id, subscriber hash,
	// outcome, status, timings. Never a URL, a header or a body. Nil discards.
	Logger *slog.Logger
}

// Handler returns the Worker's HTTP handler.
func Handler(cfg Config) http.Handler {
	h := &handler{Config: cfg}
	if h.Now == nil {
		h.Now = time.Now
	}
	if h.Logger == nil {
		h.Logger = slog.New(slog.DiscardHandler)
	}
	h.misconfigured = checkSecrets(cfg.Secrets)
	return h
}

func checkSecrets(secrets []string) error {
	if len(secrets) == 0 {
		return errors.New("SLUICE_EDGE_SECRET is not set")
	}
	for i, s := range secrets {
		// The whsec_ form the origin requires: a secret one half takes and
		// the other refuses is a misconfiguration found at the first call.
		if err := signature.CheckSecret(s); err != nil {
			return fmt.Errorf("SLUICE_EDGE_SECRET, secret %d: %w", i+1, err)
		}
	}
	return nil
}

type handler struct {
	Config
	misconfigured error
}

// maxSubscriberRead bounds how much of a subscriber's answer is read before
// the connection is let go; only its status, Retry-After and first bytes
// matter here.
const maxSubscriberRead = 64 << 10

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// One Go instance serves the whole isolate: a panic must fail this
	// request, not every request in flight.
	defer func() {
		if p := recover(); p != nil {
			h.Logger.Error("deliver", "outcome", "panic", "panic", fmt.Sprint(p))
			writeError(w, http.StatusInternalServerError, "internal", "the edge failed")
		}
	}()
	if r.Body == nil { // possible outside net/http's own server
		r.Body = http.NoBody
	}
	began := h.Now()
	if r.URL.Path != edgewire.DeliverPath {
		h.refuse(w, http.StatusNotFound, "not_found", "the edge serves only POST "+edgewire.DeliverPath)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		h.refuse(w, http.StatusMethodNotAllowed, "method_not_allowed", "use POST")
		return
	}
	if h.misconfigured != nil {
		h.Logger.Error("deliver", "outcome", "misconfigured", "error", h.misconfigured.Error())
		writeError(w, http.StatusInternalServerError, "edge_misconfigured", "the edge has no valid origin secret")
		return
	}

	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, edgewire.MaxRequestBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			h.refuse(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("the request exceeds %d bytes", edgewire.MaxRequestBytes))
			return
		}
		h.refuse(w, http.StatusBadRequest, "bad_request", "reading the request failed")
		return
	}
	// Authenticate before reading a byte of what the body says.
	if err := signature.Verify(r.Header, body, began, h.Secrets...); err != nil {
		h.Logger.Warn("deliver", "outcome", "unauthorized", "reason", rejectReason(err))
		writeError(w, http.StatusUnauthorized, "unauthorized", "missing, invalid or stale origin signature")
		return
	}

	var req edgewire.DeliverRequest
	if err := json.Unmarshal(body, &req); err != nil {
		msg := "the body is not a deliver request"
		if te := (*json.UnmarshalTypeError)(nil); errors.As(err, &te) && te.Field != "" {
			msg += ": " + te.Field + " must be " + jsonKind(te.Type)
		}
		h.refuse(w, http.StatusBadRequest, "bad_json", msg)
		return
	}
	if err := req.Validate(); err != nil {
		h.refuse(w, http.StatusUnprocessableEntity, "invalid", strings.TrimPrefix(err.Error(), "edgewire: "))
		return
	}
	if req.DeliveryID != r.Header.Get(signature.HeaderID) {
		h.refuse(w, http.StatusUnprocessableEntity, "invalid", "delivery_id must equal webhook-id")
		return
	}
	log := h.Logger.With("delivery_id", req.DeliveryID, "subscriber", SubscriberHash(req.SubscriberID))
	if h.expired(w, log, &req, began) {
		return
	}

	grant, err := h.Buckets.Take(r.Context(), req.SubscriberID, req.Rate)
	bucketDone := h.Now()
	if err != nil {
		// The subscriber was not called: the origin retries the lane or
		// falls back, without charging it an attempt.
		log.Error("deliver", "outcome", "bucket_unavailable", "error", err.Error(), "bucket_ms", ms(bucketDone.Sub(began)))
		writeError(w, http.StatusServiceUnavailable, "bucket_unavailable", "the subscriber's bucket did not answer")
		return
	}
	if !grant.OK {
		d := edgewire.Deferred{Deferred: true, RetryInMS: retryInMS(grant.RetryIn)}
		log.Info("deliver", "outcome", "deferred", "retry_in_ms", d.RetryInMS, "bucket_ms", ms(bucketDone.Sub(began)))
		writeJSON(w, http.StatusAccepted, d)
		return
	}

	if h.expired(w, log, &req, began) { // the bucket's answer may come late
		return
	}
	res, failure := h.send(r.Context(), &req)
	log.Info("deliver", "outcome", "sent", "status", res.Status, "failure", failure,
		"bucket_ms", ms(bucketDone.Sub(began)), "subscriber_ms", res.DurationMS, "total_ms", ms(h.Now().Sub(began)))
	writeJSON(w, http.StatusOK, res)
}

// refuse answers a request the edge will not act on, with its one log
// line: the status and code, never what the request held.
func (h *handler) refuse(w http.ResponseWriter, status int, code, msg string) {
	h.Logger.Warn("deliver", "outcome", "refused", "status", status, "code", code)
	writeError(w, status, code, msg)
}

// jsonKind names the JSON a Go type is read from, for a message about a
// field of the wrong kind.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "of another type"
}

// expired answers 408 for a request whose send-by time has passed: the
// origin has stopped waiting, and sends the delivery again itself.
func (h *handler) expired(w http.ResponseWriter, log *slog.Logger, req *edgewire.DeliverRequest, began time.Time) bool {
	now := h.Now()
	if !req.Expired(now) {
		return false
	}
	log.Warn("deliver", "outcome", "expired", "late_ms", now.UnixMilli()-req.SendByMS, "total_ms", ms(now.Sub(began)))
	writeError(w, http.StatusRequestTimeout, "expired", "the origin's send-by time has passed; it sends the delivery again")
	return true
}

// send makes the one attempt and reports it; every failure is a Result, since
// the subscriber has been charged a token either way. failure names the kind
// of failure for the log ("" when the subscriber answered): Result.Error may
// hold the subscriber's host, which the log must not.
func (h *handler) send(ctx context.Context, req *edgewire.DeliverRequest) (res edgewire.Result, failure string) {
	timeout := time.Duration(req.Timeout()) * time.Millisecond
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, req.URL, strings.NewReader(req.Body))
	if err != nil {
		return edgewire.Result{Error: "building the request failed"}, "bad_request"
	}
	for name, value := range req.Headers {
		out.Header.Set(name, value)
	}
	if out.Header.Get("Content-Type") == "" {
		out.Header.Set("Content-Type", "application/json")
	}

	start := h.Now()
	resp, err := h.Client.Do(out)
	if err != nil {
		res := edgewire.Result{DurationMS: ms(h.Now().Sub(start))}
		if errors.Is(err, context.DeadlineExceeded) {
			res.Error = fmt.Sprintf("timeout after %dms", req.Timeout())
			return res, "timeout"
		}
		res.Error = "request failed: " + withoutEndpoint(innerError(err), out.URL)
		return res, "request_failed"
	}
	snippet := make([]byte, edgewire.ResponseSnippet)
	n, _ := io.ReadFull(resp.Body, snippet)
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxSubscriberRead))
	resp.Body.Close()
	end := h.Now()
	return edgewire.Result{
		Status:      resp.StatusCode,
		RetryAfterS: RetryAfter(resp.Header.Get("Retry-After"), end),
		DurationMS:  ms(end.Sub(start)),
		Response:    edgewire.Snippet(snippet[:n]),
	}, ""
}

// withoutEndpoint keeps an error's words but not the subscriber's URL or
// host, which the runtime's fetch errors can quote: the origin stores and
// logs the answer, and an endpoint's URL may carry a token.
func withoutEndpoint(msg string, u *url.URL) string {
	for _, s := range []string{u.String(), u.Host, u.Hostname()} {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "<endpoint>")
		}
	}
	return msg
}

// innerError drops the *url.Error wrapper, whose text repeats the URL.
func innerError(err error) string {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return ue.Err.Error()
	}
	return err.Error()
}

// RetryAfter reads a Retry-After value, delta-seconds or any HTTP date form,
// as whole seconds from now (never negative), or nil when there is none or it
// is unreadable. The origin obeys it on 429 and 503, and caps it.
func RetryAfter(v string, now time.Time) *int64 {
	d, ok := retryafter.Parse(v, now)
	if !ok {
		return nil
	}
	s := int64(math.Ceil(d.Seconds()))
	return &s
}

// SubscriberHash names a subscriber in logs without its id: the first 12 hex
// digits of its SHA-256, enough to follow one subscriber through the logs.
func SubscriberHash(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:6])
}

// rejectReason is a log-safe word for why a signature was refused.
func rejectReason(err error) string {
	switch {
	case errors.Is(err, signature.ErrMissingHeaders):
		return "unsigned"
	case errors.Is(err, signature.ErrTooOld), errors.Is(err, signature.ErrTooNew):
		return "outside_window"
	case errors.Is(err, signature.ErrInvalidHeaders):
		return "bad_headers"
	default:
		return "bad_signature"
	}
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, edgewire.Error{Error: edgewire.ErrorDetail{Code: code, Message: message}})
}

// writeJSON sets every header, Content-Length included (the Worker runtime
// then sends a fixed-length body), before the status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"code":"internal","message":"encoding the answer failed"}}`)
	}
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
