package ledger

import (
	"context"
	"database/sql"
	"encoding/json"
	"time"
)

// pruneRescan is how often Prune starts over from the oldest event, so an
// event it passed over (a delivery still pending or dead then, or sent too
// recently) is pruned once all of its deliveries are sent and old enough.
const pruneRescan = time.Hour

// pruner is where Prune has got to; only the write loop touches it.
type pruner struct {
	after   int64 // the highest event seq examined since the last rescan
	resetAt time.Time
}

// Prune looks at up to max events enqueued before cutoff and removes those
// whose deliveries were all sent before cutoff, with the deliveries and
// their attempts. It returns how many it removed and whether older events
// remain to look at. An event with a delivery pending, in flight or dead
// stays, whatever its age: retention never takes what has not reached its
// subscriber, and one recovered from the dead letters keeps its history for
// the full period after it is sent. An event that matched no subscriber goes
// like a delivered one. A removed event's id may be enqueued again.
func (l *Ledger) Prune(ctx context.Context, cutoff time.Time, max int) (pruned int, more bool, err error) {
	err = l.write(ctx, func(ctx context.Context, w *writer) error {
		if !w.now.Before(l.prune.resetAt) {
			l.prune.after, l.prune.resetAt = 0, w.now.Add(pruneRescan)
		}
		var seqs []int64
		young := false
		err := collect(ctx, w.conn, `SELECT seq, created_at FROM events WHERE seq > ? ORDER BY seq LIMIT ?`,
			[]any{l.prune.after, max}, func(rows *sql.Rows) error {
				var seq, created int64
				if err := rows.Scan(&seq, &created); err != nil {
					return err
				}
				// created_at grows with seq: the first one too young ends the pass.
				if young = young || created >= ms(cutoff); !young {
					seqs = append(seqs, seq)
				}
				return nil
			})
		if err != nil || len(seqs) == 0 {
			return err
		}
		more = !young && len(seqs) == max
		last := seqs[len(seqs)-1]
		// The cursor moves only with a commit: a rolled-back pass is redone.
		w.after = append(w.after, func() { l.prune.after = last })
		js, _ := json.Marshal(seqs)
		var done []int64
		err = collect(ctx, w.conn, `SELECT e.value FROM json_each(?) e WHERE NOT EXISTS
			(SELECT 1 FROM deliveries d WHERE d.event_seq = e.value AND (d.status != 'sent' OR d.sent_at >= ?))`,
			[]any{string(js), ms(cutoff)}, func(rows *sql.Rows) error {
				var seq int64
				if err := rows.Scan(&seq); err != nil {
					return err
				}
				done = append(done, seq)
				return nil
			})
		if err != nil {
			return err
		}
		if len(done) == 0 {
			return nil
		}
		js, _ = json.Marshal(done)
		gone := map[string]int64{}
		err = collect(ctx, w.conn, `SELECT subscriber_id, count(*) FROM deliveries
			WHERE event_seq IN (SELECT value FROM json_each(?)) GROUP BY subscriber_id`,
			[]any{string(js)}, func(rows *sql.Rows) error {
				var id string
				var n int64
				if err := rows.Scan(&id, &n); err != nil {
					return err
				}
				gone[id] = -n
				return nil
			})
		if err != nil {
			return err
		}
		for _, q := range []string{
			`DELETE FROM attempts WHERE delivery_seq IN
				(SELECT seq FROM deliveries WHERE event_seq IN (SELECT value FROM json_each(?)))`,
			`DELETE FROM deliveries WHERE event_seq IN (SELECT value FROM json_each(?))`,
			`DELETE FROM events WHERE seq IN (SELECT value FROM json_each(?))`,
		} {
			if _, err := w.conn.ExecContext(ctx, q, string(js)); err != nil {
				return err
			}
		}
		w.after = append(w.after, func() { l.addSent(gone, true) })
		pruned = len(done)
		return nil
	})
	if err != nil {
		return 0, false, err
	}
	return pruned, more, nil
}
