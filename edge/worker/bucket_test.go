package worker

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/shared/bucket"
)

var t0 = time.Date(2026, 7, 11, 8, 14, 2, 0, time.UTC)

func TestTakeTokenStartsFullThenDefers(t *testing.T) {
	t.Parallel()
	r := bucket.Rate{PerSecond: 4, Burst: 3}
	var s *Stored // never seen
	for i := range 3 {
		next, g := TakeToken(s, r, t0)
		if !g.OK {
			t.Fatalf("take %d of a fresh burst of 3 refused", i+1)
		}
		s = &next
	}
	next, g := TakeToken(s, r, t0)
	if g.OK || g.RetryIn != 250*time.Millisecond {
		t.Fatalf("fourth take = %+v, want refused with 250ms to wait", g)
	}
	if next.Tokens != 0 || next.LastMS != t0.UnixMilli() {
		t.Fatalf("state after refusal = %+v", next)
	}
}

func TestTakeTokenKeepsTheRefillOfARefusal(t *testing.T) {
	t.Parallel()
	r := bucket.Rate{PerSecond: 1, Burst: 5}
	s := Stored{Tokens: 0, LastMS: t0.UnixMilli()}
	// 600ms accrue 0.6 tokens: refused, but the 0.6 must be stored.
	s, g := TakeToken(&s, r, t0.Add(600*time.Millisecond))
	if g.OK || g.RetryIn != 400*time.Millisecond {
		t.Fatalf("take at +600ms = %+v, want refused with 400ms to wait", g)
	}
	if s.LastMS != t0.Add(600*time.Millisecond).UnixMilli() || s.Tokens < 0.599 || s.Tokens > 0.601 {
		t.Fatalf("refused take stored %+v, want 0.6 tokens at +600ms", s)
	}
	if _, g := TakeToken(&s, r, t0.Add(time.Second)); !g.OK {
		t.Fatal("the token that accrued by +1s was refused")
	}
}

// A flood at any pace never gets more than burst + rate·t tokens, and the
// stored form (what the Durable Object writes) loses nothing between takes.
func TestTakeTokenCapsAFloodAcrossStorage(t *testing.T) {
	t.Parallel()
	r := bucket.Rate{PerSecond: 10, Burst: 20}
	var raw []byte // the object's storage
	granted := 0
	for ms := 0; ms <= 3000; ms += 5 {
		var prev *Stored
		if raw != nil {
			prev = new(Stored)
			if err := json.Unmarshal(raw, prev); err != nil {
				t.Fatal(err)
			}
		}
		next, g := TakeToken(prev, r, t0.Add(time.Duration(ms)*time.Millisecond))
		if g.OK {
			granted++
		}
		var err error
		if raw, err = json.Marshal(next); err != nil {
			t.Fatal(err)
		}
	}
	// 3s at 10/s plus the burst of 20, and no fewer: the flood wants more.
	if granted != 50 {
		t.Fatalf("granted %d tokens in 3s at 10/s with burst 20, want 50", granted)
	}
}

func TestTakeTokenIgnoresABackwardClock(t *testing.T) {
	t.Parallel()
	r := bucket.Rate{PerSecond: 100, Burst: 10}
	s := Stored{Tokens: 0, LastMS: t0.UnixMilli()}
	next, g := TakeToken(&s, r, t0.Add(-time.Minute))
	if g.OK || next != s {
		t.Fatalf("a clock a minute back gave %+v and stored %+v", g, next)
	}
}

func TestRetryInMSRoundsUp(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]int64{0: 1, time.Nanosecond: 1, time.Millisecond: 1, 1500 * time.Microsecond: 2, 250 * time.Millisecond: 250} {
		if got := retryInMS(d); got != want {
			t.Errorf("retryInMS(%v) = %d, want %d", d, got, want)
		}
	}
}
