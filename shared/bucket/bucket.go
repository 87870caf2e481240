// Package bucket is the token-bucket arithmetic both halves of sluice use: pure
// functions of a bucket's state and the current time, so the origin's
// dispatcher and the edge's Durable Object refill and spend tokens identically
// and tests drive them with any clock.
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
// burst. A clock that moved backwards accrues nothing and keeps Last, so a
// bucket never gains tokens from a clock step.
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
	// Round up so a caller that sleeps exactly this long finds the token there.
	return time.Duration(math.Ceil((1 - s.Tokens) / r.PerSecond * float64(time.Second)))
}
