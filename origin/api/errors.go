package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/origin/egress"
	"github.com/sluice-dev/sluice/origin/ledger"
	"github.com/sluice-dev/sluice/shared/event"
)

// apiError is an error with the status and code the API answers with.
type apiError struct {
	status  int
	code    string
	message string
}

func (e *apiError) Error() string { return e.message }

func fail(status int, code, format string, args ...any) error {
	return &apiError{status: status, code: code, message: fmt.Sprintf(format, args...)}
}

// badRequest is for a body or parameter sluice cannot read: bad JSON, a
// missing field, a field of the wrong type.
func badRequest(format string, args ...any) error {
	return fail(http.StatusBadRequest, "bad_request", format, args...)
}

// invalid is for a well-formed field whose value is not acceptable.
func invalid(format string, args ...any) error {
	return fail(http.StatusUnprocessableEntity, "invalid_value", format, args...)
}

// classify maps every error a handler can return to what the client sees:
// one table, so the same failure always answers the same way.
func classify(err error) *apiError {
	var ae *apiError
	var fe *event.FieldError
	var he *echo.HTTPError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &fe):
		if fe.Malformed() {
			return &apiError{http.StatusBadRequest, "bad_request", fe.Error()}
		}
		return &apiError{http.StatusUnprocessableEntity, "invalid_value", fe.Error()}
	case errors.Is(err, event.ErrInvalidJSON):
		return &apiError{http.StatusBadRequest, "invalid_json", "the body is not valid JSON in UTF-8"}
	case errors.Is(err, event.ErrNotObject):
		return &apiError{http.StatusBadRequest, "bad_request", "an event must be a JSON object"}
	case errors.Is(err, egress.ErrForbiddenAddress), errors.Is(err, egress.ErrInvalidURL):
		msg := "url: " + strings.TrimPrefix(err.Error(), "egress: ")
		if errors.Is(err, egress.ErrForbiddenAddress) {
			msg += " (sluice calls internal addresses only when serve has --allow-private-endpoints)"
		}
		return &apiError{http.StatusUnprocessableEntity, "invalid_url", msg}
	case errors.Is(err, ledger.ErrNotFound):
		what := strings.TrimSuffix(err.Error(), ": "+ledger.ErrNotFound.Error())
		return &apiError{http.StatusNotFound, "not_found", clip(what) + ": " + ledger.ErrNotFound.Error()}
	case errors.Is(err, ledger.ErrWriteFailed):
		// A full disk or an I/O error: nothing was stored, and the same
		// request may well succeed in a moment. The cause stays in the log.
		return &apiError{http.StatusServiceUnavailable, "unavailable",
			"the ledger could not store this now (nothing was stored); try again"}
	case errors.Is(err, ledger.ErrTooLarge):
		return &apiError{http.StatusRequestEntityTooLarge, "too_large", strings.TrimSuffix(err.Error(), ": "+ledger.ErrTooLarge.Error())}
	case errors.Is(err, ledger.ErrConflict):
		return &apiError{http.StatusConflict, "conflict", strings.TrimSuffix(err.Error(), ": "+ledger.ErrConflict.Error())}
	case errors.As(err, &he):
		return fromEcho(he)
	}
	return &apiError{http.StatusInternalServerError, "internal", "internal error"}
}

// fromEcho answers echo's own failures (no route, wrong method, body limit)
// in the API's error form.
func fromEcho(he *echo.HTTPError) *apiError {
	switch he.Code {
	case http.StatusNotFound:
		return &apiError{he.Code, "not_found", "no such route"}
	case http.StatusMethodNotAllowed:
		return &apiError{he.Code, "method_not_allowed", "method not allowed on this route"}
	case http.StatusRequestEntityTooLarge:
		return &apiError{he.Code, "too_large", "request body too large"}
	case http.StatusUnauthorized:
		return &apiError{he.Code, "unauthorized", "missing or invalid bearer token"}
	}
	return &apiError{he.Code, "error", http.StatusText(he.Code)}
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// handleError is echo's HTTPErrorHandler: every failure becomes
// {"error": {"code", "message"}} with its status.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	ae := classify(err)
	if ae.status >= http.StatusInternalServerError {
		s.log.Error("request failed", "method", c.Request().Method, "route", c.Path(), "err", err)
	}
	if errors.Is(err, ledger.ErrWriteFailed) {
		c.Response().Header().Set("Retry-After", strconv.Itoa(writeRetryAfter))
	}
	var b errorBody
	b.Error.Code, b.Error.Message = ae.code, ae.message
	if c.Request().Method == http.MethodHead {
		c.NoContent(ae.status)
		return
	}
	c.JSON(ae.status, b)
}

// writeRetryAfter is the Retry-After of a 503 for a write that failed. A
// sender's retry is cheap, and the next batch may well commit (the other
// writes of a batch that one bad op failed will); /healthz meanwhile stays
// 503 for 30 s after the failure, so a balancer moves away.
const writeRetryAfter = 5

// clip cuts text a client sent (an id in a path, say) short enough to send
// back in a message: an id that long names nothing anyway.
func clip(s string) string {
	const most = 100
	if len(s) <= most {
		return s
	}
	return strings.ToValidUTF8(s[:most], "") + "…"
}
