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
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"slices"
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
	Workers       int // attempts in flight in total (default 64)
	PerSubscriber int // attempts in flight per subscriber (default max(4, Workers/4))
	// FastSubscriber is the in-flight cap of a subscriber that answers
	// quickly (default: the pool less one PerSubscriber and the reserve,
	// at least PerSubscriber). Its attempts give their workers back within
	// milliseconds, so the cap that keeps a slow subscriber from holding
	// them all would only limit its throughput; and should it stall with
	// its cap out, a slow subscriber beside it still finds its whole cap
	// free, with the reserve untouched. Half the pool was too few: at 5,000
	// deliveries/s, 32 attempts in flight leave 6 ms per round trip, which
	// a busy machine overruns, and the backlog then builds.
	FastSubscriber int
	RetryBase      time.Duration // full-jitter base (default 1s)
	RetryCap       time.Duration // full-jitter cap (default 30m)
	Breaker        breaker.Settings
	ClaimBatch     int           // most deliveries one subscriber gets per claim (default 256)
	Prefetch       int           // deliveries a subscriber answering within a second may have claimed beyond its cap (default 256)
	HandoffAhead   int           // Prefetch for the enqueue's hand-off, whose bodies are in memory already (default 1024)
	DrainTimeout   time.Duration // how long Run waits for attempts in flight at shutdown (default 30s)
	UserAgent      string

	Clock  Clock          // default SystemClock
	Rand   backoff.Source // jitter source; default backoff.NewSource()
	Client *http.Client   // default http.DefaultClient; production passes the egress client
	Logger *slog.Logger   // default slog.Default()
	// Observer, if set, hears every attempt's outcome (metrics).
	Observer Observer
	// Edge, if set, delivers events of EdgeTypes through the edge Worker.
	Edge      EdgeLane
	EdgeTypes []string
}

// Observer hears attempt outcomes as they settle.
type Observer interface {
	ObserveAttempt(subscriberID string, lane ledger.Lane, success bool, sinceEnqueue time.Duration)
}

func (c *Config) defaults() {
	if c.Workers <= 0 {
		c.Workers = 64
	}
	if c.PerSubscriber <= 0 {
		c.PerSubscriber = max(4, c.Workers/4)
	}
	if c.FastSubscriber < c.PerSubscriber {
		c.FastSubscriber = max(c.PerSubscriber, c.Workers-c.PerSubscriber-reserveOf(c.Workers))
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
	if c.Prefetch <= 0 {
		c.Prefetch = 256
	}
	if c.HandoffAhead <= 0 {
		c.HandoffAhead = 1024
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

// unrecordedPerWorker sizes the bound on attempts whose outcome is not yet
// committed: enough that a busy write loop does not idle the workers at
// thousands of attempts a second, small enough to bound a crash's
// duplicates.
const unrecordedPerWorker = 4

// leaseMargin is added to an attempt's timeout for its lease.
const leaseMargin = 30 * time.Second

// Dispatcher claims due deliveries and runs their attempts.
type Dispatcher struct {
	cfg     Config
	ledger  *ledger.Ledger
	wake    chan struct{}
	results chan outcome

	mu    sync.Mutex
	subs  map[string]*sub
	order []string // round-robin order of subscriber ids
	next  int      // where the next plan starts in order
	// free counts worker slots not in use; an attempt gives its slot back
	// when its answer comes. unrecorded counts attempts whose outcome is
	// not yet committed (on the wire or waiting for the recorder): it is
	// held under maxUnrecorded, which bounds what a crash can deliver twice
	// without making every attempt wait for a commit before the next.
	free          int
	unrecorded    int
	maxUnrecorded int
	// reserve is how many free workers only a subscriber with nothing in
	// flight, and not known to answer slowly, may take: however many slow
	// subscribers fill their caps, and however many fast ones stall at once
	// with theirs out, a quiet one still finds a worker.
	reserve int
	// slowShare is how many workers the subscribers known to answer
	// slowly may hold together: the pool less one PerSubscriber and the
	// reserve, as a fast subscriber's cap is. Each slow one's own cap
	// alone let four of them, at 8 s an answer, take all but the reserve,
	// which a fast subscriber beside them could then use one attempt at a
	// time.
	slowShare int
	slowHeld  int // workers held by attempts started while their subscriber was known slow
	turn      int // where dispatchLocked next starts in order
	// attemptCtx outlives Run's context so shutdown can let attempts
	// finish; cancelAttempts abandons them when the drain times out.
	attemptCtx     context.Context
	cancelAttempts context.CancelFunc
	running        sync.WaitGroup
	stopping       bool
	idle           chan struct{} // closed and replaced each time the loop goes idle (tests)
	waiting        bool          // the loop is blocked until woken or its timer fires
	dirty          map[string]struct{}
	// unsettled counts attempts started whose outcome is not yet recorded
	// and fed back into the plan; zero with the loop waiting means the
	// dispatcher will do nothing until time passes or something changes.
	unsettled atomic.Int64
	poked     atomic.Bool // a wake-up was sent that the loop has not acted on
	// giveUp closes when a stop's drain timeout has passed: the recorder
	// stops retrying a database that refuses its writes.
	giveUp chan struct{}
	admits sync.WaitGroup
	edge   edgeHealth
}

// sub is one subscriber's sending state.
type sub struct {
	cfg         ledger.Subscriber
	signer      *signature.Signer
	signerUntil time.Time    // when the signer's secrets change (zero: never)
	bucket      bucket.State // the origin lane's
	inflight    int
	// epoch counts the breaker's fresh starts (opening, an operator's
	// probe, a new URL): the failure of an attempt started in an earlier
	// one tells the breaker nothing, and it takes no half-open slot. urls
	// counts changes of URL: nothing an attempt at an earlier URL learned,
	// success included, is about the endpoint now. started holds both for
	// each attempt in flight, by seq; current counts those of this epoch.
	epoch, urls, current int
	started              map[int64]startedIn
	// answered is when an attempt last answered, and answerTime a moving
	// average of how long attempts take to answer: together they tell a
	// fast subscriber (FastSubscriber cap) from a slow or stalled one.
	answered   time.Time
	answerTime time.Duration

	// The edge lane: the origin paces itself with its own copy of the
	// Worker's bucket so that deferrals stay rare; the Worker's is the truth.
	edgeBucket           bucket.State
	originRate, edgeRate bucket.Rate
	usesEdge, usesOrigin bool
	queue                []ledger.Claimed // claimed, waiting for a worker; each has a token reserved
	admitted             int              // reserved by Admit, not yet handed off

	hasWork  bool      // pending deliveries may exist
	due      time.Time // earliest known due time of those
	claiming bool      // a claim for it is being committed
	noted    time.Time // earliest due time noted during that claim
}

// startedIn is when, in breaker epochs and URL changes, an attempt began,
// and whether it took a worker of the slow share.
type startedIn struct {
	epoch, urls int
	slow        bool
}

// began notes an attempt of seq going out in s's current epoch.
func (s *sub) began(seq int64, slow bool) {
	if s.started == nil {
		s.started = map[int64]startedIn{}
	}
	s.started[seq] = startedIn{s.epoch, s.urls, slow}
	s.inflight++
	s.current++
}

// fresh reports whether the attempt of seq began in s's current epoch.
func (s *sub) fresh(seq int64) bool {
	e, ok := s.started[seq]
	return ok && e.epoch == s.epoch
}

// sameURL reports whether the attempt of seq went to s's current URL.
func (s *sub) sameURL(seq int64) bool {
	e, ok := s.started[seq]
	return ok && e.urls == s.urls
}

// ended notes the attempt of seq back.
func (s *sub) ended(seq int64) {
	if s.fresh(seq) {
		s.current--
	}
	delete(s.started, seq)
	s.inflight--
}

// newEpoch starts the breaker afresh: the attempts out now are from before.
func (s *sub) newEpoch() {
	s.epoch++
	s.current = 0
}

// busy is what s has in flight against its in-flight limit: a half-open
// breaker's one probe is one started since it last moved.
func (s *sub) busy() int {
	if s.cfg.Breaker.State == breaker.HalfOpen {
		return s.current
	}
	return s.inflight
}

// New returns a dispatcher over l, registered to take new deliveries
// straight from the enqueue. Call Load, then Run.
func New(l *ledger.Ledger, cfg Config) *Dispatcher {
	cfg.defaults()
	d := &Dispatcher{
		cfg:           cfg,
		ledger:        l,
		wake:          make(chan struct{}, 1),
		results:       make(chan outcome, 4096),
		subs:          map[string]*sub{},
		dirty:         map[string]struct{}{},
		free:          cfg.Workers,
		maxUnrecorded: unrecordedPerWorker * cfg.Workers,
		reserve:       reserveOf(cfg.Workers),
		slowShare:     max(cfg.PerSubscriber, cfg.Workers-cfg.PerSubscriber-reserveOf(cfg.Workers)),
		idle:          make(chan struct{}),
		giveUp:        make(chan struct{}),
	}
	d.attemptCtx, d.cancelAttempts = context.WithCancel(context.Background())
	l.SetAdmitter(d)
	return d
}

// Load reads every subscriber and assumes each may have due work (the first
// claim finds out). Each bucket continues from the state the last process
// saved when it stopped cleanly (see Run), refilled to now; after a crash
// there is none, and the bucket starts empty: this process cannot know what
// the last one spent, and an empty bucket can never let a restart exceed the
// rate. The saved states are taken as they are read, so a crash after this
// start finds none. (Writing the bucket as it changes instead would cost a
// row write per claim, a fourth write per delivery for a throttled
// subscriber.)
func (d *Dispatcher) Load(ctx context.Context) error {
	all, err := d.ledger.Subscribers(ctx)
	if err != nil {
		return err
	}
	saved := map[string]savedBuckets{}
	if text, err := d.ledger.TakeSetting(ctx, bucketsKey); err != nil {
		return err
	} else if text != "" {
		if err := json.Unmarshal([]byte(text), &saved); err != nil {
			d.cfg.Logger.Warn("saved buckets unreadable; every bucket starts empty", "err", err)
			saved = nil
		}
	}
	now := d.cfg.Clock.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range all {
		d.upsertLocked(s, now)
		st := d.subs[s.ID]
		st.bucket, st.edgeBucket = bucket.Empty(now), bucket.Empty(now)
		if b, ok := saved[s.ID]; ok && b.fits(st, now) {
			st.bucket, st.edgeBucket = b.Origin, b.Edge
		}
		st.hasWork = true
	}
	return nil
}

// bucketsKey is the setting that holds the buckets a clean stop saved.
const bucketsKey = "buckets_at_stop"

// savedBuckets is one subscriber's buckets as a clean stop left them, with
// the lanes and rates they were kept for.
type savedBuckets struct {
	Origin     bucket.State `json:"origin"`
	Edge       bucket.State `json:"edge"`
	OriginRate bucket.Rate  `json:"origin_rate"`
	EdgeRate   bucket.Rate  `json:"edge_rate"`
	UsesEdge   bool         `json:"uses_edge"`
	UsesOrigin bool         `json:"uses_origin"`
}

// fits reports whether the saved buckets can go on for s at now: the same
// lanes at the same rates (another --edge-url or --edge-types moves spending
// between lanes the saved state cannot see, since the Worker's lives in its
// Durable Object), and no Last ahead of now (a clock stepped back would
// otherwise hold the bucket shut until it caught up).
func (b savedBuckets) fits(s *sub, now time.Time) bool {
	return b.UsesEdge == s.usesEdge && b.UsesOrigin == s.usesOrigin && b.OriginRate == s.originRate &&
		b.EdgeRate == s.edgeRate && !b.Origin.Last.After(now) && !b.Edge.Last.After(now)
}

// saveBuckets keeps every bucket for the next start, once nothing can spend
// a token any more.
func (d *Dispatcher) saveBuckets() {
	d.mu.Lock()
	out := make(map[string]savedBuckets, len(d.subs))
	for id, s := range d.subs {
		out[id] = savedBuckets{Origin: s.bucket, Edge: s.edgeBucket, OriginRate: s.originRate, EdgeRate: s.edgeRate,
			UsesEdge: s.usesEdge, UsesOrigin: s.usesOrigin}
	}
	d.mu.Unlock()
	text, _ := json.Marshal(out)
	if err := d.ledger.SetSetting(context.Background(), bucketsKey, string(text)); err != nil {
		d.cfg.Logger.Warn("saving the buckets failed; they start empty at the next start", "err", err)
	}
}

// Upsert tells the dispatcher a subscriber was created or changed.
func (d *Dispatcher) Upsert(s ledger.Subscriber) {
	now := d.cfg.Clock.Now()
	d.mu.Lock()
	d.upsertLocked(s, now)
	held := d.holdLocked(d.subs[s.ID], now)
	d.mu.Unlock()
	d.release(held)
	d.poke()
}

func (d *Dispatcher) upsertLocked(s ledger.Subscriber, now time.Time) {
	st, ok := d.subs[s.ID]
	if !ok {
		st = &sub{}
		d.subs[s.ID] = st
		d.order = append(d.order, s.ID)
	} else {
		// The operator's view wins for configuration; the dispatcher's own
		// view wins for the state it moves (breaker, pause).
		s.Breaker, s.PausedUntil = st.cfg.Breaker, st.cfg.PausedUntil
	}
	// Failures at the old URL say nothing of a new one: an operator who
	// fixed the endpoint should not wait out a cooldown that was about it.
	moved := ok && s.URL != st.cfg.URL
	reset := moved && (s.Breaker.Failures > 0 || s.Breaker.State == breaker.Open || s.Breaker.State == breaker.HalfOpen)
	from := s.Breaker.State
	if reset {
		s.Breaker = breaker.Breaker{State: breaker.Closed}
	}
	st.cfg = s
	if moved {
		// Even from a clean breaker: attempts still out at the old URL
		// must not count against the new one.
		st.urls++
		st.newEpoch()
	}
	if reset {
		d.persistState(st)
		d.breakerMoved(st, from)
	}
	st.signer = nil
	wasEdge, wasOrigin, oldOrigin, oldEdge := st.usesEdge, st.usesOrigin, st.originRate, st.edgeRate
	d.lanes(st)
	edgeDown := d.edge.downUntil.After(now)
	if !ok {
		// The ledger fans events out to it from the commit that created
		// it, before this: an enqueue in between left its deliveries
		// pending, and its Notify, for an id not known here yet, was lost.
		// The first claim finds out.
		st.hasWork = true
		st.bucket, st.edgeBucket = bucket.Full(st.originRate, now), bucket.Full(st.edgeRate, now)
		if st.usesEdge && edgeDown {
			// Its edge deliveries go by the origin lane until the Worker is
			// back, from the origin bucket: the edge one starts then, empty,
			// as the outage left every other subscriber's.
			st.edgeBucket = bucket.Empty(d.edge.downUntil)
		}
		return
	}
	// A lane the subscriber starts to use starts from what it has spent,
	// not from the full bucket it kept idle: a subscriber moved from the
	// origin lane to the edge one (or back) by a change of event types
	// would otherwise get a second burst. Moved whole, the spent bucket
	// moves with it; split, the new lane starts empty.
	switch {
	case st.usesEdge && !wasEdge && !st.usesOrigin:
		st.edgeBucket = bucket.Refill(st.bucket, oldOrigin, now)
	case st.usesEdge && !wasEdge:
		st.edgeBucket = bucket.Empty(now)
	}
	if st.usesEdge && !wasEdge && edgeDown {
		st.edgeBucket = bucket.Empty(d.edge.downUntil) // as the outage left the others
	}
	switch {
	case st.usesOrigin && !wasOrigin && edgeDown:
		// The origin bucket has been the live one through the outage.
	case st.usesOrigin && !wasOrigin && !st.usesEdge:
		st.bucket = bucket.Refill(st.edgeBucket, oldEdge, now)
	case st.usesOrigin && !wasOrigin:
		st.bucket = bucket.Empty(now)
	}
}

// ProbeNow is the operator's retry or recover meeting an open breaker: its
// one probe goes now, not when the cooldown ends, so deliveries put back to
// run now do. A Retry-After pause, which the subscriber asked for, still
// holds.
func (d *Dispatcher) ProbeNow(id string) {
	now := d.cfg.Clock.Now()
	d.mu.Lock()
	if s, ok := d.subs[id]; ok && s.cfg.Breaker.Probe() {
		s.newEpoch()
		d.persistState(s)
		d.breakerMoved(s, breaker.Open)
	}
	d.mu.Unlock()
	d.Notify(now, id)
}

// Remove forgets a deleted subscriber.
func (d *Dispatcher) Remove(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s, ok := d.subs[id]; ok {
		d.unsettled.Add(-int64(len(s.queue))) // its rows are deleted with it
	}
	if f, ok := d.cfg.Observer.(interface{ Forget(string) }); ok {
		f.Forget(id)
	}
	delete(d.subs, id)
	for i, o := range d.order {
		if o == id {
			d.order = append(d.order[:i], d.order[i+1:]...)
			// Those after it move up one: the next turns stay theirs.
			if i < d.turn {
				d.turn--
			}
			if i < d.next {
				d.next--
			}
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
	defer d.cancelAttempts()
	recorded := make(chan struct{})
	go func() {
		defer close(recorded)
		d.record()
	}()
	err := d.loop(ctx)
	// From here the stop is bounded: past the drain timeout, attempts are
	// abandoned and the recorder stops retrying a database that refuses it.
	deadline := time.AfterFunc(d.cfg.DrainTimeout, func() { close(d.giveUp) })
	defer deadline.Stop()

	// Stop starting attempts and put back what was claimed but not sent,
	// once the enqueues already admitted have handed their deliveries over.
	d.mu.Lock()
	d.stopping = true
	d.mu.Unlock()
	d.admits.Wait()
	d.mu.Lock()
	var queued []ledger.Result
	now := d.cfg.Clock.Now()
	for _, s := range d.subs {
		queued = append(queued, releases(s.queue, now)...)
		s.queue = nil
	}
	d.mu.Unlock()
	d.release(queued)
	drained := make(chan struct{})
	go func() { d.running.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-d.giveUp:
		d.mu.Lock()
		running := d.cfg.Workers - d.free
		d.mu.Unlock()
		d.cfg.Logger.Warn("drain timeout: abandoning attempts still in flight; they are delivered again after the next start",
			"attempts", running, "drain_timeout", d.cfg.DrainTimeout.String())
		d.cancelAttempts() // each abandoned attempt is recorded as such and its delivery goes back to pending
		<-drained
	}
	close(d.results)
	<-recorded // past the drain timeout the recorder retries no failed write
	d.saveBuckets()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func (d *Dispatcher) loop(ctx context.Context) error {
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		now := d.cfg.Clock.Now()
		reqs, owners, wait := d.plan(now)
		if len(reqs) > 0 {
			began := time.Now()
			res, err := d.ledger.Claim(ctx, reqs)
			if o, ok := d.cfg.Observer.(interface{ ObserveClaim(time.Duration) }); ok && err == nil {
				o.ObserveClaim(time.Since(began))
			}
			if err != nil {
				d.unplan(owners)
				if ctx.Err() != nil {
					return ctx.Err()
				}
				d.cfg.Logger.Error("claim failed", "err", err)
				wait = time.Second
			} else {
				d.start(owners, res, now)
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

// plan decides, for subscribers in round-robin order, how many due
// deliveries each should claim now, and how long the loop may sleep when
// nobody can (0: until woken). A subscriber claims only what it can pay for
// with tokens not already reserved by its queue, and only while it has room
// for more work ahead; the tokens themselves are spent at send time.
// owners are the subscribers the requests are for, in order.
func (d *Dispatcher) plan(now time.Time) (reqs []ledger.ClaimRequest, owners []*sub, wait time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var first time.Time
	wakeAt := func(t time.Time) {
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	d.dispatchLocked(now) // queued deliveries whose tokens have come
	n := len(d.order)
	for i := range n {
		id := d.order[(d.next+i)%n]
		s := d.subs[id]
		if w := d.headWaitLocked(s, now); w > 0 && !s.cfg.Paused {
			// Claimed work waiting for its lane's token needs a timer even
			// when nothing is left to claim.
			wakeAt(now.Add(w))
		}
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
		limit, until := d.limitLocked(s, now)
		if limit == 0 {
			wakeAt(until)
			continue
		}
		room := d.roomLocked(s, limit, d.cfg.Prefetch)
		tokens, wait := d.tokensLocked(s, now)
		if tokens <= 0 {
			if len(s.queue) == 0 && s.admitted == 0 {
				wakeAt(now.Add(wait))
			}
			continue // else a finishing attempt wakes the loop
		}
		take := min(tokens, room, d.cfg.ClaimBatch)
		if take <= 0 {
			continue
		}
		s.claiming, s.noted = true, time.Time{}
		timeout := time.Duration(s.cfg.TimeoutMS) * time.Millisecond
		reqs = append(reqs, ledger.ClaimRequest{
			SubscriberID: id, Max: take, Now: now, LeaseUntil: now.Add(timeout + leaseMargin),
		})
		owners = append(owners, s)
	}
	if n > 0 {
		d.next = (d.next + 1) % n
	}
	if len(reqs) > 0 || first.IsZero() {
		return reqs, owners, 0
	}
	return reqs, owners, max(first.Sub(now), time.Millisecond)
}

// roomLocked is how many more deliveries a subscriber may take on (claimed
// or admitted) beyond what it holds: its in-flight limit, plus ahead, the
// prefetch that lets claims run ahead so a commit never leaves its workers
// idle. The enqueue's hand-off gets the larger HandoffAhead, so that it
// keeps handing new deliveries over in flight through a stall of a few
// hundred milliseconds: once room runs out they go in pending, each then
// costs a claim's extra write, and every later one waits for the claims to
// catch up (older work first), which under a steady load they may not do
// for seconds. A subscriber that has not answered yet, or whose attempts
// take a second or more, gets nothing ahead: its backlog waits pending
// rather than claimed (shown in flight) behind attempts that may take
// seconds, and a claim's few milliseconds are nothing beside them. A
// half-open breaker gets its probe alone.
func (d *Dispatcher) roomLocked(s *sub, limit, ahead int) int {
	room := limit - s.busy() - len(s.queue) - s.admitted
	if limit >= d.cfg.PerSubscriber && s.answerTime > 0 && s.answerTime < slowAnswer {
		room += ahead
	}
	return room
}

// slowAnswer is the answer time from which a subscriber claims nothing
// ahead.
const slowAnswer = time.Second

// reserveOf is the reserve of a pool of workers: an eighth of it, and at
// least one as soon as there are two.
func reserveOf(workers int) int {
	if workers < 2 {
		return 0
	}
	return max(1, workers/8)
}

// Admit reserves room and tokens for up to n new deliveries of a subscriber
// that has nothing older due, so the enqueue can hand them over in flight.
func (d *Dispatcher) Admit(subscriberID string, n int, now time.Time) (int, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.subs[subscriberID]
	if !ok || d.stopping || s.claiming || s.cfg.Paused || s.cfg.PausedUntil.After(now) ||
		(s.hasWork && !s.due.After(now)) {
		return 0, time.Time{} // older work first: these go through the claim
	}
	limit, _ := d.limitLocked(s, now)
	if s.cfg.Breaker.State != breaker.Closed {
		return 0, time.Time{} // open or probing: the probe goes through the claim
	}
	tokens, _ := d.tokensLocked(s, now)
	a := max(0, min(n, tokens, d.roomLocked(s, limit, d.cfg.HandoffAhead)))
	s.admitted += a
	d.admits.Add(a)
	return a, now.Add(time.Duration(s.cfg.TimeoutMS)*time.Millisecond + leaseMargin)
}

// Handoff takes the deliveries Admit made room for, now committed in flight.
func (d *Dispatcher) Handoff(claimed []ledger.Claimed) {
	if len(claimed) == 0 {
		return
	}
	now := d.cfg.Clock.Now()
	d.mu.Lock()
	var held []ledger.Result
	touched := map[*sub]struct{}{}
	for _, c := range claimed {
		d.unsettled.Add(1)
		s, ok := d.subs[c.SubscriberID]
		if !ok {
			d.unsettled.Add(-1) // removed meanwhile; its rows are gone too
			continue
		}
		s.admitted--
		s.queue = append(s.queue, c)
		touched[s] = struct{}{}
	}
	for s := range touched {
		held = append(held, d.holdLocked(s, now)...) // paused since Admit
	}
	d.dispatchLocked(now)
	// What could not start waits for a worker or for its lane's token. A
	// worker coming free wakes the loop; a token comes only by the loop's
	// timer, which it arms when it plans, and an enqueue that handed every
	// delivery over notifies nobody: a subscriber of both lanes admits on
	// either lane's tokens.
	waiting := false
	for s := range touched {
		waiting = waiting || len(s.queue) > 0
	}
	d.mu.Unlock()
	if waiting {
		d.poke()
	}
	if len(held) > 0 {
		// Handoff runs in the ledger's write loop, which the recorder
		// needs to drain the results channel: never block it on that.
		// Run waits for running (counted before admits lets it past)
		// before it closes the channel.
		d.running.Add(1)
		go func() {
			defer d.running.Done()
			d.release(held)
		}()
	}
	d.admits.Add(-len(claimed))
}

// Unadmit returns reservations whose enqueue did not commit.
func (d *Dispatcher) Unadmit(reserved map[string]int) {
	d.mu.Lock()
	n := 0
	for id, k := range reserved {
		if s, ok := d.subs[id]; ok {
			s.admitted -= k
		}
		n += k
	}
	d.mu.Unlock()
	d.admits.Add(-n)
	d.poke()
}

// limitLocked is how many attempts a subscriber may have in flight at now,
// and when that changes if it is zero.
func (d *Dispatcher) limitLocked(s *sub, now time.Time) (int, time.Time) {
	from := s.cfg.Breaker.State
	limit, until, changed := s.cfg.Breaker.Limit(now, d.cfg.Breaker)
	if changed {
		d.persistState(s)
		d.breakerMoved(s, from)
	}
	if limit == breaker.Unlimited {
		switch {
		case s.fast(now) && s.cfg.Breaker.Failures == 0:
			// A subscriber failing fast is not sent more at once: its
			// breaker should open with as few attempts out as the cap allows.
			return d.cfg.FastSubscriber, until
		case s.answerTime == 0:
			return min(startCap, d.cfg.PerSubscriber), until
		}
		return d.cfg.PerSubscriber, until
	}
	return limit, until
}

// startCap is the in-flight cap of a subscriber that has not answered since
// the start. Until its first answer nobody knows whether it answers in a
// millisecond or in eight seconds, and a crowd of new subscribers that all
// turn out slow must not take every worker at PerSubscriber each before
// that shows; the first answer lifts the cap either way.
const startCap = 2

// slow reports whether the subscriber's answers take slowAnswer or
// more: the reserve is never its, even with nothing in flight.
func (s *sub) slow() bool { return s.answerTime >= slowAnswer }

// fastAnswer is the answer time under which a subscriber counts as fast.
const fastAnswer = 50 * time.Millisecond

// fast reports whether the subscriber's attempts have been answering within
// fastAnswer, and still are: one with attempts out and no answer for that
// long is treated as slow at once, before its average catches up.
func (s *sub) fast(now time.Time) bool {
	return s.answerTime > 0 && s.answerTime < fastAnswer && (s.inflight == 0 || now.Sub(s.answered) < fastAnswer)
}

// noteAnswer folds one attempt's answer time into the subscriber's average.
func (s *sub) noteAnswer(took time.Duration, now time.Time) {
	took = max(took, time.Microsecond)
	if s.answerTime == 0 {
		s.answerTime = took
	} else {
		s.answerTime += (took - s.answerTime) / 4
	}
	s.answered = now
}

// unplan forgets claims that failed to commit.
func (d *Dispatcher) unplan(owners []*sub) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range owners {
		s.claiming = false
	}
}

// start queues what the claims returned and sends what slots allow.
func (d *Dispatcher) start(owners []*sub, res []ledger.ClaimResult, now time.Time) {
	d.mu.Lock()
	var released []ledger.Result
	for i, s := range owners {
		got := res[i]
		d.unsettled.Add(int64(len(got.Deliveries)))
		if !d.liveLocked(s) {
			// Removed since it was planned, perhaps created again under its
			// id: the claim may hold the old one's rows, which are gone, and
			// the new one's, taken by id. None is sent for a sending state
			// that no longer exists; all go back, which puts the new one's
			// back to pending (the ledger skips the old one's).
			released = append(released, releases(got.Deliveries, now)...)
			continue
		}
		s.claiming = false
		if got.Drained {
			s.hasWork, s.due = !got.NextDue.IsZero(), got.NextDue
		}
		if !s.noted.IsZero() {
			s.note(s.noted)
			s.noted = time.Time{}
		}
		s.queue = append(s.queue, got.Deliveries...)
		released = append(released, d.holdLocked(s, now)...)
	}
	d.dispatchLocked(now)
	d.mu.Unlock()
	d.release(released)
}

// dispatchLocked starts queued deliveries while there are free workers,
// taking subscribers in turn, from where the last start left off, so one
// long queue cannot take every worker and a worker freed one at a time goes
// round rather than to the first subscriber with work. The last free
// workers (the reserve) go only to subscribers with nothing in flight that
// are not known to answer slowly, and those that are share slowShare.
func (d *Dispatcher) dispatchLocked(now time.Time) {
	if d.stopping {
		return
	}
	n := len(d.order)
	for progress := true; progress && d.canStartLocked(); {
		progress = false
		from := d.turn
		for k := range n {
			if !d.canStartLocked() {
				return
			}
			at := (from + k) % n
			s := d.subs[d.order[at]]
			if len(s.queue) == 0 || s.cfg.Paused || s.cfg.PausedUntil.After(now) {
				continue
			}
			if d.free <= d.reserve && (s.inflight > 0 || s.slow()) {
				continue
			}
			slow := s.slow()
			if slow && d.slowHeld >= d.slowShare {
				continue // a slow attempt's end starts the next
			}
			if limit, _ := d.limitLocked(s, now); s.busy() >= limit {
				continue
			}
			i, lane, ok := d.nextLocked(s, now)
			if !ok {
				continue // no queued delivery's lane has a token yet; plan wakes the loop for it
			}
			c := s.queue[i]
			s.queue = slices.Delete(s.queue, i, i+1)
			s.began(c.Seq, slow)
			d.free--
			if slow {
				d.slowHeld++
			}
			d.unrecorded++
			d.running.Add(1)
			if lane == ledger.LaneEdge {
				go d.viaEdge(d.attemptCtx, s, s.cfg, d.signerLocked(s, now), c, s.edgeRate, d.edge.outages)
			} else {
				go d.attempt(d.attemptCtx, s, s.cfg, d.signerLocked(s, now), c)
			}
			d.turn = (at + 1) % n
			progress = true
		}
	}
}

// freeLocked gives back the worker of s's attempt of seq, before ended
// forgets it.
func (d *Dispatcher) freeLocked(s *sub, seq int64) {
	d.free++
	if s.started[seq].slow {
		d.slowHeld--
	}
}

// canStartLocked reports whether a worker is free and the outcomes not yet
// committed leave room for one more.
func (d *Dispatcher) canStartLocked() bool {
	return d.free > 0 && d.unrecorded < d.maxUnrecorded
}

// holdLocked empties the queue of a subscriber that may not send now
// (paused, breaker open), returning the releases to record: claimed work
// must not sit in flight while its subscriber waits.
func (d *Dispatcher) holdLocked(s *sub, now time.Time) []ledger.Result {
	if len(s.queue) == 0 {
		return nil
	}
	at := now
	switch limit, _ := d.limitLocked(s, now); {
	case s.cfg.Paused:
	case s.cfg.PausedUntil.After(now):
		at = s.cfg.PausedUntil
	case limit == 0:
		// An open breaker: back due now, held by the breaker's limit rather
		// than by a time written into the rows. A success from an attempt
		// still out when it opened closes it early, and they go then.
	case s.cfg.Breaker.State == breaker.HalfOpen && len(s.queue) > limit:
		// Half-open: keep the one probe, release the rest.
		out := releases(s.queue[limit:], at)
		s.queue = s.queue[:limit]
		s.note(at)
		return out
	default:
		return nil
	}
	out := releases(s.queue, at)
	s.queue = nil
	s.note(at)
	return out
}

func releases(cs []ledger.Claimed, at time.Time) []ledger.Result {
	out := make([]ledger.Result, len(cs))
	for i, c := range cs {
		out[i] = ledger.Result{Seq: c.Seq, SubscriberID: c.SubscriberID, Status: ledger.StatusPending, Released: true, NextAttemptAt: at}
	}
	return out
}

// outcome is a result on its way to the ledger. held says it is an
// attempt's, counted in unrecorded until committed.
type outcome struct {
	ledger.Result
	held bool
	// gone: the attempt's subscriber was removed while it was out, and
	// perhaps created again under its id. Its row went with it; nothing
	// is recorded, lest the new one's stats count what the old one got.
	gone bool
}

// release hands releases to the recorder; call without d.mu held.
func (d *Dispatcher) release(rs []ledger.Result) {
	for _, r := range rs {
		d.results <- outcome{Result: r}
	}
}

// finish hands an attempt's result (first) and any releases it caused to
// the recorder; the attempt stops counting as unrecorded once they are
// committed. known is whether its subscriber was still there.
func (d *Dispatcher) finish(rs []ledger.Result, known bool) {
	d.results <- outcome{Result: rs[0], held: true, gone: !known}
	d.release(rs[1:])
}

// signerLocked returns the subscriber's signer for the secrets valid at now.
func (d *Dispatcher) signerLocked(s *sub, now time.Time) *signature.Signer {
	// Reuse the signer until a rotated-out secret's grace period ends (then
	// that secret must stop signing).
	if s.signer != nil && (s.signerUntil.IsZero() || now.Before(s.signerUntil)) {
		return s.signer
	}
	signer, err := signature.NewSigner(s.cfg.Secrets(now)...)
	if err != nil {
		// Secrets are validated when stored; a bad one here is a bug.
		d.cfg.Logger.Error("subscriber secret unusable", "subscriber_id", s.cfg.ID, "err", err)
		signer, _ = signature.NewSigner(s.cfg.Secret)
	}
	s.signer, s.signerUntil = signer, s.cfg.SecretsChange(now)
	return signer
}

// persistState marks a subscriber's breaker and pause for the next record.
func (d *Dispatcher) persistState(s *sub) { d.dirty[s.cfg.ID] = struct{}{} }

// SubscriberSnapshot is the dispatcher's view of one subscriber now.
type SubscriberSnapshot struct {
	Rate        ledger.Rate
	Paused      bool // by the operator
	Breaker     breaker.Breaker
	PausedUntil time.Time
	Tokens      float64 // over the lanes it sends by now
	Inflight    int
}

// Snapshot returns every subscriber's sending state, for stats and views.
func (d *Dispatcher) Snapshot() map[string]SubscriberSnapshot {
	now := d.cfg.Clock.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]SubscriberSnapshot, len(d.subs))
	for id, s := range d.subs {
		// An open breaker whose cooldown has passed is half-open, whether
		// or not a delivery has come along to be its probe.
		d.limitLocked(s, now)
		// The tokens it can spend: an edge-only subscriber's origin bucket
		// is for fallback alone while the Worker is up.
		var tokens float64
		edgeUp := d.cfg.Edge != nil && s.usesEdge && !d.edge.downUntil.After(now)
		if !edgeUp || s.usesOrigin {
			tokens += bucket.Refill(s.bucket, s.originRate, now).Tokens
		}
		if edgeUp {
			tokens += bucket.Refill(s.edgeBucket, s.edgeRate, now).Tokens
		}
		out[id] = SubscriberSnapshot{
			Rate:        s.cfg.Rate,
			Paused:      s.cfg.Paused,
			Breaker:     s.cfg.Breaker,
			PausedUntil: s.cfg.PausedUntil,
			Tokens:      tokens,
			Inflight:    s.inflight,
		}
	}
	return out
}

// Held names a pending delivery by what decides when it can go: its
// subscriber and its event type (which picks the lane).
type Held struct{ SubscriberID, EventType string }

// HeldUntil is, for each delivery, the soonest it can go: when a
// Retry-After pause or an open breaker lets it, or when the bucket of the
// lane it goes by has a token (an edge deferral empties the edge one until
// the Worker's time). Zero when nothing holds it, or the subscriber is
// unknown. One lock and one clock reading for the lot.
func (d *Dispatcher) HeldUntil(ds []Held) []time.Time {
	now := d.cfg.Clock.Now()
	out := make([]time.Time, len(ds))
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, h := range ds {
		s, ok := d.subs[h.SubscriberID]
		if !ok {
			continue
		}
		var held time.Time
		if s.cfg.PausedUntil.After(now) {
			held = s.cfg.PausedUntil
		}
		if limit, until := d.limitLocked(s, now); limit == 0 && until.After(held) {
			held = until
		}
		var wait time.Duration
		if d.laneLocked(s, &ledger.Claimed{EventType: h.EventType}, now) == ledger.LaneEdge {
			wait = bucket.Wait(s.edgeBucket, s.edgeRate, now)
		} else {
			wait = bucket.WaitToSend(s.bucket, s.originRate, now)
		}
		if t := now.Add(wait); wait > 0 && t.After(held) {
			held = t
		}
		out[i] = held
	}
	return out
}

// Quiet reports whether the dispatcher is waiting with nothing in progress:
// no attempt running or unrecorded and no wake-up pending. Only time passing
// or a change (an event, a subscriber update) will make it act again.
// Claimed deliveries still queued count as quiet: the loop, waiting, has
// found that none of them can start before a lane's token comes.
func (d *Dispatcher) Quiet() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	queued := 0
	for _, s := range d.subs {
		queued += len(s.queue)
	}
	return d.waiting && !d.poked.Load() && d.unsettled.Load() == int64(queued)
}

// Idle returns a channel closed the next time the loop has nothing to start
// and waits; tests use it to know the dispatcher has acted on a change.
func (d *Dispatcher) Idle() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.idle
}
