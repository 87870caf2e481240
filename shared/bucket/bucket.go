// Package bucket is the token-bucket arithmetic both halves of sluice use: pure
// functions of a bucket's state and the current time, so the origin's
// dispatcher and the edge's Durable Object refill and spend tokens alike (the
// origin, which sends, keeps a reserve for the jitter on the way: TakeToSend)
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

// Scale returns r with its rate and burst multiplied by f, the burst rounded
// down to whole tokens so that two shares never sum above r. It splits a
// subscriber's rate between two lanes; a share that is not Valid (under one
// token of burst) cannot pay for a request.
func (r Rate) Scale(f float64) Rate {
	return Rate{PerSecond: r.PerSecond * f, Burst: math.Floor(r.Burst * f)}
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
// a deferral put off) accrues nothing and is kept, so a bucket never gains
// tokens from a clock step.
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

// SendMargin is the delay jitter a sender's bucket absorbs. A receiver that
// enforces the same bucket counts arrivals, not sends, and the first request
// of a burst arrives later than the ones after it when it pays for a new
// connection (TCP, TLS). A stream that conforms to (rate, burst) when sent
// can look rate × jitter tokens burstier when it arrives, and a strict
// receiver answers 429 to the token it thinks came early.
const SendMargin = 100 * time.Millisecond

// SendReserve is how many tokens a sender leaves in its bucket so that its sends,
// delayed unevenly by up to SendMargin, still conform when they arrive: what
// the rate refills in SendMargin, but never so much that less than one token
// is left to spend. It costs the sender that many tokens of its first burst
// and nothing of its sustained rate.
func (r Rate) SendReserve() float64 {
	if r.PerSecond <= 0 || r.Burst <= 1 {
		return 0
	}
	return min(r.PerSecond*SendMargin.Seconds(), r.Burst-1)
}

// TakeToSend is Take for the bucket of whoever sends the requests, the
// origin: it spends only above the reserve, so a burst it sends is the
// reserve smaller than the one a receiver enforcing the same rate allows. A
// receiver, like the edge's Durable Object, uses Take.
func TakeToSend(s State, r Rate, now time.Time, n float64) (State, bool) {
	s = Refill(s, r, now)
	if s.Tokens < n+r.SendReserve() {
		return s, false
	}
	s.Tokens -= n
	return s, true
}

// AvailableToSend is Available for a sender's bucket: the whole tokens above
// the reserve.
func AvailableToSend(s State, r Rate, now time.Time) int {
	t, res := Refill(s, r, now).Tokens, r.SendReserve()
	n := int(math.Floor(max(0, t-res)))
	// Count with TakeToSend's comparison, tokens ≥ n + reserve, so the two
	// never disagree by a rounding of t − reserve.
	for n > 0 && t < float64(n)+res {
		n--
	}
	for t >= float64(n+1)+res {
		n++
	}
	return n
}

// WaitToSend is Wait for a sender's bucket: how long until it holds one
// whole token above the reserve.
func WaitToSend(s State, r Rate, now time.Time) time.Duration {
	return waitFor(s, r, now, 1+r.SendReserve())
}

// Available is the number of whole tokens s holds at now.
func Available(s State, r Rate, now time.Time) int {
	return int(math.Floor(Refill(s, r, now).Tokens))
}

// Wait is how long from now until s holds one whole token (zero if it does).
func Wait(s State, r Rate, now time.Time) time.Duration { return waitFor(s, r, now, 1) }

// waitFor is how long from now until s holds need tokens.
func waitFor(s State, r Rate, now time.Time, need float64) time.Duration {
	s = Refill(s, r, now)
	if s.Tokens >= need {
		return 0
	}
	if r.PerSecond <= 0 {
		return time.Duration(math.MaxInt64)
	}
	// Refill starts at Last, which a deferral may have put ahead of now.
	// Round up so a caller that sleeps exactly this long finds the token there.
	return max(0, s.Last.Sub(now)) + time.Duration(math.Ceil((need-s.Tokens)/r.PerSecond*float64(time.Second)))
}
