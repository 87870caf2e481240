package report

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-dev/sluice/shared/bucket"
)

// Millis is a duration that reads as milliseconds in JSON.
type Millis time.Duration

// MarshalJSON writes the duration as a number of milliseconds.
func (m Millis) MarshalJSON() ([]byte, error) {
	return json.Marshal(float64(time.Duration(m).Microseconds()) / 1000)
}

// UnmarshalJSON reads a number of milliseconds.
func (m *Millis) UnmarshalJSON(b []byte) error {
	var ms float64
	if err := json.Unmarshal(b, &ms); err != nil {
		return err
	}
	*m = Millis(time.Duration(ms * float64(time.Millisecond)))
	return nil
}

// Row is one subscriber's line in a scenario's table.
type Row struct {
	Subscriber string      `json:"subscriber"`
	Role       string      `json:"role"`
	Advertised bucket.Rate `json:"advertised"`
	Tally
	Duplicates int `json:"duplicates"`
	// MaxWindow is the most requests (of any outcome) the receiver saw in
	// one second; Limit is what the advertised rate allows there.
	MaxWindow     int    `json:"max_1s_window"`
	Limit         int    `json:"limit_1s"`
	Violation     bool   `json:"rate_exceeded"`
	Sent429       int    `json:"responses_429"`
	Banned        bool   `json:"banned"`
	Sent403       int    `json:"responses_403"`
	BadSignatures int    `json:"bad_signatures"`
	BadBodies     int    `json:"bad_bodies"` // signed, but not the event its webhook-id names
	P50           Millis `json:"p50_ms"`     // enqueue → first accept
	P99           Millis `json:"p99_ms"`
	// Drain is from the burst's first byte to the last owed event's
	// settling (delivered, or dead); set only when everything settled.
	Drain   Millis `json:"drain_ms"`
	Drained bool   `json:"drained"`
	// MustDrain marks a subscriber fast enough to drain within the run: one
	// still owed deliveries at the deadline fails it, since a stalled
	// sender (claims never reclaimed after a kill, a subscriber it stopped
	// serving) loses nothing it still lists as pending.
	MustDrain bool `json:"must_drain"`
	// MinServed is, for a subscriber too slow to drain in the run, the
	// fewest deliveries it must have had: half of what its rate and answer
	// time allowed over the run. Fewer means sluice stopped serving it,
	// which loses nothing it still lists as pending.
	MinServed   int      `json:"min_served,omitempty"`
	DeadLetters int      `json:"dead_letters"` // from /v1/stats
	Notes       []string `json:"notes,omitempty"`
}

// Failed reports why the row fails the run's promises, or "" when it holds
// them: nothing lost, the advertised rate never exceeded, no forged or
// mangled request accepted.
func (r Row) Failed() string {
	var why []string
	if r.Lost > 0 {
		why = append(why, fmt.Sprintf("%d lost", r.Lost))
	}
	if r.Violation {
		why = append(why, fmt.Sprintf("%d requests in one second, limit %d", r.MaxWindow, r.Limit))
	}
	if r.BadSignatures > 0 {
		why = append(why, fmt.Sprintf("%d bad signatures", r.BadSignatures))
	}
	if r.BadBodies > 0 {
		why = append(why, fmt.Sprintf("%d signed bodies that were not the event their webhook-id names", r.BadBodies))
	}
	if !r.MustDrain && r.Delivered < r.MinServed {
		why = append(why, fmt.Sprintf("only %d delivered, under half of what its rate and answer time allowed over the run (at least %d): starved",
			r.Delivered, r.MinServed))
	}
	if owed := r.Pending + r.Inflight; r.MustDrain && owed > 0 {
		why = append(why, fmt.Sprintf("%d still pending or in flight at the deadline", owed))
	}
	if r.Banned {
		// The seed incident itself: a sender the partner had to ban.
		why = append(why, "banned by the partner for ignoring its Retry-After")
	}
	return strings.Join(why, ", ")
}

// WriteTable prints rows as an aligned table under title, then one line per
// failing row and per note.
func WriteTable(w io.Writer, title string, rows []Row) error {
	if _, err := fmt.Fprintf(w, "%s\n", title); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "subscriber\trole\tdelivered\tpending\tlost\tdup\tmax 1s / limit\t429s\tp50\tp99\tdrain\tdead")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%d\t%s\t%s\t%s\t%d\n",
			r.Subscriber, r.Role, fraction(r.Delivered, r.Expected), r.Pending+r.Inflight, r.Lost, r.Duplicates,
			window(r), r.Sent429, Short(time.Duration(r.P50)), Short(time.Duration(r.P99)), drain(r), r.DeadLetters)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rows {
		if why := r.Failed(); why != "" {
			fmt.Fprintf(w, "  FAIL %s: %s", r.Subscriber, why)
			if len(r.LostIDs) > 0 {
				fmt.Fprintf(w, " (first lost: %s)", strings.Join(r.LostIDs[:min(5, len(r.LostIDs))], " "))
			}
			fmt.Fprintln(w)
		}
		for _, n := range r.Notes {
			fmt.Fprintf(w, "  note %s: %s\n", r.Subscriber, n)
		}
	}
	return nil
}

func fraction(n, of int) string {
	if of == 0 {
		return strconv.Itoa(n)
	}
	return fmt.Sprintf("%d/%d", n, of)
}

func window(r Row) string {
	s := fmt.Sprintf("%d / %d", r.MaxWindow, r.Limit)
	if r.Violation {
		s += " !"
	}
	return s
}

func drain(r Row) string {
	if !r.Drained {
		if r.Expected == 0 {
			return "-"
		}
		return fmt.Sprintf("(%d%%)", r.Delivered*100/r.Expected)
	}
	return Short(time.Duration(r.Drain))
}

// Short formats d with three significant figures: 840µs, 12.3ms, 4.56s, 2m3s.
func Short(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < time.Second:
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', decimals(float64(d)/float64(time.Millisecond)), 64) + "ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', decimals(d.Seconds()), 64) + "s"
	default:
		return d.Round(time.Second).String()
	}
}

func decimals(v float64) int {
	switch {
	case v < 10:
		return 2
	case v < 100:
		return 1
	default:
		return 0
	}
}
