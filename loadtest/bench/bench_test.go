package bench

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/shared/bucket"
	"github.com/sluice-dev/sluice/shared/signature"
)

const exposition = `# HELP sluice_claim_duration_seconds Time to claim due deliveries from the ledger, commit included.
# TYPE sluice_claim_duration_seconds histogram
sluice_claim_duration_seconds_bucket{le="1"} 10
sluice_claim_duration_seconds_bucket{le="2"} 30
sluice_claim_duration_seconds_bucket{le="4"} 70
sluice_claim_duration_seconds_bucket{le="+Inf"} 80
sluice_claim_duration_seconds_sum 150.5
sluice_claim_duration_seconds_count 80
# TYPE sluice_attempts_total counter
sluice_attempts_total{lane="origin",outcome="success",subscriber_id="a"} 7
sluice_attempts_total{lane="origin",outcome="failure",subscriber_id="a"} 2
sluice_attempts_total{lane="origin",outcome="success",subscriber_id="b \"quoted\", with\\n"} 5 1700000000000
sluice_ledger_row_writes_total 1.2e+06
process_resident_memory_bytes 1.5728640e+08
`

func TestParseMetrics(t *testing.T) {
	t.Parallel()
	sc, err := ParseMetrics(exposition)
	if err != nil {
		t.Fatal(err)
	}
	if len(sc) != 11 {
		t.Fatalf("parsed %d samples, want 11: %+v", len(sc), sc)
	}
	for _, c := range []struct {
		name  string
		match map[string]string
		want  float64
	}{
		{"sluice_ledger_row_writes_total", nil, 1_200_000},
		{"process_resident_memory_bytes", nil, 157_286_400},
		{"sluice_attempts_total", nil, 14},
		{"sluice_attempts_total", map[string]string{"outcome": "success"}, 12},
		{"sluice_attempts_total", map[string]string{"subscriber_id": `b "quoted", with\n`}, 5},
		{"sluice_claim_duration_seconds_count", nil, 80},
	} {
		got, ok := sc.Value(c.name, c.match)
		if !ok || got != c.want {
			t.Errorf("Value(%s, %v) = %v, %v; want %v", c.name, c.match, got, ok, c.want)
		}
	}
	if _, ok := sc.Value("sluice_missing", nil); ok {
		t.Error("a missing metric was found")
	}
	if _, err := ParseMetrics("broken{le=\"1\" 3\n"); err == nil {
		t.Error("unterminated labels parsed")
	}
}

func TestHistogramQuantile(t *testing.T) {
	t.Parallel()
	sc, err := ParseMetrics(exposition)
	if err != nil {
		t.Fatal(err)
	}
	h, err := sc.Histogram("sluice_claim_duration_seconds")
	if err != nil {
		t.Fatal(err)
	}
	if h.Count() != 80 || h.Sum != 150.5 {
		t.Fatalf("count %v sum %v, want 80 and 150.5", h.Count(), h.Sum)
	}
	// 80 observations: 10 in (0,1], 20 in (1,2], 40 in (2,4], 10 above 4.
	for _, c := range []struct{ q, want float64 }{
		{0, 0},       // the lower bound of the first bucket holding anything
		{0.1, 0.8},   // rank 8 of the first bucket's 10: 0 + 1 × 8/10
		{0.25, 1.5},  // rank 20: 1 + 1 × (20-10)/20
		{0.5, 2.5},   // rank 40: 2 + 2 × (40-30)/40
		{0.875, 4},   // rank 70: the top of (2,4]
		{0.9, 4},     // rank 72 falls in +Inf: the highest finite bound
		{0.99, 4},    //
		{1, 4},       //
		{0.375, 2.0}, // rank 30: exactly the top of (1,2]
	} {
		if got := h.Quantile(c.q); got != c.want {
			t.Errorf("Quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if got := (Histogram{}).Quantile(0.99); !math.IsNaN(got) {
		t.Errorf("empty histogram's p99 = %v, want NaN", got)
	}
}

func TestHistogramSub(t *testing.T) {
	t.Parallel()
	before := Histogram{Sum: 10, Buckets: []Bucket{{0.001, 4}, {0.005, 6}, {math.Inf(1), 6}}}
	after := Histogram{Sum: 10.5, Buckets: []Bucket{{0.001, 104}, {0.005, 204}, {math.Inf(1), 206}}}
	d := after.Sub(before)
	want := []Bucket{{0.001, 100}, {0.005, 198}, {math.Inf(1), 200}}
	for i, b := range d.Buckets {
		if b != want[i] {
			t.Errorf("bucket %d = %+v, want %+v", i, b, want[i])
		}
	}
	if d.Sum != 0.5 || d.Count() != 200 {
		t.Errorf("sum %v count %v, want 0.5 and 200", d.Sum, d.Count())
	}
	// 200 observations: 100 in (0,1ms], 98 in (1ms,5ms], 2 above.
	// p99 is rank 198, the top of the second bucket; p50 rank 100, the
	// top of the first.
	if got := d.Quantile(0.99); got != 0.005 {
		t.Errorf("p99 = %v, want 0.005", got)
	}
	if got := d.Quantile(0.5); got != 0.001 {
		t.Errorf("p50 = %v, want 0.001", got)
	}
}

func TestCapAccuracy(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 7, 11, 8, 14, 2, 0, time.UTC)
	rate := bucket.Rate{PerSecond: 100, Burst: 20}
	arrivals := func(every time.Duration, n int) []time.Time {
		var out []time.Time
		for i := range 20 {
			out = append(out, t0.Add(time.Duration(i)*time.Microsecond))
		}
		for k := 1; k <= n; k++ {
			out = append(out, t0.Add(time.Duration(k)*every))
		}
		return out
	}
	for _, c := range []struct {
		name  string
		every time.Duration
		want  int
		acc   float64
	}{
		{"exact", 10 * time.Millisecond, 1000, 1.0},
		{"2% fast", 9800 * time.Microsecond, 1020, 1.02},
		{"3% slow", 10309 * time.Microsecond, 970, 0.97},
	} {
		got, acc, ok := CapAccuracy(arrivals(c.every, 1200), rate, 10*time.Second)
		if !ok || got != c.want || acc != c.acc {
			t.Errorf("%s: CapAccuracy = %d, %v, %v; want %d, %v", c.name, got, acc, ok, c.want, c.acc)
		}
	}
	if _, _, ok := CapAccuracy(arrivals(0, 0)[:19], rate, 10*time.Second); ok {
		t.Error("19 arrivals of a burst of 20 judged")
	}
}

func TestWritesPerDelivery(t *testing.T) {
	t.Parallel()
	if got := WritesPerDelivery(750, 250); got != 3 {
		t.Errorf("750 writes / 250 deliveries = %v, want 3", got)
	}
	if got := WritesPerDelivery(12, 0); !math.IsNaN(got) {
		t.Errorf("writes without deliveries = %v, want NaN", got)
	}
	w := window(counters{Writes: 100, Successes: 10, Attempts: 11, Delivered: 9},
		counters{Writes: 850, Successes: 260, Attempts: 262, Delivered: 260}, 5*time.Second)
	if w.Writes != 750 || w.Delivered != 250 || w.Attempts != 251 || w.Arrived != 251 || w.PerEvent == nil || *w.PerEvent != 3 {
		t.Errorf("window = %+v", w)
	}
}

func TestParseStatus(t *testing.T) {
	t.Parallel()
	rss, hwm := parseStatus(strings.NewReader("Name:\tsluice\nVmHWM:\t  204800 kB\nVmRSS:\t  153600 kB\nThreads:\t9\n"))
	if rss != 150<<20 || hwm != 200<<20 {
		t.Errorf("parseStatus = %d, %d; want %d, %d", rss, hwm, 150<<20, 200<<20)
	}
}

func TestSinkTimesDeliveries(t *testing.T) {
	t.Parallel()
	sent := time.Date(2026, 7, 11, 8, 14, 2, 0, time.UTC)
	now := sent.Add(3 * time.Millisecond)
	s := &sink{now: func() time.Time { return now }, seen: map[string]struct{}{}}
	body := eventBody(nil, "lat", 7, sent)
	var ev struct {
		ID     string `json:"id"`
		SentNS int64  `json:"sent_ns"`
	}
	if err := json.Unmarshal(body, &ev); err != nil || ev.ID != "lat_7" || ev.SentNS != sent.UnixNano() {
		t.Fatalf("eventBody = %s (%v)", body, err)
	}
	for _, id := range []string{"msg_1", "msg_1", "msg_2"} {
		req := httptest.NewRequest(http.MethodPost, "/hooks/bench", strings.NewReader(string(body)))
		req.Header.Set(signature.HeaderID, id)
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != http.StatusNoContent {
			t.Fatalf("status %d", rec.Code)
		}
	}
	arr, samples, dups := s.snapshot()
	if len(arr) != 2 || dups != 1 || len(samples) != 2 || samples[0].Latency != 3*time.Millisecond {
		t.Errorf("arrivals %d, dups %d, samples %+v", len(arr), dups, samples)
	}
	lat := latenciesFrom([]sample{
		{sent, 5 * time.Millisecond}, {sent.Add(time.Second), 2 * time.Millisecond}, {sent.Add(2 * time.Second), time.Millisecond},
	}, sent.Add(time.Second))
	if len(lat) != 2 || lat[0] != time.Millisecond || lat[1] != 2*time.Millisecond {
		t.Errorf("latenciesFrom = %v", lat)
	}
}

func TestBatchBody(t *testing.T) {
	t.Parallel()
	var in struct {
		Events []json.RawMessage `json:"events"`
	}
	if err := json.Unmarshal(batchBody("b", 10, 13, time.Unix(0, 42)), &in); err != nil || len(in.Events) != 3 {
		t.Fatalf("batchBody: %v, %d events", err, len(in.Events))
	}
	if !strings.Contains(string(in.Events[2]), `"id":"b_12"`) {
		t.Errorf("last event %s", in.Events[2])
	}
}

func TestThousands(t *testing.T) {
	t.Parallel()
	for v, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 1234567.4: "1,234,567", -45000: "-45,000"} {
		if got := thousands(v); got != want {
			t.Errorf("thousands(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestResultJSON(t *testing.T) {
	t.Parallel()
	// JSON has no NaN or infinity; a histogram's +Inf bound and a missing
	// quantile must still encode.
	r := &Result{Details: map[string]any{"pending": pendingResult{
		Claim:    Histogram{Buckets: []Bucket{{0.005, 3}, {math.Inf(1), 4}}},
		ClaimP99: math.NaN(), ClaimP99JSON: num(math.NaN()),
	}}}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`{"le":"0.005","count":3}`, `{"le":"+Inf","count":4}`, `"claim_p99_s":null`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("JSON lacks %s:\n%s", want, b)
		}
	}
}

func TestParseStatCPU(t *testing.T) {
	t.Parallel()
	// pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime …
	stat := "4242 (sl (u) ice) S 1 4242 4242 0 -1 4194560 2270 0 0 0 1234 66 0 0 20 0 9 0 1000 1288896 9000\n"
	got, ok := parseStatCPU(stat)
	if !ok || got != 13*time.Second {
		t.Errorf("parseStatCPU = %v, %v; want 13s", got, ok)
	}
	if _, ok := parseStatCPU("4242 (sluice) S 1"); ok {
		t.Error("a short line parsed")
	}
}

func TestParseHostCPU(t *testing.T) {
	t.Parallel()
	// cpu user nice system idle iowait irq softirq steal guest guest_nice
	a := parseHostCPU("cpu  100 0 50 800 10 0 5 35 7 0\ncpu0 50 0 25 400 5 0 2 18 3 0\n")
	b := parseHostCPU("cpu  160 0 70 900 10 0 5 95 9 0\ncpu0 80 0 35 450 5 0 2 48 4 0\n")
	if !a.ok || a.total != 1000 || a.steal != 35 {
		t.Fatalf("first reading = %+v; want total 1000, steal 35", a)
	}
	got, ok := stealBetween(a, b)
	// 240 ticks passed, 60 of them stolen.
	if !ok || got != 0.25 {
		t.Errorf("stealBetween = %v, %v; want 0.25", got, ok)
	}
	if _, ok := stealBetween(b, a); ok {
		t.Error("a reading older than the first gave a share")
	}
	for _, bad := range []string{"", "cpu  1 2 3 4 5 6 7\n", "intr 1 2 3 4 5 6 7 8 9\n", "cpu  1 2 3 4 5 6 7 x 9\n"} {
		if h := parseHostCPU(bad); h.ok {
			t.Errorf("parseHostCPU(%q) = %+v; want not ok", bad, h)
		}
	}
}

func TestSteadiness(t *testing.T) {
	t.Parallel()
	s := steadinessOf([][]int{
		{100, 100, 40, 100}, // one window at 40% of this CPU's best
		{90, 20, 45, 90},    // 22% and exactly half: only the first is slow
		{0, 0, 0, 0},        // no best to compare with: left out
	}, 50*time.Millisecond)
	if s.CPUs != 3 || s.Windows != 8 || s.Slow != 2 {
		t.Errorf("steadinessOf = %+v; want 3 CPUs, 8 windows, 2 slow", s)
	}
	if math.Abs(s.Slowest-20.0/90) > 1e-9 {
		t.Errorf("Slowest = %v; want %v", s.Slowest, 20.0/90)
	}
	if got := s.text(); got != "2 of 8 (slowest at 22%)" {
		t.Errorf("text = %q", got)
	}
	if s := steadinessOf(nil, time.Second); s.Windows != 0 || s.Slowest != 0 {
		t.Errorf("steadinessOf(nil) = %+v; want nothing measured", s)
	}
}
