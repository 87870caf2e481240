package ledger

import (
	"context"
	"database/sql"
	"errors"
)

// statements are the writer's hot statements, prepared once on its connection.
type statements struct {
	due        *sql.Stmt
	claim      *sql.Stmt
	nextDue    *sql.Stmt
	markSent   *sql.Stmt
	reschedule *sql.Stmt
	markDead   *sql.Stmt
	defer_     *sql.Stmt
	release    *sql.Stmt
	unknown    *sql.Stmt
	saveState  *sql.Stmt
	begin      *sql.Stmt
	commit     *sql.Stmt
	rollback   *sql.Stmt
	all        []*sql.Stmt
	cache      map[string]*sql.Stmt // multi-row statements by shape and size
}

func (s *statements) prepare(ctx context.Context, c *sql.Conn) error {
	var errs []error
	s.cache = map[string]*sql.Stmt{}
	p := func(q string) *sql.Stmt {
		st, err := c.PrepareContext(ctx, q)
		errs = append(errs, err)
		if st != nil {
			s.all = append(s.all, st)
		}
		return st
	}
	s.due = p(`SELECT d.seq, d.event_seq, d.attempts, d.budget_from, d.deferrals, d.created_at, d.next_attempt_at, e.id, e.type, e.body
		FROM deliveries d JOIN events e ON e.seq = d.event_seq
		WHERE d.subscriber_id = ?1 AND d.status = 'pending' AND d.next_attempt_at <= ?2
		ORDER BY d.next_attempt_at LIMIT ?3`)
	s.claim = p(`UPDATE deliveries SET status = 'inflight', lease_until = ?1, updated_at = ?2
		WHERE seq IN (SELECT value FROM json_each(?3))`)
	s.nextDue = p(`SELECT min(next_attempt_at) FROM deliveries WHERE subscriber_id = ?1 AND status = 'pending'`)
	s.markSent = p(`UPDATE deliveries SET status = 'sent', attempts = attempts + 1, sent_at = ?1, updated_at = ?1,
		lease_until = NULL, last_error = '' WHERE seq IN (SELECT value FROM json_each(?2)) AND status = 'inflight'`)
	s.reschedule = p(`UPDATE deliveries SET status = 'pending', attempts = attempts + 1, next_attempt_at = ?1,
		updated_at = ?2, lease_until = NULL, last_error = ?3 WHERE seq = ?4 AND status = 'inflight'`)
	s.markDead = p(`UPDATE deliveries SET status = 'dead', attempts = attempts + 1, dead_at = ?1, updated_at = ?1,
		lease_until = NULL, last_error = ?2 WHERE seq = ?3 AND status = 'inflight'`)
	s.defer_ = p(`UPDATE deliveries SET status = 'pending', deferrals = deferrals + 1, next_attempt_at = ?1,
		updated_at = ?2, lease_until = NULL WHERE seq = ?3 AND status = 'inflight'`)
	s.release = p(`UPDATE deliveries SET status = 'pending', next_attempt_at = ?1, updated_at = ?2, lease_until = NULL
		WHERE seq = ?3 AND status = 'inflight'`)
	// An attempt with no known outcome counts in attempts (the history
	// numbers it) and moves budget_from with it, so it spends nothing.
	s.unknown = p(`UPDATE deliveries SET status = 'pending', attempts = attempts + 1, budget_from = budget_from + 1,
		next_attempt_at = ?1, updated_at = ?2, lease_until = NULL, last_error = ?3 WHERE seq = ?4 AND status = 'inflight'`)
	s.saveState = p(`UPDATE subscribers SET paused_until = ?1, breaker_state = ?2, breaker_failures = ?3,
		breaker_opened_at = ?4 WHERE id = ?5`)
	s.begin = p(`BEGIN IMMEDIATE`)
	s.commit = p(`COMMIT`)
	s.rollback = p(`ROLLBACK`)
	return errors.Join(errs...)
}

func (s *statements) close() {
	for _, st := range s.all {
		st.Close()
	}
}
