package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// hostCPU is the machine-wide CPU time from /proc/stat, in clock ticks:
// all of it, and the part a hypervisor gave to other guests while this
// machine's virtual CPUs wanted to run ("steal"). On a shared virtual
// machine steal comes in bursts that stall every process for milliseconds
// at a time, and tail latencies follow it rather than the code under test,
// so each latency run reports what it was.
type hostCPU struct {
	total, steal uint64
	ok           bool
}

func readHostCPU() hostCPU {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return hostCPU{}
	}
	return parseHostCPU(string(b))
}

// parseHostCPU reads the aggregate "cpu" line of /proc/stat: user, nice,
// system, idle, iowait, irq, softirq, steal (guest time is already inside
// user and nice, so the sum stops at steal). Kernels before 2.6.11 have no
// steal field; those read as not known.
func parseHostCPU(stat string) hostCPU {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return hostCPU{}
	}
	var h hostCPU
	for i, s := range f[1:9] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return hostCPU{}
		}
		h.total += v
		if i == 7 {
			h.steal = v
		}
	}
	h.ok = true
	return h
}

// stealBetween is the share of the machine's CPU time between two readings
// that went to steal.
func stealBetween(a, b hostCPU) (float64, bool) {
	if !a.ok || !b.ok || b.total <= a.total || b.steal < a.steal {
		return 0, false
	}
	return float64(b.steal-a.steal) / float64(b.total-a.total), true
}

func stealText(share float64) string {
	return fmt.Sprintf("steal %.0f%% (CPU time the hypervisor gave to other guests)", share*100)
}
