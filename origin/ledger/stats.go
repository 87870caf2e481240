package ledger

import (
	"context"
	"database/sql"
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
// attempts and deliveries since since.
func (l *Ledger) Stats(ctx context.Context, since time.Time) (map[string]*SubscriberStats, error) {
	out, err := l.Counts(ctx)
	if err != nil {
		return nil, err
	}
	get := func(id string) *SubscriberStats {
		s, ok := out[id]
		if !ok {
			s = &SubscriberStats{}
			out[id] = s
		}
		return s
	}
	err = collect(ctx, l.rdb, `SELECT subscriber_id, count(*) FROM deliveries WHERE status = 'sent' GROUP BY subscriber_id`,
		nil, func(rows *sql.Rows) error {
			var id string
			var n int
			if err := rows.Scan(&id, &n); err != nil {
				return err
			}
			get(id).Sent = n
			return nil
		})
	if err != nil {
		return nil, err
	}
	err = collect(ctx, l.rdb, `SELECT subscriber_id, count(*), sum(status_code BETWEEN 200 AND 299)
		FROM attempts WHERE at >= ? GROUP BY subscriber_id`, []any{since.UnixMilli()}, func(rows *sql.Rows) error {
		var id string
		var n, ok int
		if err := rows.Scan(&id, &n, &ok); err != nil {
			return err
		}
		s := get(id)
		s.Attempts, s.Successes = n, ok
		return nil
	})
	if err != nil {
		return nil, err
	}
	lat := map[string][]int64{}
	err = collect(ctx, l.rdb, `SELECT subscriber_id, sent_at - created_at AS lat FROM deliveries
		WHERE status = 'sent' AND sent_at >= ? ORDER BY subscriber_id, lat`, []any{since.UnixMilli()}, func(rows *sql.Rows) error {
		var id string
		var v int64
		if err := rows.Scan(&id, &v); err != nil {
			return err
		}
		lat[id] = append(lat[id], v)
		return nil
	})
	if err != nil {
		return nil, err
	}
	for id, v := range lat {
		s := get(id)
		s.Delivered = len(v)
		s.P50 = time.Duration(percentile(v, 0.50)) * time.Millisecond
		s.P99 = time.Duration(percentile(v, 0.99)) * time.Millisecond
	}
	return out, nil
}

// Counts counts only pending, inflight and dead deliveries per subscriber.
// Each walks a partial index, which with a million pending takes a few
// hundred milliseconds, so answers are shared for countsTTL: a scrape and
// a status page polling every few seconds should not keep a core busy.
func (l *Ledger) Counts(ctx context.Context) (map[string]*SubscriberStats, error) {
	l.countsMu.Lock()
	defer l.countsMu.Unlock()
	if l.counts != nil && time.Since(l.countsAt) < countsTTL {
		return copyStats(l.counts), nil
	}
	out := map[string]*SubscriberStats{}
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
		err := collect(ctx, l.rdb, `SELECT subscriber_id, count(*) FROM deliveries WHERE status = '`+string(c.status)+`' GROUP BY subscriber_id`,
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
	l.counts, l.countsAt = out, time.Now()
	return copyStats(out), nil
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

// percentile returns the nearest-rank percentile of sorted values.
func percentile(sorted []int64, p float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
