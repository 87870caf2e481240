package bucket

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 7, 11, 8, 14, 2, 0, time.UTC)

func TestTakeDrainsBurstThenRefillsAtRate(t *testing.T) {
	t.Parallel()
	r := Rate{PerSecond: 10, Burst: 20}
	s := Full(r, t0)
	for i := range 20 {
		var ok bool
		if s, ok = Take(s, r, t0, 1); !ok {
			t.Fatalf("take %d of the burst refused", i+1)
		}
	}
	if _, ok := Take(s, r, t0, 1); ok {
		t.Fatal("took a 21st token with no time passing")
	}
	if got := Wait(s, r, t0); got != 100*time.Millisecond {
		t.Fatalf("Wait = %v, want 100ms", got)
	}
	// Over one second at 10/s exactly ten more tokens may be spent.
	spent := 0
	for ms := 1; ms <= 1000; ms++ {
		var ok bool
		if s, ok = Take(s, r, t0.Add(time.Duration(ms)*time.Millisecond), 1); ok {
			spent++
		}
	}
	if spent != 10 {
		t.Fatalf("spent %d tokens in 1s at 10/s, want 10", spent)
	}
}

func TestFailedTakeKeepsTheRefill(t *testing.T) {
	t.Parallel()
	r := Rate{PerSecond: 1, Burst: 5}
	s := Empty(t0)
	// Half a token accrues; the take fails but the half must not be lost.
	s, ok := Take(s, r, t0.Add(500*time.Millisecond), 1)
	if ok {
		t.Fatal("took a token from half a token")
	}
	if s.Tokens != 0.5 || !s.Last.Equal(t0.Add(500*time.Millisecond)) {
		t.Fatalf("state after failed take = %+v, want 0.5 tokens at +500ms", s)
	}
	if _, ok := Take(s, r, t0.Add(time.Second), 1); !ok {
		t.Fatal("a whole token accrued over 1s was refused")
	}
}

func TestRefillClampsAndIgnoresBackwardClock(t *testing.T) {
	t.Parallel()
	r := Rate{PerSecond: 100, Burst: 3}
	s := Refill(Empty(t0), r, t0.Add(time.Hour))
	if s.Tokens != 3 {
		t.Fatalf("tokens after an hour = %v, want burst 3", s.Tokens)
	}
	back := Refill(State{Tokens: 1, Last: t0}, r, t0.Add(-time.Minute))
	if back.Tokens != 1 || !back.Last.Equal(t0) {
		t.Fatalf("backward clock changed the bucket: %+v", back)
	}
	lowered := Refill(State{Tokens: 50, Last: t0}, Rate{PerSecond: 1, Burst: 2}, t0)
	if lowered.Tokens != 2 {
		t.Fatalf("tokens above a lowered burst = %v, want 2", lowered.Tokens)
	}
}

func TestAvailableAndScale(t *testing.T) {
	t.Parallel()
	r := Rate{PerSecond: 4, Burst: 10}
	if got := Available(Empty(t0), r, t0.Add(1250*time.Millisecond)); got != 5 {
		t.Fatalf("Available = %d, want 5", got)
	}
	half := r.Scale(0.5)
	if half.PerSecond != 2 || half.Burst != 5 {
		t.Fatalf("Scale(0.5) = %+v", half)
	}
	// Half of a burst of one is no whole token: two halves must not make two.
	if tiny := (Rate{PerSecond: 1, Burst: 1}).Scale(0.5); tiny.Burst != 0 || tiny.Valid() {
		t.Fatalf("Scale(0.5) of burst 1 = %+v, want no whole token, not Valid", tiny)
	}
	for _, bad := range []Rate{{0, 1}, {1, 0.5}, {-1, 10}} {
		if bad.Valid() {
			t.Errorf("%+v reported valid", bad)
		}
	}
}

// A sender's bucket spends only above its reserve (what the rate refills in
// SendMargin); a receiver's spends to the last token.
func TestTakeToSendKeepsAReserve(t *testing.T) {
	t.Parallel()
	r := Rate{PerSecond: 10, Burst: 20} // a reserve of one token
	s := Full(r, t0)
	for i := range 19 {
		var ok bool
		if s, ok = TakeToSend(s, r, t0, 1); !ok {
			t.Fatalf("take %d of the burst refused", i+1)
		}
	}
	if _, ok := TakeToSend(s, r, t0, 1); ok {
		t.Fatal("a sender spent its reserve")
	}
	if got := AvailableToSend(s, r, t0); got != 0 {
		t.Fatalf("AvailableToSend after the burst = %d, want 0", got)
	}
	if got := Available(s, r, t0); got != 1 {
		t.Fatalf("Available after the burst = %d, want the reserve's 1", got)
	}
	if got := WaitToSend(s, r, t0); got != 100*time.Millisecond {
		t.Fatalf("WaitToSend after the burst = %v, want 100ms", got)
	}
	if _, ok := TakeToSend(s, r, t0.Add(99*time.Millisecond), 1); ok {
		t.Fatal("a 20th token 1 ms before it refilled")
	}
	// Then exactly the rate: ten in each second.
	spent := 0
	for ms := 100; ms < 1100; ms++ {
		var ok bool
		if s, ok = TakeToSend(s, r, t0.Add(time.Duration(ms)*time.Millisecond), 1); ok {
			spent++
		}
	}
	if spent != 10 {
		t.Fatalf("spent %d tokens in 1s at 10/s, want 10", spent)
	}
	for _, c := range []struct {
		r    Rate
		want float64
	}{
		{Rate{PerSecond: 2, Burst: 1}, 0},         // a burst of one keeps nothing back
		{Rate{PerSecond: 100, Burst: 2}, 1},       // never so much that no token is left
		{Rate{PerSecond: 1000, Burst: 2000}, 100}, // rate × SendMargin
		{Rate{PerSecond: 0, Burst: 5}, 0},
	} {
		if got := c.r.SendReserve(); got != c.want {
			t.Errorf("SendReserve(%+v) = %v, want %v", c.r, got, c.want)
		}
	}
}

// What a sender's bucket lets through conforms to the same bucket on arrival
// when each request is delayed anywhere up to SendMargin: a strict receiver
// never refuses one, whether a burst starts from a full bucket or a nearly
// full one.
func TestSendsDelayedWithinTheMarginConformOnArrival(t *testing.T) {
	t.Parallel()
	rnd := rand.New(rand.NewPCG(7, 11))
	for _, r := range []Rate{{PerSecond: 10, Burst: 20}, {PerSecond: 5, Burst: 10}, {PerSecond: 50, Burst: 50}, {PerSecond: 200, Burst: 400}} {
		for round := range 200 {
			s := Full(r, t0)
			var sent []time.Time
			at := t0
			for range 40 + rnd.IntN(400) {
				switch rnd.IntN(4) {
				case 0: // idle until the bucket is nearly full, or full
					full := int64(r.Burst / r.PerSecond * float64(time.Second))
					at = at.Add(time.Duration(full - full/10 + rnd.Int64N(full/5)))
				case 1:
					at = at.Add(time.Duration(rnd.IntN(300)) * time.Millisecond)
				default: // as fast as the bucket lets it
					at = at.Add(time.Duration(rnd.IntN(3)) * time.Millisecond)
				}
				var ok bool
				if s, ok = TakeToSend(s, r, at, 1); ok {
					sent = append(sent, at)
				}
			}
			arrived := make([]time.Time, len(sent))
			for i, at := range sent {
				arrived[i] = at.Add(time.Duration(rnd.Int64N(int64(SendMargin) + 1)))
			}
			slices.SortFunc(arrived, func(a, b time.Time) int { return a.Compare(b) })
			recv := Full(r, t0)
			for i, at := range arrived {
				var ok bool
				// A billionth of a token absorbs float rounding, not a request.
				if recv, ok = Take(recv, r, at, 1-1e-9); !ok {
					t.Fatalf("%+v round %d: the receiver refused arrival %d of %d (%.3f tokens)", r, round, i+1, len(arrived), recv.Tokens)
				}
			}
		}
	}
}

// The reserve never makes a sender at or below the rate wait: it always
// leaves at least one token to spend.
func TestTakeToSendNeverDelaysAStreamWithinTheRate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		r       Rate
		offered float64
	}{
		{Rate{PerSecond: 100, Burst: 2}, 50},
		{Rate{PerSecond: 100, Burst: 2}, 90},
		{Rate{PerSecond: 100, Burst: 5}, 99},
		{Rate{PerSecond: 10, Burst: 20}, 9.9},
		{Rate{PerSecond: 2, Burst: 1}, 1.9},
	} {
		s := Full(c.r, t0)
		every := time.Duration(float64(time.Second) / c.offered)
		for i := range int(5 * c.offered) {
			var ok bool
			if s, ok = TakeToSend(s, c.r, t0.Add(time.Duration(i)*every), 1); !ok {
				t.Fatalf("%+v at %v/s: send %d refused", c.r, c.offered, i+1)
			}
		}
	}
}

// AvailableToSend counts what TakeToSend would spend: at one token above the
// reserve they agree, whatever the rounding of tokens − reserve.
func TestAvailableToSendAgreesWithTakeToSend(t *testing.T) {
	t.Parallel()
	rnd := rand.New(rand.NewPCG(3, 5))
	for range 100_000 {
		r := Rate{PerSecond: 1 + rnd.Float64()*100, Burst: 2 + float64(rnd.IntN(50))}
		s := State{Tokens: 1 + r.SendReserve(), Last: t0}
		_, ok := TakeToSend(s, r, t0, 1)
		if n := AvailableToSend(s, r, t0); ok != (n >= 1) || WaitToSend(s, r, t0) != 0 {
			t.Fatalf("%+v with %v tokens: TakeToSend %v, AvailableToSend %d, WaitToSend %v", r, s.Tokens, ok, n, WaitToSend(s, r, t0))
		}
	}
}
