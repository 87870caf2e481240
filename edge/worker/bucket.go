package worker

import (
	"math"
	"time"

	"github.com/sluice-dev/sluice/shared/bucket"
)

// Stored is a subscriber's token bucket as its Durable Object keeps it in
// storage: plain numbers, because the JavaScript shim stores and loads it.
type Stored struct {
	Tokens float64 `json:"tokens"`
	LastMS int64   `json:"last_ms"` // Unix milliseconds of Tokens
}

// Grant is a bucket's answer to one request for a token.
type Grant struct {
	OK bool
	// RetryIn is how long until a token is there; set only when !OK.
	RetryIn time.Duration
}

// TakeToken is the Durable Object's whole decision: refill s to now and spend
// one token, with the arithmetic of the origin's buckets less the origin's
// reserve for jitter (the object enforces, like a partner). A nil s is a
// subscriber the object has never seen, which starts with its full burst
// (its storage is durable, so "never seen" really means never). The returned
// state must be stored whether or not the take succeeded: it carries the
// refill, and dropping it would restart the clock on every refused take.
func TakeToken(s *Stored, r bucket.Rate, now time.Time) (Stored, Grant) {
	st := bucket.Full(r, now)
	if s != nil {
		st = bucket.State{Tokens: s.Tokens, Last: time.UnixMilli(s.LastMS)}
	}
	st, ok := bucket.Take(st, r, now, 1)
	out := Stored{Tokens: st.Tokens, LastMS: st.Last.UnixMilli()}
	if ok {
		return out, Grant{OK: true}
	}
	return out, Grant{RetryIn: bucket.Wait(st, r, now)}
}

// retryInMS is d in whole milliseconds, rounded up and at least 1, so an
// origin that waits exactly that long finds a token.
func retryInMS(d time.Duration) int64 {
	ms := int64(math.Ceil(float64(d) / float64(time.Millisecond)))
	return max(ms, 1)
}
