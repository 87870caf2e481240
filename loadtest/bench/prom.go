package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Sample is one line of the Prometheus text format: a series and its value.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Scrape is everything one GET /metrics returned.
type Scrape []Sample

// ParseMetrics reads the Prometheus text exposition format (version 0.0.4):
// comments and blank lines are skipped, an optional timestamp after the
// value is ignored. It is just enough of a parser for what sluice serves.
func ParseMetrics(text string) (Scrape, error) {
	var out Scrape
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d %q: %w", n, line, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

func parseSample(line string) (Sample, error) {
	s := Sample{Labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	if i <= 0 {
		return s, fmt.Errorf("no value")
	}
	s.Name, line = line[:i], line[i:]
	if line[0] == '{' {
		rest, err := parseLabels(line[1:], s.Labels)
		if err != nil {
			return s, err
		}
		line = rest
	}
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return s, fmt.Errorf("no value")
	}
	v, err := parseValue(fields[0])
	if err != nil {
		return s, err
	}
	s.Value = v
	return s, nil
}

// parseLabels reads name="value" pairs up to the closing brace and returns
// what follows it. Values may hold \\, \" and \n escapes.
func parseLabels(in string, into map[string]string) (string, error) {
	for {
		in = strings.TrimLeft(in, " ,")
		if in == "" {
			return "", fmt.Errorf("unterminated labels")
		}
		if in[0] == '}' {
			return in[1:], nil
		}
		eq := strings.IndexByte(in, '=')
		if eq <= 0 || eq+1 >= len(in) || in[eq+1] != '"' {
			return "", fmt.Errorf("malformed label")
		}
		name := strings.TrimSpace(in[:eq])
		in = in[eq+2:]
		var b strings.Builder
		closed := false
		for j := 0; j < len(in); j++ {
			c := in[j]
			if c == '\\' && j+1 < len(in) {
				j++
				switch in[j] {
				case 'n':
					b.WriteByte('\n')
				default:
					b.WriteByte(in[j])
				}
				continue
			}
			if c == '"' {
				in, closed = in[j+1:], true
				break
			}
			b.WriteByte(c)
		}
		if !closed {
			return "", fmt.Errorf("unterminated label value")
		}
		into[name] = b.String()
	}
}

func parseValue(s string) (float64, error) {
	switch s {
	case "+Inf":
		return math.Inf(1), nil
	case "-Inf":
		return math.Inf(-1), nil
	}
	return strconv.ParseFloat(s, 64)
}

// Value is the sum of the samples named name whose labels include every
// pair in match (all of them when match is empty), and whether any matched.
func (sc Scrape) Value(name string, match map[string]string) (float64, bool) {
	var sum float64
	found := false
	for _, s := range sc {
		if s.Name != name || !hasLabels(s.Labels, match) {
			continue
		}
		sum += s.Value
		found = true
	}
	return sum, found
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// Bucket is one cumulative histogram bucket: Count observations were at or
// below UpperBound.
type Bucket struct {
	UpperBound float64
	Count      float64
}

// MarshalJSON writes the bound as Prometheus writes it ("0.005", "+Inf"):
// JSON has no infinity.
func (b Bucket) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		LE    string  `json:"le"`
		Count float64 `json:"count"`
	}{strconv.FormatFloat(b.UpperBound, 'g', -1, 64), b.Count})
}

// Histogram is a Prometheus histogram's buckets, sorted by bound, the last
// one +Inf.
type Histogram struct {
	Buckets []Bucket `json:"buckets"`
	Sum     float64  `json:"sum"`
}

// Histogram collects the histogram name (without _bucket) from the scrape,
// summing series that differ in other labels.
func (sc Scrape) Histogram(name string) (Histogram, error) {
	byBound := map[float64]float64{}
	for _, s := range sc {
		if s.Name != name+"_bucket" {
			continue
		}
		le, err := parseValue(s.Labels["le"])
		if err != nil {
			return Histogram{}, fmt.Errorf("%s: bucket bound %q: %w", name, s.Labels["le"], err)
		}
		byBound[le] += s.Value
	}
	if len(byBound) == 0 {
		return Histogram{}, fmt.Errorf("no histogram %s in the scrape", name)
	}
	h := Histogram{}
	for le, n := range byBound {
		h.Buckets = append(h.Buckets, Bucket{UpperBound: le, Count: n})
	}
	sort.Slice(h.Buckets, func(i, j int) bool { return h.Buckets[i].UpperBound < h.Buckets[j].UpperBound })
	h.Sum, _ = sc.Value(name+"_sum", nil)
	return h, nil
}

// Count is the number of observations (the +Inf bucket).
func (h Histogram) Count() float64 {
	if len(h.Buckets) == 0 {
		return 0
	}
	return h.Buckets[len(h.Buckets)-1].Count
}

// Sub returns what was observed between an earlier scrape of the same
// histogram and this one. Buckets missing from earlier count as empty.
func (h Histogram) Sub(earlier Histogram) Histogram {
	before := map[float64]float64{}
	for _, b := range earlier.Buckets {
		before[b.UpperBound] = b.Count
	}
	out := Histogram{Sum: h.Sum - earlier.Sum}
	for _, b := range h.Buckets {
		out.Buckets = append(out.Buckets, Bucket{UpperBound: b.UpperBound, Count: b.Count - before[b.UpperBound]})
	}
	return out
}

// Quantile estimates the q-quantile (0 ≤ q ≤ 1) the way Prometheus's
// histogram_quantile does: find the bucket holding rank q × count and
// interpolate linearly inside it, assuming observations spread evenly
// between its lower bound (0 for the first bucket) and its upper bound. A
// rank in the +Inf bucket answers the highest finite bound. It returns NaN
// when there are no observations.
func (h Histogram) Quantile(q float64) float64 {
	n := h.Count()
	if n <= 0 || len(h.Buckets) == 0 || q < 0 || q > 1 {
		return math.NaN()
	}
	rank := q * n
	lower, below := 0.0, 0.0
	for i, b := range h.Buckets {
		if b.Count >= rank && b.Count > below {
			if math.IsInf(b.UpperBound, 1) {
				if i == 0 {
					return math.NaN()
				}
				return h.Buckets[i-1].UpperBound
			}
			return lower + (b.UpperBound-lower)*(rank-below)/(b.Count-below)
		}
		lower, below = b.UpperBound, b.Count
	}
	return lower
}
