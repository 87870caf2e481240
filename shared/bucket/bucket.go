// Package bucket is the token-bucket arithmetic both halves of sluice use: pure
// functions of a bucket's state and the current time, so the origin's
// dispatcher and the edge's Durable Object refill and spend tokens alike (the
// origin, which sends, leaves a margin after a burst: TakeToSend) and tests
// drive them with any clock.
package bucket

import (
	"math"
	"time"
)

// Rate is a subscriber's advertised limit: a sustained rate and a burst.
type Rate struct {
	PerSecond float64 `json:"per_second"`
	Burst     float64 `json:"burst"`
}

// Valid reports whether r can meter anything: a positive rate and a burst of
// at least one token (a smaller burst could never pay for a request).
func (r Rate) Valid() bool {
	return r.PerSecond > 0 && r.Burst >= 1 && !math.IsInf(r.PerSecond, 0) && !math.IsInf(r.Burst, 0)
}

// Scale returns r with its rate and burst multiplied by f, keeping a burst of at
// least one token. It splits a subscriber's rate between two lanes.
func (r Rate) Scale(f float64) Rate {
	return Rate{PerSecond: r.PerSecond * f, Burst: math.Max(1, math.Floor(r.Burst*f))}
}

// State is a bucket at an instant: the tokens it held at Last.
type State struct {
	Tokens float64   `json:"tokens"`
	Last   time.Time `json:"last"`
}

// Full is a bucket holding its whole burst at now.
func Full(r Rate, now time.Time) State { return State{Tokens: r.Burst, Last: now} }

// Empty is a bucket holding nothing at now; a restarted process that cannot
// know what it spent before starts here, so the cap holds across the restart.
func Empty(now time.Time) State { return State{Last: now} }

// Refill returns s advanced to now: tokens accrued since Last, clamped to the
// burst. A Last ahead of now (a clock that moved backwards, or a refill that
// TakeToSend or a deferral put off) accrues nothing and is kept, so a bucket
// never gains tokens from a clock step.
func Refill(s State, r Rate, now time.Time) State {
	if s.Tokens > r.Burst {
		s.Tokens = r.Burst // the burst was lowered
	}
	elapsed := now.Sub(s.Last)
	if elapsed <= 0 {
		return s
	}
	s.Tokens = math.Min(r.Burst, s.Tokens+elapsed.Seconds()*r.PerSecond)
	s.Last = now
	return s
}

// Take refills s to now and spends n tokens if it holds them. It returns the
// refilled state even when it cannot spend: callers must keep it, or every
// failed take restarts the clock and a busy subscriber never accrues a token.
func Take(s State, r Rate, now time.Time, n float64) (State, bool) {
	s = Refill(s, r, now)
	if s.Tokens < n {
		return s, false
	}
	s.Tokens -= n
	return s, true
}

// SendMargin is, at most, how long a sender's bucket waits after a spend
// from full before it starts to refill. A receiver that enforces the same
// bucket starts its refill at the first arrival, and the first request of a
// burst arrives later than the ones after it when it pays for a new
// connection (TCP, TLS): without a margin, a later request on a warm
// connection arrives a token early and earns a 429.
const SendMargin = 100 * time.Millisecond

// margin is the refill delay TakeToSend applies: SendMargin, but never more
// than the burst left after the spend can cover at the full rate, so a
// sender below the rate never waits for it (and a burst of one gets none).
// It costs a burst that empties the bucket rate × margin tokens.
func margin(r Rate) time.Duration {
	if r.PerSecond <= 0 || r.Burst <= 1 {
		return 0
	}
	return min(SendMargin, time.Duration((r.Burst-1)/r.PerSecond*float64(time.Second)))
}

// TakeToSend is Take for the bucket of whoever sends the requests, the
// origin: a spend from a full bucket starts its refill a margin later. A
// receiver enforcing a rate, like the edge's Durable Object, uses Take.
func TakeToSend(s State, r Rate, now time.Time, n float64) (State, bool) {
	s = Refill(s, r, now)
	full := s.Tokens >= r.Burst
	s, ok := Take(s, r, now, n)
	if m := margin(r); ok && full && m > 0 {
		s.Last = now.Add(m)
	}
	return s, ok
}

// Available is the number of whole tokens s holds at now.
func Available(s State, r Rate, now time.Time) int {
	return int(math.Floor(Refill(s, r, now).Tokens))
}

// Wait is how long from now until s holds one whole token (zero if it does).
func Wait(s State, r Rate, now time.Time) time.Duration {
	s = Refill(s, r, now)
	if s.Tokens >= 1 {
		return 0
	}
	if r.PerSecond <= 0 {
		return time.Duration(math.MaxInt64)
	}
	// Refill starts at Last, which TakeToSend may have put ahead of now.
	// Round up so a caller that sleeps exactly this long finds the token there.
	return max(0, s.Last.Sub(now)) + time.Duration(math.Ceil((1-s.Tokens)/r.PerSecond*float64(time.Second)))
}
