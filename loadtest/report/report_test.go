package report

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/shared/bucket"
)

var t0 = time.Date(2026, 7, 11, 8, 14, 2, 0, time.UTC)

func at(ms ...int) []time.Time {
	out := make([]time.Time, len(ms))
	for i, m := range ms {
		out[i] = t0.Add(time.Duration(m) * time.Millisecond)
	}
	return out
}

func TestMaxInWindow(t *testing.T) {
	t.Parallel()
	// A sender keeping to 10/s with a burst of 20: 20 at once, then one
	// every 100 ms for two seconds.
	burst := make([]int, 20)
	for i := 1; i <= 20; i++ {
		burst = append(burst, i*100)
	}
	tests := []struct {
		name  string
		times []time.Time
		want  int
		start time.Time
	}{
		{"none", nil, 0, time.Time{}},
		{"one", at(5), 1, t0.Add(5 * time.Millisecond)},
		// [500, 1500) holds 500, 999, 1000 and 1499; [0, 1000) only three.
		{"slides", at(0, 500, 999, 1000, 1499, 2600), 4, t0.Add(500 * time.Millisecond)},
		// The end is open: 0 and 1000 are never in one window.
		{"half-open", at(0, 1000), 1, t0},
		{"same instant", at(7, 7, 7, 7), 4, t0.Add(7 * time.Millisecond)},
		// [0, 1000) holds the 20 and 100…900: 29, one short of 20 + 10.
		{"bucket sender", at(burst...), 29, t0},
	}
	for _, tt := range tests {
		n, start := MaxInWindow(tt.times, time.Second)
		if n != tt.want || !start.Equal(tt.start) {
			t.Errorf("%s: MaxInWindow = %d at %v, want %d at %v", tt.name, n, start, tt.want, tt.start)
		}
	}
}

func TestLimitAndExceeds(t *testing.T) {
	t.Parallel()
	r := bucket.Rate{PerSecond: 10, Burst: 20}
	tests := []struct {
		rate   bucket.Rate
		jitter time.Duration
		want   int
	}{
		{r, 0, 30},
		{r, 50 * time.Millisecond, 30}, // 30.5 rounds down
		{r, 250 * time.Millisecond, 32},
		{bucket.Rate{PerSecond: 1000, Burst: 2000}, 50 * time.Millisecond, 3050},
		{bucket.Rate{PerSecond: 0.5, Burst: 1}, 0, 1},
		{bucket.Rate{PerSecond: 0.1, Burst: 1}, 10 * time.Second, 2}, // 1 + 0.1 × 11 = 2.1
	}
	for _, tt := range tests {
		if got := Limit(tt.rate, time.Second, tt.jitter); got != tt.want {
			t.Errorf("Limit(%+v, 1s, %s) = %d, want %d", tt.rate, tt.jitter, got, tt.want)
		}
	}
	for _, c := range []struct {
		seen int
		want bool
	}{{29, false}, {30, false}, {31, true}, {300, true}} {
		if got := Exceeds(c.seen, r, time.Second, 0); got != c.want {
			t.Errorf("Exceeds(%d, 10/s burst 20) = %v, want %v", c.seen, got, c.want)
		}
	}
	if Exceeds(1_000_000, bucket.Rate{}, time.Second, 0) {
		t.Error("a partner advertising nothing cannot be exceeded")
	}
}

func TestPercentileAndRate(t *testing.T) {
	t.Parallel()
	var hundred []time.Duration
	for i := 1; i <= 100; i++ {
		hundred = append(hundred, time.Duration(i)*time.Millisecond)
	}
	tests := []struct {
		vals []time.Duration
		p    float64
		want time.Duration
	}{
		{nil, 0.5, 0},
		{[]time.Duration{5}, 0.99, 5},
		{[]time.Duration{1, 2, 3}, 0.5, 2},
		{[]time.Duration{1, 2, 3, 4}, 0.5, 2},
		{hundred, 0.50, 50 * time.Millisecond},
		{hundred, 0.99, 99 * time.Millisecond},
		{hundred, 1, 100 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := Percentile(tt.vals, tt.p); got != tt.want {
			t.Errorf("Percentile(%d values, %v) = %v, want %v", len(tt.vals), tt.p, got, tt.want)
		}
	}
	if got := Rate(30, 3*time.Second); got != 10 {
		t.Errorf("Rate(30, 3s) = %v, want 10", got)
	}
	if got := Rate(30, 0); got != 0 {
		t.Errorf("Rate(30, 0) = %v, want 0", got)
	}
}

func set(ids ...string) map[string]bool {
	m := map[string]bool{}
	for _, id := range ids {
		m[id] = true
	}
	return m
}

func TestAccount(t *testing.T) {
	t.Parallel()
	expected := []string{"e1", "e2", "e3", "e4", "e5", "e6", "e7"}
	accepts := map[string]int{"e1": 1, "e2": 3, "e3": 1, "stray": 1, "e7": 0}
	held := Sluice{
		Inflight: set("e4", "e3"), // e3 was accepted before its outcome was recorded
		Pending:  set("e4", "e5"),
		Dead:     set("e6"),
	}
	got := Account(expected, accepts, held)
	want := Tally{
		Expected: 7, Delivered: 3, Inflight: 1, Pending: 1, Dead: 1,
		Lost: 1, LostIDs: []string{"e7"}, Unexpected: 1,
	}
	if got.Expected != want.Expected || got.Delivered != want.Delivered || got.Inflight != want.Inflight ||
		got.Pending != want.Pending || got.Dead != want.Dead || got.Lost != want.Lost ||
		!slices.Equal(got.LostIDs, want.LostIDs) || got.Unexpected != want.Unexpected {
		t.Errorf("Account = %+v, want %+v", got, want)
	}
	if sum := got.Delivered + got.Inflight + got.Pending + got.Dead + got.Lost; sum != got.Expected {
		t.Errorf("buckets sum to %d, want every expected event in exactly one: %d", sum, got.Expected)
	}
	if got := Duplicates(accepts); got != 2 {
		t.Errorf("Duplicates = %d, want 2 (e2 accepted three times)", got)
	}
	if got := Missing(expected, accepts); !slices.Equal(got, []string{"e4", "e5", "e6", "e7"}) {
		t.Errorf("Missing = %v, want [e4 e5 e6 e7]", got)
	}
}

func TestShort(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0:                        "-",
		840 * time.Microsecond:   "840µs",
		12340 * time.Microsecond: "12.3ms",
		4560 * time.Millisecond:  "4.56s",
		32300 * time.Millisecond: "32.3s",
		123 * time.Second:        "2m3s",
	} {
		if got := Short(d); got != want {
			t.Errorf("Short(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestMillisJSON(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(struct{ D Millis }{Millis(1500 * time.Microsecond)})
	if err != nil || string(b) != `{"D":1.5}` {
		t.Fatalf("Marshal = %s, %v; want {\"D\":1.5}", b, err)
	}
	var back struct{ D Millis }
	if err := json.Unmarshal(b, &back); err != nil || time.Duration(back.D) != 1500*time.Microsecond {
		t.Fatalf("Unmarshal = %v, %v; want 1.5ms", time.Duration(back.D), err)
	}
}

func TestRowFailedAndTable(t *testing.T) {
	t.Parallel()
	ok := Row{Subscriber: "analytics-a", Role: "fast sink", Tally: Tally{Expected: 100, Delivered: 100},
		MaxWindow: 100, Limit: 3050, Drained: true, Drain: Millis(1234 * time.Millisecond)}
	bad := Row{Subscriber: "partner-dash", Role: "10/s", Tally: Tally{Expected: 100, Delivered: 40, Pending: 58, Lost: 2,
		LostIDs: []string{"e1", "e9"}}, MaxWindow: 31, Limit: 30, Violation: true, Sent429: 4, BadSignatures: 1, Banned: true,
		Notes: []string{"the partner BANNED sluice"}}
	if why := ok.Failed(); why != "" {
		t.Errorf("ok.Failed() = %q, want \"\"", why)
	}
	// Owed deliveries fail only a subscriber that must drain.
	stalled := Row{Subscriber: "crm", Tally: Tally{Expected: 100, Delivered: 14, Pending: 80, Inflight: 6}, MustDrain: true}
	if why, want := stalled.Failed(), "86 still pending or in flight at the deadline"; why != want {
		t.Errorf("stalled.Failed() = %q, want %q", why, want)
	}
	stalled.MustDrain = false
	if why := stalled.Failed(); why != "" {
		t.Errorf("a slow subscriber's progress failed the run: %q", why)
	}
	// A slow one fails when it got under the least its rate allowed.
	stalled.MinServed = 14
	if why := stalled.Failed(); why != "" {
		t.Errorf("a slow subscriber served its least failed the run: %q", why)
	}
	stalled.MinServed = 15
	if why, want := stalled.Failed(), "only 14 delivered, under half of what its rate and answer time allowed over the run (at least 15): starved"; why != want {
		t.Errorf("starved.Failed() = %q, want %q", why, want)
	}
	mangled := Row{Subscriber: "crm", Tally: Tally{Expected: 1, Delivered: 1}, BadBodies: 2}
	if why, want := mangled.Failed(), "2 signed bodies that were not the event their webhook-id names"; why != want {
		t.Errorf("mangled.Failed() = %q, want %q", why, want)
	}
	if why, want := bad.Failed(), "2 lost, 31 requests in one second, limit 30, 1 bad signatures, banned by the partner for ignoring its Retry-After"; why != want {
		t.Errorf("bad.Failed() = %q, want %q", why, want)
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, "canal", []Row{ok, bad}); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"100/100", "1.23s", "100 / 3050",
		"40/100", "58", "31 / 30 !", "(40%)",
		"FAIL partner-dash: 2 lost, 31 requests in one second, limit 30, 1 bad signatures, banned by the partner for ignoring its Retry-After (first lost: e1 e9)",
		"note partner-dash: the partner BANNED sluice",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}
