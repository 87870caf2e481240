package report

import "sort"

// Sluice is where sluice says each event's delivery to one subscriber stands,
// by event id: read from its API before the receiver's record is read, so a
// delivery moving on meanwhile is found in one place or the other.
type Sluice struct {
	Pending  map[string]bool
	Inflight map[string]bool
	Dead     map[string]bool
}

// Tally is one subscriber's account of the events it was owed.
type Tally struct {
	Expected  int `json:"expected"`
	Delivered int `json:"delivered"` // accepted by the receiver at least once
	Pending   int `json:"pending"`   // not delivered, still pending in sluice
	Inflight  int `json:"inflight"`  // not delivered, claimed by sluice
	Dead      int `json:"dead"`      // not delivered, dead-lettered
	// Lost were owed, never delivered, and sluice holds them nowhere: it
	// dropped them or believes it sent them. It must be zero.
	Lost    int      `json:"lost"`
	LostIDs []string `json:"lost_ids,omitempty"`
	// Unexpected were delivered but never owed (another run's events, or a
	// delivery to the wrong subscriber).
	Unexpected int `json:"unexpected"`
}

// Account sorts each expected event into exactly one bucket, in this order:
// delivered (accepts[id] > 0), inflight, pending, dead, lost. A delivery both
// accepted and still held by sluice (its outcome not yet recorded when it was
// read) counts as delivered.
func Account(expected []string, accepts map[string]int, s Sluice) Tally {
	t := Tally{Expected: len(expected)}
	owed := make(map[string]bool, len(expected))
	for _, id := range expected {
		owed[id] = true
		switch {
		case accepts[id] > 0:
			t.Delivered++
		case s.Inflight[id]:
			t.Inflight++
		case s.Pending[id]:
			t.Pending++
		case s.Dead[id]:
			t.Dead++
		default:
			t.Lost++
			t.LostIDs = append(t.LostIDs, id)
		}
	}
	for id, n := range accepts {
		if n > 0 && !owed[id] {
			t.Unexpected++
		}
	}
	sort.Strings(t.LostIDs)
	return t
}

// Duplicates counts the accepts beyond the first of each id: the times a
// receiver was handed an event it had already processed.
func Duplicates(accepts map[string]int) int {
	n := 0
	for _, c := range accepts {
		if c > 1 {
			n += c - 1
		}
	}
	return n
}

// Missing returns the expected ids never accepted, sorted.
func Missing(expected []string, accepts map[string]int) []string {
	var out []string
	for _, id := range expected {
		if accepts[id] == 0 {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}
