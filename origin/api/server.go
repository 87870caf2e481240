// Package api is the origin's HTTP API: echo routes over the ledger and the
// dispatcher, bearer-token auth, body limits, and one error table so every
// failure answers {"error": {"code", "message"}} with the right status.
package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/origin/delivery"
	"github.com/sluice-dev/sluice/origin/egress"
	"github.com/sluice-dev/sluice/origin/ledger"
	"github.com/sluice-dev/sluice/origin/statuspage"
)

// Dispatcher is what the API tells about changes, so deliveries start at
// once instead of at the next poll.
type Dispatcher interface {
	Upsert(s ledger.Subscriber)
	ProbeNow(id string)
	Remove(id string)
	Notify(at time.Time, subscriberIDs ...string)
	Snapshot() map[string]delivery.SubscriberSnapshot
	HeldUntil(ds []delivery.Held) []time.Time
}

// Config is what a Server needs.
type Config struct {
	Ledger     *ledger.Ledger
	Dispatcher Dispatcher
	Egress     egress.Policy
	// TokenSHA256 is the SHA-256 of the bearer token for /v1: the server
	// never needs the token itself, so the database keeps only this. All
	// zeros refuses every request.
	TokenSHA256 [32]byte
	MaxBody     int64 // largest event accepted; default 256 KiB
	// EdgeLane is whether an edge lane is configured; without one a
	// subscriber's rate.edge_share shows only when set away from 0.5.
	EdgeLane bool
	Now      func() time.Time
	Rand     io.Reader // secrets and ids; default crypto/rand
	Logger   *slog.Logger
	Metrics  http.Handler // served at /metrics; nil for none
}

// Server holds the API's dependencies.
type Server struct {
	Config
	log *slog.Logger
	// subs serializes changes to subscribers, from the ledger's read to the
	// dispatcher's copy: two PATCHes cannot each undo the other's fields,
	// and the dispatcher hears of changes in the order they committed.
	subs sync.Mutex
}

// Limits the API enforces.
const (
	defaultMaxBody = 256 << 10
	maxBatchEvents = 1000
	// A batch's body is limited to the larger of batchBodyFactor events at
	// the per-event limit and minBatchBody: --max-body limits each event,
	// and 1,000 ordinary events are never refused for their total, while
	// one request still cannot hold 1,000 events at the limit (256 MiB).
	batchBodyFactor = 16
	minBatchBody    = 16 << 20
	defaultPage     = 50
	maxPage         = 1000
)

// BatchBodyLimit is the largest batch body with events of at most maxBody
// bytes each (0: the default).
func BatchBodyLimit(maxBody int64) int64 {
	if maxBody <= 0 {
		maxBody = defaultMaxBody
	}
	return max(maxBody*batchBodyFactor, minBatchBody)
}

// New returns the API as an http.Handler.
func New(cfg Config) *echo.Echo {
	s := &Server{Config: cfg, log: cfg.Logger}
	if s.MaxBody <= 0 {
		s.MaxBody = defaultMaxBody
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.handleError
	e.JSONSerializer = compactJSON{}

	get(e, "/healthz", s.healthz)
	get(e, "/openapi.json", s.openAPI)
	if cfg.Metrics != nil {
		get(e, "/metrics", echo.WrapHandler(cfg.Metrics))
	}
	// The status page is a static shell and needs no token to load; its
	// script sends the token to /v1/stats like any other client.
	page := echo.WrapHandler(statuspage.Handler())
	for _, p := range statuspage.Routes() {
		get(e, p, page)
	}
	e.Pre(decodedPath)
	// The token is checked before routing, so without it every path under
	// /v1, routed or not, answers 401 and tells nothing about the routes.
	e.Pre(s.auth)
	// A group without middleware: echo adds its catch-all 404 routes only
	// for a group's middleware, and those would answer 404 where 405 is due.
	v1 := e.Group("/v1")
	v1.POST("/subscribers", s.createSubscriber)
	get(v1, "/subscribers", s.listSubscribers)
	get(v1, "/subscribers/:id", s.getSubscriber)
	v1.PATCH("/subscribers/:id", s.patchSubscriber)
	v1.DELETE("/subscribers/:id", s.deleteSubscriber)
	v1.POST("/subscribers/:id/rotate-secret", s.rotateSecret)
	v1.POST("/subscribers/:id/recover", s.recoverSubscriber)
	v1.POST("/events", s.postEvent)
	v1.POST("/events/batch", s.postBatch)
	get(v1, "/events/:id", s.getEvent)
	get(v1, "/deliveries", s.listDeliveries)
	get(v1, "/deliveries/:id", s.getDelivery)
	v1.POST("/deliveries/:id/retry", s.retryDelivery)
	get(v1, "/stats", s.stats)
	return e
}

// get routes GET and HEAD to h, as net/http's own mux does: a HEAD gets
// GET's status and headers, and the server drops the body.
func get(r interface {
	GET(string, echo.HandlerFunc, ...echo.MiddlewareFunc) *echo.Route
	HEAD(string, echo.HandlerFunc, ...echo.MiddlewareFunc) *echo.Route
}, path string, h echo.HandlerFunc) {
	r.GET(path, h)
	r.HEAD(path, h)
}

// decodedPath routes on the decoded path. echo routes on the raw one when
// it holds an escape Go would not have written (%3A for ":", as
// encodeURIComponent sends it), and would hand "crm%3Aeu-1" to the handler
// as the id. A path with an encoded slash keeps routing on its raw form,
// where it names nothing: %2F is part of a segment, never a separator
// (DELETE /v1%2Fsubscribers%2Fs1 is no DELETE of s1).
func decodedPath(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		u := c.Request().URL
		if !strings.Contains(strings.ToUpper(u.RawPath), "%2F") {
			u.RawPath = ""
		}
		return next(c)
	}
}

// auth checks the bearer token, in constant time, on every path under /v1.
func (s *Server) auth(next echo.HandlerFunc) echo.HandlerFunc {
	want := s.TokenSHA256
	return func(c echo.Context) error {
		if p := c.Request().URL.Path; p != "/v1" && !strings.HasPrefix(p, "/v1/") {
			return next(c)
		}
		// The scheme's name is case-insensitive (RFC 9110 §11.1).
		scheme, got, ok := strings.Cut(c.Request().Header.Get("Authorization"), " ")
		// Digests of equal length compare in constant time whatever was sent.
		have := sha256.Sum256([]byte(strings.TrimSpace(got)))
		if !ok || !strings.EqualFold(scheme, "Bearer") || want == [32]byte{} || subtle.ConstantTimeCompare(have[:], want[:]) != 1 {
			c.Response().Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
			return fail(http.StatusUnauthorized, "unauthorized", "missing or invalid bearer token")
		}
		return next(c)
	}
}

func (s *Server) healthz(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
	defer cancel()
	if err := s.Ledger.Ping(ctx); err != nil {
		s.log.Warn("health check failed", "err", err)
		return fail(http.StatusServiceUnavailable, "unavailable", "database does not answer")
	}
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

// readBody reads a request body of at most limit bytes (413 beyond).
func readBody(c echo.Context, limit int64) ([]byte, error) {
	r := c.Request()
	// A compressed body would be stored and signed as its compressed
	// bytes, or refused as "not JSON" with no word of why.
	if enc := r.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		return nil, fail(http.StatusUnsupportedMediaType, "unsupported_media_type", "Content-Encoding %s is not accepted: send the body uncompressed", clip(enc))
	}
	if r.ContentLength > limit {
		return nil, fail(http.StatusRequestEntityTooLarge, "too_large", "request body exceeds %d bytes", limit)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, fail(http.StatusRequestTimeout, "timeout", "the body did not arrive in time")
	}
	if err != nil {
		return nil, badRequest("could not read the body")
	}
	if int64(len(body)) > limit {
		return nil, fail(http.StatusRequestEntityTooLarge, "too_large", "request body exceeds %d bytes", limit)
	}
	return body, nil
}

// errEmptyBody answers a body of nothing or only spaces, on every route.
var errEmptyBody = &apiError{http.StatusBadRequest, "invalid_json", "the body is empty; expected a JSON object"}

// decodeStrict reads a JSON object into v, refusing unknown fields,
// fields spelled in another case, repeated fields and trailing data.
func decodeStrict(body []byte, v any) error {
	text := strings.TrimSpace(string(body))
	if len(text) == 0 {
		return errEmptyBody
	}
	if !json.Valid(body) || !utf8.Valid(body) {
		return malformed(body)
	}
	if text[0] != '{' {
		return badRequest("expected a JSON object")
	}
	if err := exactKeys(body, reflect.TypeOf(v)); err != nil {
		return err
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		// A number too big for its field (1e400) is valid JSON with a bad
		// value; a number where a string belongs is the wrong type.
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" && strings.HasPrefix(te.Value, "number ") && te.Type.Kind() == reflect.Float64 {
			return invalid("%s is out of range", te.Field)
		}
		return badRequest("invalid JSON: %s", jsonReason(err))
	}
	return nil
}

// malformed describes a body that is not JSON in UTF-8 with the code the
// event routes use, without echoing it.
func malformed(body []byte) error {
	reason := "not valid UTF-8"
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		reason = jsonReason(err)
	}
	return fail(http.StatusBadRequest, "invalid_json", "invalid JSON: %s", reason)
}

// jsonReason describes a decoding error without echoing the input.
func jsonReason(err error) string {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		if te.Field != "" {
			return te.Field + " must be " + jsonKind(te.Type.Kind().String())
		}
		return "expected a JSON object"
	case errors.As(err, &se):
		return "syntax error at byte " + strconv.FormatInt(se.Offset, 10)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field ")
	case err == io.EOF || err == io.ErrUnexpectedEOF:
		return "unexpected end of input"
	}
	return "malformed"
}

func jsonKind(k string) string {
	switch k {
	case "string":
		return "a string"
	case "slice":
		return "an array"
	case "struct", "map", "ptr":
		return "an object"
	case "bool":
		return "a boolean"
	default:
		return "a number"
	}
}

// compactJSON writes responses without echo's indentation.
type compactJSON struct{}

func (compactJSON) Serialize(c echo.Context, i any, _ string) error {
	// No HTML escaping: an event's body and a subscriber's URL read back
	// as they were sent ("&", not "\u0026"); these answers are JSON, never
	// HTML.
	enc := json.NewEncoder(c.Response())
	enc.SetEscapeHTML(false)
	return enc.Encode(i)
}

func (compactJSON) Deserialize(c echo.Context, i any) error {
	return json.NewDecoder(c.Request().Body).Decode(i)
}

// millis is t as the ledger keeps times, in UTC to the millisecond, so that
// a time from the dispatcher's memory reads like every other timestamp.
func millis(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC().Truncate(time.Millisecond)
}
