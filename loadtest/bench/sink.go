package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/shared/signature"
)

// sink is the benchmark's receiver on 127.0.0.1: it answers 204 at once and
// records when each delivery arrived and, for events carrying "sent_ns",
// how long after that send it arrived. It does not verify signatures (the
// partners of the scenarios do): every cycle it spends is one sluice does
// not get on a 2-core machine.
type sink struct {
	now func() time.Time
	srv *http.Server
	url string

	mu       sync.Mutex
	seen     map[string]struct{}
	arrivals []time.Time // first arrival of each webhook-id, in lock order
	latency  []sample    // first arrivals carrying sent_ns
	dups     int
}

// startSink serves a new sink.
func startSink(now func() time.Time) (*sink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &sink{now: now, seen: map[string]struct{}{}}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	s.url = "http://" + ln.Addr().String() + "/hooks/bench"
	go s.srv.Serve(ln)
	return s, nil
}

var sentKey = []byte(`"sent_ns":`)

func (s *sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := s.now()
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	id := r.Header.Get(signature.HeaderID)
	var sent time.Time
	if i := bytes.Index(body, sentKey); i >= 0 {
		rest := body[i+len(sentKey):]
		j := bytes.IndexAny(rest, ",}")
		if j > 0 {
			if ns, err := strconv.ParseInt(string(bytes.TrimSpace(rest[:j])), 10, 64); err == nil {
				sent = time.Unix(0, ns)
			}
		}
	}
	s.mu.Lock()
	if _, dup := s.seen[id]; dup {
		s.dups++
	} else {
		s.seen[id] = struct{}{}
		s.arrivals = append(s.arrivals, at)
		if !sent.IsZero() {
			s.latency = append(s.latency, sample{Sent: sent, Latency: at.Sub(sent)})
		}
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// count is the number of distinct deliveries so far.
func (s *sink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.arrivals)
}

// sample is one delivery's timing: when the harness sent its event and how
// long after that it arrived.
type sample struct {
	Sent    time.Time
	Latency time.Duration
}

// snapshot returns the sorted arrival times, the timed samples (in arrival
// order), and the duplicates so far.
func (s *sink) snapshot() ([]time.Time, []sample, int) {
	s.mu.Lock()
	arr, lat, dups := slices.Clone(s.arrivals), slices.Clone(s.latency), s.dups
	s.mu.Unlock()
	slices.SortFunc(arr, func(a, b time.Time) int { return a.Compare(b) })
	return arr, lat, dups
}

// waitFor polls until want distinct deliveries arrived or timeout passed.
// The arrival times are recorded as they come, so the poll's coarseness
// does not touch the numbers.
func (s *sink) waitFor(ctx context.Context, want int, timeout time.Duration) error {
	deadline := s.now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		got := s.count()
		if got >= want {
			return nil
		}
		if !s.now().Before(deadline) {
			return fmt.Errorf("%s of %s deliveries arrived within %s", thousands(float64(got)), thousands(float64(want)), timeout)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (s *sink) close() { s.srv.Close() }
