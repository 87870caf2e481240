// Package backoff decides how long a failed delivery waits: full-jitter
// exponential backoff, or exactly what the subscriber asked for in
// Retry-After. It is pure: time and randomness are arguments.
package backoff

import (
	crand "crypto/rand"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
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
// attempt counting from 1 for the first retry. Spreading retries over the
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

// RetryAfter parses a Retry-After header value, delta-seconds or an HTTP-date
// in any of its three forms, into a wait from now, capped at MaxPause: how
// long the subscriber pauses. ok is false for an empty or unparseable value,
// so the caller falls back to its backoff.
func RetryAfter(value string, now time.Time) (d time.Duration, ok bool) {
	d, ok = ParseRetryAfter(value, now)
	return min(d, MaxPause), ok
}

// ParseRetryAfter is RetryAfter without the cap: the wait the subscriber
// asked for, as the attempt's history records it. Dates in the past give 0;
// a wait beyond what a Duration holds gives the largest one.
func ParseRetryAfter(value string, now time.Time) (d time.Duration, ok bool) {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0, false
	}
	if isDigits(value) {
		secs, err := strconv.ParseInt(value, 10, 64)
		if err != nil || secs > math.MaxInt64/int64(time.Second) {
			return math.MaxInt64, true // only overflow can fail here
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(value)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
