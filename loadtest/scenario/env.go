package scenario

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/loadtest/instance"
	"github.com/sluice-dev/sluice/loadtest/partner"
	"github.com/sluice-dev/sluice/loadtest/report"
	"github.com/sluice-dev/sluice/shared/signature"
)

// Options are what every scenario takes; zero values take the defaults.
type Options struct {
	// Sluice is the sluice binary; when empty the scenario builds
	// ./origin/cmd/sluice of the module it runs in into its temp folder.
	Sluice  string
	Events  int           // events in the burst
	Timeout time.Duration // how long to wait for deliveries after the burst
	Specs   []Spec        // subscribers and partners (default: the scenario's own)
	// ServeArgs are extra `sluice serve` flags (--workers, --retry-base …).
	ServeArgs []string
	// Jitter is the arrival-time spread the rate check allows for (default 50ms).
	Jitter time.Duration
	// Edge also runs the edge Worker locally (in workerd, through
	// Miniflare) and sends milestone events through it; Canal adds a
	// quarter as many of them to its burst.
	Edge bool
	// Root is the module's root, where sluice and the Worker are built
	// (default: the working folder).
	Root string
	Seed uint64 // seeds the partners' faults (and the chaos schedule)
	// Live receives a per-subscriber progress view every second; nil for
	// none. LiveTTY redraws it in place with ANSI escapes.
	Live    io.Writer
	LiveTTY bool
	// LiveWidth is the terminal's width in columns, when known: redrawn
	// lines are cut to fit it.
	LiveWidth int
	Log       io.Writer // the harness's own messages (nil: discarded)
	// LogTTY is whether Log is the terminal the view is redrawn on, so
	// its lines interleave with the view.
	LogTTY bool
	// SluiceLog receives sluice's stderr (nil: kept in sluice.log in the
	// temp folder, whose tail is shown when sluice fails).
	SluiceLog io.Writer
	Now       func() time.Time // default time.Now
}

func (o *Options) defaults(events int, timeout time.Duration, specs func() []Spec) {
	if o.Events <= 0 {
		o.Events = events
	}
	if o.Timeout <= 0 {
		o.Timeout = timeout
	}
	if o.Specs == nil {
		o.Specs = specs()
	}
	if o.Jitter == 0 {
		o.Jitter = 50 * time.Millisecond
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Root == "" {
		o.Root, _ = os.Getwd()
	}
}

// env is one scenario's world: a temp folder, the partners, and sluice.
type env struct {
	o        Options
	dir      string
	bin      string
	token    string
	partners []*partner.Partner
	logFile  *os.File

	mu     sync.Mutex
	inst   *instance.Instance
	client *instance.Client
}

// newEnv starts the partners (and with startSluice, sluice with its
// subscribers). Call close when done, whatever happens.
func newEnv(ctx context.Context, o Options, startSluice bool) (*env, error) {
	dir, err := os.MkdirTemp("", "sluice-loadtest-")
	if err != nil {
		return nil, err
	}
	e := &env{o: o, dir: dir}
	ok := false
	defer func() {
		if !ok {
			e.close()
		}
	}()
	for i, s := range o.Specs {
		cfg := s.Partner
		cfg.Name = s.ID
		cfg.Jitter = o.Jitter
		cfg.Seed = o.Seed*1000 + uint64(i)
		if cfg.Secret, err = signature.NewSecret(rand.Reader); err != nil {
			return nil, err
		}
		p, err := partner.Start(cfg)
		if err != nil {
			return nil, err
		}
		e.partners = append(e.partners, p)
	}
	if startSluice {
		if err := e.startSluice(ctx); err != nil {
			return nil, err
		}
		if err := e.subscribe(ctx); err != nil {
			return nil, err
		}
	}
	ok = true
	return e, nil
}

func (e *env) startSluice(ctx context.Context) error {
	e.bin = e.o.Sluice
	if e.bin == "" {
		e.bin = filepath.Join(e.dir, "sluice")
		fmt.Fprintf(e.o.Log, "building sluice into %s\n", e.bin)
		if err := instance.Build(ctx, e.o.Root, e.bin); err != nil {
			return err
		}
	}
	var b [16]byte
	rand.Read(b[:])
	e.token = "loadtest-" + hex.EncodeToString(b[:])
	if e.o.SluiceLog == nil {
		f, err := os.Create(filepath.Join(e.dir, "sluice.log"))
		if err != nil {
			return err
		}
		e.logFile = f
	}
	return e.restart(ctx)
}

// restart starts sluice on the scenario's database (again, after a kill).
func (e *env) restart(ctx context.Context) error {
	logw := e.o.SluiceLog
	if logw == nil {
		logw = e.logFile
	}
	in, err := instance.Start(ctx, instance.Options{
		Bin: e.bin, DB: filepath.Join(e.dir, "sluice.db"), Token: e.token, Args: e.o.ServeArgs, Log: logw,
	})
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.inst = in
	e.client = &instance.Client{URL: in.URL, Token: e.token}
	e.mu.Unlock()
	fmt.Fprintf(e.o.Log, "sluice pid %d listening on %s\n", in.Pid(), in.URL)
	return nil
}

// api returns the client of the sluice running now.
func (e *env) api() *instance.Client {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.client
}

func (e *env) sluice() *instance.Instance {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.inst
}

// subscribe creates every spec's subscriber with the rate its partner
// advertises and the secret it verifies with.
func (e *env) subscribe(ctx context.Context) error {
	for i, s := range e.o.Specs {
		p := e.partners[i]
		rate := p.Config().Advertised
		got, err := e.api().CreateSubscriber(ctx, instance.NewSubscriber{
			ID: s.ID, URL: p.URL(), EventTypes: e.o.eventTypes(), Rate: &rate,
			MaxAttempts: s.MaxAttempts, TimeoutMS: s.TimeoutMS, Secret: p.Config().Secret,
		})
		if err != nil {
			return fmt.Errorf("create subscriber %s: %w", s.ID, err)
		}
		if got.Rate.PerSecond != rate.PerSecond || got.Rate.Burst != rate.Burst {
			return fmt.Errorf("subscriber %s stored with rate %+v, want %+v", s.ID, got.Rate, rate)
		}
	}
	return nil
}

// close stops sluice (gracefully, then by force) and the partners, and
// removes the temp folder.
func (e *env) close() {
	if in := e.sluice(); in != nil {
		if err := in.Stop(10 * time.Second); err != nil {
			fmt.Fprintf(e.o.Log, "stopping sluice: %v\n", err)
		}
	}
	for _, p := range e.partners {
		p.Close()
	}
	if e.logFile != nil {
		e.logFile.Close()
	}
	os.RemoveAll(e.dir)
}

// sluiceTail is the end of sluice's log, for errors.
func (e *env) sluiceTail() string {
	if in := e.sluice(); in != nil {
		return in.Tail()
	}
	return ""
}

// The scenarios' event types: the seed's burst, and the high-volume,
// low-value kind the edge lane is for.
const (
	eventType     = "video.trending"
	milestoneType = "video.view_milestone"
)

// eventTypes are what every subscriber of the run receives.
func (o *Options) eventTypes() []string {
	if o.Edge {
		return []string{eventType, milestoneType}
	}
	return []string{eventType}
}

// milestonePrefix begins the ids of milestoneType events.
const milestonePrefix = "milestone"

// typeOf is the type of the event with this id: milestone ids are
// milestoneType, every other one the seed's eventType.
func typeOf(id string) string {
	if strings.HasPrefix(id, milestonePrefix+"_") {
		return milestoneType
	}
	return eventType
}

// eventIDs are the ids of a run's n events.
func eventIDs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s_%06d", prefix, i+1)
	}
	return ids
}

// eventBody is an event shaped like the seed's video.trending, of the type
// its id says (typeOf), with the time it was handed to sluice in sent_at, so
// receivers can time the delivery.
func eventBody(id string, i int, sentAt time.Time) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(
		`{"id":%q,"type":%q,"video_id":"vv_9f31c2","region":"NL","velocity":%.2f,"occurred_at":"2026-07-11T08:14:02Z","sent_at":%q}`,
		id, typeOf(id), 224+float64(i%1000)/100, sentAt.UTC().Format(time.RFC3339Nano)))
}

const batchSize = 1000

// fire posts ids to sluice in batches of up to 1,000, one after the other,
// stamping each batch when it is built. retry makes a failed batch be sent
// again (same ids: sluice answers duplicates) until it is taken or ctx ends.
func (e *env) fire(ctx context.Context, ids []string, offset int, retry bool) error {
	for lo := 0; lo < len(ids); lo += batchSize {
		hi := min(lo+batchSize, len(ids))
		for try := 0; ; try++ {
			now := e.o.Now()
			batch := make([]json.RawMessage, 0, hi-lo)
			for i := lo; i < hi; i++ {
				batch = append(batch, eventBody(ids[i], offset+i, now))
			}
			_, err := e.api().SendBatch(ctx, batch)
			if err == nil {
				break
			}
			if !retry || ctx.Err() != nil || try >= maxBatchTries {
				return fmt.Errorf("posting events %s…%s: %w", ids[lo], ids[hi-1], err)
			}
			if err := sleep(ctx, 250*time.Millisecond); err != nil {
				return err
			}
		}
	}
	return nil
}

// maxBatchTries bounds the resends of one batch while sluice restarts.
const maxBatchTries = 120

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// settled reports whether every subscriber that must drain has nothing
// pending or in flight.
func (e *env) settled(st instance.Stats) bool {
	for _, s := range e.o.Specs {
		if s.SlowToDrain {
			continue
		}
		v := st.Of(s.ID)
		if v.Pending+v.Inflight > 0 {
			return false
		}
	}
	return true
}

// waitSettled polls /v1/stats every second, drawing the live view, until
// every subscriber that must drain has (and, with all, the slow ones too),
// or until deadline. It returns the last stats read.
func (e *env) waitSettled(ctx context.Context, start, deadline time.Time, expected int, all bool, lv *live) (instance.Stats, error) {
	var last instance.Stats
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		st, err := e.api().Stats(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return last, ctx.Err()
			}
			fmt.Fprintf(e.o.Log, "stats: %v\n", err)
		} else {
			last = st
			lv.draw(e.o.Now(), start, e.o.Specs, e.partners, st, expected)
			done := e.settled(st)
			if all {
				done = st.Totals.Pending+st.Totals.Inflight == 0
			}
			if done {
				return st, nil
			}
		}
		if !e.o.Now().Before(deadline) {
			return last, nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return last, ctx.Err()
		}
	}
}

// watch draws the live view every second until the returned stop is
// called: the view of a phase that is not waiting to settle (chaos's kills
// and outages). While sluice is down for a restart it redraws the last
// stats it read beside the partners' own counts.
func (e *env) watch(ctx context.Context, start time.Time, expected int, lv *live) (stop func()) {
	if lv == nil || lv.w == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var last instance.Stats
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
			if st, err := e.api().Stats(sctx); err == nil {
				last = st
			}
			scancel()
			if ctx.Err() == nil {
				lv.draw(e.o.Now(), start, e.o.Specs, e.partners, last, expected)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// maxRechecks bounds the one-by-one second look at lost candidates.
const maxRechecks = 500

// account reads where sluice holds each subscriber's events, then what each
// partner accepted, and sorts every expected event into one place. Events
// found nowhere get a second look, one by one, to rule out a delivery that
// moved between two reads.
func (e *env) account(ctx context.Context, expected []string, start time.Time) ([]report.Row, error) {
	api := e.api()
	st, err := api.Stats(ctx)
	if err != nil {
		return nil, err
	}
	rows := make([]report.Row, len(e.o.Specs))
	rechecks := 0
	for i, s := range e.o.Specs {
		var held report.Sluice
		for _, x := range []struct {
			status string
			dst    *map[string]bool
		}{{"inflight", &held.Inflight}, {"pending", &held.Pending}, {"dead", &held.Dead}} {
			if *x.dst, err = api.EventIDs(ctx, s.ID, x.status); err != nil {
				return nil, err
			}
		}
		p := e.partners[i]
		pr := p.Report(expected)
		tally := report.Account(expected, pr.Accepts, held)
		var still []string
		for _, id := range tally.LostIDs {
			if rechecks >= maxRechecks {
				still = append(still, id)
				continue
			}
			rechecks++
			where, err := e.locate(ctx, api, p, s.ID, id)
			if err != nil {
				return nil, err
			}
			switch where {
			case "delivered":
				tally.Delivered++
			case "inflight":
				tally.Inflight++
			case "pending":
				tally.Pending++
			case "dead":
				tally.Dead++
			default:
				still = append(still, id)
			}
		}
		tally.Lost, tally.LostIDs = len(still), still
		rows[i] = e.row(s, pr, tally, st.Of(s.ID), start)
		if rechecks >= maxRechecks && tally.Lost > 0 {
			rows[i].Notes = append(rows[i].Notes, fmt.Sprintf("more than %d lost candidates; the rest were not looked at twice", maxRechecks))
		}
	}
	return rows, nil
}

// locate looks one event up in sluice, then at the partner: "delivered",
// a delivery status, or "" when it is nowhere (lost).
func (e *env) locate(ctx context.Context, api *instance.Client, p *partner.Partner, subID, eventID string) (string, error) {
	ds, err := api.EventDeliveries(ctx, eventID)
	var ae *instance.APIError
	if err != nil && !(errors.As(err, &ae) && ae.Status == 404) {
		return "", err
	}
	status := ""
	for _, d := range ds {
		if d.SubscriberID == subID {
			status = d.Status
		}
	}
	if p.Accepts(eventID) > 0 {
		return "delivered", nil
	}
	switch status {
	case "pending", "inflight", "dead":
		return status, nil
	}
	return "", nil // sent but never accepted, or never enqueued
}

// minServed is half of what a partner could take of expected events over
// elapsed: no more than burst + rate·t, nor than one answer per Delay (as
// if it were sent one at a time). Half leaves room for restarts and a
// busy machine; a subscriber sluice stopped serving gets none of it.
func minServed(p partner.Config, expected int, elapsed time.Duration) int {
	allowed := float64(expected)
	if r := p.Advertised; r.Valid() {
		allowed = min(allowed, r.Burst+r.PerSecond*elapsed.Seconds())
	}
	if p.Delay > 0 {
		allowed = min(allowed, elapsed.Seconds()/p.Delay.Seconds())
	}
	return int(allowed / 2)
}

// row builds a subscriber's table row.
func (e *env) row(s Spec, pr partner.Report, t report.Tally, st instance.SubscriberStats, start time.Time) report.Row {
	r := report.Row{
		Subscriber: s.ID, Role: s.Role, Advertised: pr.Advertised, Tally: t,
		Duplicates: pr.Duplicates, MaxWindow: pr.MaxWindow, Limit: pr.Limit, Violation: pr.Violation,
		Sent429: pr.Sent429, Banned: pr.Banned, Sent403: pr.Sent403, BadSignatures: pr.BadSignatures, BadBodies: pr.BadBodies,
		P50: pr.P50, P99: pr.P99, DeadLetters: st.Dead, MustDrain: !s.SlowToDrain,
	}
	if s.SlowToDrain {
		r.MinServed = minServed(s.Partner, t.Expected, e.o.Now().Sub(start))
	}
	if t.Pending+t.Inflight+t.Lost == 0 && t.Expected > 0 {
		r.Drained = true
		if !pr.LastAccept.IsZero() {
			r.Drain = report.Millis(pr.LastAccept.Sub(start))
		}
	}
	if strict := report.Limit(pr.Advertised, time.Second, 0); pr.Advertised.Valid() && pr.MaxWindow > strict && !pr.Violation {
		r.Notes = append(r.Notes, fmt.Sprintf("busiest second %d is %d above the strict burst + rate (%d), within the jitter allowance",
			pr.MaxWindow, pr.MaxWindow-strict, strict))
	}
	if !pr.First429.IsZero() {
		r.Notes = append(r.Notes, fmt.Sprintf("%d × 429 sent by the partner, the first at t+%s (the 1-second window allows %d)",
			pr.Sent429, report.Short(pr.First429.Sub(start)), pr.Limit))
	}
	if pr.Banned {
		r.Notes = append(r.Notes, fmt.Sprintf("the partner BANNED the sender (%d × 403)", pr.Sent403))
	}
	if pr.ViaWorker > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("%d of its %d requests came through the edge Worker", pr.ViaWorker, pr.Requests))
	}
	if f := pr.Counts; f.Sent500+f.Resets+f.Timeouts > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("partner injected %d × 500, %d resets, %d timeouts", f.Sent500, f.Resets, f.Timeouts))
	}
	if st.Breaker != "" && st.Breaker != "closed" {
		r.Notes = append(r.Notes, "breaker "+st.Breaker+" at the end")
	}
	if t.Unexpected > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("%d deliveries of events it was never owed", t.Unexpected))
	}
	for _, p := range pr.Problems[:min(3, len(pr.Problems))] {
		r.Notes = append(r.Notes, p)
	}
	return r
}
