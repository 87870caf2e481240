package ledger

import (
	"math"
	"sync"
	"time"
)

// The stats window (attempts, successes and enqueue-to-delivery latency of
// the last minutes) is counted in memory as outcomes commit, not queried
// from indexes on attempts.at and deliveries.sent_at: those two indexes
// cost a b-tree insert each per delivery on the hot path, for a read an
// operator makes every few seconds. The window starts empty when the
// process starts.

const (
	slotWidth   = 30 * time.Second
	windowSlots = 11 // 5 minutes of 30 s slots, plus the one being filled
	maxWindow   = (windowSlots - 1) * slotWidth

	// Latencies up to linearMS are counted per millisecond; above, in
	// buckets 5% wide up to a month, so a percentile is off by under 5%:
	// a delivery held by a long pause, or a dead letter recovered days
	// later, is counted as late as it was. Beyond, the last bucket's floor.
	linearMS     = 64
	growth       = 1.05
	logBuckets   = 360 // 64 ms · 1.05^360 > 31 days
	latencySlots = linearMS + logBuckets + 1
)

// slot is one slotWidth of a subscriber's outcomes.
type slot struct {
	n                              int64 // the slot's number: unix time / slotWidth
	attempts, successes, delivered int
	latency                        [latencySlots]uint32
}

// windows holds the recent slots of each subscriber that had outcomes in
// the last maxWindow (about 18 KiB each); quiet ones are dropped.
type windows struct {
	mu     sync.Mutex
	subs   map[string]*[windowSlots]slot
	pruned int64 // the slot number of the last sweep for quiet subscribers
}

// windowEntry is one committed result as the window counts it.
type windowEntry struct {
	subscriber string
	attempt    bool // an attempt was made (not a deferral or a release)
	success    bool
	delivered  bool
	latency    time.Duration // enqueue to delivery, when delivered
}

func (w *windows) add(at time.Time, entries []windowEntry) {
	n := at.UnixNano() / int64(slotWidth)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.subs == nil {
		w.subs = map[string]*[windowSlots]slot{}
	}
	if n != w.pruned {
		w.pruned = n
		w.pruneLocked(n)
	}
	for _, e := range entries {
		ring, ok := w.subs[e.subscriber]
		if !ok {
			ring = new([windowSlots]slot)
			w.subs[e.subscriber] = ring
		}
		s := &ring[n%windowSlots]
		if s.n > n {
			continue // older than what the ring now holds (the clock stepped back)
		}
		if s.n != n {
			*s = slot{n: n}
		}
		if e.attempt {
			s.attempts++
			if e.success {
				s.successes++
			}
		}
		if e.delivered {
			s.delivered++
			s.latency[latencyBucket(e.latency)]++
		}
	}
}

// pruneLocked drops the windows with no slot in the window ending at slot n.
func (w *windows) pruneLocked(n int64) {
	for id, ring := range w.subs {
		quiet := true
		for i := range ring {
			if ring[i].n > n-windowSlots {
				quiet = false
				break
			}
		}
		if quiet {
			delete(w.subs, id)
		}
	}
}

// forget drops a removed subscriber's window.
func (w *windows) forget(id string) {
	w.mu.Lock()
	delete(w.subs, id)
	w.mu.Unlock()
}

// fill sums each subscriber's slots that start at or after since (to the
// slot: up to slotWidth more than asked) and fills the window fields of out.
func (w *windows) fill(out map[string]*SubscriberStats, since, now time.Time) {
	from := fromSlot(since, now)
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, ring := range w.subs {
		var sum windowSum
		sum.add(ring, from)
		if sum.st.Attempts == 0 && sum.st.Delivered == 0 {
			continue
		}
		o, ok := out[id]
		if !ok {
			o = &SubscriberStats{}
			out[id] = o
		}
		st := sum.stats()
		o.Attempts, o.Successes, o.Delivered, o.P50, o.P99 = st.Attempts, st.Successes, st.Delivered, st.P50, st.P99
	}
}

// total sums every subscriber's slots that start at or after since, as
// fill does for each: the window of all deliveries together.
func (w *windows) total(since, now time.Time) SubscriberStats {
	from := fromSlot(since, now)
	w.mu.Lock()
	defer w.mu.Unlock()
	var sum windowSum
	for _, ring := range w.subs {
		sum.add(ring, from)
	}
	return sum.stats()
}

// fromSlot is the first slot of the window since since, at most maxWindow.
func fromSlot(since, now time.Time) int64 {
	if now.Sub(since) > maxWindow {
		since = now.Add(-maxWindow)
	}
	return since.UnixNano() / int64(slotWidth)
}

// windowSum adds up slots: counts and the latency histogram.
type windowSum struct {
	st   SubscriberStats
	hist [latencySlots]uint64
}

// add adds the ring's slots from slot from on.
func (w *windowSum) add(ring *[windowSlots]slot, from int64) {
	for i := range ring {
		s := &ring[i]
		if s.n < from || s.n == 0 {
			continue
		}
		w.st.Attempts += s.attempts
		w.st.Successes += s.successes
		w.st.Delivered += s.delivered
		for b, c := range s.latency {
			w.hist[b] += uint64(c)
		}
	}
}

// stats is the sum with its percentiles.
func (w *windowSum) stats() SubscriberStats {
	st := w.st
	st.P50 = histPercentile(&w.hist, st.Delivered, 0.50)
	st.P99 = histPercentile(&w.hist, st.Delivered, 0.99)
	return st
}

// latencyBucket is the histogram bucket of d.
func latencyBucket(d time.Duration) int {
	ms := d.Milliseconds()
	if ms < linearMS {
		return int(max(ms, 0))
	}
	b := linearMS + int(math.Log(float64(ms)/linearMS)/math.Log(growth))
	return min(b, latencySlots-1)
}

// bucketFloor is the smallest latency bucket b holds.
func bucketFloor(b int) time.Duration {
	if b < linearMS {
		return time.Duration(b) * time.Millisecond
	}
	return time.Duration(math.Ceil(linearMS*math.Pow(growth, float64(b-linearMS)))) * time.Millisecond
}

// histPercentile is the nearest-rank percentile p of n counted latencies,
// as the floor of its bucket.
func histPercentile(hist *[latencySlots]uint64, n int, p float64) time.Duration {
	if n == 0 {
		return 0
	}
	rank := uint64(max(1, int(math.Ceil(p*float64(n)))))
	var seen uint64
	for b, c := range hist {
		seen += c
		if seen >= rank {
			return bucketFloor(b)
		}
	}
	return bucketFloor(latencySlots - 1)
}
