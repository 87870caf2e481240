// Package bench measures one sluice build on one machine, black-box: it
// starts real `sluice serve` processes on temp databases, drives them over
// HTTP from 127.0.0.1, reads /metrics and /proc, and returns one table —
// ingest rates, end-to-end delivery rate and latency, rate-cap accuracy,
// row writes per delivery while throttled, memory and claim latency with a
// million deliveries pending, and the canal scenario beside the naive loop.
// A missed target is a number in the table, not an error.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-dev/sluice/loadtest/report"
)

// Options size one run; zero values take the defaults, which keep the
// whole run under 4 minutes on 2 cores.
type Options struct {
	Sluice string // the sluice binary (required)
	// Relay is a loadtest binary whose `relay` command the latency section
	// runs as the machine's floor; empty skips that measurement.
	Relay     string
	ServeArgs []string // extra `sluice serve` flags, after --log-level warn
	// Only lists the sections to run (default: all of Sections).
	Only []string

	IngestFor     time.Duration // each ingest measurement (default 5s)
	IngestClients int           // single-event clients (default 64)
	BatchClients  int           // batch clients (default 4)
	Backlog       int           // events of the end-to-end throughput run (default 50,000)
	LatencyRate   int           // offered events/s of the latency run (default 5,000)
	LatencyFor    time.Duration // measured part of the latency run, after a 1 s warm-up (default 5s)
	Pending       int           // deliveries pending for the memory and claim run (default 1,000,000)
	ClaimFor      time.Duration // how long it claims before the histogram is read (default 5s)
	CanalEvents   int           // the canal burst (default 12,000, the seed's)
	CanalTimeout  time.Duration // the canal run's and the naive loop's bound (default 60s)

	Progress io.Writer        // one line per step (nil: discarded)
	Now      func() time.Time // default time.Now
}

func (o *Options) defaults() {
	if o.IngestFor <= 0 {
		o.IngestFor = 5 * time.Second
	}
	if o.IngestClients <= 0 {
		o.IngestClients = 64
	}
	if o.BatchClients <= 0 {
		o.BatchClients = 4
	}
	if o.Backlog <= 0 {
		o.Backlog = 50_000
	}
	if o.LatencyRate <= 0 {
		o.LatencyRate = 5000
	}
	if o.LatencyFor <= 0 {
		o.LatencyFor = 5 * time.Second
	}
	if o.Pending <= 0 {
		o.Pending = 1_000_000
	}
	if o.ClaimFor <= 0 {
		o.ClaimFor = 5 * time.Second
	}
	if o.CanalEvents <= 0 {
		o.CanalEvents = 12000
	}
	if o.CanalTimeout <= 0 {
		o.CanalTimeout = 60 * time.Second
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Row is one line of the table. Value is the number the row is judged on,
// in Unit; Shown is how the table prints it.
type Row struct {
	Section string   `json:"section"`
	Metric  string   `json:"metric"`
	Value   *float64 `json:"value"` // null when there is no number (an error)
	Unit    string   `json:"unit"`
	Shown   string   `json:"shown"`
	Target  string   `json:"target"`
	// Pass is whether Value meets Target; null when the row has no target.
	Pass *bool `json:"pass"`
}

// Result is one run.
type Result struct {
	Started   time.Time     `json:"started"`
	Elapsed   report.Millis `json:"elapsed_ms"`
	GoVersion string        `json:"go_version"`
	OS        string        `json:"os"`
	CPUs      int           `json:"cpus"`
	Sluice    string        `json:"sluice"`
	// LoadBefore and LoadAfter are /proc/loadavg's 1, 5 and 15-minute
	// averages: other work on the machine skews every number.
	LoadBefore string `json:"load_before,omitempty"`
	LoadAfter  string `json:"load_after,omitempty"`
	// Steal is the share of the machine's CPU time over the run that a
	// hypervisor gave to other guests (absent where /proc/stat has none).
	Steal *float64 `json:"steal,omitempty"`
	Rows  []Row    `json:"rows"`
	// Notes say how each number was taken; Errors, which sections broke.
	Notes   []string       `json:"notes"`
	Errors  []string       `json:"errors,omitempty"`
	Details map[string]any `json:"details"` // each section's raw numbers
}

// section is one measurement: its rows, notes and raw numbers.
type section struct {
	name  string
	title string
	run   func(ctx context.Context, o *Options) (sectionResult, error)
}

type sectionResult struct {
	rows    []Row
	notes   []string
	details any
}

// Sections are the measurements in the order they run.
var Sections = []string{"ingest", "throughput", "latency", "ratecap", "writes", "pending", "canal"}

func sections() []section {
	return []section{
		{"ingest", "ingest", runIngest},
		{"throughput", "deliveries/s end to end", runThroughput},
		{"latency", "enqueue→delivery latency", runLatency},
		{"ratecap", "rate-cap accuracy", runRateCap},
		{"writes", "row writes while throttled", runWrites},
		{"pending", "RSS and claim latency with deliveries pending", runPending},
		{"canal", "canal scenario vs naive loop", runCanal},
	}
}

// Run takes every measurement in turn. A section that breaks (sluice fails
// to start, a bounded wait runs out) becomes an error row and the run goes
// on; Run itself fails only when ctx ends.
func Run(ctx context.Context, o Options) (*Result, error) {
	o.defaults()
	if o.Sluice == "" {
		return nil, errors.New("bench: Options.Sluice (the sluice binary) is required")
	}
	for _, name := range o.Only {
		if !slices.Contains(Sections, name) {
			return nil, fmt.Errorf("bench: no section %q (have %s)", name, strings.Join(Sections, ", "))
		}
	}
	res := &Result{
		Started: o.Now(), GoVersion: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH,
		CPUs: runtime.NumCPU(), Sluice: o.Sluice, Details: map[string]any{}, LoadBefore: loadAvg(),
	}
	host := readHostCPU()
	for _, s := range sections() {
		if len(o.Only) > 0 && !slices.Contains(o.Only, s.name) {
			continue
		}
		began := o.Now()
		fmt.Fprintf(o.Progress, "bench: %s …\n", s.title)
		sr, err := s.run(ctx, &o)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil {
			res.Errors = append(res.Errors, s.name+": "+err.Error())
			first, _, _ := strings.Cut(err.Error(), "\n")
			res.Rows = append(res.Rows, Row{Section: s.name, Metric: s.title, Shown: "error: " + first, Target: "runs", Pass: mark(false)})
			fmt.Fprintf(o.Progress, "bench: %s failed after %s: %v\n", s.title, report.Short(o.Now().Sub(began)), err)
			continue
		}
		for i := range sr.rows {
			sr.rows[i].Section = s.name
		}
		res.Rows = append(res.Rows, sr.rows...)
		res.Notes = append(res.Notes, sr.notes...)
		res.Details[s.name] = sr.details
		fmt.Fprintf(o.Progress, "bench: %s done in %s\n", s.title, report.Short(o.Now().Sub(began)))
	}
	res.Elapsed = report.Millis(o.Now().Sub(res.Started))
	res.LoadAfter = loadAvg()
	if st, ok := stealBetween(host, readHostCPU()); ok {
		res.Steal = &st
	}
	return res, nil
}

// Write prints the table, then how the numbers were taken.
func (r *Result) Write(w io.Writer) error {
	fmt.Fprintf(w, "sluice bench: %s, %d CPUs, %s, took %s", r.OS, r.CPUs, r.GoVersion, report.Short(time.Duration(r.Elapsed)))
	if r.LoadBefore != "" {
		fmt.Fprintf(w, ", load average %s before, %s after", r.LoadBefore, r.LoadAfter)
	}
	if r.Steal != nil {
		fmt.Fprintf(w, ", %s", stealText(*r.Steal))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "metric\tvalue\ttarget\t")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", row.Metric, row.Shown, row.Target, markText(row.Pass))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	passed, missed := 0, 0
	for _, row := range r.Rows {
		switch {
		case row.Pass == nil:
		case *row.Pass:
			passed++
		default:
			missed++
		}
	}
	fmt.Fprintf(w, "%d of %d targets met\n", passed, passed+missed)
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  · %s\n", n)
	}
	for _, e := range r.Errors {
		fmt.Fprintf(w, "  error %s\n", e)
	}
	return nil
}

func markText(p *bool) string {
	switch {
	case p == nil:
		return ""
	case *p:
		return "✓"
	default:
		return "✗"
	}
}

func mark(ok bool) *bool { return &ok }

func num(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// loadAvg is the machine's load averages from /proc/loadavg ("" elsewhere).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// thousands formats n with thin separators: 1,000,000.
func thousands(n float64) string {
	s := fmt.Sprintf("%.0f", math.Round(n))
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// ms formats seconds as milliseconds with three significant figures.
func ms(seconds float64) string {
	if math.IsNaN(seconds) {
		return "n/a"
	}
	return report.Short(time.Duration(seconds * float64(time.Second)))
}
