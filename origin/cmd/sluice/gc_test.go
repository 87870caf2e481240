package main

import (
	"runtime/debug"
	"testing"
)

func TestTuneGCDefersToTheEnvironment(t *testing.T) {
	percent, limit := debug.SetGCPercent(100), debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetGCPercent(percent); debug.SetMemoryLimit(limit) })

	tuneGC(func(k string) string { return map[string]string{"GOGC": "50", "GOMEMLIMIT": "1GiB"}[k] })
	if p := debug.SetGCPercent(100); p != 100 {
		t.Fatalf("with GOGC set, tuneGC changed the GC percent to %d", p)
	}
	tuneGC(func(string) string { return "" })
	if p := debug.SetGCPercent(100); p != 400 {
		t.Fatalf("GC percent = %d, want 400", p)
	}
	if l := debug.SetMemoryLimit(-1); l != 256<<20 {
		t.Fatalf("memory limit = %d, want 256 MiB", l)
	}
}
