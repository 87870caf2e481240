// Package breaker is the per-subscriber circuit breaker: after a run of
// consecutive failures it stops attempts to a subscriber for a cooldown, then
// lets exactly one probe through, and closes again when the probe succeeds.
// While open, deliveries wait without spending attempts.
package breaker

import "time"

// State names where a breaker is.
type State string

// Breaker states. Record moves closed → open on the threshold-th consecutive
// failure and half-open → open on a failed probe; Limit moves open →
// half-open when the cooldown has passed; a success closes it.
const (
	Closed   State = "closed"
	Open     State = "open"
	HalfOpen State = "half_open"
)

// Settings are the breaker's policy; zero fields take the defaults.
type Settings struct {
	Threshold int           // consecutive failures that open it (default 5)
	Cooldown  time.Duration // time open before the half-open probe (default 60s)
}

func (s Settings) threshold() int {
	if s.Threshold <= 0 {
		return 5
	}
	return s.Threshold
}

func (s Settings) cooldown() time.Duration {
	if s.Cooldown <= 0 {
		return 60 * time.Second
	}
	return s.Cooldown
}

// Breaker is one subscriber's breaker; the zero value is closed.
type Breaker struct {
	State    State     `json:"state"`
	Failures int       `json:"failures"`           // consecutive failures: the run that opened it and failed probes count on
	OpenedAt time.Time `json:"opened_at,omitzero"` // when it last opened
}

// Unlimited is the Limit of a closed breaker.
const Unlimited = -1

// Limit returns how many attempts may be in flight at now (Unlimited when
// closed, 1 when half-open, 0 while cooling down) and, when it is 0, the time
// at which that changes. It moves an open breaker whose cooldown has passed to
// half-open; the caller persists b when changed is true.
func (b *Breaker) Limit(now time.Time, s Settings) (limit int, until time.Time, changed bool) {
	switch b.State {
	case Open:
		reopen := b.OpenedAt.Add(s.cooldown())
		if now.Before(reopen) {
			return 0, reopen, false
		}
		b.State = HalfOpen
		return 1, time.Time{}, true
	case HalfOpen:
		return 1, time.Time{}, false
	default:
		return Unlimited, time.Time{}, false
	}
}

// Probe lets an open breaker's probe go now rather than when its cooldown
// ends, and reports whether b changed. The cooldown is sluice's guess at
// when the subscriber is back; an operator who retries its deliveries
// (often just after fixing its endpoint) knows better. A failed probe opens
// it again for a full cooldown, as any probe does.
func (b *Breaker) Probe() (changed bool) {
	if b.State != Open {
		return false
	}
	b.State = HalfOpen
	return true
}

// Record notes an attempt's outcome at now and reports whether b changed in a
// way worth persisting.
func (b *Breaker) Record(success bool, now time.Time, s Settings) (changed bool) {
	if success {
		if b.State == Closed || b.State == "" {
			changed = b.Failures != 0
			b.Failures = 0
			b.State = Closed
			return changed
		}
		*b = Breaker{State: Closed}
		return true
	}
	switch b.State {
	case HalfOpen:
		b.State, b.OpenedAt = Open, now
		b.Failures++
		return true
	case Open:
		// A late failure from an attempt started before the breaker opened
		// says nothing new; the cooldown runs from the opening.
		return false
	default:
		b.State = Closed
		b.Failures++
		if b.Failures >= s.threshold() {
			b.State, b.OpenedAt = Open, now
		}
		return true
	}
}
