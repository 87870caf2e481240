package api

import (
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/origin/ledger"
	"github.com/sluice-dev/sluice/shared/event"
)

func (s *Server) newEventID() string { return event.NewID("evt", s.Now(), s.random()) }

func (s *Server) postEvent(c echo.Context) error {
	body, err := readBody(c, s.MaxBody)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return errEmptyBody
	}
	p, err := event.Parse(body, s.newEventID)
	if err != nil {
		return err
	}
	res, err := s.Ledger.Enqueue(c.Request().Context(), []ledger.NewEvent{{ID: p.ID, Type: p.Type, Body: p.Body}})
	if err != nil {
		return err
	}
	s.wake(res)
	e := res.Events[0]
	status := http.StatusAccepted
	if e.Duplicate {
		status = http.StatusOK
	}
	return c.JSON(status, map[string]any{"id": e.ID, "deliveries": e.Deliveries, "duplicate": e.Duplicate})
}

func (s *Server) postBatch(c echo.Context) error {
	body, err := readBody(c, BatchBodyLimit(s.MaxBody))
	if err != nil {
		return err
	}
	var in struct {
		Events *[]json.RawMessage `json:"events"`
	}
	if err := decodeStrict(body, &in); err != nil {
		return err
	}
	if in.Events == nil {
		return badRequest("events is required: {\"events\": [...]}")
	}
	raw := *in.Events
	if len(raw) == 0 {
		return invalid("events must hold at least one event")
	}
	if len(raw) > maxBatchEvents {
		return fail(http.StatusRequestEntityTooLarge, "too_large", "a batch holds at most %d events, got %d", maxBatchEvents, len(raw))
	}
	events := make([]ledger.NewEvent, len(raw))
	for i, r := range raw {
		if int64(len(r)) > s.MaxBody {
			return fail(http.StatusRequestEntityTooLarge, "too_large", "events[%d] exceeds %d bytes", i, s.MaxBody)
		}
		p, err := event.Parse(r, s.newEventID)
		if err != nil {
			ae := classify(err)
			return fail(ae.status, ae.code, "events[%d]: %s", i, ae.message)
		}
		events[i] = ledger.NewEvent{ID: p.ID, Type: p.Type, Body: p.Body}
	}
	res, err := s.Ledger.Enqueue(c.Request().Context(), events)
	if err != nil {
		return err
	}
	s.wake(res)
	var accepted, dups, deliveries int
	for _, e := range res.Events {
		if e.Duplicate {
			dups++
		} else {
			accepted++
			deliveries += e.Deliveries
		}
	}
	return c.JSON(http.StatusAccepted, map[string]int{"accepted": accepted, "duplicates": dups, "deliveries": deliveries})
}

// wake tells the dispatcher which subscribers just got work.
func (s *Server) wake(res ledger.EnqueueResult) {
	if len(res.Subscribers) == 0 {
		return
	}
	ids := make([]string, 0, len(res.Subscribers))
	for id := range res.Subscribers {
		ids = append(ids, id)
	}
	s.Dispatcher.Notify(s.Now(), ids...)
}

func (s *Server) getEvent(c echo.Context) error {
	e, ds, err := s.Ledger.Event(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	ds = s.held(nonNil(ds))
	return c.JSON(http.StatusOK, map[string]any{
		"id": e.ID, "type": e.Type, "created_at": e.CreatedAt, "body": e.Body, "deliveries": ds,
	})
}
