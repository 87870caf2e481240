package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"time"

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
	Events []Enqueued
	// Subscribers counts the new pending deliveries per subscriber, to wake
	// the dispatcher; deliveries handed straight to it are not among them.
	Subscribers map[string]int
}

// Admitter lets a new delivery skip the claim. Asked inside the enqueue's
// transaction, it reserves room for up to n of a subscriber's new
// deliveries, which the ledger then inserts already in flight; after the
// commit it receives them (Handoff), or its reservations back if the
// transaction failed (Unadmit). Admit and Handoff run in the write loop:
// keep them quick, and never wait there for a write.
type Admitter interface {
	Admit(subscriberID string, n int, now time.Time) (admitted int, leaseUntil time.Time)
	Handoff(claimed []Claimed)
	Unadmit(reserved map[string]int)
}

// fanOut counts the deliveries events would create if none were stored yet
// (an id repeated in events counts once), or 0 when that cannot exceed
// MaxFanOut.
func (l *Ledger) fanOut(events []NewEvent) int {
	if len(events)*len(l.patterns) <= MaxFanOut {
		return 0 // within the bound whatever matches
	}
	n := 0
	seen := make(map[string]bool, len(events))
	for _, e := range events {
		if seen[e.ID] {
			continue
		}
		seen[e.ID] = true
		for _, patterns := range l.patterns {
			if event.MatchType(patterns, e.Type) {
				n++
			}
		}
	}
	return n
}

// MaxFanOut is the most deliveries one Enqueue may create. The write loop
// is single, so one request fanning out to millions of rows (1,000 events
// to 5,000 catch-all subscribers) would hold every other enqueue and every
// outcome behind it for minutes, with the rows held in memory meanwhile;
// at this size the commit takes about a second.
const MaxFanOut = 100_000

// oneByOne is how many in-flight deliveries an enqueue inserts a row at a
// time rather than in one statement with RETURNING.
const oneByOne = 4

// SetAdmitter installs the dispatcher's hand-off; call before any Enqueue.
func (l *Ledger) SetAdmitter(a Admitter) { l.admitter = a }

// Enqueue stores events and fans each new one out to every subscriber whose
// patterns match its type, in one transaction with whatever else shares the
// commit. An id already stored is a duplicate and enqueues nothing: its
// Deliveries is 0, the count this call enqueued.
func (l *Ledger) Enqueue(ctx context.Context, events []NewEvent) (EnqueueResult, error) {
	var (
		res      EnqueueResult
		reserved map[string]int
		handoff  []Claimed
	)
	err := l.write(ctx, func(ctx context.Context, w *writer) error {
		res = EnqueueResult{Events: make([]Enqueued, len(events)), Subscribers: map[string]int{}}
		reserved, handoff = map[string]int{}, nil
		// Checked before any write, so a refusal leaves the batch intact.
		// Events already stored count too: the bound needs no read.
		if n := l.fanOut(events); n > MaxFanOut {
			advice := "send fewer events at once"
			if len(events) == 1 {
				advice = "narrow the subscribers' event types"
			}
			return fmt.Errorf("the events would fan out to %d deliveries; at most %d per request: %s: %w",
				n, MaxFanOut, advice, ErrTooLarge)
		}
		now := ms(w.now)
		inserted := make(map[string]int64, len(events))
		if len(events) == 1 {
			e := events[0]
			seq, ok, err := w.insertOne(ctx, insertEvents, e.ID, e.Type, e.Body, now)
			if err != nil {
				return err
			}
			if ok {
				inserted[e.ID] = seq
			}
		} else {
			args := make([]any, 0, insertEvents.perRow*len(events))
			for _, e := range events {
				args = append(args, e.ID, e.Type, e.Body, now)
			}
			if err := w.insert(ctx, insertEvents, args, func(rows *sql.Rows) error {
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
			sub   string
			seq   int64
			event int // index in events
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
					fan = append(fan, pair{sub, seq, i})
					res.Events[i].Deliveries++
					res.Subscribers[sub]++
				}
			}
		}
		// Offer each subscriber its new deliveries, oldest first; what it
		// admits goes in already in flight.
		var pending, inflight []any
		byEvent := map[int64]int{}
		leases := map[string]time.Time{}
		if l.admitter != nil {
			for sub, n := range res.Subscribers {
				if a, lease := l.admitter.Admit(sub, n, w.now); a > 0 {
					reserved[sub], leases[sub] = a, lease
				}
			}
		}
		taken := map[string]int{}
		for _, p := range fan {
			if taken[p.sub] < reserved[p.sub] {
				taken[p.sub]++
				inflight = append(inflight, p.sub, p.seq, now, now, now, ms(leases[p.sub]))
				byEvent[p.seq] = p.event
				res.Subscribers[p.sub]--
				continue
			}
			pending = append(pending, p.sub, p.seq, now, now, now)
		}
		for sub, n := range res.Subscribers {
			if n == 0 {
				delete(res.Subscribers, sub)
			}
		}
		hand := func(seq int64, sub string, eventSeq int64) {
			e := events[byEvent[eventSeq]]
			handoff = append(handoff, Claimed{Seq: seq, SubscriberID: sub, eventSeq: eventSeq,
				EventID: e.ID, EventType: e.Type, Body: e.Body, CreatedAt: w.now, Due: w.now})
		}
		if n := len(inflight) / insertInflight.perRow; n > 0 && n <= oneByOne {
			for i := 0; i < len(inflight); i += insertInflight.perRow {
				row := inflight[i : i+insertInflight.perRow]
				seq, _, err := w.insertOne(ctx, insertInflight, row...)
				if err != nil {
					return err
				}
				hand(seq, row[0].(string), row[1].(int64))
			}
		} else if n > 0 {
			if err := w.insert(ctx, insertInflight, inflight, func(rows *sql.Rows) error {
				var seq, eventSeq int64
				var sub string
				if err := rows.Scan(&seq, &sub, &eventSeq); err != nil {
					return err
				}
				hand(seq, sub, eventSeq)
				return nil
			}); err != nil {
				return err
			}
		}
		// The pending rows after the ones handed over, which come first in
		// each subscriber's order: their seqs then follow the events'
		// order, and a handed-over delivery that goes back to pending
		// (a failed lane) sorts before its newer siblings on a tie.
		if len(pending) > 0 {
			if err := w.insert(ctx, insertDeliveries, pending, nil); err != nil {
				return err
			}
		}
		if l.admitter != nil && len(handoff) > 0 {
			// Hand over from the write loop as soon as the batch commits,
			// not once this caller's goroutine is scheduled again.
			taken := handoff
			w.after = append(w.after, func() {
				sort.Slice(taken, func(i, j int) bool { return taken[i].Seq < taken[j].Seq })
				l.admitter.Handoff(taken)
			})
		}
		return nil
	})
	if l.admitter != nil && err != nil {
		l.admitter.Unadmit(reserved)
	}
	return res, err
}

// collect runs q and calls each for every row.
func collect(ctx context.Context, c querier, q string, args []any, each func(*sql.Rows) error) error {
	rows, err := c.QueryContext(ctx, q, args...)
	return eachRow(rows, err, each)
}

// eachRow calls each for every row of a query's answer, then closes it.
func eachRow(rows *sql.Rows, err error, each func(*sql.Rows) error) error {
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
