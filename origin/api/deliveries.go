package api

import (
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/origin/delivery"
	"github.com/sluice-dev/sluice/origin/ledger"
)

func (s *Server) listDeliveries(c echo.Context) error {
	f := ledger.DeliveryFilter{Limit: defaultPage, SubscriberID: c.QueryParam("subscriber_id")}
	if v := c.QueryParam("status"); v != "" {
		f.Status = ledger.Status(v)
		if !f.Status.Valid() {
			return invalid("status must be pending, inflight, sent or dead")
		}
	}
	limit, err := pageLimit(c)
	if err != nil {
		return err
	}
	f.Limit = limit
	if v := c.QueryParam("cursor"); v != "" {
		seq, ok := ledger.ParseDeliveryID(v)
		if !ok {
			return badRequest("cursor is not one this API gave")
		}
		f.Before = seq
	}
	ds, next, err := s.Ledger.Deliveries(c.Request().Context(), f)
	if err != nil {
		return err
	}
	out := map[string]any{"data": s.held(nonNil(ds))}
	if next > 0 {
		out["next_cursor"] = ledger.DeliveryID(next)
	}
	return c.JSON(http.StatusOK, out)
}

// pageLimit reads a list's limit parameter.
func pageLimit(c echo.Context) (int, error) {
	v := c.QueryParam("limit")
	if v == "" {
		return defaultPage, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, badRequest("limit must be an integer")
	}
	if n < 1 || n > maxPage {
		return 0, invalid("limit must be between 1 and %d", maxPage)
	}
	return n, nil
}

func nonNil(ds []ledger.Delivery) []ledger.Delivery {
	if ds == nil {
		return []ledger.Delivery{}
	}
	return ds
}

func (s *Server) getDelivery(c echo.Context) error {
	d, err := s.Ledger.Delivery(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	d = s.held([]ledger.Delivery{d})[0]
	return c.JSON(http.StatusOK, struct {
		ledger.Delivery
		Attempts []ledger.Attempt `json:"attempts"`
	}{d, d.History})
}

// held moves the next_attempt_at of pending deliveries that a Retry-After
// pause, an open breaker or the subscriber's rate holds to when they may
// go, so the API says when the next attempt can really come rather than a
// time already past.
func (s *Server) held(ds []ledger.Delivery) []ledger.Delivery {
	var idx []int
	var ask []delivery.Held
	for i, d := range ds {
		if d.Status == ledger.StatusPending {
			idx = append(idx, i)
			ask = append(ask, delivery.Held{SubscriberID: d.SubscriberID, EventType: d.EventType})
		}
	}
	if len(ask) == 0 {
		return ds
	}
	for k, until := range s.Dispatcher.HeldUntil(ask) {
		if until = millis(until); until.After(ds[idx[k]].NextAttemptAt) {
			ds[idx[k]].NextAttemptAt = until
		}
	}
	return ds
}

func (s *Server) retryDelivery(c echo.Context) error {
	d, err := s.Ledger.Requeue(c.Request().Context(), c.Param("id"))
	if d.SubscriberID != "" {
		// The requeue committed, even if it could not be read back.
		s.Dispatcher.ProbeNow(d.SubscriberID)
	}
	if err != nil {
		return err
	}
	// Due now, it still waits out a Retry-After pause: the answer says
	// when it can go, as a GET would.
	return c.JSON(http.StatusOK, s.held([]ledger.Delivery{d})[0])
}
