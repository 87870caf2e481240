package backoff_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/origin/backoff"
)

func TestFullJitterExact(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	// Each draw is uniform over [0, min(30m, 1s·2^attempt)], from one source.
	tests := []struct {
		attempt int
		want    time.Duration
	}{
		{1, 1538746539},      // of [0, 2s]
		{2, 2465744895},      // of [0, 4s]
		{3, 6275424014},      // of [0, 8s]
		{5, 25491090512},     // of [0, 32s]
		{10, 239898901174},   // of [0, 1024s]
		{11, 74169462731},    // of [0, 30m]: 2048s is above the cap
		{1000, 899841159691}, // of [0, 30m]
	}
	for _, tc := range tests {
		if got := backoff.FullJitter(tc.attempt, time.Second, 30*time.Minute, r); got != tc.want {
			t.Errorf("FullJitter(%d) = %d (%v), want %d (%v)", tc.attempt, got, got, tc.want, tc.want)
		}
	}
}

func TestFullJitterBounds(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	const base, cap = 100 * time.Millisecond, 30 * time.Minute
	for attempt := 0; attempt <= 100; attempt++ {
		ceiling := cap
		if attempt < 20 {
			ceiling = min(cap, base*time.Duration(1<<attempt))
		}
		for range 50 {
			if d := backoff.FullJitter(attempt, base, cap, r); d < 0 || d > ceiling {
				t.Fatalf("FullJitter(%d) = %v, want within [0, %v]", attempt, d, ceiling)
			}
		}
	}
}

// maxSource always draws the largest value allowed, exposing the ceiling.
type maxSource struct{}

func (maxSource) Int64N(n int64) int64 { return n - 1 }

func TestFullJitterCeiling(t *testing.T) {
	t.Parallel()
	tests := []struct {
		attempt   int
		base, cap time.Duration
		want      time.Duration
	}{
		{0, time.Second, time.Minute, time.Second},
		{-3, time.Second, time.Minute, time.Second},
		{1, time.Second, time.Minute, 2 * time.Second},
		{5, time.Second, time.Minute, 32 * time.Second},
		{6, time.Second, time.Minute, time.Minute},
		{62, 1, math.MaxInt64, 1 << 62},
		{63, 1, math.MaxInt64, math.MaxInt64 - 1}, // Int64N cannot take MaxInt64+1
		{200, time.Hour, math.MaxInt64, math.MaxInt64 - 1},
		{math.MaxInt, time.Second, 30 * time.Minute, 30 * time.Minute},
		{3, 0, time.Minute, 0},
		{3, time.Second, 0, 0},
		{3, time.Second, -time.Second, 0},
	}
	for _, tc := range tests {
		if got := backoff.FullJitter(tc.attempt, tc.base, tc.cap, maxSource{}); got != tc.want {
			t.Errorf("FullJitter(%d, %v, %v) at the top of its range = %v, want %v", tc.attempt, tc.base, tc.cap, got, tc.want)
		}
	}
}

func TestNewSourceIsSeeded(t *testing.T) {
	t.Parallel()
	a, b := backoff.NewSource(), backoff.NewSource()
	if a.Int64N(math.MaxInt64) == b.Int64N(math.MaxInt64) && a.Int64N(math.MaxInt64) == b.Int64N(math.MaxInt64) {
		t.Error("two sources drew the same values: not seeded independently")
	}
}
