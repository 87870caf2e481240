package ledger

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// DeliveryID is the public id of the delivery with sequence number seq.
func DeliveryID(seq int64) string { return "dlv_" + strconv.FormatInt(seq, 10) }

// ParseDeliveryID returns the sequence number of a public delivery id.
func ParseDeliveryID(id string) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimPrefix(id, "dlv_"), 10, 64)
	// Only the spelling DeliveryID gives: dlv_013 or dlv_+13 would be a
	// second name for dlv_13.
	return n, err == nil && n > 0 && id == DeliveryID(n)
}

// ClaimRequest asks for up to Max deliveries of one subscriber due at Now.
type ClaimRequest struct {
	SubscriberID string
	Max          int
	Now          time.Time
	LeaseUntil   time.Time
}

// Claimed is a delivery taken for an attempt, with what sending it needs.
type Claimed struct {
	Seq          int64
	SubscriberID string
	EventID      string
	EventType    string
	Body         []byte
	Attempts     int // attempts made before this one
	BudgetFrom   int // attempts made before the last requeue; the budget counts from here
	Deferrals    int
	CreatedAt    time.Time
	// Due is when it fell due (its next_attempt_at when claimed): a
	// deferral puts it back there, so it keeps its place among the
	// subscriber's due deliveries.
	Due time.Time

	eventSeq int64
}

// ID is the delivery's public id.
func (c *Claimed) ID() string { return DeliveryID(c.Seq) }

// ClaimResult is what one ClaimRequest got.
type ClaimResult struct {
	Deliveries []Claimed
	// NextDue is when the subscriber's earliest pending delivery falls due;
	// zero when it has none. Known only when fewer than Max were claimed
	// (otherwise more may be due now).
	NextDue time.Time
	Drained bool // fewer than Max were due: NextDue is exact
}

// Claim moves due deliveries to inflight for each request, in one commit.
// Each request reads its due deliveries with their events in one query and
// marks them in one update: cheaper than an UPDATE … RETURNING, which SQLite
// answers from a temporary table, followed by a second read for the bodies.
func (l *Ledger) Claim(ctx context.Context, reqs []ClaimRequest) ([]ClaimResult, error) {
	out := make([]ClaimResult, len(reqs))
	err := l.writeUrgent(ctx, func(ctx context.Context, w *writer) error {
		for i, r := range reqs {
			res := &out[i]
			*res = ClaimResult{}
			if _, ok := l.patterns[r.SubscriberID]; !ok || r.Max <= 0 {
				res.Drained = true
				continue
			}
			var seqs []int64
			err := collectStmt(ctx, w.s.due, []any{r.SubscriberID, ms(r.Now), r.Max}, func(rows *sql.Rows) error {
				c := Claimed{SubscriberID: r.SubscriberID}
				var created, due int64
				if err := rows.Scan(&c.Seq, &c.eventSeq, &c.Attempts, &c.BudgetFrom, &c.Deferrals, &created, &due,
					&c.EventID, &c.EventType, &c.Body); err != nil {
					return err
				}
				c.CreatedAt, c.Due = fromMS(created), fromMS(due)
				res.Deliveries = append(res.Deliveries, c)
				seqs = append(seqs, c.Seq)
				return nil
			})
			if err != nil {
				return err
			}
			if len(seqs) > 0 {
				js, _ := json.Marshal(seqs)
				if _, err := w.s.claim.ExecContext(ctx, ms(r.LeaseUntil), ms(w.now), string(js)); err != nil {
					return err
				}
				// Attempt oldest first.
				sort.Slice(res.Deliveries, func(a, b int) bool { return res.Deliveries[a].Seq < res.Deliveries[b].Seq })
			}
			if len(res.Deliveries) < r.Max {
				res.Drained = true
				var next sql.NullInt64
				if err := w.s.nextDue.QueryRowContext(ctx, r.SubscriberID).Scan(&next); err != nil {
					return err
				}
				if next.Valid {
					res.NextDue = fromMS(next.Int64)
				}
			}
		}
		return nil
	})
	return out, err
}

// collectStmt is collect for a prepared statement.
func collectStmt(ctx context.Context, st *sql.Stmt, args []any, each func(*sql.Rows) error) error {
	rows, err := st.QueryContext(ctx, args...)
	return eachRow(rows, err, each)
}

// Result is the outcome of one claimed delivery, ready to record.
type Result struct {
	Seq          int64
	SubscriberID string
	// Attempt is nil for a deferral (the edge lane had no token) or a
	// release (claimed but never sent): the delivery goes back to pending
	// at NextAttemptAt without spending an attempt.
	Attempt  *Attempt
	Released bool // a release rather than a deferral: nothing is counted
	// Unknown marks an attempt whose outcome is not known (shutdown cut it
	// off): it is kept in the history, but it spends no attempt of the
	// budget and is not a failure in the stats; the delivery goes back to
	// pending at NextAttemptAt.
	Unknown       bool
	Status        Status // sent, pending (retry) or dead
	NextAttemptAt time.Time
	EnqueuedAt    time.Time // when the delivery was created, for the stats window's latency
}

// Record writes attempt outcomes and the subscriber states they changed, in
// one commit with whatever else shares it.
func (l *Ledger) Record(ctx context.Context, results []Result, states []SubscriberState) error {
	return l.write(ctx, func(ctx context.Context, w *writer) error {
		now := ms(w.now)
		var sent []int64
		var rows []Result
		for _, r := range results {
			if _, ok := l.patterns[r.SubscriberID]; !ok || r.Seq <= l.bornAfter[r.SubscriberID] {
				continue // removed while the attempt ran (and perhaps created again)
			}
			rows = append(rows, r)
		}
		var args []any
		sentBy := map[string]int64{}
		entries := make([]windowEntry, 0, len(rows))
		for _, r := range rows {
			a := r.Attempt
			if a == nil {
				continue
			}
			if !r.Unknown {
				e := windowEntry{subscriber: r.SubscriberID, attempt: true,
					success: a.Error == "" && a.StatusCode >= 200 && a.StatusCode < 300}
				if r.Status == StatusSent && !r.EnqueuedAt.IsZero() {
					e.delivered, e.latency = true, w.now.Sub(r.EnqueuedAt)
				}
				entries = append(entries, e)
			}
			var ra any
			if a.RetryAfterMS != nil {
				ra = *a.RetryAfterMS
			}
			args = append(args, r.Seq, a.Number, r.SubscriberID, ms(a.At), string(a.Lane), a.StatusCode,
				a.Error, a.DurationMS, ra, a.Response)
		}
		if err := w.insert(ctx, insertAttempts, args, nil); err != nil {
			return err
		}
		for _, r := range rows {
			var err error
			switch {
			case r.Released:
				_, err = w.s.release.ExecContext(ctx, ms(r.NextAttemptAt), now, r.Seq)
			case r.Attempt == nil:
				_, err = w.s.defer_.ExecContext(ctx, ms(r.NextAttemptAt), now, r.Seq)
			case r.Unknown:
				_, err = w.s.unknown.ExecContext(ctx, ms(r.NextAttemptAt), now, r.Attempt.summary(), r.Seq)
			case r.Status == StatusSent:
				sent = append(sent, r.Seq)
				sentBy[r.SubscriberID]++
			case r.Status == StatusDead:
				_, err = w.s.markDead.ExecContext(ctx, now, r.Attempt.summary(), r.Seq)
			default:
				_, err = w.s.reschedule.ExecContext(ctx, ms(r.NextAttemptAt), now, r.Attempt.summary(), r.Seq)
			}
			if err != nil {
				return err
			}
		}
		if len(sent) > 0 {
			js, _ := json.Marshal(sent)
			res, err := w.s.markSent.ExecContext(ctx, now, string(js))
			if err != nil {
				return err
			}
			marked, err := res.RowsAffected()
			exact := err == nil && marked == int64(len(sent))
			// After the commit, with it: Counts must never see the marks
			// in the totals and the rows still in flight.
			w.after = append(w.after, func() { l.addSent(sentBy, exact) })
		}
		w.after = append(w.after, func() { l.window.add(w.now, entries) })
		for _, s := range states {
			if _, ok := l.patterns[s.ID]; !ok {
				continue
			}
			if _, err := w.s.saveState.ExecContext(ctx, ms(s.PausedUntil), string(s.Breaker.State), s.Breaker.Failures,
				ms(s.Breaker.OpenedAt), s.ID); err != nil {
				return err
			}
		}
		return nil
	})
}

// summary is the one-line reason kept on the delivery for its last failure.
func (a *Attempt) summary() string {
	switch {
	case a.Error != "" && a.StatusCode != 0:
		return fmt.Sprintf("HTTP %d: %s", a.StatusCode, a.Error)
	case a.Error != "":
		return a.Error
	default:
		return fmt.Sprintf("HTTP %d", a.StatusCode)
	}
}

// Requeue puts a dead or pending delivery back to run now with a fresh
// attempt budget. ErrConflict if it is in flight or already sent.
func (l *Ledger) Requeue(ctx context.Context, id string) (Delivery, error) {
	seq, ok := ParseDeliveryID(id)
	if !ok {
		return Delivery{}, fmt.Errorf("delivery %s: %w", id, ErrNotFound)
	}
	var subID string
	err := l.write(ctx, func(ctx context.Context, w *writer) error {
		var status string
		err := w.conn.QueryRowContext(ctx, `SELECT status, subscriber_id FROM deliveries WHERE seq = ?`, seq).Scan(&status, &subID)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("delivery %s: %w", id, ErrNotFound)
		}
		if err != nil {
			return err
		}
		if s := Status(status); s != StatusDead && s != StatusPending {
			return fmt.Errorf("delivery %s is %s; only dead or pending deliveries can be retried: %w", id, s, ErrConflict)
		}
		_, err = w.conn.ExecContext(ctx, `UPDATE deliveries SET status = 'pending', budget_from = attempts, next_attempt_at = ?1,
			dead_at = NULL, updated_at = ?1 WHERE seq = ?2`, ms(w.now), seq)
		return err
	})
	if err != nil {
		return Delivery{}, err
	}
	d, err := l.Delivery(ctx, id)
	if err != nil {
		// Committed all the same (a caller that left, say): it must still
		// learn whose delivery is due, to wake the dispatcher.
		return Delivery{ID: id, SubscriberID: subID, Status: StatusPending}, err
	}
	return d, nil
}

// Recover requeues every dead delivery of a subscriber that died at or after
// since, with fresh attempt budgets, and returns how many.
func (l *Ledger) Recover(ctx context.Context, subscriberID string, since time.Time) (int, error) {
	var n int64
	err := l.write(ctx, func(ctx context.Context, w *writer) error {
		if _, ok := l.patterns[subscriberID]; !ok {
			return fmt.Errorf("subscriber %s: %w", subscriberID, ErrNotFound)
		}
		r, err := w.conn.ExecContext(ctx, `UPDATE deliveries SET status = 'pending', budget_from = attempts, next_attempt_at = ?1,
			dead_at = NULL, updated_at = ?1 WHERE subscriber_id = ?2 AND status = 'dead' AND dead_at >= ?3`,
			ms(w.now), subscriberID, since.UnixMilli())
		if err != nil {
			return err
		}
		n, err = r.RowsAffected()
		return err
	})
	return int(n), err
}

const deliveryColumns = `d.seq, e.id, e.type, d.subscriber_id, d.status, d.attempts, d.deferrals, d.next_attempt_at,
	d.created_at, d.updated_at, d.sent_at, d.dead_at, d.last_error`

func (l *Ledger) queryDeliveries(ctx context.Context, where string, args ...any) ([]Delivery, error) {
	rows, err := l.rdb.QueryContext(ctx, `SELECT `+deliveryColumns+` FROM deliveries d JOIN events e ON e.seq = d.event_seq `+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Delivery
	for rows.Next() {
		var (
			d                  Delivery
			status             string
			next, created, upd int64
			sent, dead         sql.NullInt64
		)
		if err := rows.Scan(&d.seq, &d.EventID, &d.EventType, &d.SubscriberID, &status, &d.Attempts, &d.Deferrals,
			&next, &created, &upd, &sent, &dead, &d.LastError); err != nil {
			return nil, err
		}
		d.ID, d.Status = DeliveryID(d.seq), Status(status)
		d.CreatedAt, d.UpdatedAt = fromMS(created), fromMS(upd)
		if d.Status == StatusPending {
			d.NextAttemptAt = fromMS(next)
		}
		if sent.Valid {
			t := fromMS(sent.Int64)
			d.SentAt = &t
		}
		if dead.Valid {
			t := fromMS(dead.Int64)
			d.DeadAt = &t
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// Delivery returns one delivery with its whole attempt history.
func (l *Ledger) Delivery(ctx context.Context, id string) (Delivery, error) {
	seq, ok := ParseDeliveryID(id)
	if !ok {
		return Delivery{}, fmt.Errorf("delivery %s: %w", id, ErrNotFound)
	}
	ds, err := l.queryDeliveries(ctx, `WHERE d.seq = ?`, seq)
	if err != nil {
		return Delivery{}, err
	}
	if len(ds) == 0 {
		return Delivery{}, fmt.Errorf("delivery %s: %w", id, ErrNotFound)
	}
	d := ds[0]
	d.History = []Attempt{}
	err = collect(ctx, l.rdb, `SELECT number, at, lane, status_code, error, duration_ms, retry_after_ms, response
		FROM attempts WHERE delivery_seq = ? ORDER BY number`, []any{seq}, func(rows *sql.Rows) error {
		var a Attempt
		var at int64
		var lane string
		var ra sql.NullInt64
		if err := rows.Scan(&a.Number, &at, &lane, &a.StatusCode, &a.Error, &a.DurationMS, &ra, &a.Response); err != nil {
			return err
		}
		a.At, a.Lane = fromMS(at), Lane(lane)
		if ra.Valid {
			a.RetryAfterMS = &ra.Int64
		}
		d.History = append(d.History, a)
		return nil
	})
	return d, err
}

// DeliveryFilter selects a page of deliveries, newest first.
type DeliveryFilter struct {
	Status       Status
	SubscriberID string
	Limit        int
	Before       int64 // the cursor: only deliveries with a smaller seq
}

// Deliveries returns a page and the cursor of the next one (0 on the last page).
func (l *Ledger) Deliveries(ctx context.Context, f DeliveryFilter) ([]Delivery, int64, error) {
	var conds []string
	var args []any
	if f.SubscriberID != "" {
		conds, args = append(conds, "d.subscriber_id = ?"), append(args, f.SubscriberID)
	}
	if f.Status != "" {
		conds, args = append(conds, "d.status = ?"), append(args, string(f.Status))
	}
	if f.Before > 0 {
		conds, args = append(conds, "d.seq < ?"), append(args, f.Before)
	}
	where := ""
	if len(conds) > 0 {
		where = "WHERE " + strings.Join(conds, " AND ")
	}
	ds, err := l.queryDeliveries(ctx, where+" ORDER BY d.seq DESC LIMIT ?", append(args, f.Limit+1)...)
	if err != nil {
		return nil, 0, err
	}
	var next int64
	if len(ds) > f.Limit {
		ds = ds[:f.Limit]
		next = ds[len(ds)-1].seq
	}
	return ds, next, nil
}
