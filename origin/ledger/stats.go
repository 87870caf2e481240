package ledger

import (
	"context"
	"database/sql"
	"maps"
	"sync"
	"time"
)

// SubscriberStats are one subscriber's numbers from the ledger.
type SubscriberStats struct {
	Pending, Inflight, Sent, Dead int
	// Over the window: attempts made, those that succeeded, and the
	// enqueue-to-delivery latency percentiles of deliveries sent in it.
	Attempts, Successes int
	Delivered           int // sent in the window; P50 and P99 are over these
	P50, P99            time.Duration
}

// Stats counts deliveries by state for every subscriber and summarises the
// attempts and deliveries since since (at most the last 5 minutes, to
// 30 s; counted in memory since the process started).
func (l *Ledger) Stats(ctx context.Context, since time.Time) (map[string]*SubscriberStats, error) {
	out, err := l.Counts(ctx)
	if err != nil {
		return nil, err
	}
	l.window.fill(out, since, l.now())
	return out, nil
}

// WindowTotals is the window's attempts, successes and latency
// percentiles over every subscriber since since (to the slot, as Stats).
func (l *Ledger) WindowTotals(since time.Time) SubscriberStats {
	return l.window.total(since, l.now())
}

// sentTotals counts sent deliveries per subscriber in memory. Sent is
// final, so Record adds what it marks; the count taken at Open sets them,
// and a batch rolled back (or a mark that did not add up) makes them stale
// until a recount. Every change happens in the write loop, in step with
// the rows it counts.
type sentTotals struct {
	mu    sync.Mutex
	n     map[string]int64
	stale bool
}

const countSent = `SELECT subscriber_id, count(*) FROM deliveries WHERE status = 'sent' GROUP BY subscriber_id`

// recountSent sets the totals from the rows; call from the write loop (or
// before it starts).
func (l *Ledger) recountSent(ctx context.Context, c querier) error {
	n, err := sentRows(ctx, c)
	if err != nil {
		return err
	}
	l.sent.mu.Lock()
	l.sent.n, l.sent.stale = n, false
	l.sent.mu.Unlock()
	return nil
}

// querier is a database, a connection or a transaction: what collect reads from.
type querier interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}

// sentRows counts the sent rows per subscriber.
func sentRows(ctx context.Context, c querier) (map[string]int64, error) {
	n := map[string]int64{}
	err := collect(ctx, c, countSent, nil, func(rows *sql.Rows) error {
		var id string
		var k int64
		if err := rows.Scan(&id, &k); err != nil {
			return err
		}
		n[id] = k
		return nil
	})
	return n, err
}

// sentCounts returns the sent totals, recounting them first if stale.
func (l *Ledger) sentCounts(ctx context.Context) (map[string]int64, error) {
	l.sent.mu.Lock()
	stale := l.sent.stale
	l.sent.mu.Unlock()
	if stale {
		if err := l.write(ctx, func(ctx context.Context, w *writer) error {
			n, err := sentRows(ctx, w.conn)
			if err != nil {
				return err
			}
			// Set with the commit, in op order: the count already holds
			// the marks of the batch's earlier ops, whose additions run
			// just before, and none of the later ones', whose run after.
			w.after = append(w.after, func() {
				l.sent.mu.Lock()
				l.sent.n, l.sent.stale = n, false
				l.sent.mu.Unlock()
			})
			return nil
		}); err != nil {
			return nil, err
		}
	}
	l.sent.mu.Lock()
	defer l.sent.mu.Unlock()
	return maps.Clone(l.sent.n), nil
}

// addSent adds marks (negative when rows were pruned) to the totals, in the
// write loop; exact is false when the rows marked did not match the results.
func (l *Ledger) addSent(marks map[string]int64, exact bool) {
	l.sent.mu.Lock()
	defer l.sent.mu.Unlock()
	if !exact {
		l.sent.stale = true
		return
	}
	for id, k := range marks {
		if l.sent.n[id] += k; l.sent.n[id] == 0 {
			delete(l.sent.n, id) // as a recount would have it
		}
	}
}

// staleSent marks the totals for a recount (a batch rolled back).
func (l *Ledger) staleSent() {
	l.sent.mu.Lock()
	l.sent.stale = true
	l.sent.mu.Unlock()
}

// Counts counts pending, inflight, sent and dead deliveries per
// subscriber. Each of the first three walks a partial index, which with a
// million pending takes a few hundred milliseconds, so answers are shared
// for countsTTL: a scrape and a status page polling every few seconds
// should not keep a core busy. They are read in one transaction, and the
// sent totals (kept in memory) at its start, so that the four add up to
// every delivery the subscriber had then, not to a mix of two moments.
func (l *Ledger) Counts(ctx context.Context) (map[string]*SubscriberStats, error) {
	// countsMu is not held while counting: the count waits on the write
	// loop (committing, a recount), whose after-commit steps take countsMu
	// to drop a removed subscriber's share. Callers that come while a
	// count runs wait for its answer on a channel instead.
	l.countsMu.Lock()
	if l.counts != nil && l.now().Sub(l.countsAt) < countsTTL {
		out := copyStats(l.counts)
		l.countsMu.Unlock()
		return out, nil
	}
	if run := l.counting; run != nil {
		l.countsMu.Unlock()
		select {
		case <-run.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if run.err == nil {
			return copyStats(run.out), nil
		}
		return l.count(ctx) // its caller's failure (a cancelled request) need not be ours
	}
	run := &countRun{done: make(chan struct{})}
	l.counting = run
	gen := l.countsGen
	l.countsMu.Unlock()
	run.out, run.err = l.count(ctx)
	l.countsMu.Lock()
	if run.err == nil && l.countsGen == gen { // no subscriber removed meanwhile
		l.counts, l.countsAt = run.out, l.now()
	}
	l.counting = nil
	l.countsMu.Unlock()
	close(run.done)
	if run.err != nil {
		return nil, run.err
	}
	return copyStats(run.out), nil
}

// countRun is a count under way, whose answer later callers share.
type countRun struct {
	done chan struct{}
	out  map[string]*SubscriberStats
	err  error
}

// count is Counts without the sharing.
func (l *Ledger) count(ctx context.Context) (map[string]*SubscriberStats, error) {
	if _, err := l.sentCounts(ctx); err != nil { // recounts stale totals in the write loop
		return nil, err
	}
	tx, err := l.rdb.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	// A read fixes the transaction's snapshot, and the sent totals are
	// copied with no commit between the two.
	var one int
	l.committing.Lock()
	err = tx.QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&one)
	l.sent.mu.Lock()
	sent, stale := maps.Clone(l.sent.n), l.sent.stale
	l.sent.mu.Unlock()
	l.committing.Unlock()
	if err != nil {
		return nil, err
	}
	if stale { // went stale since the recount: count in the snapshot itself
		if sent, err = sentRows(ctx, tx); err != nil {
			return nil, err
		}
	}
	out := map[string]*SubscriberStats{}
	for id, n := range sent {
		out[id] = &SubscriberStats{Sent: int(n)}
	}
	for _, c := range []struct {
		status Status
		dst    func(*SubscriberStats) *int
	}{
		{StatusPending, func(s *SubscriberStats) *int { return &s.Pending }},
		{StatusInflight, func(s *SubscriberStats) *int { return &s.Inflight }},
		{StatusDead, func(s *SubscriberStats) *int { return &s.Dead }},
	} {
		// A literal status, not a parameter: only then can SQLite use the
		// status's partial index.
		err := collect(ctx, tx, `SELECT subscriber_id, count(*) FROM deliveries WHERE status = '`+string(c.status)+`' GROUP BY subscriber_id`,
			nil, func(rows *sql.Rows) error {
				var id string
				var n int
				if err := rows.Scan(&id, &n); err != nil {
					return err
				}
				s, ok := out[id]
				if !ok {
					s = &SubscriberStats{}
					out[id] = s
				}
				*c.dst(s) = n
				return nil
			})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// countsTTL is how long Counts answers from its last count.
const countsTTL = time.Second

func copyStats(m map[string]*SubscriberStats) map[string]*SubscriberStats {
	out := make(map[string]*SubscriberStats, len(m))
	for k, v := range m {
		c := *v
		out[k] = &c
	}
	return out
}
