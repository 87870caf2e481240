package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/origin/ledger"
)

// A write the ledger could not commit (a full disk) is 503 with a
// Retry-After: nothing was stored and the same request may succeed in a
// moment, which a 500 does not tell a sender.
func TestAFailedWriteIsRetryLater(t *testing.T) {
	t.Parallel()
	s := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	e := echo.New()
	rec := httptest.NewRecorder()
	c := e.NewContext(httptest.NewRequest(http.MethodPost, "/v1/events", nil), rec)
	s.handleError(fmt.Errorf("enqueue: %w", fmt.Errorf("%w: database or disk is full", ledger.ErrWriteFailed)), c)
	var b errorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
		t.Fatal(err)
	}
	if rec.Code != http.StatusServiceUnavailable || b.Error.Code != "unavailable" || rec.Header().Get("Retry-After") != "5" {
		t.Errorf("answer %d %+v, Retry-After %q; want 503 unavailable with Retry-After 5", rec.Code, b.Error, rec.Header().Get("Retry-After"))
	}
	rec = httptest.NewRecorder()
	s.handleError(errors.New("something else"), e.NewContext(httptest.NewRequest(http.MethodGet, "/v1/stats", nil), rec))
	if rec.Code != http.StatusInternalServerError || rec.Header().Get("Retry-After") != "" {
		t.Errorf("another failure: %d, Retry-After %q; want a plain 500", rec.Code, rec.Header().Get("Retry-After"))
	}
}

// A fan-out the ledger refuses for its size is 413, and says what to do.
func TestATooLargeFanOutIs413(t *testing.T) {
	t.Parallel()
	s := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	e := echo.New()
	rec := httptest.NewRecorder()
	c := e.NewContext(httptest.NewRequest(http.MethodPost, "/v1/events/batch", nil), rec)
	s.handleError(fmt.Errorf("the events would fan out to 101000 deliveries; at most 100000 per request: send fewer events at once: %w", ledger.ErrTooLarge), c)
	var b errorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
		t.Fatal(err)
	}
	if rec.Code != http.StatusRequestEntityTooLarge || b.Error.Code != "too_large" || b.Error.Message != "the events would fan out to 101000 deliveries; at most 100000 per request: send fewer events at once" {
		t.Errorf("answer %d %+v; want 413 too_large with the ledger's reason", rec.Code, b.Error)
	}
}
