// Package partner is a fake webhook subscriber that behaves like real ones:
// honest, rate-limited with a ban for clients that ignore Retry-After, slow,
// down, or flaky. Every partner verifies each request's Standard Webhooks
// signature, records when each webhook-id arrived, and reports deliveries,
// duplicates, missing ids and the busiest second against what it advertised.
package partner

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/loadtest/report"
	"github.com/sluice-dev/sluice/shared/bucket"
	"github.com/sluice-dev/sluice/shared/signature"
)

// Faults are the odds, per request that passed the rate limiter, of each
// failure a flaky partner injects. They are drawn from a source seeded by
// Config.Seed, so a run's fault stream can be replayed.
type Faults struct {
	Error   float64 // answer 500
	Reset   float64 // drop the connection with a TCP reset, before processing
	Timeout float64 // never answer in time: hold the request until the client gives up
	// Hold bounds how long a timeout fault holds a request (default 30s),
	// after which it answers 504.
	Hold time.Duration
}

// Mode is whether a partner is reachable. SetMode moves it.
type Mode int

// Modes a partner can be in.
const (
	Up          Mode = iota // serving
	Refusing                // listener closed: connections are refused; kept-alive ones are reset
	Unavailable             // answering 503, with Retry-After when Config.DownRetryAfter is set
)

func (m Mode) String() string {
	switch m {
	case Refusing:
		return "refusing connections"
	case Unavailable:
		return "503"
	}
	return "up"
}

// Config is one partner's behaviour. The zero value beyond Secret is an
// honest partner that accepts everything at once.
type Config struct {
	Name   string
	Secret string // the subscriber's whsec_ secret; every request is verified with it
	// Advertised is the rate the partner publishes. The report checks every
	// 1-second window against it; with Enforce the partner also answers 429
	// with Retry-After beyond it, from its own token bucket.
	Advertised bucket.Rate
	Enforce    bool
	// BanAfter requests arriving while a Retry-After it gave still runs earn
	// the client a ban: 403 to everything for BanFor (default 1h). 0 never bans.
	BanAfter int
	BanFor   time.Duration
	// Delay is how long a slow partner takes to answer each accepted request.
	Delay  time.Duration
	Faults Faults
	Seed   uint64
	// DownRetryAfter is the Retry-After sent with 503 while Unavailable.
	DownRetryAfter time.Duration
	// Jitter widens the window the rate check allows for (see report.Limit).
	Jitter time.Duration
	// Addr is where Start listens (default 127.0.0.1:0); it must be a
	// loopback address.
	Addr string
	// Now is the partner's clock (default time.Now).
	Now func() time.Time
}

// Counts are how a partner answered.
type Counts struct {
	Requests      int `json:"requests"`       // every request, any outcome
	Accepted      int `json:"accepted"`       // answered 2xx (duplicates included)
	Sent429       int `json:"responses_429"`  // rate limited
	Sent403       int `json:"responses_403"`  // banned
	Sent503       int `json:"responses_503"`  // down
	Sent500       int `json:"responses_500"`  // flaky
	Resets        int `json:"resets"`         // connection dropped
	Timeouts      int `json:"timeouts"`       // held until the client gave up
	Abandoned     int `json:"abandoned"`      // the client went away during a slow answer
	BadSignatures int `json:"bad_signatures"` // answered 401
	BadBodies     int `json:"bad_bodies"`     // answered 400: not the event its webhook-id names
	// ViaWorker counts requests a Cloudflare Worker made (workerd sets
	// CF-Worker on a Worker's subrequests): the edge lane's share.
	ViaWorker int `json:"via_worker"`
}

// Partner is a running fake subscriber. It is an http.Handler; Start also
// serves it on 127.0.0.1.
type Partner struct {
	cfg Config
	now func() time.Time

	mu          sync.Mutex
	rng         *rand.Rand
	bucket      bucket.State
	retryUntil  time.Time // the end of the last Retry-After given
	hammered    int       // requests received before retryUntil
	bannedUntil time.Time
	bans        int // bans it handed out, over and gone included
	mode        Mode
	arrivals    []time.Time // every request; appended in lock order, so nearly sorted
	accepts     map[string]int
	firstAccept map[string]time.Time
	latency     []time.Duration
	counts      Counts
	first429    time.Time
	problems    []string

	addr string
	srv  *http.Server
	ln   net.Listener
}

// maxBody bounds what a partner reads of one request.
const maxBody = 1 << 20

// maxProblems bounds how many problem descriptions a partner keeps.
const maxProblems = 20

// New returns a partner that is not serving yet (use it as a handler, or
// call Start instead).
func New(cfg Config) *Partner {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.BanFor <= 0 {
		cfg.BanFor = time.Hour
	}
	if cfg.Faults.Hold <= 0 {
		cfg.Faults.Hold = 30 * time.Second
	}
	return &Partner{
		cfg:         cfg,
		now:         cfg.Now,
		rng:         rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		bucket:      bucket.Full(cfg.Advertised, cfg.Now()),
		accepts:     map[string]int{},
		firstAccept: map[string]time.Time{},
	}
}

// Start serves a new partner on cfg.Addr, by default 127.0.0.1 at a free port.
func Start(cfg Config) (*Partner, error) {
	p := New(cfg)
	addr := cfg.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("partner %s: %w", cfg.Name, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("partner %s: %s is not a loopback address", cfg.Name, addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("partner %s: %w", cfg.Name, err)
	}
	p.addr = ln.Addr().String()
	p.srv = &http.Server{
		Handler:           p,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0), // resets and aborted holds are the point
	}
	p.serve(ln)
	return p, nil
}

func (p *Partner) serve(ln net.Listener) {
	p.ln = ln
	go p.srv.Serve(ln)
}

// Name is the partner's name.
func (p *Partner) Name() string { return p.cfg.Name }

// Config returns the partner's configuration.
func (p *Partner) Config() Config { return p.cfg }

// URL is the partner's webhook endpoint.
func (p *Partner) URL() string { return "http://" + p.addr + "/hooks/" + p.cfg.Name }

// Close stops serving; requests being held are cut off.
func (p *Partner) Close() error {
	if p.srv == nil {
		return nil
	}
	return p.srv.Close()
}

// SetMode takes a served partner down or brings it back up. Refusing closes
// the listener; leaving it listens again on the same address.
func (p *Partner) SetMode(m Mode) error {
	p.mu.Lock()
	old := p.mode
	p.mode = m
	p.mu.Unlock()
	if p.srv == nil || old == m {
		return nil
	}
	if m == Refusing {
		return p.ln.Close()
	}
	if old == Refusing {
		ln, err := net.Listen("tcp", p.addr)
		if err != nil {
			return fmt.Errorf("partner %s: listening again on %s: %w", p.cfg.Name, p.addr, err)
		}
		p.serve(ln)
	}
	return nil
}

// action is what the partner decided to do with one request.
type action int

const (
	actAccept action = iota
	actStatus        // answer status (with retryAfter when > 0)
	actReset
	actHold
)

// ServeHTTP verifies, records and answers one delivery attempt.
func (p *Partner) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := p.now()
	body, readErr := io.ReadAll(io.LimitReader(r.Body, maxBody))

	p.mu.Lock()
	p.arrivals = append(p.arrivals, at)
	p.counts.Requests++
	if r.Header.Get("Cf-Worker") != "" {
		p.counts.ViaWorker++
	}
	act, status, retryAfter := p.decideLocked(at, r.Header, body, readErr)
	p.mu.Unlock()

	switch act {
	case actStatus:
		if retryAfter > 0 {
			w.Header().Set("Retry-After", strconv.FormatInt(int64(retryAfterFor(retryAfter)/time.Second), 10))
		}
		http.Error(w, http.StatusText(status), status)
		return
	case actReset:
		reset(w)
		return
	case actHold:
		p.wait(r, p.cfg.Faults.Hold, func() { http.Error(w, "held too long", http.StatusGatewayTimeout) })
		return
	}
	if p.cfg.Delay > 0 && !p.wait(r, p.cfg.Delay, nil) {
		p.mu.Lock()
		p.counts.Abandoned++
		p.mu.Unlock()
		return
	}
	if !p.accept(r.Header.Get(signature.HeaderID), body) {
		http.Error(w, "the body is not the event its webhook-id names", http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// decideLocked verifies the request and picks its fate: ban, rate limit,
// outage, injected fault, or acceptance, in the order a real endpoint's
// layers would apply them.
func (p *Partner) decideLocked(at time.Time, h http.Header, body []byte, readErr error) (action, int, time.Duration) {
	if p.mode == Refusing {
		// A request on a connection kept alive from before the outage.
		p.counts.Resets++
		return actReset, 0, 0
	}
	if readErr != nil {
		p.problemLocked("reading a body: %v", readErr)
		return actStatus, http.StatusBadRequest, 0
	}
	if err := signature.Verify(h, body, at, p.cfg.Secret); err != nil {
		p.counts.BadSignatures++
		p.problemLocked("webhook-id %q: %v", h.Get(signature.HeaderID), err)
		return actStatus, http.StatusUnauthorized, 0
	}
	if at.Before(p.bannedUntil) {
		p.counts.Sent403++
		return actStatus, http.StatusForbidden, 0
	}
	if p.cfg.Enforce && p.cfg.Advertised.Valid() {
		if at.Before(p.retryUntil) {
			p.hammered++
			if p.cfg.BanAfter > 0 && p.hammered >= p.cfg.BanAfter {
				p.bannedUntil = at.Add(p.cfg.BanFor)
				p.bans++
				p.problemLocked("banned the client at %s for %s: %d requests while told to wait",
					at.Format("15:04:05.000"), p.cfg.BanFor, p.hammered)
				p.counts.Sent403++
				return actStatus, http.StatusForbidden, 0
			}
			p.counts.Sent429++
			return actStatus, http.StatusTooManyRequests, retryAfterFor(p.retryUntil.Sub(at))
		}
		var ok bool
		if p.bucket, ok = bucket.Take(p.bucket, p.cfg.Advertised, at, 1); !ok {
			ra := retryAfterFor(bucket.Wait(p.bucket, p.cfg.Advertised, at))
			p.retryUntil, p.hammered = at.Add(ra), 0
			p.counts.Sent429++
			if p.first429.IsZero() {
				p.first429 = at
			}
			return actStatus, http.StatusTooManyRequests, ra
		}
	}
	if p.mode == Unavailable {
		p.counts.Sent503++
		return actStatus, http.StatusServiceUnavailable, p.cfg.DownRetryAfter
	}
	f := p.cfg.Faults
	if f.Error+f.Reset+f.Timeout > 0 {
		switch u := p.rng.Float64(); {
		case u < f.Error:
			p.counts.Sent500++
			return actStatus, http.StatusInternalServerError, 0
		case u < f.Error+f.Reset:
			p.counts.Resets++
			return actReset, 0, 0
		case u < f.Error+f.Reset+f.Timeout:
			p.counts.Timeouts++
			return actHold, 0, 0
		}
	}
	return actAccept, 0, 0
}

// retryAfterFor rounds a wait up to the whole seconds Retry-After carries,
// at least one, so a client that obeys it never comes back early.
func retryAfterFor(d time.Duration) time.Duration {
	return time.Duration(max(1, math.Ceil(d.Seconds()))) * time.Second
}

// wait holds the request for d; it reports false when the client went away
// first. done runs when the hold ran its course.
func (p *Partner) wait(r *http.Request, d time.Duration, done func()) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		if done != nil {
			done()
		}
		return true
	case <-r.Context().Done():
		return false
	}
}

// reset drops the connection with a TCP RST, as a crashing proxy would.
func reset(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler) // closes the connection without answering
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	conn.Close()
}

// accept records a processed delivery, or refuses one whose body is not
// the event its webhook-id names: a signed but mangled delivery is not
// delivered.
func (p *Partner) accept(id string, body []byte) bool {
	at := p.now()
	// Only the exact top-level "id" names the event (encoding/json would
	// also take "ID"); sent_at, the scenarios' send time, is read when it
	// is there, and any other event is taken as it comes.
	var obj map[string]json.RawMessage
	parseErr := json.Unmarshal(body, &obj)
	var evID string
	if parseErr == nil && obj == nil {
		parseErr = errors.New("null")
	}
	if parseErr == nil {
		parseErr = json.Unmarshal(obj["id"], &evID)
	}
	var sentAt time.Time
	if raw, ok := obj["sent_at"]; ok {
		json.Unmarshal(raw, &sentAt) // best effort: not every event carries the scenarios' field
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case parseErr != nil:
		p.counts.BadBodies++
		p.problemLocked("webhook-id %q: body is not an event with an id: %v", id, parseErr)
		return false
	case evID != id:
		p.counts.BadBodies++
		p.problemLocked("webhook-id %q carries the body of event %q", id, evID)
		return false
	}
	p.counts.Accepted++
	p.accepts[id]++
	if p.accepts[id] == 1 {
		p.firstAccept[id] = at
		if !sentAt.IsZero() {
			p.latency = append(p.latency, at.Sub(sentAt))
		}
	}
	return true
}

func (p *Partner) problemLocked(format string, args ...any) {
	if len(p.problems) < maxProblems {
		p.problems = append(p.problems, fmt.Sprintf(format, args...))
	}
}

// Accepts returns how many times id was accepted.
func (p *Partner) Accepts(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepts[id]
}

// Arrivals returns when every request arrived, sorted, whatever its outcome.
func (p *Partner) Arrivals() []time.Time {
	p.mu.Lock()
	out := slices.Clone(p.arrivals)
	p.mu.Unlock()
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

// Progress is a partner's state at a glance, for a live view.
type Progress struct {
	Delivered  int  // distinct ids accepted
	LastSecond int  // requests in the last second
	Sent429    int  // 429s so far
	Banned     bool // the client is banned now
	Mode       Mode
}

// Progress returns the partner's state at now.
func (p *Partner) Progress(now time.Time) Progress {
	p.mu.Lock()
	defer p.mu.Unlock()
	from := now.Add(-time.Second)
	n := 0
	// arrivals are in lock order, within a few ms of time order.
	for i := len(p.arrivals) - 1; i >= 0; i-- {
		t := p.arrivals[i]
		if t.Before(from.Add(-time.Second)) {
			break
		}
		if !t.Before(from) && t.Before(now) {
			n++
		}
	}
	return Progress{
		Delivered: len(p.accepts), LastSecond: n, Sent429: p.counts.Sent429,
		Banned: now.Before(p.bannedUntil), Mode: p.mode,
	}
}

// Report is what a partner saw, for the events it was owed.
type Report struct {
	Name       string      `json:"name"`
	Advertised bucket.Rate `json:"advertised"`
	Counts
	Delivered  int      `json:"delivered"`  // distinct ids accepted
	Duplicates int      `json:"duplicates"` // accepts beyond the first per id
	Missing    []string `json:"missing,omitempty"`
	// MaxWindow is the most requests in any 1-second window, WindowStart
	// where it began; Limit is what the advertised rate allows there.
	MaxWindow   int           `json:"max_1s_window"`
	WindowStart time.Time     `json:"window_start"`
	Limit       int           `json:"limit_1s"`
	Violation   bool          `json:"rate_exceeded"`
	Banned      bool          `json:"banned"` // at any time in the run, a ban over by the report included
	P50         report.Millis `json:"p50_ms"` // sent_at in the body → first accept
	P99         report.Millis `json:"p99_ms"`
	// LastAccept is when the last of the expected ids that arrived (all
	// ids when none are expected) was first accepted.
	LastAccept time.Time `json:"last_accept,omitzero"`
	// First429 is when the partner first ran out of tokens.
	First429 time.Time      `json:"first_429,omitzero"`
	Accepts  map[string]int `json:"-"` // accept count by id
	Problems []string       `json:"problems,omitempty"`
}

// Report summarises what the partner saw. expected lists the ids it was
// owed; nil skips the missing-id check.
func (p *Partner) Report(expected []string) Report {
	p.mu.Lock()
	arrivals := slices.Clone(p.arrivals)
	accepts := make(map[string]int, len(p.accepts))
	for id, n := range p.accepts {
		accepts[id] = n
	}
	var last time.Time
	if expected == nil {
		for _, t := range p.firstAccept {
			if t.After(last) {
				last = t
			}
		}
	}
	for _, id := range expected {
		if t, ok := p.firstAccept[id]; ok && t.After(last) {
			last = t
		}
	}
	lat := slices.Clone(p.latency)
	r := Report{
		Name: p.cfg.Name, Advertised: p.cfg.Advertised, Counts: p.counts,
		Banned: p.bans > 0, Problems: slices.Clone(p.problems),
		First429: p.first429,
	}
	p.mu.Unlock()

	slices.SortFunc(arrivals, func(a, b time.Time) int { return a.Compare(b) })
	slices.Sort(lat)
	r.Delivered = len(accepts)
	r.Duplicates = report.Duplicates(accepts)
	if expected != nil {
		r.Missing = report.Missing(expected, accepts)
	}
	r.MaxWindow, r.WindowStart = report.MaxInWindow(arrivals, time.Second)
	if p.cfg.Advertised.Valid() {
		r.Limit = report.Limit(p.cfg.Advertised, time.Second, p.cfg.Jitter)
		r.Violation = report.Exceeds(r.MaxWindow, p.cfg.Advertised, time.Second, p.cfg.Jitter)
	}
	r.P50 = report.Millis(report.Percentile(lat, 0.50))
	r.P99 = report.Millis(report.Percentile(lat, 0.99))
	r.LastAccept = last
	r.Accepts = accepts
	return r
}
