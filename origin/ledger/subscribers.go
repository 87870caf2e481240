package ledger

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/sluice-dev/sluice/origin/breaker"
)

const subscriberColumns = `id, url, event_types, rate_per_second, rate_burst, rate_burst_given, edge_share, max_attempts, timeout_ms,
	secret, previous_secrets, paused, paused_until, breaker_state, breaker_failures,
	breaker_opened_at, created_at, updated_at`

type scanner interface{ Scan(dest ...any) error }

func scanSubscriber(row scanner) (Subscriber, error) {
	var (
		s                                   Subscriber
		types, previous                     string
		pausedUntil, openedAt, created, upd int64
		paused                              bool
		state                               string
	)
	err := row.Scan(&s.ID, &s.URL, &types, &s.Rate.PerSecond, &s.Rate.Burst, &s.Rate.BurstGiven, &s.Rate.EdgeShare, &s.MaxAttempts,
		&s.TimeoutMS, &s.Secret, &previous, &paused, &pausedUntil, &state,
		&s.Breaker.Failures, &openedAt, &created, &upd)
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal([]byte(types), &s.EventTypes); err != nil {
		return s, fmt.Errorf("subscriber %s event types: %w", s.ID, err)
	}
	if s.Previous, err = decodePrevious(previous); err != nil {
		return s, fmt.Errorf("subscriber %s previous secrets: %w", s.ID, err)
	}
	s.Paused = paused
	s.PausedUntil = fromMS(pausedUntil)
	s.Breaker.State = breaker.State(state)
	s.Breaker.OpenedAt = fromMS(openedAt)
	s.CreatedAt, s.UpdatedAt = fromMS(created), fromMS(upd)
	return s, nil
}

// storedSecret is a PreviousSecret as the previous_secrets column holds it.
type storedSecret struct {
	Secret  string `json:"secret"`
	UntilMS int64  `json:"until_ms"`
}

func decodePrevious(text string) ([]PreviousSecret, error) {
	var stored []storedSecret
	if err := json.Unmarshal([]byte(text), &stored); err != nil {
		return nil, err
	}
	out := make([]PreviousSecret, 0, len(stored))
	for _, p := range stored {
		out = append(out, PreviousSecret{Secret: p.Secret, Until: fromMS(p.UntilMS)})
	}
	return out, nil
}

func encodePrevious(ps []PreviousSecret) string {
	stored := make([]storedSecret, 0, len(ps))
	for _, p := range ps {
		stored = append(stored, storedSecret{Secret: p.Secret, UntilMS: ms(p.Until)})
	}
	b, _ := json.Marshal(stored)
	return string(b)
}

// Subscribers returns every subscriber, oldest first.
func (l *Ledger) Subscribers(ctx context.Context) ([]Subscriber, error) {
	return l.querySubscribers(ctx, `ORDER BY created_at, id`)
}

// SubscriberPage returns up to limit subscribers by id after the cursor
// (an id; "" for the first page) and the cursor of the next page ("" on the
// last).
func (l *Ledger) SubscriberPage(ctx context.Context, after string, limit int) ([]Subscriber, string, error) {
	out, err := l.querySubscribers(ctx, `WHERE id > ? ORDER BY id LIMIT ?`, after, limit+1)
	if err != nil || len(out) <= limit {
		return out, "", err
	}
	out = out[:limit]
	return out, out[limit-1].ID, nil
}

func (l *Ledger) querySubscribers(ctx context.Context, tail string, args ...any) ([]Subscriber, error) {
	rows, err := l.rdb.QueryContext(ctx, `SELECT `+subscriberColumns+` FROM subscribers `+tail, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Subscriber
	for rows.Next() {
		s, err := scanSubscriber(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// Subscriber returns one subscriber or ErrNotFound.
func (l *Ledger) Subscriber(ctx context.Context, id string) (Subscriber, error) {
	s, err := scanSubscriber(l.rdb.QueryRowContext(ctx, `SELECT `+subscriberColumns+` FROM subscribers WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return s, fmt.Errorf("subscriber %s: %w", id, ErrNotFound)
	}
	return s, err
}

func getSubscriber(ctx context.Context, w *writer, id string) (Subscriber, error) {
	s, err := scanSubscriber(w.conn.QueryRowContext(ctx, `SELECT `+subscriberColumns+` FROM subscribers WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return s, fmt.Errorf("subscriber %s: %w", id, ErrNotFound)
	}
	return s, err
}

// CreateSubscriber stores s, stamping its times; ErrConflict if the id is taken.
func (l *Ledger) CreateSubscriber(ctx context.Context, s *Subscriber) error {
	return l.write(ctx, func(ctx context.Context, w *writer) error {
		var n int
		if err := w.conn.QueryRowContext(ctx, `SELECT count(*) FROM subscribers WHERE id = ?`, s.ID).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("subscriber %s already exists: %w", s.ID, ErrConflict)
		}
		// Stored in milliseconds: answer what a later read will show.
		s.CreatedAt, s.UpdatedAt = fromMS(ms(w.now)), fromMS(ms(w.now))
		if s.Breaker.State == "" {
			s.Breaker.State = breaker.Closed
		}
		types, _ := json.Marshal(s.EventTypes)
		_, err := w.conn.ExecContext(ctx, `INSERT INTO subscribers (id, url, event_types, rate_per_second, rate_burst,
			rate_burst_given, edge_share, max_attempts, timeout_ms, secret, paused, breaker_state, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			s.ID, s.URL, string(types), s.Rate.PerSecond, s.Rate.Burst, s.Rate.BurstGiven, s.Rate.EdgeShare, s.MaxAttempts, s.TimeoutMS,
			s.Secret, s.Paused, string(s.Breaker.State), ms(w.now), ms(w.now))
		if err != nil {
			return err
		}
		var last int64 // no row when no delivery was ever made
		err = w.conn.QueryRowContext(ctx, `SELECT seq FROM sqlite_sequence WHERE name = 'deliveries'`).Scan(&last)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		l.patterns[s.ID] = s.EventTypes
		l.setBornAfter(w, s.ID, last, true)
		return nil
	})
}

// UpdateSubscriber applies change to the stored subscriber and saves the
// fields an operator may change (url, types, rate, limits, paused, secrets).
// change must not fail: validate before calling. A change that changes
// nothing writes nothing, and updated_at stays.
func (l *Ledger) UpdateSubscriber(ctx context.Context, id string, change func(*Subscriber)) (Subscriber, error) {
	var out Subscriber
	err := l.write(ctx, func(ctx context.Context, w *writer) error {
		s, err := getSubscriber(ctx, w, id)
		if err != nil {
			return err
		}
		before := s
		before.EventTypes, before.Previous = slices.Clone(s.EventTypes), slices.Clone(s.Previous)
		change(&s)
		if reflect.DeepEqual(before, s) {
			out = s
			return nil
		}
		s.UpdatedAt = fromMS(ms(w.now))
		if s.URL != before.URL {
			// Failures at the old URL say nothing of the new one; the
			// dispatcher clears its breaker too (Upsert).
			s.Breaker = breaker.Breaker{State: breaker.Closed}
			if _, err := w.conn.ExecContext(ctx, `UPDATE subscribers SET breaker_state = 'closed', breaker_failures = 0,
				breaker_opened_at = 0 WHERE id = ?`, id); err != nil {
				return err
			}
		}
		types, _ := json.Marshal(s.EventTypes)
		_, err = w.conn.ExecContext(ctx, `UPDATE subscribers SET url = ?, event_types = ?, rate_per_second = ?,
			rate_burst = ?, rate_burst_given = ?, edge_share = ?, max_attempts = ?, timeout_ms = ?, secret = ?,
			previous_secrets = ?, paused = ?, updated_at = ? WHERE id = ?`,
			s.URL, string(types), s.Rate.PerSecond, s.Rate.Burst, s.Rate.BurstGiven, s.Rate.EdgeShare, s.MaxAttempts, s.TimeoutMS,
			s.Secret, encodePrevious(s.Previous), s.Paused, ms(w.now), id)
		if err == nil {
			l.patterns[id] = s.EventTypes
			out = s
		}
		return err
	})
	return out, err
}

// DeleteSubscriber removes a subscriber with its deliveries and their
// attempts. Deliveries leave the ledger this way, or by retention once sent (Prune).
func (l *Ledger) DeleteSubscriber(ctx context.Context, id string) error {
	return l.write(ctx, func(ctx context.Context, w *writer) error {
		if _, ok := l.patterns[id]; !ok {
			return fmt.Errorf("subscriber %s: %w", id, ErrNotFound)
		}
		for _, q := range []string{
			`DELETE FROM attempts WHERE subscriber_id = ?`,
			`DELETE FROM deliveries WHERE subscriber_id = ?`,
			`DELETE FROM subscribers WHERE id = ?`,
		} {
			if _, err := w.conn.ExecContext(ctx, q, id); err != nil {
				return err
			}
		}
		delete(l.patterns, id)
		l.setBornAfter(w, id, 0, false)
		w.after = append(w.after, func() { l.forgetSubscriber(id) })
		return nil
	})
}

// setBornAfter sets (or, when !set, clears) id's bornAfter within w's
// batch, and puts it back should the batch roll back: a value left by a
// create that never committed would skip the outcomes of the subscriber
// that is still there.
func (l *Ledger) setBornAfter(w *writer, id string, seq int64, set bool) {
	prev, had := l.bornAfter[id]
	if set {
		l.bornAfter[id] = seq
	} else {
		delete(l.bornAfter, id)
	}
	w.undo = append(w.undo, func() {
		if had {
			l.bornAfter[id] = prev
		} else {
			delete(l.bornAfter, id)
		}
	})
}

// forgetSubscriber drops a removed subscriber's in-memory numbers.
func (l *Ledger) forgetSubscriber(id string) {
	l.sent.mu.Lock()
	delete(l.sent.n, id)
	l.sent.mu.Unlock()
	l.window.forget(id)
	l.countsMu.Lock()
	l.counts = nil // its rows are gone: count afresh
	l.countsGen++  // and drop a count begun before
	l.countsMu.Unlock()
}

// SubscriberState is what the dispatcher persists when a result changes a
// subscriber's pause or breaker.
type SubscriberState struct {
	ID          string
	PausedUntil time.Time
	Breaker     breaker.Breaker
}

// Setting returns a stored setting, or "" when it is unset.
func (l *Ledger) Setting(ctx context.Context, key string) (string, error) {
	var v string
	err := l.rdb.QueryRowContext(ctx, `SELECT value FROM settings WHERE key = ?`, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return v, err
}

// SetSetting stores a setting.
func (l *Ledger) SetSetting(ctx context.Context, key, value string) error {
	return l.write(ctx, func(ctx context.Context, w *writer) error {
		_, err := w.conn.ExecContext(ctx, `INSERT INTO settings (key, value) VALUES (?, ?)
			ON CONFLICT (key) DO UPDATE SET value = excluded.value`, key, value)
		return err
	})
}

// EraseSetting removes a setting and overwrites what it held in the file,
// for a value that must not outlive its row (a credential): the delete
// zeroes the row's bytes, and a checkpoint copies the zeroed page back and
// empties the WAL, which still holds the row. A reader of the file outside
// sluice (a shell, a backup) can keep the checkpoint from finishing: the
// error then wraps ErrScrubPending, and ScrubWAL, which every start should
// call, finishes the job later.
func (l *Ledger) EraseSetting(ctx context.Context, key string) error {
	err := l.write(ctx, func(ctx context.Context, w *writer) error {
		if _, err := w.conn.ExecContext(ctx, `PRAGMA secure_delete = ON`); err != nil {
			return err
		}
		_, err := w.conn.ExecContext(ctx, `DELETE FROM settings WHERE key = ?`, key)
		if err == nil {
			_, err = w.conn.ExecContext(ctx, `INSERT INTO settings (key, value) VALUES (?, '1')
				ON CONFLICT (key) DO NOTHING`, scrubKey)
		}
		if _, off := w.conn.ExecContext(ctx, `PRAGMA secure_delete = OFF`); err == nil {
			err = off
		}
		return err
	})
	if err != nil {
		return err
	}
	return l.ScrubWAL(ctx)
}

// scrubKey marks a WAL that still holds an erased value.
const scrubKey = "wal_scrub_pending"

// ErrScrubPending says the WAL may still hold an erased value.
var ErrScrubPending = errors.New("a reader outside sluice kept the WAL from being emptied; the next start tries again")

// ScrubWAL empties the WAL if an erase left it holding what it erased,
// waiting up to the busy timeout for readers.
func (l *Ledger) ScrubWAL(ctx context.Context) error {
	if v, err := l.Setting(ctx, scrubKey); err != nil || v == "" {
		return err
	}
	var busy, logged, moved int
	if err := l.cdb.QueryRowContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`).Scan(&busy, &logged, &moved); err != nil {
		return err
	}
	if busy != 0 {
		return ErrScrubPending
	}
	// The marker's delete goes to the emptied WAL, with nothing erased in it.
	_, err := l.TakeSetting(ctx, scrubKey)
	return err
}

// TakeSetting returns a setting and removes it, in one write: what it held
// is read once.
func (l *Ledger) TakeSetting(ctx context.Context, key string) (string, error) {
	var v string
	err := l.write(ctx, func(ctx context.Context, w *writer) error {
		err := w.conn.QueryRowContext(ctx, `DELETE FROM settings WHERE key = ? RETURNING value`, key).Scan(&v)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		return err
	})
	return v, err
}

// loadPatterns fills the write loop's view of who receives which types.
func (l *Ledger) loadPatterns(ctx context.Context) error {
	rows, err := l.wconn.QueryContext(ctx, `SELECT id, event_types FROM subscribers`)
	if err != nil {
		return err
	}
	defer rows.Close()
	l.patterns = map[string][]string{}
	if l.bornAfter == nil {
		l.bornAfter = map[string]int64{}
	}
	for rows.Next() {
		var id, types string
		if err := rows.Scan(&id, &types); err != nil {
			return err
		}
		var p []string
		if err := json.Unmarshal([]byte(types), &p); err != nil {
			return err
		}
		l.patterns[id] = p
	}
	return rows.Err()
}
