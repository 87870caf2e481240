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
