package delivery

import (
	"context"
	"time"

	"github.com/sluice-dev/sluice/origin/ledger"
)

// recordBatch bounds how many outcomes share one ledger write.
const recordBatch = 512

// record writes outcomes in batches until the results channel closes. A retry
// becomes claimable only once its row is pending again, so the dispatcher
// learns of its due time after the commit, not before.
func (d *Dispatcher) record() {
	batch := make([]ledger.Result, 0, recordBatch)
	for first := range d.results {
		batch = append(batch[:0], first)
	fill:
		for len(batch) < recordBatch {
			select {
			case r, ok := <-d.results:
				if !ok {
					break fill
				}
				batch = append(batch, r)
			default:
				break fill
			}
		}
		d.flush(batch)
	}
	d.flush(nil) // states changed without a result (a breaker turning half-open)
}

func (d *Dispatcher) flush(batch []ledger.Result) {
	d.mu.Lock()
	states := make([]ledger.SubscriberState, 0, len(d.dirty))
	for id := range d.dirty {
		if s, ok := d.subs[id]; ok {
			states = append(states, ledger.SubscriberState{ID: id, PausedUntil: s.cfg.PausedUntil, Breaker: s.cfg.Breaker})
		}
	}
	clear(d.dirty)
	d.mu.Unlock()
	defer d.unsettled.Add(-int64(len(batch)))
	if len(batch) == 0 && len(states) == 0 {
		return
	}
	// Outcomes must not be lost to a cancelled context: retry until written.
	for try := 0; ; try++ {
		err := d.ledger.Record(context.Background(), batch, states)
		if err == nil {
			break
		}
		d.cfg.Logger.Error("recording attempts failed; retrying", "err", err, "attempts", len(batch))
		if try >= 5 {
			return // rows stay inflight and return to pending at the next start
		}
		time.Sleep(time.Duration(try+1) * 100 * time.Millisecond)
	}
	d.mu.Lock()
	for _, r := range batch {
		if r.Status == ledger.StatusPending {
			if s, ok := d.subs[r.SubscriberID]; ok {
				s.note(r.NextAttemptAt)
			}
		}
	}
	d.mu.Unlock()
	d.poke()
}
