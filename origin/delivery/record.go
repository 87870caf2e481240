package delivery

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-dev/sluice/origin/ledger"
)

// recordBatch bounds how many outcomes share one ledger write.
const recordBatch = 128

// record writes outcomes in batches until the results channel closes. A retry
// becomes claimable only once its row is pending again, so the dispatcher
// learns of its due time after the commit, not before.
func (d *Dispatcher) record() {
	batch := make([]outcome, 0, recordBatch)
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

func (d *Dispatcher) flush(batch []outcome) {
	results := make([]ledger.Result, 0, len(batch))
	held := 0
	for _, o := range batch {
		if !o.gone {
			results = append(results, o.Result)
		}
		if o.held {
			held++
		}
	}
	// Whatever happens, the attempts stop counting as unrecorded at the
	// end: after the commit, or when shutting down.
	defer func() {
		d.mu.Lock()
		d.unrecorded -= held
		d.dispatchLocked(d.cfg.Clock.Now())
		d.mu.Unlock()
	}()
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
	if len(results) == 0 && len(states) == 0 {
		return
	}
	// An outcome must not be lost while the process runs: its row stays in
	// flight until recorded (leases are reclaimed only at start-up, since
	// one process owns the file), so keep trying while the database refuses,
	// until a stop gives up waiting: then the rows stay in flight and go
	// back to pending at the next start.
	for try := 0; ; try++ {
		err := d.ledger.Record(context.Background(), results, states)
		if err == nil {
			break
		}
		if errors.Is(err, ledger.ErrClosed) {
			return
		}
		d.cfg.Logger.Error("recording attempt outcomes failed; retrying", "err", err, "outcomes", len(batch))
		t := time.NewTimer(min(time.Duration(try+1)*100*time.Millisecond, 5*time.Second))
		select {
		case <-t.C:
		case <-d.giveUp:
			t.Stop()
			d.cfg.Logger.Error("stopping with attempt outcomes unrecorded; their deliveries are sent again after the next start",
				"outcomes", len(batch))
			return
		}
	}
	d.mu.Lock()
	for _, r := range results {
		if r.Status == ledger.StatusPending {
			if s, ok := d.subs[r.SubscriberID]; ok {
				s.note(r.NextAttemptAt)
			}
		}
	}
	d.mu.Unlock()
	d.poke()
}
