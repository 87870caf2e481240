package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

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

// rowsPerInsert bounds a multi-row INSERT well under SQLite's variable limit.
const rowsPerInsert = 400

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
		for start := 0; start < len(events); start += rowsPerInsert {
			chunk := events[start:min(start+rowsPerInsert, len(events))]
			var q strings.Builder
			q.WriteString(`INSERT INTO events (id, type, body, created_at) VALUES `)
			args := make([]any, 0, 4*len(chunk))
			for i, e := range chunk {
				if i > 0 {
					q.WriteByte(',')
				}
				q.WriteString("(?,?,?,?)")
				args = append(args, e.ID, e.Type, e.Body, now)
			}
			q.WriteString(` ON CONFLICT (id) DO NOTHING RETURNING seq, id`)
			if err := collect(ctx, w.conn, q.String(), args, func(rows *sql.Rows) error {
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
		for start := 0; start < len(fan); start += rowsPerInsert {
			chunk := fan[start:min(start+rowsPerInsert, len(fan))]
			var q strings.Builder
			q.WriteString(`INSERT INTO deliveries (subscriber_id, event_seq, status, next_attempt_at, created_at, updated_at) VALUES `)
			args := make([]any, 0, 3*len(chunk))
			for i, p := range chunk {
				if i > 0 {
					q.WriteByte(',')
				}
				q.WriteString("(?,?,'pending',?2,?2,?2)")
				_ = i
				args = append(args, p.sub, p.seq)
			}
			// Positional ?NNN parameters keep one timestamp for all rows.
			sqlText, sqlArgs := numberParams(q.String(), args, now)
			if _, err := w.conn.ExecContext(ctx, sqlText, sqlArgs...); err != nil {
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

// numberParams rewrites a VALUES list written with "?" for row values and "?2"
// for the shared timestamp into explicit ?N parameters.
func numberParams(q string, args []any, shared any) (string, []any) {
	var b strings.Builder
	b.Grow(len(q) + len(q)/2)
	out := make([]any, 0, len(args)+1)
	out = append(out, shared)
	n := 1
	for i := 0; i < len(q); i++ {
		if q[i] != '?' {
			b.WriteByte(q[i])
			continue
		}
		if i+1 < len(q) && q[i+1] == '2' {
			b.WriteString("?1")
			i++
			continue
		}
		n++
		fmt.Fprintf(&b, "?%d", n)
		out = append(out, args[n-2])
	}
	return b.String(), out
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
