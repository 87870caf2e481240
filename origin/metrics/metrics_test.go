package metrics

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluice-dev/sluice/origin/delivery"
	"github.com/sluice-dev/sluice/origin/egress"
	"github.com/sluice-dev/sluice/origin/ledger"
)

func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse scrape: %v\n%s", err, body)
	}
	return fams
}

func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("metric %s missing", name)
	}
next:
	for _, m := range f.Metric {
		for _, lp := range m.Label {
			if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	t.Fatalf("metric %s has no series with %v", name, labels)
	return 0
}

func TestScrapeShowsAttemptsLatencyAndState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, err := ledger.Open(ctx, filepath.Join(t.TempDir(), "m.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	m := New()
	d := delivery.New(l, delivery.Config{Observer: m, Client: egress.Policy{AllowPrivate: true}.Client(),
		Logger: slog.New(slog.DiscardHandler)})
	m.Watch(d, l, slog.New(slog.DiscardHandler))
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	defer func() { cancel(); <-done }()

	ok := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer ok.Close()
	for _, s := range []ledger.Subscriber{
		{ID: "good", URL: ok.URL, Paused: false},
		{ID: "held", URL: ok.URL, Paused: true},
	} {
		s.EventTypes, s.Rate, s.MaxAttempts, s.TimeoutMS = []string{"*"}, ledger.Rate{PerSecond: 5, Burst: 7}, 3, 1000
		s.Secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		if err := l.CreateSubscriber(ctx, &s); err != nil {
			t.Fatal(err)
		}
		d.Upsert(s)
	}
	res, err := l.Enqueue(ctx, []ledger.NewEvent{{ID: "e1", Type: "t", Body: []byte(`{"id":"e1","type":"t"}`)}})
	if err != nil {
		t.Fatal(err)
	}
	for id := range res.Subscribers {
		d.Notify(time.Now(), id)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		fams := scrape(t, m.Handler())
		// A scrape gathers the collectors concurrently, so one taken while the
		// attempt is being counted may hold its attempt but not yet its latency.
		_, timed := fams["sluice_delivery_latency_seconds"]
		if f, ok := fams["sluice_attempts_total"]; ok && len(f.Metric) > 0 && timed {
			if got := value(t, fams, "sluice_attempts_total", map[string]string{"subscriber_id": "good", "lane": "origin", "outcome": "success"}); got != 1 {
				t.Fatalf("attempts_total{good,success} = %v, want 1", got)
			}
			if got := value(t, fams, "sluice_delivery_latency_seconds", map[string]string{"subscriber_id": "good"}); got != 1 {
				t.Fatalf("latency histogram count = %v, want 1", got)
			}
			if got := value(t, fams, "sluice_deliveries_pending", map[string]string{"subscriber_id": "held"}); got != 1 {
				t.Fatalf("pending{held} = %v, want 1", got)
			}
			if got := value(t, fams, "sluice_bucket_tokens", map[string]string{"subscriber_id": "held"}); got != 7 {
				t.Fatalf("tokens{held} = %v, want its full burst 7", got)
			}
			if got := value(t, fams, "sluice_breaker_state", map[string]string{"subscriber_id": "good"}); got != 0 {
				t.Fatalf("breaker{good} = %v, want 0 (closed)", got)
			}
			if held, good := value(t, fams, "sluice_subscriber_paused", map[string]string{"subscriber_id": "held"}),
				value(t, fams, "sluice_subscriber_paused", map[string]string{"subscriber_id": "good"}); held != 1 || good != 0 {
				t.Fatalf("paused{held} = %v and paused{good} = %v, want 1 and 0", held, good)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no attempt was counted within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// brokenLedger fails where told to, with err.
type brokenLedger struct {
	changes, counts error
}

func (b brokenLedger) Counts(context.Context) (map[string]*ledger.SubscriberStats, error) {
	return map[string]*ledger.SubscriberStats{}, b.counts
}
func (b brokenLedger) Changes(context.Context) (int64, error) { return 7, b.changes }

// A ledger that cannot be read fails the scrape: an alert on dead letters
// must see the scrape fail, not the series go quietly missing. One too slow
// to answer leaves out only its own series.
func TestAnUnreadableLedgerFailsTheScrape(t *testing.T) {
	t.Parallel()
	broken := errors.New("file is not a database")
	for name, c := range map[string]struct {
		ledger brokenLedger
		status int
	}{
		"write count unreadable": {brokenLedger{changes: broken}, http.StatusInternalServerError},
		"counts unreadable":      {brokenLedger{counts: broken}, http.StatusInternalServerError},
		"counts too slow":        {brokenLedger{counts: context.DeadlineExceeded}, http.StatusOK},
		"all well":               {brokenLedger{}, http.StatusOK},
	} {
		m := New()
		m.Watch(oneSnapshot{}, c.ledger, slog.New(slog.DiscardHandler))
		srv := httptest.NewServer(m.Handler())
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		if resp.StatusCode != c.status {
			t.Errorf("%s: scrape %d, want %d", name, resp.StatusCode, c.status)
			continue
		}
		if c.status == http.StatusOK && !strings.Contains(string(body), `sluice_breaker_state{subscriber_id="s"} 0`) {
			t.Errorf("%s: the scrape lost the dispatcher's series:\n%s", name, body)
		}
		if pending := strings.Contains(string(body), "sluice_deliveries_pending{"); pending != (name == "all well") {
			t.Errorf("%s: pending series shown %v", name, pending)
		}
	}
}

type oneSnapshot struct{}

func (oneSnapshot) Snapshot() map[string]delivery.SubscriberSnapshot {
	return map[string]delivery.SubscriberSnapshot{"s": {}}
}
