package delivery

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/origin/backoff"
	"github.com/sluice-dev/sluice/origin/breaker"
	"github.com/sluice-dev/sluice/origin/ledger"
	"github.com/sluice-dev/sluice/shared/bucket"
)

func TestRateCapHoldsUnderABacklog(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	rc := newReceiver(t, b.clock, nil)
	const perSecond, burst, backlog = 100, 20, 300
	b.subscriber("partner", rc.URL, func(s *ledger.Subscriber) { s.Rate.PerSecond, s.Rate.Burst = perSecond, burst })
	b.send("e", "video.trending", backlog)
	b.settle()
	b.step(4*time.Second, 5*time.Millisecond)

	at := rc.times()
	if len(at) != backlog {
		t.Fatalf("delivered %d of %d", len(at), backlog)
	}
	// No 1-second window holds more than burst + rate.
	for i := range at {
		n := 0
		for j := i; j < len(at) && at[j].Sub(at[i]) < time.Second; j++ {
			n++
		}
		if n > burst+perSecond {
			t.Fatalf("%d deliveries in the second from %v, cap is %d", n, at[i].Sub(t0), burst+perSecond)
		}
	}
	// After the burst, the sustained rate is the configured one within 10%.
	sustained := at[burst:]
	rate := float64(len(sustained)-1) / sustained[len(sustained)-1].Sub(sustained[0]).Seconds()
	if rate < perSecond*0.9 || rate > perSecond*1.1 {
		t.Fatalf("sustained rate %.1f/s, want %d/s ±10%%", rate, perSecond)
	}
}

// A partner enforcing its advertised bucket counts arrivals, and the first
// request of a burst, which opens a connection, arrives later than the warm
// ones after it (30 ms here). sluice keeps back what the rate refills in
// bucket.SendMargin, so the partner never runs short and never answers 429.
func TestABurstLeavesAStrictPartnerItsMargin(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	r := bucket.Rate{PerSecond: 10, Burst: 20}
	var (
		mu       sync.Mutex
		strict   = bucket.Full(r, t0)
		refusals int
	)
	rc := newReceiver(t, b.clock, func(_ *http.Request, n int) (int, http.Header) {
		at := b.clock.Now()
		if n == 1 {
			at = at.Add(30 * time.Millisecond)
		}
		mu.Lock()
		defer mu.Unlock()
		var ok bool
		if strict, ok = bucket.Take(strict, r, at, 1); !ok {
			refusals++
			return http.StatusTooManyRequests, nil
		}
		return http.StatusNoContent, nil
	})
	b.subscriber("partner", rc.URL, func(s *ledger.Subscriber) { s.Rate.PerSecond, s.Rate.Burst = r.PerSecond, r.Burst })
	b.send("e", "video.trending", 60)
	b.settle()
	b.step(3*time.Second, 5*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if refusals != 0 {
		t.Fatalf("the partner refused %d requests as early", refusals)
	}
	// The reserve costs one token at 10/s: 20 − 1 + 10 × 3 s.
	if n := rc.count(); n != 49 {
		t.Fatalf("%d requests in 3 s at 10/s after a burst of 20, want 49", n)
	}
}

func TestAThrottledBacklogCostsNoWritesWhileItWaits(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	rc := newReceiver(t, b.clock, nil)
	b.subscriber("slow", rc.URL, func(s *ledger.Subscriber) { s.Rate.PerSecond, s.Rate.Burst = 2, 1 })
	b.send("e", "t", 1000)
	b.settle()
	ctx := context.Background()
	before, err := b.l.Changes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	delivered := rc.count()
	// Ten seconds in 10 ms ticks: a thousand ticks, twenty tokens.
	b.step(10*time.Second, 10*time.Millisecond)
	after, err := b.l.Changes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sent := rc.count() - delivered
	if sent != 20 {
		t.Fatalf("%d delivered in 10 s at 2/s, want 20", sent)
	}
	// Claim (pending → inflight), the attempt row, and the sent mark: three
	// rows per delivery, and nothing for the 980 deliveries still waiting.
	t.Logf("%d row writes for %d deliveries", after-before, sent)
	if writes := after - before; writes > int64(3*sent) {
		t.Fatalf("%d row writes for %d deliveries over 1000 ticks, want at most %d", writes, sent, 3*sent)
	}
}

// A clean stop saves the buckets and the next start continues from them; a
// crash saves nothing, and the next start finds every bucket empty.
func TestBucketContinuesAfterAStopAndStartsEmptyAfterACrash(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	rc := newReceiver(t, b.clock, nil)
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) { s.Rate.PerSecond, s.Rate.Burst = 1, 5 })
	b.send("e", "t", 20)
	b.settle()
	// The burst of 5, less the sender's reserve of 0.1 token at 1/s.
	if n := rc.count(); n != 4 {
		t.Fatalf("first process delivered %d, want 4 of the burst of 5", n)
	}
	b.stop()
	b.start() // at the same instant: the bucket holds the 1.0 token it was left with
	b.settle()
	if saved, err := b.l.Setting(context.Background(), bucketsKey); err != nil || saved != "" {
		t.Fatalf("the start left the saved buckets (%q, %v): a crash now would reuse them", saved, err)
	}
	if n := rc.count(); n != 4 {
		t.Fatalf("after a clean restart %d delivered with no time passing, want still 4", n)
	}
	b.step(200*time.Millisecond, 10*time.Millisecond) // 1.2 tokens: one above the reserve
	if n := rc.count(); n != 5 {
		t.Fatalf("200 ms after a clean restart %d delivered, want 5", n)
	}

	// A crash: the process saves nothing (the start took what was saved).
	b.stop()
	if _, err := b.l.TakeSetting(context.Background(), bucketsKey); err != nil {
		t.Fatal(err)
	}
	b.start()
	b.step(time.Second, 10*time.Millisecond) // from empty, 1.1 s to a token above the reserve
	if n := rc.count(); n != 5 {
		t.Fatalf("one second after a crash %d delivered, want still 5", n)
	}
	b.step(200*time.Millisecond, 10*time.Millisecond)
	if n := rc.count(); n != 6 {
		t.Fatalf("1.2 s after a crash %d delivered, want 6", n)
	}

	// A clock stepped back between a stop and a start: the saved bucket
	// would stay shut until the clock caught up; it starts empty instead.
	// (New events: those already pending are due an hour ahead now.)
	b.stop()
	b.fake.Advance(-time.Hour)
	b.start()
	b.send("later", "t", 1)
	b.step(1200*time.Millisecond, 10*time.Millisecond)
	if n := rc.count(); n != 7 {
		t.Fatalf("1.2 s after a start with the clock an hour back %d delivered, want 7", n)
	}
}

func TestRetryAfterPausesTheWholeSubscriber(t *testing.T) {
	t.Parallel()
	forms := map[string]func(time.Time) string{
		"delta-seconds": func(time.Time) string { return "120" },
		"IMF-fixdate":   func(now time.Time) string { return now.Add(120 * time.Second).Format(http.TimeFormat) },
		"RFC 850":       func(now time.Time) string { return now.Add(120 * time.Second).Format(time.RFC850) },
		"asctime":       func(now time.Time) string { return now.Add(120 * time.Second).Format(time.ANSIC) },
	}
	for name, header := range forms {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, true)
			rc := newReceiver(t, b.clock, func(r *http.Request, n int) (int, http.Header) {
				if n == 1 {
					return http.StatusTooManyRequests, http.Header{"Retry-After": {header(b.clock.Now())}}
				}
				return http.StatusOK, nil
			})
			// A burst of one makes the first attempt the only one in flight.
			b.subscriber("s", rc.URL, func(s *ledger.Subscriber) { s.Rate.PerSecond, s.Rate.Burst = 100, 1 })
			b.send("e", "t", 5)
			b.settle()
			if n := rc.count(); n != 1 {
				t.Fatalf("%d requests before the 429 was answered, want 1", n)
			}
			want := t0.Add(120 * time.Second)
			if got := b.d.Snapshot()["s"].PausedUntil; !got.Equal(want) {
				t.Fatalf("paused until %v, want %v", got, want)
			}
			stored, err := b.l.Subscriber(context.Background(), "s")
			if err != nil || !stored.PausedUntil.Equal(want) {
				t.Fatalf("persisted pause %v (%v), want %v", stored.PausedUntil, err, want)
			}
			b.step(119*time.Second, 500*time.Millisecond)
			if n := rc.count(); n != 1 {
				t.Fatalf("%d requests during the Retry-After pause, want none after the first", n)
			}
			b.step(2*time.Second, 100*time.Millisecond)
			if n := rc.count(); n != 6 {
				t.Fatalf("%d requests after the pause, want 6 (the 429 and all five)", n)
			}
			d := deliveryOf(t, b, "e-0")
			if len(d.History) != 2 || d.History[0].RetryAfterMS == nil || *d.History[0].RetryAfterMS != 120_000 {
				t.Fatalf("first delivery's history = %+v, want the 429 with Retry-After 120s then a success", d.History)
			}
		})
	}
}

// A subscriber that keeps answering 429 with a Retry-After is obeyed each
// time, not broken: its breaker stays closed past the threshold, so a
// Retry-After of 1 s never becomes the breaker's cooldown. One answering
// 503 with a Retry-After is down: the pauses are obeyed and the breaker
// opens all the same.
func TestRetryAfterOnA429DoesNotOpenTheBreaker(t *testing.T) {
	t.Parallel()
	for status, wantOpen := range map[int]bool{http.StatusTooManyRequests: false, http.StatusServiceUnavailable: true} {
		logs := &logBuffer{}
		b := setup(t, true, func(c *Config) { c.Breaker.Threshold = 3; c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
		rc := newReceiver(t, b.clock, func(*http.Request, int) (int, http.Header) {
			return status, http.Header{"Retry-After": {"1"}}
		})
		b.subscriber("s", rc.URL, func(s *ledger.Subscriber) { s.Rate.PerSecond, s.Rate.Burst, s.MaxAttempts = 100, 1, 20 })
		b.send("e", "t", 1)
		b.settle()
		b.step(6*time.Second, 250*time.Millisecond)
		br := b.d.Snapshot()["s"].Breaker
		switch {
		case !wantOpen && rc.count() < 5:
			t.Errorf("%d: %d attempts in 6 s of 1 s Retry-Afters, want one a second", status, rc.count())
		case !wantOpen && (br.State != breaker.Closed || br.Failures != 0):
			t.Errorf("%d: breaker %+v after %d answers with Retry-After, want closed with no failures counted", status, br, rc.count())
		case wantOpen && br.State != breaker.Open:
			t.Errorf("%d: breaker %+v after %d answers, want open", status, br, rc.count())
		}
		// Each answer came after the last 1 s pause ended: each starts one.
		if n := strings.Count(logs.String(), `msg="subscriber paused by its Retry-After" subscriber_id=s status=`+strconv.Itoa(status)); n != rc.count() {
			t.Errorf("%d: %d pause lines for %d answers, each after the last pause ended; want one each", status, n, rc.count())
		}
	}
}

// A pause is logged when it starts, not at each answer that extends it.
func TestARetryAfterPauseIsLoggedOnce(t *testing.T) {
	t.Parallel()
	logs := &logBuffer{}
	b := setup(t, true, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	hold := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release)
	rc := newReceiver(t, b.clock, func(_ *http.Request, n int) (int, http.Header) {
		if n == 1 {
			<-hold // the second request is out before the first answers
		}
		return http.StatusTooManyRequests, http.Header{"Retry-After": {"60"}}
	})
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) { s.Rate.PerSecond, s.Rate.Burst = 10, 5 })
	b.send("e", "t", 2)
	waitFor(t, 10*time.Second, "both requests out", func() bool { return rc.count() == 2 })
	waitFor(t, 10*time.Second, "the first pause", func() bool { return !b.d.Snapshot()["s"].PausedUntil.IsZero() })
	b.fake.Advance(time.Second) // the held answer comes later, and extends the pause
	release()
	b.settle()
	if until := b.d.Snapshot()["s"].PausedUntil; !until.Equal(b.clock.Now().Add(time.Minute)) {
		t.Errorf("paused until %v, want the later answer's minute, to %v", until, b.clock.Now().Add(time.Minute))
	}
	if n := strings.Count(logs.String(), `msg="subscriber paused by its Retry-After"`); n != 1 {
		t.Errorf("%d pause lines for two 429s of one pause; want 1:\n%s", n, logs.String())
	}
}

// A Retry-After of 0 asks for no pause: none is set, and none is logged.
func TestARetryAfterOfZeroPausesNothing(t *testing.T) {
	t.Parallel()
	logs := &logBuffer{}
	b := setup(t, true, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	rc := newReceiver(t, b.clock, func(*http.Request, int) (int, http.Header) {
		return http.StatusTooManyRequests, http.Header{"Retry-After": {"0"}}
	})
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) { s.MaxAttempts = 1 })
	b.send("e", "t", 3)
	b.settle()
	if rc.count() != 3 {
		t.Fatalf("%d requests, want 3", rc.count())
	}
	if n := strings.Count(logs.String(), "paused by its Retry-After"); n != 0 || !b.d.Snapshot()["s"].PausedUntil.IsZero() {
		t.Errorf("%d pause lines, paused until %v, after three Retry-After: 0; want none", n, b.d.Snapshot()["s"].PausedUntil)
	}
}

// A Retry-After on a success is kept in the history as seen, like any other.
func TestARetryAfterOnASuccessIsRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	rc := newReceiver(t, b.clock, func(*http.Request, int) (int, http.Header) {
		return http.StatusOK, http.Header{"Retry-After": {"7"}}
	})
	b.subscriber("s", rc.URL, nil)
	b.send("e", "t", 1)
	b.settle()
	d := deliveryOf(t, b, "e-0")
	if len(d.History) != 1 || d.History[0].RetryAfterMS == nil || *d.History[0].RetryAfterMS != 7000 {
		t.Fatalf("history %+v, want the 200 with the Retry-After it sent, 7 s", d.History)
	}
	if got := b.d.Snapshot()["s"].PausedUntil; !got.IsZero() {
		t.Fatalf("a 200's Retry-After paused the subscriber until %v", got)
	}
}

// A Retry-After beyond backoff.MaxPause pauses the subscriber for the cap,
// and the history keeps what the subscriber asked for.
func TestAnAbsurdRetryAfterPausesAnHourAndIsRecordedAsAsked(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	rc := newReceiver(t, b.clock, func(_ *http.Request, n int) (int, http.Header) {
		if n == 1 {
			return http.StatusServiceUnavailable, http.Header{"Retry-After": {"999999"}}
		}
		return http.StatusOK, nil
	})
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) { s.Rate.PerSecond, s.Rate.Burst = 100, 1 })
	b.send("e", "t", 1)
	b.settle()
	if got, want := b.d.Snapshot()["s"].PausedUntil, t0.Add(backoff.MaxPause); !got.Equal(want) {
		t.Fatalf("paused until %v, want the cap %v", got, want)
	}
	d := deliveryOf(t, b, "e-0")
	if len(d.History) != 1 || d.History[0].RetryAfterMS == nil || *d.History[0].RetryAfterMS != 999_999_000 {
		t.Fatalf("history %+v, want the 503 with the Retry-After it sent, 999999 s", d.History)
	}
}

// A Retry-After on another status is recorded as seen but not obeyed: the
// delivery backs off as any failure does, and the subscriber is not paused.
func TestARetryAfterOnA500IsRecordedNotObeyed(t *testing.T) {
	t.Parallel()
	b := setup(t, true, func(c *Config) { c.RetryBase, c.RetryCap = 100*time.Millisecond, 100*time.Millisecond })
	rc := newReceiver(t, b.clock, func(_ *http.Request, n int) (int, http.Header) {
		if n == 1 {
			return http.StatusInternalServerError, http.Header{"Retry-After": {"30"}}
		}
		return http.StatusOK, nil
	})
	b.subscriber("s", rc.URL, nil)
	b.send("e", "t", 1)
	b.settle()
	if got := b.d.Snapshot()["s"].PausedUntil; !got.IsZero() {
		t.Fatalf("a 500's Retry-After paused the subscriber until %v", got)
	}
	b.step(200*time.Millisecond, 10*time.Millisecond)
	d := deliveryOf(t, b, "e-0")
	if d.Status != ledger.StatusSent || len(d.History) != 2 || d.History[0].RetryAfterMS == nil || *d.History[0].RetryAfterMS != 30_000 {
		t.Fatalf("%s with history %+v, want the 500 with the 30 s it asked, then sent after the backoff", d.Status, d.History)
	}
}

// topOfRange draws the largest value it may: the longest full-jitter wait.
type topOfRange struct{}

func (topOfRange) Int64N(n int64) int64 { return n - 1 }

// The first retry waits at most the base, the next at most twice it: the
// backoff's exponent counts retries from 0.
func TestTheFirstRetryWaitsAtMostTheBase(t *testing.T) {
	t.Parallel()
	b := setup(t, true, func(c *Config) { c.RetryBase, c.RetryCap, c.Rand = time.Second, time.Hour, topOfRange{} })
	rc := newReceiver(t, b.clock, func(_ *http.Request, n int) (int, http.Header) {
		if n <= 2 {
			return http.StatusInternalServerError, nil
		}
		return http.StatusOK, nil
	})
	b.subscriber("s", rc.URL, nil)
	b.send("e", "t", 1)
	b.settle()
	b.step(time.Second-time.Millisecond, time.Second-time.Millisecond)
	if n := rc.count(); n != 1 {
		t.Fatalf("%d requests before the base had passed, want 1", n)
	}
	b.step(time.Millisecond, time.Millisecond)
	if n := rc.count(); n != 2 {
		t.Fatalf("%d requests once the base had passed, want the first retry", n)
	}
	b.step(2*time.Second-time.Millisecond, 2*time.Second-time.Millisecond)
	if n := rc.count(); n != 2 {
		t.Fatalf("%d requests within twice the base of the first retry, want still 2", n)
	}
	b.step(time.Millisecond, time.Millisecond)
	if d := deliveryOf(t, b, "e-0"); rc.count() != 3 || d.Status != ledger.StatusSent {
		t.Fatalf("%d requests and %s after twice the base, want the second retry sent", rc.count(), d.Status)
	}
}

func deliveryOf(t *testing.T, b *bundle, eventID string) ledger.Delivery {
	t.Helper()
	_, ds, err := b.l.Event(context.Background(), eventID)
	if err != nil || len(ds) != 1 {
		t.Fatalf("event %s: %d deliveries (%v)", eventID, len(ds), err)
	}
	d, err := b.l.Delivery(context.Background(), ds[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestSlowAndFailingSubscribersDoNotDelayAFastOne(t *testing.T) {
	t.Parallel()
	b := setup(t, false, func(c *Config) { c.Workers, c.PerSubscriber = 16, 4 })
	var slowNow, slowMax atomic.Int64
	release := make(chan struct{})
	slow := newReceiver(t, b.clock, func(r *http.Request, _ int) (int, http.Header) {
		n := slowNow.Add(1)
		defer slowNow.Add(-1)
		for m := slowMax.Load(); n > m && !slowMax.CompareAndSwap(m, n); m = slowMax.Load() {
		}
		select { // answers in 8 s, like the slow relay
		case <-time.After(8 * time.Second):
		case <-r.Context().Done():
		case <-release:
		}
		return http.StatusOK, nil
	})
	failing := newReceiver(t, b.clock, func(*http.Request, int) (int, http.Header) { return http.StatusInternalServerError, nil })
	fast := newReceiver(t, b.clock, nil)
	// Release the slow handlers before the servers close (cleanups run last-in first-out).
	t.Cleanup(func() { close(release) })

	b.subscriber("slow", slow.URL, func(s *ledger.Subscriber) { s.TimeoutMS = 10_000 })
	b.subscriber("failing", failing.URL, nil)
	b.subscriber("fast", fast.URL, nil)
	b.send("e", "video.trending", 100)

	waitFor(t, 3*time.Second, "the fast subscriber's 100 deliveries", func() bool { return fast.count() == 100 })
	if n := slowNow.Load(); n == 0 {
		t.Fatal("the slow subscriber had no attempt in flight; the test proves nothing")
	}
	if m := slowMax.Load(); m > 4 {
		t.Fatalf("the slow subscriber held %d workers at once, cap is 4", m)
	}
	if n := failing.count(); n == 0 {
		t.Fatal("the failing subscriber was never tried")
	}
}

// A subscriber whose attempts answer at once may use FastSubscriber workers
// (16 less a PerSubscriber of 4 and the reserve of 2: 10 here), not
// PerSubscriber: its cap is there to stop it holding workers, and it gives
// them straight back. If it then stalls with all of them out, a slow
// subscriber beside it (one that has answered) still gets its whole cap at once.
func TestFastSubscriberUsesMoreWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t, true, func(c *Config) { c.Workers, c.PerSubscriber = 16, 4 })
	var held gauge
	release := make(chan struct{})
	rc := newReceiver(t, b.clock, func(r *http.Request, n int) (int, http.Header) {
		if n == 1 {
			return http.StatusOK, nil // answered at once: the subscriber is fast
		}
		held.hold(r, release)
		return http.StatusOK, nil
	})
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock)
	b.subscriber("s", rc.URL, nil)
	b.send("first", "t", 1)
	b.settle()
	if rc.count() != 1 {
		t.Fatalf("%d requests, want the first delivery", rc.count())
	}

	b.send("e", "t", 30)
	waitFor(t, 3*time.Second, "10 attempts in flight", func() bool { return held.now.Load() == 10 })
	b.looked()
	if n := b.d.Snapshot()["s"].Inflight; n != 10 {
		t.Fatalf("the dispatcher holds %d attempts in flight, want FastSubscriber = 10", n)
	}
	if p := held.peak.Load(); p != 10 {
		t.Fatalf("%d attempts in flight at most, want FastSubscriber = 10", p)
	}

	var otherHeld gauge
	other := newReceiver(t, b.clock, func(r *http.Request, n int) (int, http.Header) {
		if n == 1 {
			return http.StatusOK, nil // it has answered: past its startCap
		}
		otherHeld.hold(r, release)
		return http.StatusOK, nil
	})
	t.Cleanup(unblock) // before its server closes, which waits for them
	b.subscriber("other", other.URL, func(s *ledger.Subscriber) { s.EventTypes = []string{"u"} })
	b.send("first-o", "u", 1)
	waitFor(t, 3*time.Second, "the other subscriber's first answer", func() bool {
		return b.d.Snapshot()["other"].Inflight == 0 && other.count() == 1
	})
	b.send("o", "u", 6)
	waitFor(t, 3*time.Second, "the other subscriber's 4 attempts at once", func() bool { return otherHeld.now.Load() == 4 })
	if n := held.now.Load(); n != 10 {
		t.Fatalf("the stalled subscriber has %d attempts out, want its 10 still held", n)
	}
}

// The fast cap follows how quickly attempts answer, and a subscriber with
// attempts out that has not answered for fastAnswer loses it at once.
func TestFastSubscriberTracksAnswerTimes(t *testing.T) {
	var s sub
	if s.fast(t0) {
		t.Fatal("a subscriber that never answered counts as fast")
	}
	s.noteAnswer(2*time.Millisecond, t0)
	if !s.fast(t0) {
		t.Fatal("a 2ms answer does not make a subscriber fast")
	}
	s.inflight = 3
	if !s.fast(t0.Add(fastAnswer - time.Millisecond)) {
		t.Fatal("attempts out for less than fastAnswer made it slow")
	}
	if s.fast(t0.Add(fastAnswer)) {
		t.Fatal("attempts out with no answer for fastAnswer still count as fast")
	}
	s.inflight = 0
	if !s.fast(t0.Add(time.Hour)) {
		t.Fatal("an idle fast subscriber lost its cap")
	}
	for range 3 {
		s.noteAnswer(2*time.Second, t0)
	}
	if s.fast(t0) {
		t.Fatalf("still fast after three 2s answers (average %v)", s.answerTime)
	}
	for range 20 {
		s.noteAnswer(time.Millisecond, t0)
	}
	if !s.fast(t0) {
		t.Fatalf("not fast again after twenty 1ms answers (average %v)", s.answerTime)
	}
}

func TestDeadLetterAfterMaxAttemptsThenRetryAndRecover(t *testing.T) {
	t.Parallel()
	b := setup(t, true, func(c *Config) {
		c.RetryBase, c.RetryCap = time.Second, 4*time.Second
		c.Breaker.Threshold = 100 // this test is about attempts, not the breaker
	})
	var healthy atomic.Bool
	rc := newReceiver(t, b.clock, func(*http.Request, int) (int, http.Header) {
		if healthy.Load() {
			return http.StatusOK, nil
		}
		return http.StatusBadGateway, nil
	})
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) { s.MaxAttempts = 3 })
	b.send("e", "t", 2)
	b.settle()
	b.step(20*time.Second, 100*time.Millisecond)

	if n := rc.count(); n != 6 {
		t.Fatalf("%d requests, want 3 attempts for each of 2 deliveries", n)
	}
	d := deliveryOf(t, b, "e-0")
	if d.Status != ledger.StatusDead || d.Attempts != 3 || d.DeadAt == nil {
		t.Fatalf("delivery = %s after %d attempts (dead at %v), want dead after 3", d.Status, d.Attempts, d.DeadAt)
	}
	for i, a := range d.History {
		if a.Number != i+1 || a.StatusCode != http.StatusBadGateway || a.Lane != ledger.LaneOrigin {
			t.Fatalf("attempt %d = %+v", i+1, a)
		}
		if i > 0 && a.At.Sub(d.History[i-1].At) > 4*time.Second+100*time.Millisecond {
			t.Fatalf("attempt %d came %v after the previous one, above the 4s cap", i+1, a.At.Sub(d.History[i-1].At))
		}
	}
	if d.LastError != "HTTP 502" {
		t.Fatalf("last error %q, want HTTP 502", d.LastError)
	}

	healthy.Store(true)
	ctx := context.Background()
	if _, err := b.l.Requeue(ctx, d.ID); err != nil {
		t.Fatal(err)
	}
	b.d.Notify(b.clock.Now(), "s")
	b.settle()
	if d := deliveryOf(t, b, "e-0"); d.Status != ledger.StatusSent || len(d.History) != 4 || d.History[3].Number != 4 ||
		d.History[3].StatusCode != http.StatusOK {
		t.Fatalf("retried delivery = %s with history %+v, want sent with the three failures kept and a fourth attempt", d.Status, d.History)
	}
	// The other one died at t0 + a few seconds: recovering since a later time
	// finds nothing, since t0 finds it.
	if n, err := b.l.Recover(ctx, "s", b.clock.Now().Add(time.Second)); err != nil || n != 0 {
		t.Fatalf("recover since the future = %d, %v", n, err)
	}
	if n, err := b.l.Recover(ctx, "s", t0); err != nil || n != 1 {
		t.Fatalf("recover since t0 = %d, %v; want 1", n, err)
	}
	b.d.Notify(b.clock.Now(), "s")
	b.settle()
	if d := deliveryOf(t, b, "e-1"); d.Status != ledger.StatusSent {
		t.Fatalf("recovered delivery is %s, want sent", d.Status)
	}
}

// An attempt started before the breaker last moved afresh tells it nothing.
// Here one is still out (held) when the first failure opens the breaker and
// the operator's retry turns it half-open: the probe goes at once beside
// it, and its late failure neither takes the probe's place nor reopens the
// breaker for another hour.
func TestALateAttemptDoesNotTakeTheOperatorsProbe(t *testing.T) {
	t.Parallel()
	b := setup(t, true, func(c *Config) { c.Breaker = breaker.Settings{Threshold: 1, Cooldown: time.Hour} })
	release := make(chan struct{})
	var healthy atomic.Bool
	rc := newReceiver(t, b.clock, func(_ *http.Request, n int) (int, http.Header) {
		if n == 2 {
			<-release
		}
		if healthy.Load() && n > 2 {
			return http.StatusOK, nil
		}
		return http.StatusInternalServerError, nil
	})
	free := sync.OnceFunc(func() { close(release) })
	t.Cleanup(free) // before the receiver closes: it waits for the held request
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) { s.MaxAttempts = 1 })
	b.send("e", "t", 2)
	waitFor(t, 5*time.Second, "two requests and an open breaker", func() bool {
		return rc.count() == 2 && b.d.Snapshot()["s"].Breaker.State == breaker.Open
	})
	var dead ledger.Delivery
	waitFor(t, 5*time.Second, "the first delivery dead", func() bool {
		for _, id := range []string{"e-0", "e-1"} {
			if d := deliveryOf(t, b, id); d.Status == ledger.StatusDead {
				dead = d
				return true
			}
		}
		return false
	})
	healthy.Store(true)
	if _, err := b.l.Requeue(context.Background(), dead.ID); err != nil {
		t.Fatal(err)
	}
	b.d.ProbeNow("s")
	waitFor(t, 5*time.Second, "the probe sent beside the held attempt", func() bool {
		return deliveryOf(t, b, dead.EventID).Status == ledger.StatusSent
	})
	free() // the old attempt fails now
	b.settle()
	if st := b.d.Snapshot()["s"].Breaker; st.State != breaker.Closed || st.Failures != 0 {
		t.Errorf("breaker %+v after the probe succeeded and the older attempt failed late, want closed", st)
	}
}

// A PATCH of the URL clears the breaker, in the ledger too, and whatever an
// attempt still out at the old URL learns (a failure, with the breaker open
// or clean at the change, or a success once the new URL has opened it) is
// about another endpoint and leaves the new one's breaker as it is.
func TestAttemptsAtAnOldURLTellTheNewOneNothing(t *testing.T) {
	t.Parallel()
	threshold1 := func(c *Config) { c.Breaker = breaker.Settings{Threshold: 1, Cooldown: time.Hour} }
	// holdAtOld sends events to an old URL that answers status and holds
	// the last of them; the func it returns lets that one answer.
	holdAtOld := func(t *testing.T, b *bundle, status, events int) func() {
		release := make(chan struct{})
		old := newReceiver(t, b.clock, func(_ *http.Request, n int) (int, http.Header) {
			if n == events {
				<-release
			}
			return status, nil
		})
		free := sync.OnceFunc(func() { close(release) })
		t.Cleanup(free) // before the receiver closes: it waits for the held request
		b.subscriber("s", old.URL, func(s *ledger.Subscriber) { s.MaxAttempts = 1 })
		b.send("e", "t", events)
		waitFor(t, 5*time.Second, "the requests at the old URL", func() bool { return old.count() == events })
		return free
	}

	t.Run("a late failure after the breaker opened", func(t *testing.T) {
		t.Parallel()
		b := setup(t, true, threshold1)
		fresh := newReceiver(t, b.clock, nil)
		free := holdAtOld(t, b, http.StatusInternalServerError, 2)
		waitFor(t, 5*time.Second, "an open breaker", func() bool { return b.d.Snapshot()["s"].Breaker.State == breaker.Open })
		b.update("s", func(x *ledger.Subscriber) { x.URL = fresh.URL })
		stored, err := b.l.Subscriber(context.Background(), "s")
		if err != nil || stored.Breaker.State != breaker.Closed {
			t.Errorf("stored breaker %+v (%v) after the URL changed, want closed: a crash would bring the old one back", stored.Breaker, err)
		}
		free()
		b.settle()
		b.send("f", "t", 1)
		b.settle()
		if n := fresh.count(); n != 1 {
			t.Errorf("the new URL got %d requests, want 1: the old URL's late failure opened its breaker", n)
		}
	})
	t.Run("a late failure with the breaker clean", func(t *testing.T) {
		t.Parallel()
		b := setup(t, true, threshold1)
		fresh := newReceiver(t, b.clock, nil)
		free := holdAtOld(t, b, http.StatusInternalServerError, 1)
		b.update("s", func(x *ledger.Subscriber) { x.URL = fresh.URL })
		free()
		b.settle()
		b.send("f", "t", 1)
		b.settle()
		if n := fresh.count(); n != 1 {
			t.Errorf("the new URL got %d requests, want 1; breaker %+v", n, b.d.Snapshot()["s"].Breaker)
		}
	})
	t.Run("a late success", func(t *testing.T) {
		t.Parallel()
		b := setup(t, true, threshold1)
		down := newReceiver(t, b.clock, func(*http.Request, int) (int, http.Header) { return http.StatusInternalServerError, nil })
		free := holdAtOld(t, b, http.StatusOK, 1)
		b.update("s", func(x *ledger.Subscriber) { x.URL = down.URL })
		b.send("f", "t", 1)
		waitFor(t, 5*time.Second, "the new URL's breaker open", func() bool { return b.d.Snapshot()["s"].Breaker.State == breaker.Open })
		free()
		b.settle()
		if st := b.d.Snapshot()["s"].Breaker; st.State != breaker.Open {
			t.Errorf("breaker %+v after the old URL's late success, want the new URL's open", st)
		}
	})
}

func TestBreakerOpensProbesOnceAndCloses(t *testing.T) {
	t.Parallel()
	logs := &logBuffer{}
	b := setup(t, true, func(c *Config) {
		c.Breaker = breaker.Settings{Threshold: 3, Cooldown: time.Minute}
		c.RetryBase, c.RetryCap = 100*time.Millisecond, 100*time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	var (
		healthy atomic.Bool
		mu      sync.Mutex
		log     []string // "in" and "out" in arrival order
	)
	rc := newReceiver(t, b.clock, func(*http.Request, int) (int, http.Header) {
		mu.Lock()
		log = append(log, "in")
		mu.Unlock()
		defer func() {
			mu.Lock()
			log = append(log, "out")
			mu.Unlock()
		}()
		if healthy.Load() {
			return http.StatusOK, nil
		}
		return http.StatusInternalServerError, nil
	})
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) { s.MaxAttempts = 20; s.Rate.Burst = 1; s.Rate.PerSecond = 1000 })
	b.send("e", "t", 5)
	b.settle()
	b.step(time.Second, 10*time.Millisecond)
	if st := b.d.Snapshot()["s"].Breaker.State; st != breaker.Open {
		t.Fatalf("breaker %s after repeated failures, want open", st)
	}
	opened := rc.count()
	if opened < 3 {
		t.Fatalf("breaker opened after %d requests, threshold is 3", opened)
	}
	stored, _ := b.l.Subscriber(context.Background(), "s")
	if stored.Breaker.State != breaker.Open {
		t.Fatalf("persisted breaker %s, want open", stored.Breaker.State)
	}
	before := deliveryOf(t, b, "e-4").Attempts

	healthy.Store(true)
	b.step(58*time.Second, 500*time.Millisecond)
	if n := rc.count(); n != opened {
		t.Fatalf("%d requests while the breaker was open, want none", n-opened)
	}
	if after := deliveryOf(t, b, "e-4").Attempts; after != before {
		t.Fatalf("waiting behind an open breaker spent %d attempts", after-before)
	}
	mu.Lock()
	log = nil
	mu.Unlock()
	b.step(3*time.Second, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(log) < 4 || log[0] != "in" || log[1] != "out" {
		t.Fatalf("after the cooldown the requests went %v, want one probe alone first", log)
	}
	if st := b.d.Snapshot()["s"].Breaker.State; st != breaker.Closed {
		t.Fatalf("breaker %s after a successful probe, want closed", st)
	}
	for i := range 5 {
		if d := deliveryOf(t, b, "e-"+string(rune('0'+i))); d.Status != ledger.StatusSent {
			t.Fatalf("delivery of e-%d is %s after the breaker closed", i, d.Status)
		}
	}
	// Each move is a log line: an open breaker stops a subscriber's traffic.
	var moves []string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "msg=\"breaker") && strings.Contains(line, "subscriber_id=s") {
			moves = append(moves, line[strings.Index(line, "msg="):])
		}
	}
	if len(moves) != 3 || !strings.HasPrefix(moves[0], `msg="breaker opened`) || !strings.Contains(moves[0], "failures=3") ||
		!strings.HasPrefix(moves[1], `msg="breaker half-open`) || !strings.HasPrefix(moves[2], `msg="breaker closed`) {
		t.Errorf("breaker log lines %q; want opened (failures=3), half-open, closed", moves)
	}
}

// logBuffer is a log destination goroutines may share.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Once its cooldown has passed, a breaker shows half-open even when no
// delivery is waiting to be its probe.
func TestABreakerShowsHalfOpenAfterItsCooldown(t *testing.T) {
	t.Parallel()
	b := setup(t, true, func(c *Config) { c.Breaker = breaker.Settings{Threshold: 1, Cooldown: time.Minute} })
	rc := newReceiver(t, b.clock, func(*http.Request, int) (int, http.Header) { return http.StatusInternalServerError, nil })
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) { s.MaxAttempts = 1 })
	b.send("e", "t", 1)
	b.settle()
	if st := b.d.Snapshot()["s"].Breaker.State; st != breaker.Open {
		t.Fatalf("breaker %s after a failure at threshold 1, want open", st)
	}
	b.step(59*time.Second, time.Second)
	if st := b.d.Snapshot()["s"].Breaker.State; st != breaker.Open {
		t.Fatalf("breaker %s before its cooldown ended, want open", st)
	}
	b.step(time.Second, time.Second)
	if st := b.d.Snapshot()["s"].Breaker.State; st != breaker.HalfOpen {
		t.Fatalf("breaker %s after its cooldown with nothing to send, want half_open", st)
	}
}

func TestOperatorPauseHoldsDeliveries(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	rc := newReceiver(t, b.clock, nil)
	s := b.subscriber("s", rc.URL, func(s *ledger.Subscriber) { s.Paused = true })
	b.send("e", "t", 3)
	b.step(2*time.Second, 100*time.Millisecond)
	if n := rc.count(); n != 0 {
		t.Fatalf("paused subscriber got %d requests", n)
	}
	s.Paused = false
	b.d.Upsert(s)
	b.settle()
	if n := rc.count(); n != 3 {
		t.Fatalf("unpaused subscriber got %d of 3", n)
	}
}

func TestRotatedSecretStopsSigningWhenItsGraceEnds(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	var mu sync.Mutex
	var sigs []string
	rc := newReceiver(t, b.clock, func(r *http.Request, _ int) (int, http.Header) {
		mu.Lock()
		sigs = append(sigs, r.Header.Get("webhook-signature"))
		mu.Unlock()
		return http.StatusOK, nil
	})
	const previous = "whsec_cHJldmlvdXMtc2VjcmV0LTI0LWJ5dGVzLWxvbmch"
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) {
		s.Previous = []ledger.PreviousSecret{{Secret: previous, Until: t0.Add(time.Hour)}}
	})
	b.send("before", "t", 1)
	b.settle()
	b.fake.Advance(time.Hour)
	b.send("after", "t", 1)
	b.settle()
	mu.Lock()
	defer mu.Unlock()
	if len(sigs) != 2 {
		t.Fatalf("%d requests, want 2", len(sigs))
	}
	if n := len(strings.Fields(sigs[0])); n != 2 {
		t.Fatalf("during the grace period the header held %d signatures, want 2: %q", n, sigs[0])
	}
	if n := len(strings.Fields(sigs[1])); n != 1 {
		t.Fatalf("after the grace period the header held %d signatures, want 1: %q", n, sigs[1])
	}
}

// At the default level the log holds a line per failed attempt, none per
// success, and a warning naming what a drain that timed out abandoned.
func TestLogsFailuresAndRecordsWhatADrainAbandons(t *testing.T) {
	t.Parallel()
	// An *os.File takes writes from many goroutines and reads between them.
	logs, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	logged := func() string {
		b, err := os.ReadFile(logs.Name())
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	b := setup(t, false, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	release := make(chan struct{})
	ok := newReceiver(t, b.clock, nil)
	bad := newReceiver(t, b.clock, func(*http.Request, int) (int, http.Header) { return http.StatusInternalServerError, nil })
	stuck := newReceiver(t, b.clock, func(_ *http.Request, n int) (int, http.Header) {
		switch n {
		case 1:
			<-release // outlasts the drain
		case 2:
			return http.StatusInternalServerError, nil // after the restart, one failure
		}
		return http.StatusOK, nil
	})
	b.subscriber("ok", ok.URL, func(s *ledger.Subscriber) { s.EventTypes = []string{"ok"} })
	b.subscriber("bad", bad.URL, func(s *ledger.Subscriber) { s.EventTypes = []string{"bad"} })
	// Two attempts in all: the abandoned one must not spend one, or the
	// failure after the restart would be the last.
	b.subscriber("stuck", stuck.URL, func(s *ledger.Subscriber) { s.EventTypes, s.MaxAttempts = []string{"stuck"}, 2 })
	b.send("o", "ok", 3)
	b.send("b", "bad", 1)
	b.send("s", "stuck", 1)
	waitFor(t, 10*time.Second, "the three receivers' requests", func() bool {
		return ok.count() == 3 && bad.count() >= 1 && stuck.count() == 1
	})
	waitFor(t, 10*time.Second, "the failure's log line", func() bool { return strings.Contains(logged(), "subscriber_id=bad") })
	b.stop() // DrainTimeout is 200 ms; the stuck attempt outlasts it
	close(release)
	b.start()

	out := logged()
	if strings.Contains(out, "subscriber_id=ok") {
		t.Errorf("successes were logged at the default level:\n%s", out)
	}
	if !strings.Contains(out, "level=WARN msg=attempt") || !strings.Contains(out, "status=500") {
		t.Errorf("no warning for the failed attempt:\n%s", out)
	}
	if !strings.Contains(out, "msg=\"drain timeout") || !strings.Contains(out, "attempts=1") {
		t.Errorf("no drain warning naming the one abandoned attempt:\n%s", out)
	}
	if !regexp.MustCompile(`msg="attempt abandoned at shutdown[^\n]* delivery_id=dlv_\d+ subscriber_id=stuck`).MatchString(out) {
		t.Errorf("no line naming the abandoned delivery:\n%s", out)
	}
	// The history keeps the abandoned attempt, which spent nothing: after
	// the restart a failure and a success fit in the budget of two.
	var d ledger.Delivery
	waitFor(t, 10*time.Second, "the abandoned delivery settled after the restart", func() bool {
		d = deliveryOf(t, b, "s-0")
		return d.Status == ledger.StatusSent || d.Status == ledger.StatusDead
	})
	if d.Status != ledger.StatusSent || len(d.History) != 3 || !strings.Contains(d.History[0].Error, "abandoned at shutdown") ||
		d.History[1].StatusCode != http.StatusInternalServerError || d.History[2].Number != 3 || d.History[2].StatusCode != http.StatusOK {
		t.Errorf("%s with history %+v, want sent after the abandoned attempt, a 500 and a 200", d.Status, d.History)
	}
}

// A slow subscriber's backlog stays pending: once its attempts take a
// second or more, it claims (in flight in the ledger) what its cap lets it
// send, not the prefetch.
func TestASlowSubscriberClaimsNothingAhead(t *testing.T) {
	t.Parallel()
	const perSub = 4
	b := setup(t, true, func(c *Config) { c.Workers, c.PerSubscriber = 16, perSub })
	release := make(chan struct{})
	rc := newReceiver(t, b.clock, func(_ *http.Request, n int) (int, http.Header) {
		if n == 1 {
			b.fake.Advance(2 * time.Second) // the first answer takes two seconds
		} else {
			<-release // the others hang
		}
		return http.StatusOK, nil
	})
	defer close(release)
	b.subscriber("slow", rc.URL, func(s *ledger.Subscriber) { s.TimeoutMS = 10_000 })
	b.send("warm", "t", 1)
	b.settle()
	b.send("e", "t", 100)
	waitFor(t, 10*time.Second, "a round of attempts", func() bool { return rc.count() == 1+perSub })
	b.claimedOnly("slow", perSub, 100-perSub)
}

// Nor does a subscriber that has not answered yet claim the prefetch, or
// send more than startCap at once: until its first answer nobody knows it
// is fast.
func TestANewSubscriberClaimsNothingAhead(t *testing.T) {
	t.Parallel()
	b := setup(t, true, func(c *Config) { c.Workers, c.PerSubscriber = 16, 4 })
	rc, release := heldReceiver(t, b.clock)
	defer close(release)
	b.subscriber("new", rc.URL, nil)
	b.send("e", "t", 100)
	waitFor(t, 10*time.Second, "a round of attempts", func() bool { return rc.count() == startCap })
	b.claimedOnly("new", startCap, 100-startCap)
}

// However many slow subscribers fill their caps, workers stay for the
// others: six slow subscribers, created one after another, with a cap of 4
// each could hold all 16 workers. They leave some for a fast subscriber
// twice over: before any of them has answered, when each may have only
// startCap attempts out (nobody knows yet that they are slow), and once
// they are known to be slow, when together they hold no more than the pool
// less one subscriber's cap and the reserve.
func TestACrowdOfSlowSubscribersLeavesAWorker(t *testing.T) {
	t.Parallel()
	const workers, perSub, crowd = 16, 4, 6
	b := setup(t, true, func(c *Config) { c.Workers, c.PerSubscriber = workers, perSub })
	slow := newPhasedReceiver(t, b.clock)
	for i := range crowd {
		id := fmt.Sprintf("slow%d", i)
		b.subscriber(id, slow.URL, func(s *ledger.Subscriber) { s.EventTypes, s.TimeoutMS = []string{id}, 60_000 })
		b.send(id, id, 20)
		b.looked()
	}
	waitFor(t, 10*time.Second, "the slow subscribers' first attempts", func() bool { return slow.held.Load() >= crowd*startCap })
	b.looked()
	if n := slowInflight(b, crowd); n != crowd*startCap {
		t.Fatalf("the new slow subscribers hold %d workers, want %d each", n, startCap)
	}
	b.servedBeside("fast1", 3)

	// They answer after 2 s, and from then on are known to be slow. The
	// first heard from start their next attempts while the others do not
	// count as slow yet; once those answer too, the crowd holds its share.
	b.fake.Advance(2 * time.Second)
	slow.next()
	waitFor(t, 10*time.Second, "every slow subscriber's first answer", func() bool {
		b.d.mu.Lock()
		defer b.d.mu.Unlock()
		for i := range crowd {
			if !b.d.subs[fmt.Sprintf("slow%d", i)].slow() {
				return false
			}
		}
		return true
	})
	b.looked()
	b.fake.Advance(2 * time.Second)
	slow.next()
	share := workers - perSub - reserveOf(workers)
	waitFor(t, 10*time.Second, fmt.Sprintf("the slow subscribers holding %d workers: one cap and the reserve are not theirs", share), func() bool {
		return slowInflight(b, crowd) == share && slow.held.Load() == int64(share)
	})
	b.servedBeside("fast2", 3)

	// A fast subscriber beside them has several attempts out at once, not
	// the reserve's one at a time.
	fast := newPhasedReceiver(t, b.clock)
	b.subscriber("fast3", fast.URL, func(s *ledger.Subscriber) { s.EventTypes = []string{"fast3"} })
	b.send("warm", "fast3", 1)
	waitFor(t, 10*time.Second, "fast3's first attempt", func() bool { return fast.held.Load() == 1 })
	fast.next() // answered at once on the test's clock: fast3 is fast
	b.heardFrom("fast3")
	b.send("fast3", "fast3", 10)
	waitFor(t, 10*time.Second, "fast3's attempts beside the slow crowd", func() bool { return fast.held.Load() >= int64(perSub) })
	if n := slowInflight(b, crowd); n != share {
		t.Fatalf("the slow subscribers hold %d workers beside fast3, want %d", n, share)
	}
}

// Slow subscribers share their workers in turn: five with backlogs, each
// allowed 4 at once, hold the share of 10 together, and round after round
// each gets about a fifth of it, however many idle subscribers come after
// them in the order.
func TestSlowSubscribersTakeTheirShareInTurn(t *testing.T) {
	t.Parallel()
	const workers, perSub, crowd, rounds = 16, 4, 5, 10
	share := workers - perSub - reserveOf(workers)
	b := setup(t, true, func(c *Config) { c.Workers, c.PerSubscriber = workers, perSub })
	slow := newPhasedReceiver(t, b.clock)
	idle := newReceiver(t, b.clock, nil)
	for i := range crowd {
		id := fmt.Sprintf("slow%d", i)
		b.subscriber(id, slow.URL, func(s *ledger.Subscriber) { s.EventTypes, s.TimeoutMS = []string{id}, 60_000 })
		b.send("warm"+id, id, 1)
	}
	for i := range 40 {
		b.subscriber(fmt.Sprintf("idle%d", i), idle.URL, func(s *ledger.Subscriber) { s.EventTypes = []string{"none"} })
	}
	waitFor(t, 10*time.Second, "the warm-up attempts", func() bool { return slow.held.Load() == crowd })
	b.fake.Advance(2 * time.Second) // each takes 2 s: all are known slow
	slow.next()
	for i := range crowd {
		b.heardFrom(fmt.Sprintf("slow%d", i))
	}
	for i := range crowd {
		id := fmt.Sprintf("slow%d", i)
		b.send(id, id, 100)
	}
	got := make([]int, crowd)
	for r := range rounds {
		arrived := crowd + (r+1)*share
		waitFor(t, 10*time.Second, fmt.Sprintf("round %d's attempts", r), func() bool {
			return slow.count() == arrived && slowInflight(b, crowd) == share
		})
		snap := b.d.Snapshot()
		for i := range crowd {
			got[i] += snap[fmt.Sprintf("slow%d", i)].Inflight
		}
		b.fake.Advance(2 * time.Second)
		slow.next()
	}
	fair := rounds * share / crowd
	for _, n := range got {
		if n < fair/2 || n > fair*3/2 {
			t.Fatalf("attempts per slow subscriber over %d rounds: %v; want each near %d", rounds, got, fair)
		}
	}
}

// heardFrom waits until the dispatcher has subscriber id's answers to every
// attempt it sent, for tests where other subscribers' attempts stay out and
// the dispatcher never settles.
func (b *bundle) heardFrom(id string) {
	b.t.Helper()
	waitFor(b.t, 10*time.Second, id+"'s answers", func() bool {
		b.d.mu.Lock()
		defer b.d.mu.Unlock()
		s := b.d.subs[id]
		return s.answerTime > 0 && s.inflight == 0
	})
}

// slowInflight is the attempts the dispatcher has out for slow0…slow(n-1):
// its own count, which includes any started that have not reached the
// receiver yet.
func slowInflight(b *bundle, n int) int {
	snap, total := b.d.Snapshot(), 0
	for i := range n {
		total += snap[fmt.Sprintf("slow%d", i)].Inflight
	}
	return total
}

// A subscriber known to answer slowly does not take the reserve even with
// nothing in flight, and with room left in the slow share: with 8 of 16
// workers held by two slow subscribers and 6 by a fast one that stalled, a
// third slow one's new delivery waits, and the last two workers stay for
// subscribers that may be fast.
func TestAKnownSlowSubscriberLeavesTheReserve(t *testing.T) {
	t.Parallel()
	b := setup(t, true, func(c *Config) { c.Workers, c.PerSubscriber = 16, 4 })
	slow := newPhasedReceiver(t, b.clock)
	for i := range 3 {
		id := fmt.Sprintf("slow%d", i)
		b.subscriber(id, slow.URL, func(s *ledger.Subscriber) { s.EventTypes, s.TimeoutMS = []string{id}, 60_000 })
		b.send("warm"+id, id, 1)
	}
	waitFor(t, 10*time.Second, "the warm-up attempts", func() bool { return slow.held.Load() == 3 })
	b.fake.Advance(2 * time.Second) // each takes 2 s: all three are known slow
	slow.next()
	b.settle()
	for i := range 2 {
		id := fmt.Sprintf("slow%d", i)
		b.send("fill"+id, id, 10)
	}
	waitFor(t, 10*time.Second, "8 of 16 workers held by the slow", func() bool { return slow.held.Load() == 8 })
	release := make(chan struct{})
	var stalled gauge
	fast := newReceiver(t, b.clock, func(r *http.Request, n int) (int, http.Header) {
		if n > 1 {
			stalled.hold(r, release) // the first answered at once: it is fast
		}
		return http.StatusOK, nil
	})
	t.Cleanup(func() { close(release) }) // before the receiver closes, which waits for its requests
	b.subscriber("fast", fast.URL, func(s *ledger.Subscriber) { s.EventTypes = []string{"fast"} })
	b.send("first", "fast", 1)
	b.heardFrom("fast")
	b.send("stall", "fast", 20)
	waitFor(t, 10*time.Second, "the fast subscriber's stalled attempts", func() bool { return stalled.now.Load() == 6 })
	b.send("late", "slow2", 1)
	b.looked()
	if n := b.d.Snapshot()["slow2"].Inflight; n != 0 {
		t.Fatalf("the known-slow subscriber took %d of the reserve's workers, want none", n)
	}
}

// Fast subscribers that stall together with their caps out leave the
// reserve too: with 16 workers, the first takes its 10, the second the 4
// above the reserve of 2, and a third subscriber still gets its deliveries.
func TestStalledFastSubscribersLeaveTheReserve(t *testing.T) {
	t.Parallel()
	b := setup(t, true, func(c *Config) { c.Workers, c.PerSubscriber = 16, 4 })
	release := make(chan struct{})
	var hanging atomic.Int64
	stalling := func(r *http.Request, n int) (int, http.Header) {
		if n == 1 {
			return http.StatusOK, nil // answered at once: the subscriber is fast
		}
		hanging.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		return http.StatusOK, nil
	}
	f1, f2 := newReceiver(t, b.clock, stalling), newReceiver(t, b.clock, stalling)
	t.Cleanup(func() { close(release) })
	b.subscriber("f1", f1.URL, func(s *ledger.Subscriber) { s.EventTypes = []string{"f1"} })
	b.subscriber("f2", f2.URL, func(s *ledger.Subscriber) { s.EventTypes = []string{"f2"} })
	b.send("first1", "f1", 1)
	b.send("first2", "f2", 1)
	b.settle()
	b.send("a", "f1", 30)
	b.send("b", "f2", 30)
	waitFor(t, 10*time.Second, "the fast subscribers' attempts", func() bool { return hanging.Load() >= 14 })
	b.looked()
	snap := b.d.Snapshot()
	if n, max := snap["f1"].Inflight+snap["f2"].Inflight, 16-reserveOf(16); n > max {
		t.Fatalf("the stalled fast subscribers hold %d workers, want at most %d: the reserve is not theirs", n, max)
	}
	b.servedBeside("other", 3)
}

// A subscriber whose last answer was a failure gets PerSubscriber, not the
// fast cap, however quickly it fails: its breaker should open with as few
// attempts out as possible.
func TestAFailingSubscriberIsNotSentMoreAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, true, func(c *Config) {
		c.Workers, c.PerSubscriber = 16, 4
		c.Breaker.Threshold = 100 // this test is about the cap, not the breaker
	})
	release := make(chan struct{})
	var held gauge
	rc := newReceiver(t, b.clock, func(r *http.Request, n int) (int, http.Header) {
		switch n {
		case 1:
			return http.StatusOK, nil // fast
		case 2:
			return http.StatusInternalServerError, nil // fast, and failing
		}
		held.hold(r, release)
		return http.StatusOK, nil
	})
	t.Cleanup(func() { close(release) })
	b.subscriber("s", rc.URL, nil)
	b.send("ok", "t", 1)
	b.settle()
	b.send("bad", "t", 1)
	b.settle()
	if rc.count() != 2 {
		t.Fatalf("%d requests, want a success and a failure", rc.count())
	}
	b.send("e", "t", 30)
	waitFor(t, 3*time.Second, "4 attempts in flight", func() bool { return held.now.Load() >= 4 })
	b.looked()
	if n := b.d.Snapshot()["s"].Inflight; n != 4 {
		t.Fatalf("the dispatcher holds %d attempts in flight after a failure, want PerSubscriber = 4", n)
	}
	if p := held.peak.Load(); p != 4 {
		t.Fatalf("%d attempts in flight at most after a failure, want PerSubscriber = 4", p)
	}
}

// A worker freed one at a time goes round the subscribers with work, not
// back to the first of them: with one worker, the third subscriber's
// delivery goes third, not after the first two subscribers' backlogs.
func TestAFreedWorkerGoesRound(t *testing.T) {
	t.Parallel()
	b := setup(t, true, func(c *Config) { c.Workers = 1 })
	var mu sync.Mutex
	var order []string
	gate := make(chan struct{})
	for _, name := range []string{"a", "b", "c"} {
		rc := newReceiver(t, b.clock, func(r *http.Request, _ int) (int, http.Header) {
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			select {
			case <-gate:
			case <-r.Context().Done():
			}
			return http.StatusOK, nil
		})
		b.subscriber(name, rc.URL, func(s *ledger.Subscriber) { s.EventTypes = []string{name} })
	}
	t.Cleanup(func() { close(gate) }) // before the receivers close (cleanups run last-in first-out)
	b.send("a", "a", 5)
	b.send("b", "b", 5)
	b.send("c", "c", 1)
	arrived := func(n int) func() bool {
		return func() bool { mu.Lock(); defer mu.Unlock(); return len(order) >= n }
	}
	for n := 1; n <= 3; n++ {
		waitFor(t, 10*time.Second, fmt.Sprintf("arrival %d", n), arrived(n))
		if n < 3 {
			gate <- struct{}{}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(order[:3], ","); got != "a,b,c" {
		t.Fatalf("the first three attempts went to %s, want a,b,c", got)
	}
}

// A stop cannot hang on a database that refuses writes: past the drain
// timeout the recorder gives up, and the outcome it could not record leaves
// its delivery in flight, to go back to pending at the next start.
func TestAStopGivesUpOnADatabaseThatRefusesWrites(t *testing.T) {
	t.Parallel()
	logs, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	b := setup(t, false, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	rc, answer := heldReceiver(t, b.clock)
	b.subscriber("s", rc.URL, nil)
	b.send("e", "t", 1)
	waitFor(t, 10*time.Second, "the attempt", func() bool { return rc.count() == 1 })

	// Another connection holds the write lock: from now on every write of
	// the ledger fails once its busy timeout has passed.
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+b.path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	lock, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if _, err := lock.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	close(answer) // the attempt succeeds; its outcome cannot be recorded

	stopped := make(chan struct{})
	go func(stop func()) {
		defer close(stopped)
		stop()
	}(b.stop)
	b.stop = func() {} // the cleanup must not wait for it again
	select {
	case <-stopped:
	case <-time.After(time.Minute):
		t.Fatal("the stop still waits a minute after the drain timeout of 200 ms")
	}
	var status string
	if err := lock.QueryRowContext(ctx, `SELECT status FROM deliveries`).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != string(ledger.StatusInflight) {
		t.Errorf("the delivery is %s, want still inflight: its outcome was never recorded", status)
	}
	if _, err := lock.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	out, err := os.ReadFile(logs.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "stopping with attempt outcomes unrecorded") || !strings.Contains(string(out), "outcomes=1") {
		t.Errorf("no error naming the one outcome left unrecorded:\n%s", out)
	}
}

// observations records what the dispatcher reports to its Observer.
type observations struct {
	mu  sync.Mutex
	got map[string]int
}

func (o *observations) ObserveAttempt(sub string, _ ledger.Lane, _ bool, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got[sub]++
}

func (o *observations) ObserveDeferral(sub string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got["deferral "+sub]++
}

func (o *observations) count(key string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.got[key]
}

// A subscriber removed while its attempts are out is not reported when they
// answer: its metric series went with it and must not come back.
func TestARemovedSubscribersLateAnswersAreNotObserved(t *testing.T) {
	t.Parallel()
	obs := &observations{got: map[string]int{}}
	b := setup(t, false, func(c *Config) { c.Observer = obs })
	rc, release := heldReceiver(t, b.clock)
	b.subscriber("gone", rc.URL, nil)
	b.send("e", "t", 2)
	waitFor(t, 10*time.Second, "both attempts at the receiver", func() bool { return rc.count() == 2 })
	b.removeWhileOut("gone", release)
	if n := obs.count("gone"); n != 0 {
		t.Fatalf("%d attempts of the removed subscriber observed, want none", n)
	}
}

// A subscriber removed and created again under the same id while the old
// one's attempts are out starts clean: their late answers touch neither
// its attempts in flight nor its breaker, and are neither reported nor
// counted in the stats as its own.
func TestARecreatedSubscriberIgnoresTheOldOnesAnswers(t *testing.T) {
	t.Parallel()
	obs := &observations{got: map[string]int{}}
	b := setup(t, false, func(c *Config) { c.Observer = obs })
	release := make(chan struct{})
	old := newReceiver(t, b.clock, func(*http.Request, int) (int, http.Header) {
		<-release
		return http.StatusInternalServerError, nil
	})
	b.subscriber("again", old.URL, nil)
	b.send("e", "t", 2)
	waitFor(t, 10*time.Second, "both attempts at the old receiver", func() bool { return old.count() == 2 })
	if err := b.l.DeleteSubscriber(context.Background(), "again"); err != nil {
		t.Fatal(err)
	}
	b.d.Remove("again")
	fresh := newReceiver(t, b.clock, nil)
	b.subscriber("again", fresh.URL, nil)
	close(release)
	b.settle()
	b.d.mu.Lock()
	s := b.d.subs["again"]
	inflight, failures := s.inflight, s.cfg.Breaker.Failures
	b.d.mu.Unlock()
	if inflight != 0 || failures != 0 {
		t.Fatalf("the new subscriber has %d in flight and %d breaker failures, want 0 and 0", inflight, failures)
	}
	if n := obs.count("again"); n != 0 {
		t.Fatalf("%d of the old subscriber's attempts observed as the new one's, want none", n)
	}
	stats, err := b.l.Stats(context.Background(), b.clock.Now().Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if st := stats["again"]; st != nil && st.Attempts != 0 {
		t.Fatalf("the new subscriber's stats count %d attempts, want none", st.Attempts)
	}
}

// A claim planned for a subscriber that was then removed and created again
// under the same id is not sent for the new one: the rows it took by id go
// back to pending and reach the new subscriber through its own claim.
func TestAClaimOfARemovedSubscriberIsNotStartedForItsSuccessor(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	oldRC, fresh := newReceiver(t, b.clock, nil), newReceiver(t, b.clock, nil)
	b.subscriber("again", oldRC.URL, nil)
	b.d.mu.Lock()
	old := b.d.subs["again"]
	b.d.mu.Unlock()
	if err := b.l.DeleteSubscriber(context.Background(), "again"); err != nil {
		t.Fatal(err)
	}
	b.d.Remove("again")
	// The new one is created paused, so its delivery waits pending for the
	// claim the old sending state made.
	s := b.subscriber("again", fresh.URL, func(s *ledger.Subscriber) { s.Paused = true })
	b.send("new", "t", 1)
	now := b.clock.Now()
	res, err := b.l.Claim(context.Background(), []ledger.ClaimRequest{{SubscriberID: "again", Max: 10, Now: now, LeaseUntil: now.Add(time.Minute)}})
	if err != nil || len(res[0].Deliveries) != 1 {
		t.Fatalf("claim = %+v, %v; want the new subscriber's delivery", res, err)
	}
	b.d.start([]*sub{old}, res, now)
	b.settle()
	if n := fresh.count() + oldRC.count(); n != 0 {
		t.Fatalf("%d requests from a claim of a removed subscriber's sending state, want none", n)
	}
	s.Paused = false
	b.d.Upsert(s)
	waitFor(t, 10*time.Second, "the new subscriber's delivery, put back and claimed again", func() bool { return fresh.count() == 1 })
	b.settle() // its answer recorded
	if d := deliveryOf(t, b, "new-0"); d.Status != ledger.StatusSent {
		t.Fatalf("the new subscriber's delivery is %s, want sent", d.Status)
	}
}

// Deliveries claimed when the breaker opens go back due, not at the end of
// the cooldown: a success from an attempt still out when it opened closes
// the breaker, and they must go then, not an hour later.
func TestABreakerClosedByALateSuccessHoldsNothingBack(t *testing.T) {
	t.Parallel()
	b := setup(t, true, func(c *Config) {
		c.Workers, c.PerSubscriber, c.FastSubscriber, c.Prefetch = 4, 2, 2, 8
		c.Breaker.Threshold, c.Breaker.Cooldown = 1, time.Hour
	})
	release := make(chan struct{})
	rc := newReceiver(t, b.clock, func(_ *http.Request, n int) (int, http.Header) {
		switch n {
		case 2: // out when the breaker opens; answers 200 after
			<-release
		case 3:
			return http.StatusInternalServerError, nil
		}
		return http.StatusOK, nil
	})
	b.subscriber("s", rc.URL, func(s *ledger.Subscriber) { s.Rate.PerSecond, s.Rate.Burst = 1000, 1000 })
	b.send("w", "t", 1) // one fast answer: the subscriber claims ahead from now on
	b.settle()
	b.send("e", "t", 6)
	waitFor(t, 5*time.Second, "the breaker to open", func() bool { return b.d.Snapshot()["s"].Breaker.State == breaker.Open })
	close(release)
	waitFor(t, 5*time.Second, "the late success to close it", func() bool { return b.d.Snapshot()["s"].Breaker.State == breaker.Closed })
	b.step(5*time.Second, 250*time.Millisecond)
	for i := range 6 {
		if d := deliveryOf(t, b, fmt.Sprintf("e-%d", i)); d.Status != ledger.StatusSent {
			t.Errorf("e-%d is %s (next at %v) 5 s after the breaker closed; want sent", i, d.Status, d.NextAttemptAt.Sub(t0))
		}
	}
}

// The ledger fans events out to a subscriber from the commit that creates
// it, before the API tells the dispatcher: an event enqueued in between
// goes in pending, and its Notify, for an id the dispatcher does not know
// yet, is lost. The new subscriber's first claim must find it.
func TestADeliveryEnqueuedBeforeUpsertOfItsNewSubscriberGoes(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	rc := newReceiver(t, b.clock, nil)
	s := ledger.Subscriber{ID: "new", URL: rc.URL, EventTypes: []string{"*"},
		Rate:        ledger.Rate{PerSecond: 1000, Burst: 1000, EdgeShare: 0.5},
		MaxAttempts: 8, TimeoutMS: 5000, Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}
	if err := b.l.CreateSubscriber(context.Background(), &s); err != nil {
		t.Fatal(err)
	}
	b.send("e", "video.trending", 1) // the API's POST /v1/events, between the create's commit and its Upsert
	b.d.Upsert(s)
	b.settle()
	waitFor(t, 2*time.Second, "the delivery enqueued before Upsert", func() bool { return rc.count() == 1 })
}
