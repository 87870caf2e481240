// Package backoff decides how long a failed delivery waits: full-jitter
// exponential backoff, and at most MaxPause for what a subscriber asks in
// Retry-After. It is pure: time and randomness are arguments.
package backoff

import (
	crand "crypto/rand"
	"math"
	"math/rand/v2"
	"time"
)

// Source is the randomness backoff draws from; *math/rand/v2.Rand satisfies
// it, and tests pass a seeded one.
type Source interface {
	Int64N(n int64) int64
}

// NewSource returns a ChaCha8 generator seeded from crypto/rand, so that
// retry times cannot be predicted from one another. It is not safe for
// concurrent use; callers lock.
func NewSource() *rand.Rand {
	var seed [32]byte
	crand.Read(seed[:]) // never fails: since Go 1.24 it crashes the program instead
	return rand.New(rand.NewChaCha8(seed))
}

// FullJitter returns a delay drawn uniformly from [0, min(cap, base·2^attempt)],
// attempt counting retries from 0: the first waits at most base. Spreading retries over the
// whole window keeps a recovering subscriber from being hit by every retry at
// once. It never overflows, whatever the attempt; a non-positive base or cap
// gives 0.
func FullJitter(attempt int, base, cap time.Duration, r Source) time.Duration {
	if base <= 0 || cap <= 0 {
		return 0
	}
	attempt = max(attempt, 0)
	ceiling := cap
	// base·2^attempt ≤ cap exactly when base ≤ ⌊cap/2^attempt⌋.
	if attempt < 63 && base <= cap>>attempt {
		ceiling = base << attempt
	}
	if ceiling == math.MaxInt64 {
		return time.Duration(r.Int64N(int64(ceiling)))
	}
	return time.Duration(r.Int64N(int64(ceiling) + 1))
}

// MaxPause caps how long a Retry-After can pause a subscriber, so a typo or a
// hostile value cannot silence it for days.
const MaxPause = time.Hour
