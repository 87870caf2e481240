// Package report is the harness's arithmetic: how many arrivals fell in the
// busiest window, whether that exceeds what a subscriber advertised, which
// events were delivered, duplicated or lost, percentiles, and the tables the
// subcommands print. Everything here is a pure function of its arguments.
package report

import (
	"math"
	"time"

	"github.com/sluice-dev/sluice/shared/bucket"
)

// MaxInWindow returns the largest number of times falling in one half-open
// window [t, t+w), and the start of the first window holding that many.
// times must be sorted; the busiest window always starts at an arrival, so
// only those starts are tried.
func MaxInWindow(times []time.Time, w time.Duration) (int, time.Time) {
	best, at := 0, time.Time{}
	j := 0
	for i, t := range times {
		end := t.Add(w)
		if j < i {
			j = i
		}
		for j < len(times) && times[j].Before(end) {
			j++
		}
		if n := j - i; n > best {
			best, at = n, t
		}
	}
	return best, at
}

// Limit is the most requests a sender that keeps to r can land in any window
// of length w at the receiver: the burst plus what the rate refills during
// the window. jitter widens the window by how much the delay between send
// and arrival may vary (two sends 1.05 s apart can arrive 1 s apart), so
// scheduling noise on a loaded machine is not reported as a violation; it
// is 0 for a strict check.
func Limit(r bucket.Rate, w, jitter time.Duration) int {
	return int(math.Floor(r.Burst + r.PerSecond*(w+jitter).Seconds() + 1e-9))
}

// Exceeds reports whether seen requests in one window break r's limit.
// A zero rate advertises nothing and is never exceeded.
func Exceeds(seen int, r bucket.Rate, w, jitter time.Duration) bool {
	if r.PerSecond <= 0 {
		return false
	}
	return seen > Limit(r, w, jitter)
}

// Percentile returns the nearest-rank percentile p (0 < p ≤ 1) of sorted
// values, 0 when there are none: the smallest value with at least p of the
// values at or below it.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Rate is count per second over elapsed, 0 when no time passed.
func Rate(count int, elapsed time.Duration) float64 {
	if elapsed <= 0 {
		return 0
	}
	return float64(count) / elapsed.Seconds()
}
