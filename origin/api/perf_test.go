package api_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/origin/api"
	"github.com/sluice-dev/sluice/origin/delivery"
	"github.com/sluice-dev/sluice/origin/egress"
	"github.com/sluice-dev/sluice/origin/ledger"
)

// perfStack is the whole origin on a temp database, served on 127.0.0.1.
type perfStack struct {
	url    string
	token  string
	client *http.Client
}

func newPerfStack(b *testing.B) *perfStack {
	b.Helper()
	l, err := ledger.Open(context.Background(), filepath.Join(b.TempDir(), "bench.db"), ledger.Options{})
	if err != nil {
		b.Fatal(err)
	}
	policy := egress.Policy{AllowPrivate: true}
	quiet := slog.New(slog.DiscardHandler)
	d := delivery.New(l, delivery.Config{Client: policy.Client(), Rand: rand.New(rand.NewPCG(1, 2)), Logger: quiet})
	if err := d.Load(context.Background()); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	srv := httptest.NewServer(api.New(api.Config{Ledger: l, Dispatcher: d, Egress: policy, TokenSHA256: sha256.Sum256([]byte("bench")), Logger: quiet}))
	b.Cleanup(func() {
		srv.Close()
		cancel()
		<-done
		l.Close()
	})
	tr := &http.Transport{MaxIdleConnsPerHost: 256, MaxIdleConns: 256}
	return &perfStack{url: srv.URL, token: "bench", client: &http.Client{Transport: tr}}
}

func (s *perfStack) post(b *testing.B, path string, body []byte) int {
	req, _ := http.NewRequest(http.MethodPost, s.url+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := s.client.Do(req)
	if err != nil {
		b.Error(err)
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func (s *perfStack) subscriber(b *testing.B, id, url, types string, perSecond float64) {
	body := fmt.Sprintf(`{"id":%q,"url":%q,"event_types":[%q],"rate":{"per_second":%g,"burst":%g},"timeout_ms":5000}`,
		id, url, types, perSecond, perSecond)
	if code := s.post(b, "/v1/subscribers", []byte(body)); code != http.StatusCreated {
		b.Fatalf("create subscriber: %d", code)
	}
}

// BenchmarkIngestSingle: 64 concurrent clients posting one event each time.
func BenchmarkIngestSingle(b *testing.B) {
	s := newPerfStack(b)
	const clients, total = 64, 40_000
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > total {
					return
				}
				if code := s.post(b, "/v1/events", fmt.Appendf(nil, `{"id":"e%d","type":"bench.single"}`, i)); code != http.StatusAccepted {
					b.Errorf("event %d: %d", i, code)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(total)/time.Since(start).Seconds(), "events/s")
}

// BenchmarkIngestBatch: batches of 1,000 events from 4 concurrent clients.
func BenchmarkIngestBatch(b *testing.B) {
	s := newPerfStack(b)
	const clients, batches, size = 4, 200, 1000
	bodies := make([][]byte, batches)
	for i := range bodies {
		var buf bytes.Buffer
		buf.WriteString(`{"events":[`)
		for j := range size {
			if j > 0 {
				buf.WriteByte(',')
			}
			fmt.Fprintf(&buf, `{"id":"b%d-%d","type":"bench.batch","video_id":"vv_9f31c2","velocity":224.0}`, i, j)
		}
		buf.WriteString(`]}`)
		bodies[i] = buf.Bytes()
	}
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= batches {
					return
				}
				if code := s.post(b, "/v1/events/batch", bodies[i]); code != http.StatusAccepted {
					b.Errorf("batch %d: %d", i, code)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(batches*size)/time.Since(start).Seconds(), "events/s")
}

// perfSink counts deliveries and, for events carrying "sent_ns", the
// enqueue-to-delivery latency.
type perfSink struct {
	got       atomic.Int64
	mu        sync.Mutex
	latencies []time.Duration
	done      chan struct{}
	want      int64
}

func (r *perfSink) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	var e struct {
		SentNS int64 `json:"sent_ns"`
	}
	if json.Unmarshal(body, &e) == nil && e.SentNS > 0 {
		lat := time.Duration(time.Now().UnixNano() - e.SentNS)
		r.mu.Lock()
		r.latencies = append(r.latencies, lat)
		r.mu.Unlock()
	}
	if r.got.Add(1) == r.want {
		close(r.done)
	}
}

// BenchmarkDeliveryThroughput: a backlog of events delivered end to end to
// one loopback perfSink, from the first enqueue to the last arrival.
func BenchmarkDeliveryThroughput(b *testing.B) {
	s := newPerfStack(b)
	const total, size = 50_000, 1000
	rc := &perfSink{done: make(chan struct{}), want: total}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	s.subscriber(b, "sink", srv.URL, "*", 1_000_000)
	start := time.Now()
	for i := 0; i < total; i += size {
		var buf bytes.Buffer
		buf.WriteString(`{"events":[`)
		for j := range size {
			if j > 0 {
				buf.WriteByte(',')
			}
			fmt.Fprintf(&buf, `{"id":"d%d","type":"bench.deliver"}`, i+j)
		}
		buf.WriteString(`]}`)
		if code := s.post(b, "/v1/events/batch", buf.Bytes()); code != http.StatusAccepted {
			b.Fatalf("batch: %d", code)
		}
	}
	select {
	case <-rc.done:
	case <-time.After(2 * time.Minute):
		b.Fatalf("delivered %d of %d in 2 minutes", rc.got.Load(), total)
	}
	b.ReportMetric(float64(total)/time.Since(start).Seconds(), "deliveries/s")
}

// BenchmarkLatency: single events offered at a fixed 5,000/s for 4 s; the
// enqueue-to-delivery latency percentiles.
func BenchmarkLatency(b *testing.B) {
	s := newPerfStack(b)
	const rate, seconds = 5000, 4
	total := rate * seconds
	rc := &perfSink{done: make(chan struct{}), want: int64(total)}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	s.subscriber(b, "sink", srv.URL, "*", 1_000_000)
	const clients = 64
	interval := time.Second * clients / rate
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			time.Sleep(interval * time.Duration(c) / clients)
			for range tick.C {
				i := next.Add(1)
				if i > int64(total) {
					return
				}
				body := `{"id":"l` + strconv.FormatInt(i, 10) + `","type":"bench.latency","sent_ns":` + strconv.FormatInt(time.Now().UnixNano(), 10) + `}`
				s.post(b, "/v1/events", []byte(body))
			}
		}()
	}
	wg.Wait()
	select {
	case <-rc.done:
	case <-time.After(time.Minute):
		b.Fatalf("delivered %d of %d", rc.got.Load(), total)
	}
	offered := float64(total) / time.Since(start).Seconds()
	rc.mu.Lock()
	lat := rc.latencies
	rc.mu.Unlock()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(offered, "offered/s")
	b.ReportMetric(p(0.50), "p50-ms")
	b.ReportMetric(p(0.99), "p99-ms")
}
