package bench

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/loadtest/report"
)

// A virtual machine's host can slow its CPUs down without taking them
// away: on the reference machine /proc/stat's steal stays at 0 while a
// fixed computation, alone on an idle CPU, runs at a fifth of its speed
// for 50–200 ms at a time, every second or two. Every process's latency
// stretches in those windows, the floors' as well as sluice's, so the
// latency section first measures how steady the machine's CPUs are.

// steadiness is what the probe saw: how many windows, over all CPUs, and
// how many of them did under half the work of that CPU's best window.
type steadiness struct {
	CPUs    int           `json:"cpus"`
	Window  report.Millis `json:"window_ms"`
	Windows int           `json:"windows"`
	Slow    int           `json:"slow"`
	// Slowest is the least work done in one window, as a share of its
	// CPU's best window.
	Slowest float64 `json:"slowest"`
}

// steadinessOf sums up the work counted in each window on each CPU. A CPU
// that counted nothing in any window is left out: it had no best to
// compare with.
func steadinessOf(counts [][]int, window time.Duration) steadiness {
	s := steadiness{CPUs: len(counts), Window: report.Millis(window), Slowest: 1}
	for _, cpu := range counts {
		best := 0
		for _, c := range cpu {
			best = max(best, c)
		}
		if best == 0 {
			continue
		}
		for _, c := range cpu {
			s.Windows++
			share := float64(c) / float64(best)
			if share < 0.5 {
				s.Slow++
			}
			s.Slowest = min(s.Slowest, share)
		}
	}
	if s.Windows == 0 {
		s.Slowest = 0
	}
	return s
}

// probeSpin keeps the probe's arithmetic from being optimised away.
var probeSpin atomic.Uint64

// probeSteadiness runs one thread per CPU for d, each repeating a fixed
// computation (a few microseconds, no memory beyond 4 KiB, no system calls)
// and counting how many it finishes in each window.
func probeSteadiness(ctx context.Context, d, window time.Duration, now func() time.Time) steadiness {
	n := runtime.NumCPU()
	counts := make([][]int, n)
	start := now()
	windows := int(d / window)
	var wg sync.WaitGroup
	for cpu := range n {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			c := make([]int, windows)
			var buf [512]uint64
			x := uint64(cpu + 1)
			for ctx.Err() == nil {
				k := int(now().Sub(start) / window)
				if k >= windows {
					break
				}
				for range 2000 {
					x = x*6364136223846793005 + 1442695040888963407
					buf[x%512] += x
				}
				c[k]++
			}
			probeSpin.Add(buf[0])
			counts[cpu] = c
		})
	}
	wg.Wait()
	return steadinessOf(counts, window)
}

// text is how the latency section's row shows it.
func (s steadiness) text() string {
	return fmt.Sprintf("%d of %d (slowest at %.0f%%)", s.Slow, s.Windows, s.Slowest*100)
}
