//go:build edge

package scenario

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCanalThroughTheEdge runs canal --edge at a small scale: the Worker in
// real workerd, milestone events through it, every partner subscribed to
// both types. Nothing may be lost, no partner's rate exceeded summed over
// both lanes, and some requests must have come through the Worker. It needs
// Node and `npm ci`; `make edge-test` runs it.
func TestCanalThroughTheEdge(t *testing.T) {
	root, err := filepath.Abs("../..") // where scripts/ and node_modules/ are
	if err != nil {
		t.Fatal(err)
	}
	res, table := shortCanal(t, Options{Events: 200, Timeout: 8 * time.Second, Edge: true, Root: root})
	const expected = 200 + 50 // the burst and a milestone after every four
	for _, r := range res.Rows {
		if r.Expected != expected || r.Lost != 0 || r.Violation || r.BadSignatures != 0 {
			t.Errorf("%s: expected %d (want %d), lost %d, window %d of %d, bad signatures %d",
				r.Subscriber, r.Expected, expected, r.Lost, r.MaxWindow, r.Limit, r.BadSignatures)
		}
		// Milestones ride in the burst, so both lanes run at once, the
		// 10/s partner's too.
		if (r.Role == "fast sink" || r.Subscriber == "partner-dash") && !strings.Contains(strings.Join(r.Notes, "\n"), "through the edge Worker") {
			t.Errorf("%s: no request came through the Worker (notes %q)", r.Subscriber, r.Notes)
		}
	}
	if !res.Pass {
		t.Errorf("canal --edge failed: %v", res.Failures)
	}
	t.Logf("\n%s", table)
}
