package bucket

import (
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
	if tiny := (Rate{PerSecond: 1, Burst: 1}).Scale(0.5); tiny.Burst != 1 {
		t.Fatalf("Scale kept burst %v below one token", tiny.Burst)
	}
	for _, bad := range []Rate{{0, 1}, {1, 0.5}, {-1, 10}} {
		if bad.Valid() {
			t.Errorf("%+v reported valid", bad)
		}
	}
}

// A sender's first spend from a full bucket starts the refill SendMargin
// later; a receiver's bucket (Take) refills at once. Later spends, with the
// bucket below full, move nothing.
func TestTakeToSendStartsTheRefillAMarginLater(t *testing.T) {
	t.Parallel()
	r := Rate{PerSecond: 10, Burst: 20}
	s := Full(r, t0)
	for i := range 20 {
		var ok bool
		if s, ok = TakeToSend(s, r, t0.Add(time.Duration(i)*time.Millisecond), 1); !ok {
			t.Fatalf("take %d of the burst refused", i+1)
		}
	}
	if !s.Last.Equal(t0.Add(SendMargin)) {
		t.Fatalf("Last = %v after the burst, want the first spend + SendMargin", s.Last.Sub(t0))
	}
	if got, want := Wait(s, r, t0.Add(19*time.Millisecond)), SendMargin+100*time.Millisecond-19*time.Millisecond; got != want {
		t.Fatalf("Wait after the burst = %v, want %v", got, want)
	}
	first := t0.Add(SendMargin + 100*time.Millisecond)
	if _, ok := TakeToSend(s, r, first.Add(-time.Millisecond), 1); ok {
		t.Fatal("a 21st token 1 ms before the margin and one interval had passed")
	}
	s, ok := TakeToSend(s, r, first, 1)
	if !ok {
		t.Fatal("no 21st token once the margin and one interval had passed")
	}
	if !s.Last.Equal(first) {
		t.Fatalf("a spend below full moved Last to %v, want %v", s.Last.Sub(t0), first.Sub(t0))
	}
	// Over the next second exactly ten more, as with Take.
	spent := 0
	for ms := 1; ms <= 1000; ms++ {
		if s, ok = TakeToSend(s, r, first.Add(time.Duration(ms)*time.Millisecond), 1); ok {
			spent++
		}
	}
	if spent != 10 {
		t.Fatalf("spent %d tokens in 1s at 10/s, want 10", spent)
	}

	recv, _ := Take(Full(r, t0), r, t0, 1)
	if !recv.Last.Equal(t0) {
		t.Fatalf("Take moved a receiver's Last to %v", recv.Last.Sub(t0))
	}
	one := Rate{PerSecond: 2, Burst: 1}
	if s, _ := TakeToSend(Full(one, t0), one, t0, 1); !s.Last.Equal(t0) {
		t.Fatalf("a burst of one got a margin: Last %v", s.Last.Sub(t0))
	}
}

// The margin never makes a sender at or below the rate wait: it is at most
// what the burst left after a spend covers at the full rate.
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
	if m := margin(Rate{PerSecond: 100, Burst: 2}); m != 10*time.Millisecond {
		t.Fatalf("margin at 100/s, burst 2 = %v, want the 10 ms one spare token covers", m)
	}
}
