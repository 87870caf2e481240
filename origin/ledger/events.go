package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/sluice-dev/sluice/shared/event"
)

// NewEvent is a validated event to enqueue.
type NewEvent struct {
	ID   string
	Type string
	Body []byte
}

// Enqueued is the outcome for one event of an Enqueue call.
type Enqueued struct {
	ID         string
	Duplicate  bool // the id was already in the ledger (or earlier in the same batch)
	Deliveries int  // deliveries created; for a duplicate, the deliveries it already has
}

// EnqueueResult is what an Enqueue committed.
type EnqueueResult struct {
	Events      []Enqueued
	Subscribers map[string]int // new deliveries per subscriber, to wake the dispatcher
}

// Enqueue stores events and fans each new one out to every subscriber whose
// patterns match its type, in one transaction with whatever else shares the
// commit. An id already stored is a duplicate and enqueues nothing. With
// countDuplicates it also reports how many deliveries a duplicate has.
func (l *Ledger) Enqueue(ctx context.Context, events []NewEvent, countDuplicates bool) (EnqueueResult, error) {
	var res EnqueueResult
	err := l.write(ctx, func(ctx context.Context, w *writer) error {
		res = EnqueueResult{Events: make([]Enqueued, len(events)), Subscribers: map[string]int{}}
		now := ms(w.now)
		inserted := make(map[string]int64, len(events))
		args := make([]any, 0, 3*len(events))
		for _, e := range events {
			args = append(args, e.ID, e.Type, e.Body)
		}
		if err := w.insert(ctx, insertEvents, now, args, func(rows *sql.Rows) error {
			var seq int64
			var id string
			if err := rows.Scan(&seq, &id); err != nil {
				return err
			}
			inserted[id] = seq
			return nil
		}); err != nil {
			return err
		}
		type pair struct {
			sub string
			seq int64
		}
		var fan []pair
		for i, e := range events {
			res.Events[i].ID = e.ID
			seq, ok := inserted[e.ID]
			if !ok {
				res.Events[i].Duplicate = true
				continue
			}
			delete(inserted, e.ID) // a later copy in this batch is a duplicate
			for sub, patterns := range l.patterns {
				if event.MatchType(patterns, e.Type) {
					fan = append(fan, pair{sub, seq})
					res.Events[i].Deliveries++
					res.Subscribers[sub]++
				}
			}
		}
		if len(fan) > 0 {
			args := make([]any, 0, 2*len(fan))
			for _, p := range fan {
				args = append(args, p.sub, p.seq)
			}
			if err := w.insert(ctx, insertDeliveries, now, args, nil); err != nil {
				return err
			}
		}
		if countDuplicates {
			for i := range res.Events {
				if res.Events[i].Duplicate {
					if err := w.s.countByEvent.QueryRowContext(ctx, res.Events[i].ID).Scan(&res.Events[i].Deliveries); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
	return res, err
}

func collect(ctx context.Context, c interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, q string, args []any, each func(*sql.Rows) error) error {
	rows, err := c.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// Event returns a stored event and its deliveries.
func (l *Ledger) Event(ctx context.Context, id string) (Event, []Delivery, error) {
	var (
		e       Event
		seq     int64
		created int64
		body    []byte
	)
	err := l.rdb.QueryRowContext(ctx, `SELECT seq, id, type, body, created_at FROM events WHERE id = ?`, id).
		Scan(&seq, &e.ID, &e.Type, &body, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return e, nil, fmt.Errorf("event %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return e, nil, err
	}
	e.Body, e.CreatedAt = body, fromMS(created)
	ds, err := l.queryDeliveries(ctx, `WHERE d.event_seq = ? ORDER BY d.seq`, seq)
	return e, ds, err
}
