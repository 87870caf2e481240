// Package metrics exposes sluice's Prometheus metrics: counters and
// histograms the dispatcher feeds as attempts finish, and gauges read from
// the dispatcher and the ledger when Prometheus scrapes. Labels carry
// subscriber ids, never URLs, so their sets stay bounded by what the
// operator configured.
package metrics

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-dev/sluice/origin/breaker"
	"github.com/sluice-dev/sluice/origin/delivery"
	"github.com/sluice-dev/sluice/origin/ledger"
)

// Metrics holds sluice's collectors on their own registry.
type Metrics struct {
	reg       *prometheus.Registry
	attempts  *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	deferrals *prometheus.CounterVec
	claims    prometheus.Histogram
}

// Snapshotter is the dispatcher's view of its subscribers.
type Snapshotter interface {
	Snapshot() map[string]delivery.SubscriberSnapshot
}

// Counter is the ledger's per-subscriber counts and its write count.
type Counter interface {
	Counts(ctx context.Context) (map[string]*ledger.SubscriberStats, error)
	Changes(ctx context.Context) (int64, error)
}

// New registers sluice's metrics and the Go runtime's.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_attempts_total",
			Help: "Delivery attempts by subscriber, lane and outcome (success or failure).",
		}, []string{"subscriber_id", "lane", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_delivery_latency_seconds",
			Help:    "Time from enqueue to successful delivery, by subscriber.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 1800},
		}, []string{"subscriber_id"}),
		deferrals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_edge_deferrals_total",
			Help: "Edge-lane answers that the subscriber's edge bucket was empty (not attempts).",
		}, []string{"subscriber_id"}),
	}
	m.claims = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sluice_claim_duration_seconds",
		Help:    "Time to claim due deliveries from the ledger, commit included.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
	})
	m.reg.MustRegister(m.attempts, m.latency, m.deferrals, m.claims,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// ObserveAttempt counts one attempt and, for a success, its delivery latency.
func (m *Metrics) ObserveAttempt(subscriberID string, lane ledger.Lane, success bool, sinceEnqueue time.Duration) {
	outcome := "failure"
	if success {
		outcome = "success"
		m.latency.WithLabelValues(subscriberID).Observe(sinceEnqueue.Seconds())
	}
	m.attempts.WithLabelValues(subscriberID, string(lane), outcome).Inc()
}

// ObserveClaim times one claim.
func (m *Metrics) ObserveClaim(d time.Duration) { m.claims.Observe(d.Seconds()) }

// ObserveDeferral counts an edge deferral.
func (m *Metrics) ObserveDeferral(subscriberID string) {
	m.deferrals.WithLabelValues(subscriberID).Inc()
}

// Forget drops a removed subscriber's series.
func (m *Metrics) Forget(subscriberID string) {
	l := prometheus.Labels{"subscriber_id": subscriberID}
	m.attempts.DeletePartialMatch(l)
	m.latency.DeletePartialMatch(l)
	m.deferrals.DeletePartialMatch(l)
}

// Watch adds the gauges read at scrape time from the dispatcher and the ledger.
func (m *Metrics) Watch(d Snapshotter, c Counter, log *slog.Logger) {
	m.reg.MustRegister(&state{d: d, c: c, log: log})
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

var (
	pendingDesc  = prometheus.NewDesc("sluice_deliveries_pending", "Deliveries waiting to be attempted.", []string{"subscriber_id"}, nil)
	inflightDesc = prometheus.NewDesc("sluice_deliveries_inflight", "Deliveries claimed and not yet settled.", []string{"subscriber_id"}, nil)
	deadDesc     = prometheus.NewDesc("sluice_dead_letters", "Deliveries in the dead-letter state.", []string{"subscriber_id"}, nil)
	breakerDesc  = prometheus.NewDesc("sluice_breaker_state", "Circuit breaker state: 0 closed, 1 half-open, 2 open.", []string{"subscriber_id"}, nil)
	pausedDesc   = prometheus.NewDesc("sluice_paused_until_timestamp_seconds", "When the subscriber's Retry-After pause ends (0 if not paused).", []string{"subscriber_id"}, nil)
	heldDesc     = prometheus.NewDesc("sluice_subscriber_paused", "1 while an operator has paused the subscriber, else 0.", []string{"subscriber_id"}, nil)
	tokensDesc   = prometheus.NewDesc("sluice_bucket_tokens", "Tokens the subscriber can spend now, over the lanes it sends by (origin, edge).", []string{"subscriber_id"}, nil)
	writesDesc   = prometheus.NewDesc("sluice_ledger_row_writes_total", "Rows this process has inserted, updated or deleted in the ledger.", nil, nil)
)

// state collects the gauges at scrape time.
type state struct {
	d   Snapshotter
	c   Counter
	log *slog.Logger
}

func (s *state) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{pendingDesc, inflightDesc, deadDesc, breakerDesc, pausedDesc, heldDesc, tokensDesc, writesDesc} {
		ch <- d
	}
}

func (s *state) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	snap := s.d.Snapshot()
	for id, sn := range snap {
		var b float64
		switch sn.Breaker.State {
		case breaker.HalfOpen:
			b = 1
		case breaker.Open:
			b = 2
		}
		var paused float64
		if sn.PausedUntil.After(now) {
			paused = float64(sn.PausedUntil.UnixMilli()) / 1000
		}
		ch <- prometheus.MustNewConstMetric(breakerDesc, prometheus.GaugeValue, b, id)
		ch <- prometheus.MustNewConstMetric(pausedDesc, prometheus.GaugeValue, paused, id)
		held := 0.0
		if sn.Paused {
			held = 1
		}
		ch <- prometheus.MustNewConstMetric(heldDesc, prometheus.GaugeValue, held, id)
		ch <- prometheus.MustNewConstMetric(tokensDesc, prometheus.GaugeValue, sn.Tokens, id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// A ledger that cannot be read fails the scrape (a 500, and up == 0 in
	// Prometheus) rather than leave out the series an alert watches. One
	// too slow to answer in time (a huge backlog) leaves out only its own
	// series: the rest of the scrape matters most then.
	failed := func(desc *prometheus.Desc, what string, err error) {
		s.log.Error("metrics: reading "+what, "err", err)
		if !errors.Is(err, context.DeadlineExceeded) {
			ch <- prometheus.NewInvalidMetric(desc, err)
		}
	}
	n, err := s.c.Changes(ctx)
	if err != nil {
		failed(writesDesc, "the ledger's write count", err)
		return
	}
	ch <- prometheus.MustNewConstMetric(writesDesc, prometheus.CounterValue, float64(n))
	stats, err := s.c.Counts(ctx)
	if err != nil {
		failed(pendingDesc, "ledger counts", err)
		return
	}
	for id := range snap {
		st := stats[id]
		if st == nil {
			st = &ledger.SubscriberStats{}
		}
		ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(st.Pending), id)
		ch <- prometheus.MustNewConstMetric(inflightDesc, prometheus.GaugeValue, float64(st.Inflight), id)
		ch <- prometheus.MustNewConstMetric(deadDesc, prometheus.GaugeValue, float64(st.Dead), id)
	}
}
