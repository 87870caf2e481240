package fakeclock_test

import (
	"testing"
	"time"

	"github.com/sluice-dev/sluice/shared/fakeclock"
)

func TestAdvanceMovesNowAndFiresDueTimers(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 7, 11, 8, 14, 2, 0, time.UTC)
	c := fakeclock.New(t0)
	now := c.After(0)
	soon, later := c.After(time.Second), c.After(time.Minute)
	if got := <-now; !got.Equal(t0) {
		t.Fatalf("After(0) gave %v, want %v at once", got, t0)
	}
	c.Advance(999 * time.Millisecond)
	select {
	case <-soon:
		t.Fatal("a 1 s timer fired 999 ms in")
	default:
	}
	c.Advance(time.Millisecond)
	if got := <-soon; !got.Equal(t0.Add(time.Second)) {
		t.Fatalf("the 1 s timer gave %v, want %v", got, t0.Add(time.Second))
	}
	select {
	case <-later:
		t.Fatal("a 1 min timer fired 1 s in")
	default:
	}
	c.Advance(time.Hour)
	if got := <-later; !got.Equal(t0.Add(time.Hour + time.Second)) {
		t.Fatalf("the 1 min timer gave %v, want the time Advance reached", got)
	}
	if got := c.Now(); !got.Equal(t0.Add(time.Hour + time.Second)) {
		t.Fatalf("Now = %v after advancing 1h1s", got)
	}
}
