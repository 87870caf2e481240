// Package naive is the seed's starting point, kept for comparison: dequeue
// an event, POST it to the subscriber, move on. No rate limit, no
// Retry-After, no retries, no ledger: a failed POST is a lost event.
package naive

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/shared/signature"
)

// Target is one subscriber.
type Target struct {
	ID     string
	URL    string
	Secret string
}

// Event is one event to fan out.
type Event struct {
	ID   string
	Body []byte
}

// Options are one run of the loop.
type Options struct {
	Targets []Target
	Events  []Event
	Workers int           // loops running side by side (default 64, like sluice's --workers)
	Timeout time.Duration // per POST (default 10s, the seed's curl timeout)
	Now     func() time.Time
}

// Outcome is what the loop did for one target.
type Outcome struct {
	Attempted int // POSTs made (each event once)
	OK        int // answered 2xx
	Failed    int // anything else: dropped for good
	Unsent    int // still queued when the run ended
}

// Run fans every event out to every target, event by event, until the
// queue is empty or ctx ends. It returns each target's outcome by id.
func Run(ctx context.Context, o Options) (map[string]*Outcome, error) {
	if o.Workers <= 0 {
		o.Workers = 64
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	signers := make([]*signature.Signer, len(o.Targets))
	out := map[string]*Outcome{}
	for i, t := range o.Targets {
		s, err := signature.NewSigner(t.Secret)
		if err != nil {
			return nil, err
		}
		signers[i] = s
		out[t.ID] = &Outcome{Unsent: len(o.Events)}
	}
	type job struct{ ev, target int }
	jobs := make(chan job)
	client := &http.Client{Timeout: o.Timeout, Transport: &http.Transport{MaxIdleConnsPerHost: o.Workers}}
	defer client.CloseIdleConnections()

	var mu sync.Mutex
	var wg sync.WaitGroup
	for range o.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				t, ev := o.Targets[j.target], o.Events[j.ev]
				ok := post(ctx, client, t.URL, signers[j.target], ev, o.Now())
				if ctx.Err() != nil && !ok {
					continue // cut off by the end of the run: still unsent
				}
				mu.Lock()
				r := out[t.ID]
				r.Attempted++
				r.Unsent--
				if ok {
					r.OK++
				} else {
					r.Failed++
				}
				mu.Unlock()
			}
		}()
	}
feed:
	for i := range o.Events {
		for k := range o.Targets {
			select {
			case jobs <- job{i, k}:
			case <-ctx.Done():
				break feed
			}
		}
	}
	close(jobs)
	wg.Wait()
	return out, nil
}

func post(ctx context.Context, client *http.Client, url string, s *signature.Signer, ev Event, now time.Time) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(ev.Body))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	s.Set(req.Header, ev.ID, now, ev.Body)
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode/100 == 2
}
