package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is one line of the Prometheus text format: a series and its value.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Scrape is everything one GET /metrics returned.
type Scrape []Sample

// ParseMetrics reads the Prometheus text exposition format with the
// Prometheus parser and flattens it back into its samples: a histogram
// becomes its _bucket (with le), _sum and _count series, as on the wire.
func ParseMetrics(text string) (Scrape, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	var out Scrape
	for name, f := range families {
		for _, m := range f.GetMetric() {
			labels := func(extra ...string) map[string]string {
				l := map[string]string{}
				for _, lp := range m.GetLabel() {
					l[lp.GetName()] = lp.GetValue()
				}
				for i := 0; i+1 < len(extra); i += 2 {
					l[extra[i]] = extra[i+1]
				}
				return l
			}
			switch {
			case m.Histogram != nil:
				h := m.GetHistogram()
				inf := false
				for _, b := range h.GetBucket() {
					inf = inf || math.IsInf(b.GetUpperBound(), 1)
					le := strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)
					out = append(out, Sample{name + "_bucket", labels("le", le), float64(b.GetCumulativeCount())})
				}
				if !inf {
					out = append(out, Sample{name + "_bucket", labels("le", "+Inf"), float64(h.GetSampleCount())})
				}
				out = append(out, Sample{name + "_sum", labels(), h.GetSampleSum()},
					Sample{name + "_count", labels(), float64(h.GetSampleCount())})
			case m.Summary != nil:
				sm := m.GetSummary()
				for _, q := range sm.GetQuantile() {
					out = append(out, Sample{name, labels("quantile", strconv.FormatFloat(q.GetQuantile(), 'g', -1, 64)), q.GetValue()})
				}
				out = append(out, Sample{name + "_sum", labels(), sm.GetSampleSum()},
					Sample{name + "_count", labels(), float64(sm.GetSampleCount())})
			case m.Counter != nil:
				out = append(out, Sample{name, labels(), m.GetCounter().GetValue()})
			case m.Gauge != nil:
				out = append(out, Sample{name, labels(), m.GetGauge().GetValue()})
			default:
				out = append(out, Sample{name, labels(), m.GetUntyped().GetValue()})
			}
		}
	}
	return out, nil
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
		le, err := strconv.ParseFloat(s.Labels["le"], 64)
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
