// Package delivery is sluice's dispatcher and its workers. The dispatcher
// keeps each subscriber's sending state in memory (token bucket, breaker,
// Retry-After pause, attempts in flight, when its next pending delivery falls
// due) and claims work from the ledger only for subscribers that can send now,
// so a throttled, paused, broken or slow subscriber costs nothing while it
// waits and never holds up another. Attempts run one goroutine each, bounded
// by a global worker limit and a per-subscriber cap; their outcomes are
// recorded in batches.
package delivery

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/origin/backoff"
	"github.com/sluice-dev/sluice/origin/breaker"
	"github.com/sluice-dev/sluice/origin/ledger"
	"github.com/sluice-dev/sluice/shared/bucket"
	"github.com/sluice-dev/sluice/shared/signature"
)

// Config is the dispatcher's policy; zero values take the defaults.
type Config struct {
	Workers       int           // attempts in flight in total (default 64)
	PerSubscriber int           // attempts in flight per subscriber (default max(4, Workers/4))
	RetryBase     time.Duration // full-jitter base (default 1s)
	RetryCap      time.Duration // full-jitter cap (default 30m)
	Breaker       breaker.Settings
	ClaimBatch    int           // most deliveries one subscriber gets per claim (default 256)
	DrainTimeout  time.Duration // how long Run waits for attempts in flight at shutdown (default 30s)
	UserAgent     string

	Clock  Clock          // default SystemClock
	Rand   backoff.Source // jitter source; default backoff.NewSource()
	Client *http.Client   // default http.DefaultClient; production passes the egress client
	Logger *slog.Logger   // default slog.Default()
}

func (c *Config) defaults() {
	if c.Workers <= 0 {
		c.Workers = 64
	}
	if c.PerSubscriber <= 0 {
		c.PerSubscriber = max(4, c.Workers/4)
	}
	if c.RetryBase <= 0 {
		c.RetryBase = time.Second
	}
	if c.RetryCap <= 0 {
		c.RetryCap = 30 * time.Minute
	}
	if c.ClaimBatch <= 0 {
		c.ClaimBatch = 256
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 30 * time.Second
	}
	if c.UserAgent == "" {
		c.UserAgent = "sluice/dev"
	}
	if c.Clock == nil {
		c.Clock = SystemClock{}
	}
	if c.Rand == nil {
		c.Rand = backoff.NewSource()
	}
	if c.Client == nil {
		c.Client = http.DefaultClient
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// leaseMargin is added to an attempt's timeout for its lease.
const leaseMargin = 30 * time.Second

// Dispatcher claims due deliveries and runs their attempts.
type Dispatcher struct {
	cfg     Config
	ledger  *ledger.Ledger
	wake    chan struct{}
	results chan ledger.Result

	mu       sync.Mutex
	subs     map[string]*sub
	order    []string // round-robin order of subscriber ids
	next     int      // where the next plan starts in order
	free     int      // global worker slots not in use
	running  sync.WaitGroup
	stopping bool
	idle     chan struct{} // closed and replaced each time the loop goes idle (tests)
	waiting  bool          // the loop is blocked until woken or its timer fires
	dirty    map[string]struct{}
	// unsettled counts attempts started whose outcome is not yet recorded
	// and fed back into the plan; zero with the loop waiting means the
	// dispatcher will do nothing until time passes or something changes.
	unsettled atomic.Int64
	poked     atomic.Bool // a wake-up was sent that the loop has not acted on
}

// sub is one subscriber's sending state.
type sub struct {
	cfg      ledger.Subscriber
	signer   *signature.Signer
	signerAt time.Time // the signer was built for the secrets valid then
	bucket   bucket.State
	inflight int

	hasWork  bool      // pending deliveries may exist
	due      time.Time // earliest known due time of those
	claiming bool      // a claim for it is being committed
	noted    time.Time // earliest due time noted during that claim
}

// New returns a dispatcher over l. Call Load, then Run.
func New(l *ledger.Ledger, cfg Config) *Dispatcher {
	cfg.defaults()
	return &Dispatcher{
		cfg:     cfg,
		ledger:  l,
		wake:    make(chan struct{}, 1),
		results: make(chan ledger.Result, 4096),
		subs:    map[string]*sub{},
		dirty:   map[string]struct{}{},
		free:    cfg.Workers,
		idle:    make(chan struct{}),
	}
}

// Load reads every subscriber and assumes each may have due work (the first
// claim finds out). A bucket never persisted starts full; a persisted one
// resumes where the last commit left it, so a restart cannot exceed the rate.
func (d *Dispatcher) Load(ctx context.Context) error {
	all, err := d.ledger.Subscribers(ctx)
	if err != nil {
		return err
	}
	now := d.cfg.Clock.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range all {
		d.upsertLocked(s, now)
		d.subs[s.ID].hasWork = true
	}
	return nil
}

// Upsert tells the dispatcher a subscriber was created or changed.
func (d *Dispatcher) Upsert(s ledger.Subscriber) {
	d.mu.Lock()
	d.upsertLocked(s, d.cfg.Clock.Now())
	d.mu.Unlock()
	d.poke()
}

func (d *Dispatcher) upsertLocked(s ledger.Subscriber, now time.Time) {
	st, ok := d.subs[s.ID]
	if !ok {
		st = &sub{}
		switch {
		case s.HasTokens:
			st.bucket = s.Tokens
		default:
			st.bucket = bucket.Full(s.Rate.Bucket(), now)
		}
		d.subs[s.ID] = st
		d.order = append(d.order, s.ID)
	} else {
		// The operator's view wins for configuration; the dispatcher's own
		// view wins for the state it moves (breaker, pause).
		s.Breaker, s.PausedUntil = st.cfg.Breaker, st.cfg.PausedUntil
	}
	st.cfg = s
	st.signer = nil
}

// Remove forgets a deleted subscriber.
func (d *Dispatcher) Remove(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.subs, id)
	for i, o := range d.order {
		if o == id {
			d.order = append(d.order[:i], d.order[i+1:]...)
			break
		}
	}
}

// Notify tells the dispatcher that subscribers have pending deliveries due
// at or before at (new events, requeues).
func (d *Dispatcher) Notify(at time.Time, subscriberIDs ...string) {
	d.mu.Lock()
	for _, id := range subscriberIDs {
		if st, ok := d.subs[id]; ok {
			st.note(at)
		}
	}
	d.mu.Unlock()
	d.poke()
}

func (s *sub) note(at time.Time) {
	if s.claiming && (s.noted.IsZero() || at.Before(s.noted)) {
		s.noted = at
	}
	if !s.hasWork || at.Before(s.due) {
		s.hasWork, s.due = true, at
	}
}

func (d *Dispatcher) poke() {
	d.poked.Store(true)
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Run claims and sends until ctx ends, then stops claiming, waits for the
// attempts in flight (up to DrainTimeout), records them and returns.
func (d *Dispatcher) Run(ctx context.Context) error {
	attemptCtx, cancelAttempts := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelAttempts()
	recorded := make(chan struct{})
	go func() {
		defer close(recorded)
		d.record()
	}()
	err := d.loop(ctx, attemptCtx)

	d.mu.Lock()
	d.stopping = true
	d.mu.Unlock()
	drained := make(chan struct{})
	go func() { d.running.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(d.cfg.DrainTimeout):
		cancelAttempts() // abandoned attempts stay inflight and return to pending at the next start
		<-drained
	}
	close(d.results)
	<-recorded
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func (d *Dispatcher) loop(ctx, attemptCtx context.Context) error {
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		now := d.cfg.Clock.Now()
		reqs, wait := d.plan(now)
		if len(reqs) > 0 {
			res, err := d.ledger.Claim(ctx, reqs)
			if err != nil {
				d.unplan(reqs)
				if ctx.Err() != nil {
					return ctx.Err()
				}
				d.cfg.Logger.Error("claim failed", "err", err)
				wait = time.Second
			} else {
				d.start(attemptCtx, reqs, res, now)
				continue
			}
		}
		var timer <-chan time.Time
		if wait > 0 {
			timer = d.cfg.Clock.After(wait)
		}
		d.mu.Lock()
		d.waiting = true
		close(d.idle)
		d.idle = make(chan struct{})
		d.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-d.wake:
		case <-timer:
		}
		d.mu.Lock()
		d.waiting = false
		d.poked.Store(false)
		d.mu.Unlock()
	}
}

// plan decides, for subscribers in round-robin order, how many deliveries
// each may start now, reserving the slots; and how long the loop may sleep
// when nobody can (0: until woken).
func (d *Dispatcher) plan(now time.Time) ([]ledger.ClaimRequest, time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var (
		reqs  []ledger.ClaimRequest
		first time.Time
	)
	wakeAt := func(t time.Time) {
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	n := len(d.order)
	for i := 0; i < n && d.free > 0; i++ {
		id := d.order[(d.next+i)%n]
		s := d.subs[id]
		if !s.hasWork || s.claiming || s.cfg.Paused {
			continue
		}
		if s.due.After(now) {
			wakeAt(s.due)
			continue
		}
		if s.cfg.PausedUntil.After(now) {
			wakeAt(s.cfg.PausedUntil)
			continue
		}
		limit, until, changed := s.cfg.Breaker.Limit(now, d.cfg.Breaker)
		if changed {
			d.persistState(s)
		}
		if limit == 0 {
			wakeAt(until)
			continue
		}
		cap := d.cfg.PerSubscriber
		if limit != breaker.Unlimited {
			cap = limit
		}
		room := cap - s.inflight
		if room <= 0 {
			continue // a finishing attempt wakes the loop
		}
		rate := s.cfg.Rate.Bucket()
		tokens := bucket.Available(s.bucket, rate, now)
		if tokens <= 0 {
			wakeAt(now.Add(bucket.Wait(s.bucket, rate, now)))
			continue
		}
		take := min(tokens, room, d.free, d.cfg.ClaimBatch)
		d.free -= take
		s.inflight += take
		s.claiming, s.noted = true, time.Time{}
		timeout := time.Duration(s.cfg.TimeoutMS) * time.Millisecond
		reqs = append(reqs, ledger.ClaimRequest{
			SubscriberID: id, Max: take, Now: now, LeaseUntil: now.Add(timeout + leaseMargin),
			Rate: rate, Bucket: s.bucket,
		})
	}
	if n > 0 {
		d.next = (d.next + 1) % n
	}
	if len(reqs) > 0 || first.IsZero() {
		return reqs, 0
	}
	return reqs, max(first.Sub(now), time.Millisecond)
}

// unplan returns the slots plan reserved for a claim that failed.
func (d *Dispatcher) unplan(reqs []ledger.ClaimRequest) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range reqs {
		d.free += r.Max
		if s, ok := d.subs[r.SubscriberID]; ok {
			s.inflight -= r.Max
			s.claiming = false
		}
	}
}

// start applies claim results and launches an attempt per claimed delivery.
func (d *Dispatcher) start(ctx context.Context, reqs []ledger.ClaimRequest, res []ledger.ClaimResult, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, r := range reqs {
		got := res[i]
		unused := r.Max - len(got.Deliveries)
		d.free += unused
		s, ok := d.subs[r.SubscriberID]
		if !ok {
			d.free += len(got.Deliveries) // removed meanwhile; its rows are gone too
			continue
		}
		s.inflight -= unused
		s.claiming = false
		if len(got.Deliveries) > 0 {
			s.bucket = got.Bucket
		}
		if got.Drained {
			s.hasWork, s.due = !got.NextDue.IsZero(), got.NextDue
		}
		if !s.noted.IsZero() {
			s.note(s.noted)
			s.noted = time.Time{}
		}
		for _, c := range got.Deliveries {
			snap := s.cfg
			signer := d.signerLocked(s, now)
			d.running.Add(1)
			d.unsettled.Add(1)
			go d.attempt(ctx, snap, signer, c)
		}
	}
}

// signerLocked returns the subscriber's signer for the secrets valid at now.
func (d *Dispatcher) signerLocked(s *sub, now time.Time) *signature.Signer {
	if s.signer != nil && (s.cfg.PreviousUntil.IsZero() || now.Before(s.cfg.PreviousUntil) == s.signerAt.Before(s.cfg.PreviousUntil)) {
		return s.signer
	}
	signer, err := signature.NewSigner(s.cfg.Secrets(now)...)
	if err != nil {
		// Secrets are validated when stored; a bad one here is a bug.
		d.cfg.Logger.Error("subscriber secret unusable", "subscriber_id", s.cfg.ID, "err", err)
		signer, _ = signature.NewSigner(s.cfg.Secret)
	}
	s.signer, s.signerAt = signer, now
	return signer
}

// persistState marks a subscriber's breaker and pause for the next record.
func (d *Dispatcher) persistState(s *sub) { d.dirty[s.cfg.ID] = struct{}{} }

// SubscriberSnapshot is the dispatcher's view of one subscriber now.
type SubscriberSnapshot struct {
	Breaker     breaker.Breaker
	PausedUntil time.Time
	Tokens      float64
	Inflight    int
}

// Snapshot returns every subscriber's sending state, for stats and views.
func (d *Dispatcher) Snapshot() map[string]SubscriberSnapshot {
	now := d.cfg.Clock.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]SubscriberSnapshot, len(d.subs))
	for id, s := range d.subs {
		out[id] = SubscriberSnapshot{
			Breaker:     s.cfg.Breaker,
			PausedUntil: s.cfg.PausedUntil,
			Tokens:      bucket.Refill(s.bucket, s.cfg.Rate.Bucket(), now).Tokens,
			Inflight:    s.inflight,
		}
	}
	return out
}

// Quiet reports whether the dispatcher is waiting with nothing in progress:
// no attempt running or unrecorded and no wake-up pending. Only time passing
// or a change (an event, a subscriber update) will make it act again.
func (d *Dispatcher) Quiet() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.waiting && !d.poked.Load() && d.unsettled.Load() == 0
}

// Idle returns a channel closed the next time the loop has nothing to start
// and waits; tests use it to know the dispatcher has acted on a change.
func (d *Dispatcher) Idle() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.idle
}
