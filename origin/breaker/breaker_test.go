package breaker

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 7, 11, 8, 0, 0, 0, time.UTC)

func TestOpensAfterThresholdProbesOnceAndCloses(t *testing.T) {
	t.Parallel()
	s := Settings{Threshold: 3, Cooldown: 10 * time.Second}
	var b Breaker
	for i := range 2 {
		b.Record(false, t0, s)
		if lim, _, _ := b.Limit(t0, s); lim != Unlimited {
			t.Fatalf("after %d failures limit = %d, want unlimited", i+1, lim)
		}
	}
	if !b.Record(false, t0, s) || b.State != Open {
		t.Fatalf("third failure left breaker %+v, want open", b)
	}
	lim, until, _ := b.Limit(t0.Add(9*time.Second), s)
	if lim != 0 || !until.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("cooling down: limit %d until %v, want 0 until +10s", lim, until)
	}
	lim, _, changed := b.Limit(t0.Add(10*time.Second), s)
	if lim != 1 || !changed || b.State != HalfOpen {
		t.Fatalf("after cooldown: limit %d changed %v state %s, want one probe", lim, changed, b.State)
	}
	if !b.Record(true, t0.Add(11*time.Second), s) || b.State != Closed || b.Failures != 0 {
		t.Fatalf("successful probe left %+v, want closed", b)
	}
}

func TestFailedProbeReopensForAFullCooldown(t *testing.T) {
	t.Parallel()
	s := Settings{Threshold: 1, Cooldown: time.Minute}
	var b Breaker
	b.Record(false, t0, s)
	b.Limit(t0.Add(time.Minute), s)
	b.Record(false, t0.Add(61*time.Second), s)
	if b.State != Open || !b.OpenedAt.Equal(t0.Add(61*time.Second)) {
		t.Fatalf("failed probe left %+v, want open from +61s", b)
	}
	if lim, _, _ := b.Limit(t0.Add(2*time.Minute), s); lim != 0 {
		t.Fatalf("limit %d one second before the new cooldown ends, want 0", lim)
	}
}

func TestSuccessResetsTheRunAndDefaultsApply(t *testing.T) {
	t.Parallel()
	var b Breaker
	for range 4 {
		b.Record(false, t0, Settings{})
	}
	b.Record(true, t0, Settings{})
	for range 4 {
		b.Record(false, t0, Settings{})
	}
	if b.State != Closed {
		t.Fatalf("4+4 failures split by a success opened the breaker: %+v", b)
	}
	b.Record(false, t0, Settings{})
	if b.State != Open {
		t.Fatalf("5 consecutive failures with default settings left %+v", b)
	}
	if lim, until, _ := b.Limit(t0.Add(59*time.Second), Settings{}); lim != 0 || !until.Equal(t0.Add(time.Minute)) {
		t.Fatalf("default cooldown: limit %d until %v", lim, until)
	}
}

// Failures reads as the run it is: the failures that opened the breaker
// and the probes that failed after, until a success.
func TestFailuresCountTheRunThatOpenedIt(t *testing.T) {
	s := Settings{Threshold: 3, Cooldown: time.Second}
	var b Breaker
	for i := range 3 {
		b.Record(false, t0.Add(time.Duration(i)*time.Millisecond), s)
	}
	if b.State != Open || b.Failures != 3 {
		t.Fatalf("after 3 failures: %+v; want open with 3", b)
	}
	b.Limit(t0.Add(2*time.Second), s)
	b.Record(false, t0.Add(2*time.Second), s)
	if b.State != Open || b.Failures != 4 {
		t.Fatalf("after a failed probe: %+v; want open with 4", b)
	}
	b.Limit(t0.Add(4*time.Second), s)
	b.Record(true, t0.Add(4*time.Second), s)
	if b.State != Closed || b.Failures != 0 {
		t.Fatalf("after a good probe: %+v; want closed with none", b)
	}
}

func TestProbeLetsAnOpenBreakerProbeNow(t *testing.T) {
	t.Parallel()
	s := Settings{Threshold: 1, Cooldown: time.Hour}
	var b Breaker
	if b.Probe() || b.State != "" {
		t.Fatalf("Probe moved a closed breaker to %q", b.State)
	}
	b.Record(false, t0, s)
	if !b.Probe() || b.State != HalfOpen {
		t.Fatalf("Probe left an open breaker %+v, want half-open", b)
	}
	if lim, _, _ := b.Limit(t0, s); lim != 1 {
		t.Fatalf("limit %d right after Probe, want one probe", lim)
	}
	if b.Probe() {
		t.Error("Probe of a half-open breaker reported a change")
	}
	b.Record(false, t0.Add(time.Second), s)
	if lim, until, _ := b.Limit(t0.Add(time.Minute), s); lim != 0 || !until.Equal(t0.Add(time.Second+time.Hour)) {
		t.Errorf("failed probe: limit %d until %v, want a full cooldown from it", lim, until)
	}
}
