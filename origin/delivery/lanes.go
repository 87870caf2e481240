package delivery

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-dev/sluice/origin/ledger"
	"github.com/sluice-dev/sluice/shared/bucket"
	"github.com/sluice-dev/sluice/shared/edgewire"
	"github.com/sluice-dev/sluice/shared/event"
	"github.com/sluice-dev/sluice/shared/signature"
)

// EdgeLane sends one attempt through the edge Worker. deferFor > 0 means the
// Worker's bucket was empty and nothing was sent; an error means the lane
// itself failed and the subscriber was not called (for that request alone
// when it wraps edgewire.ErrRefused).
type EdgeLane interface {
	Deliver(ctx context.Context, req edgewire.DeliverRequest) (deferFor time.Duration, res edgewire.Result, err error)
}

// Edge-lane health: after edgeFailLimit consecutive lane failures the origin
// delivers edge types itself for a while, doubling from edgeDownMin to
// edgeDownMax while the Worker keeps failing.
const (
	edgeFailLimit = 3
	edgeDownMin   = time.Second
	edgeDownMax   = 30 * time.Second
)

// edgeHealth is the dispatcher's view of the Worker, guarded by d.mu.
type edgeHealth struct {
	failures  int       // consecutive lane failures
	downs     int       // consecutive times it was taken out of use
	downUntil time.Time // the origin lane serves edge types until then
	// outages counts the times it was taken out of use. A failure of a
	// request dispatched before the last of them is the outage already
	// counted, not news of the Worker: the requests in flight when it
	// stalls all fail together.
	outages int
}

// lanes sets how a subscriber's rate is split. One whose types all go
// through the edge has its whole rate there, one whose types all stay at the
// origin has it all at the origin, and one that can receive both has it
// split by edge_share so that the sum never exceeds it. The origin bucket of
// an edge-only subscriber keeps the whole rate for when the lane is down. A
// burst too small to give each lane a whole token (or an edge_share of 0 or
// 1) is not split: everything goes by the origin lane at the whole rate.
func (d *Dispatcher) lanes(s *sub) {
	s.usesEdge, s.usesOrigin = false, len(d.cfg.EdgeTypes) == 0
	if len(d.cfg.EdgeTypes) > 0 {
		for _, e := range d.cfg.EdgeTypes {
			for _, p := range s.cfg.EventTypes {
				// "*", a type and "prefix.*" share a type exactly when one
				// covers the other.
				if event.MatchType([]string{p}, e) || event.MatchType([]string{e}, p) {
					s.usesEdge = true
				}
			}
		}
		for _, p := range s.cfg.EventTypes {
			if !event.MatchType(d.cfg.EdgeTypes, p) { // "*", a prefix, or a type kept at the origin
				s.usesOrigin = true
			}
		}
	}
	full := s.cfg.Rate.Bucket()
	s.originRate, s.edgeRate = full, full
	if s.usesEdge && s.usesOrigin {
		share := s.cfg.Rate.EdgeShare
		origin, edge := full.Scale(1-share), full.Scale(share)
		if origin.Valid() && edge.Valid() {
			s.originRate, s.edgeRate = origin, edge
		} else {
			s.usesEdge = false
		}
	}
}

// laneLocked picks the lane for a delivery at now. An edge-only subscriber
// sends everything through the edge while it is up, even a delivery of a type
// kept at the origin (one enqueued before its types changed, or requeued from
// the dead letters): its whole rate is there, and its origin bucket, full for
// fallback, spent beside it would double the rate.
func (d *Dispatcher) laneLocked(s *sub, c *ledger.Claimed, now time.Time) ledger.Lane {
	if d.cfg.Edge == nil || !s.usesEdge || d.edge.downUntil.After(now) {
		return ledger.LaneOrigin
	}
	if s.usesOrigin && !event.MatchType(d.cfg.EdgeTypes, c.EventType) {
		return ledger.LaneOrigin
	}
	return ledger.LaneEdge
}

// takeLocked spends a token of the lane's bucket. The origin lane sends to
// the subscriber, so its bucket keeps the sender's reserve; the edge bucket
// only foresees the Durable Object's, which enforces on arrival.
func (d *Dispatcher) takeLocked(s *sub, lane ledger.Lane, now time.Time) bool {
	var ok bool
	if lane == ledger.LaneEdge {
		s.edgeBucket, ok = bucket.Take(s.edgeBucket, s.edgeRate, now, 1)
	} else {
		s.bucket, ok = bucket.TakeToSend(s.bucket, s.originRate, now, 1)
	}
	return ok
}

// tokensLocked is how many deliveries a subscriber's buckets could pay for
// now beyond what it already holds, and how long until one more if none.
func (d *Dispatcher) tokensLocked(s *sub, now time.Time) (int, time.Duration) {
	var n int
	var wait time.Duration = -1
	add := func(tokens int, w time.Duration) {
		n += tokens
		if wait < 0 || w < wait {
			wait = w
		}
	}
	edgeUp := d.cfg.Edge != nil && s.usesEdge && !d.edge.downUntil.After(now)
	if !edgeUp || s.usesOrigin {
		// An edge-only subscriber's origin bucket is for fallback alone.
		add(bucket.AvailableToSend(s.bucket, s.originRate, now), bucket.WaitToSend(s.bucket, s.originRate, now))
	}
	if edgeUp {
		add(bucket.Available(s.edgeBucket, s.edgeRate, now), bucket.Wait(s.edgeBucket, s.edgeRate, now))
	}
	if n > 0 && d.twoLanesLocked(s, now) {
		// Claims come in the ledger's order: look a little further, so a
		// lane with a token finds its deliveries behind the other lane's.
		n += laneLookahead
	}
	return n - len(s.queue) - s.admitted, wait
}

// laneLookahead is how many deliveries a subscriber of both lanes may claim
// beyond its tokens, while it has one, to find the other lane's work.
const laneLookahead = 16

// nextLocked spends a token for the queued delivery to start next and
// returns its index and lane: the first in the queue, or, when its lane has
// no token, the first of the other lane's, so one lane's backlog never holds
// the other lane's share of the rate idle. ok is false when neither can go.
func (d *Dispatcher) nextLocked(s *sub, now time.Time) (int, ledger.Lane, bool) {
	head := d.laneLocked(s, &s.queue[0], now)
	if d.takeLocked(s, head, now) {
		return 0, head, true
	}
	if i, lane, ok := d.otherLaneLocked(s, head, now); ok {
		return i, lane, d.takeLocked(s, lane, now)
	}
	return 0, head, false
}

// otherLaneLocked finds the first queued delivery that goes by another lane
// than head, when the subscriber's queue can hold both.
func (d *Dispatcher) otherLaneLocked(s *sub, head ledger.Lane, now time.Time) (int, ledger.Lane, bool) {
	if !d.twoLanesLocked(s, now) {
		return 0, head, false
	}
	for i := 1; i < len(s.queue); i++ {
		if lane := d.laneLocked(s, &s.queue[i], now); lane != head {
			return i, lane, true
		}
	}
	return 0, head, false
}

// twoLanesLocked reports whether the subscriber's queue can hold deliveries
// of both lanes now.
func (d *Dispatcher) twoLanesLocked(s *sub, now time.Time) bool {
	return d.cfg.Edge != nil && s.usesEdge && s.usesOrigin && !d.edge.downUntil.After(now)
}

// headWaitLocked is how long until a queued delivery's lane has a token (0
// when one has, or the queue is empty): the sooner of the two lanes' waits
// when the queue holds both.
func (d *Dispatcher) headWaitLocked(s *sub, now time.Time) time.Duration {
	if len(s.queue) == 0 {
		return 0
	}
	wait := func(lane ledger.Lane) time.Duration {
		if lane == ledger.LaneEdge {
			return bucket.Wait(s.edgeBucket, s.edgeRate, now)
		}
		return bucket.WaitToSend(s.bucket, s.originRate, now)
	}
	head := d.laneLocked(s, &s.queue[0], now)
	w := wait(head)
	if _, lane, ok := d.otherLaneLocked(s, head, now); ok && w > 0 {
		return min(w, wait(lane))
	}
	return w
}

// viaEdge makes one attempt through the edge Worker.
// outages is d.edge.outages when it was dispatched.
func (d *Dispatcher) viaEdge(ctx context.Context, owner *sub, s ledger.Subscriber, signer *signature.Signer, c ledger.Claimed, rate bucket.Rate, outages int) {
	defer d.running.Done()
	start := d.cfg.Clock.Now()
	h := http.Header{}
	signer.Set(h, c.EventID, start, c.Body)
	headers := map[string]string{"content-type": "application/json", "user-agent": d.cfg.UserAgent}
	for _, k := range []string{signature.HeaderID, signature.HeaderTimestamp, signature.HeaderSignature} {
		headers[k] = h.Get(k)
	}
	deferFor, res, err := d.cfg.Edge.Deliver(ctx, edgewire.DeliverRequest{
		DeliveryID: c.ID(), SubscriberID: s.ID, URL: s.URL, Headers: headers, Body: string(c.Body),
		Rate: rate, TimeoutMS: int64(s.TimeoutMS),
	})
	end := d.cfg.Clock.Now()
	if err != nil && ctx.Err() != nil {
		d.abandoned(owner, c, ledger.LaneEdge, start, end)
		return
	}
	switch {
	case errors.Is(err, edgewire.ErrRefused):
		// The lane will never take this delivery (too large for the Worker,
		// say), which says nothing of the Worker's health: it goes through
		// the origin now, in this worker's slot. Its token came from the
		// edge bucket, which paces the subscriber's edge rate, so the sum
		// over both lanes still holds.
		d.cfg.Logger.Warn("edge lane refused the delivery; sending it through the origin", "delivery_id", c.ID(), "subscriber_id", s.ID, "err", err)
		d.running.Add(1) // attempt's own, beside this one's
		d.attempt(ctx, owner, s, signer, c)
	case err != nil:
		// The lane failed, not the subscriber: nothing is charged, and the
		// delivery goes straight back (to the origin lane if the Worker is
		// now out of use), due as it was, ahead of newer ones.
		d.cfg.Logger.Warn("edge lane failed", "delivery_id", c.ID(), "subscriber_id", s.ID, "err", err)
		results, known := d.settleLane(owner, ledger.Result{Seq: c.Seq, SubscriberID: s.ID, Status: ledger.StatusPending, Released: true, NextAttemptAt: c.Due},
			outages, end, false, time.Time{})
		d.finish(results, known)
	case deferFor > 0:
		// The Worker's bucket was empty: take its word for when its next
		// token comes, and reschedule without an attempt. The delivery goes
		// back due as it was, keeping its place ahead of the subscriber's
		// newer deliveries; the edge bucket, which settleLane holds empty
		// until the Worker's time, keeps the lane from sending before it.
		results, known := d.settleLane(owner, ledger.Result{Seq: c.Seq, SubscriberID: s.ID, Status: ledger.StatusPending, NextAttemptAt: c.Due},
			outages, end, true, end.Add(deferFor))
		if o, ok := d.cfg.Observer.(interface{ ObserveDeferral(string) }); ok && known {
			o.ObserveDeferral(s.ID) // not for a subscriber removed meanwhile: its series are gone
		}
		d.finish(results, known)
	default:
		a := &ledger.Attempt{
			Number: c.Attempts + 1, At: start, Lane: ledger.LaneEdge,
			StatusCode: res.Status, Error: res.Error, DurationMS: res.DurationMS, Response: edgewire.Snippet([]byte(res.Response)),
		}
		retryAfter := ""
		if res.RetryAfterS != nil {
			retryAfter = strconv.FormatInt(*res.RetryAfterS, 10)
		}
		d.edgeAnswered()
		results, known := d.settle(owner, c, a, retryAfter, end)
		d.observe(ctx, s.ID, c, a, results[0], end, known)
		d.finish(results, known)
	}
}

// settleLane frees the worker of an edge attempt that was not an attempt
// (a deferral, or a lane failure) and notes what it says about the Worker;
// tokenAt is when a deferring Worker said the subscriber's next token
// comes; outages is d.edge.outages when the request was dispatched. known
// is whether s is still there.
func (d *Dispatcher) settleLane(s *sub, res ledger.Result, outages int, now time.Time, answered bool, tokenAt time.Time) (out []ledger.Result, known bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	defer d.poke()
	out = []ledger.Result{res}
	d.freeLocked(s, res.Seq)
	if known = d.liveLocked(s); known {
		s.ended(res.Seq)
		if answered {
			s.answered = now
		}
		if answered && tokenAt.After(now) {
			// The Worker's bucket holds its next token at tokenAt: so does
			// this copy, one token's refill from empty then (Refill waits
			// for the clock). Empty at tokenAt would hold the lane a whole
			// token longer than the Worker does, after every deferral. Not
			// before the lane is back in use, though: a deferral that comes
			// back during an outage must not let it refill.
			s.edgeBucket = oneTokenAt(tokenAt, s.edgeRate)
			if d.edge.downUntil.After(s.edgeBucket.Last) {
				s.edgeBucket = bucket.Empty(d.edge.downUntil)
			}
		}
		out = append(out, d.holdLocked(s, now)...)
	}
	switch {
	case answered:
		d.edge.failures, d.edge.downs = 0, 0
	case outages != d.edge.outages:
		// Dispatched before the lane was last taken out of use: already counted.
	default:
		d.edge.failures++
	}
	if d.edge.failures >= edgeFailLimit {
		down := min(edgeDownMin<<min(d.edge.downs, 10), edgeDownMax)
		d.edge.downs++
		d.edge.failures = 0
		d.edge.outages++
		d.edge.downUntil = now.Add(down)
		d.cfg.Logger.Warn("edge lane out of use; delivering edge types through the origin", "for", down.String())
		// The origin lane takes over edge-only subscribers from an empty
		// bucket, so it cannot add a burst to what the edge just sent; and
		// the edge bucket starts empty when the Worker comes back, so the
		// edge cannot add one to what the origin sent meanwhile.
		for _, s := range d.subs {
			if s.usesEdge && !s.usesOrigin {
				s.bucket = bucket.Empty(now)
			}
			if s.usesEdge {
				s.edgeBucket = bucket.Empty(d.edge.downUntil) // a Last ahead: nothing until then
			}
		}
	}
	d.dispatchLocked(now)
	return out, known
}

// oneTokenAt is a bucket that reaches one token at t and holds nothing
// before.
func oneTokenAt(t time.Time, r bucket.Rate) bucket.State {
	if r.PerSecond <= 0 {
		return bucket.Empty(t)
	}
	return bucket.Empty(t.Add(-time.Duration(math.Ceil(float64(time.Second) / r.PerSecond))))
}

// edgeAnswered notes a Worker that answered.
func (d *Dispatcher) edgeAnswered() {
	d.mu.Lock()
	d.edge.failures, d.edge.downs = 0, 0
	d.mu.Unlock()
}

// observe reports an attempt to the observer and the log; of a subscriber
// removed while it was out (known false), only a debug line.
func (d *Dispatcher) observe(ctx context.Context, subID string, c ledger.Claimed, a *ledger.Attempt, res ledger.Result, end time.Time, known bool) {
	if !known {
		// Removed while the attempt was out: its series are gone and its
		// deliveries with it, and a metric observed now would bring them
		// back, for good.
		d.cfg.Logger.Debug("attempt answered after its subscriber was removed", "delivery_id", c.ID(),
			"subscriber_id", subID, "lane", a.Lane, "status", a.StatusCode)
		return
	}
	sent := res.Status == ledger.StatusSent
	if d.cfg.Observer != nil {
		d.cfg.Observer.ObserveAttempt(subID, a.Lane, sent, end.Sub(c.CreatedAt))
	}
	// One line per failure; a success is the normal case, and at thousands
	// a second its line would cost more than the delivery.
	lvl := slog.LevelDebug
	if !sent {
		lvl = slog.LevelWarn
	}
	d.cfg.Logger.Log(ctx, lvl, "attempt", "delivery_id", c.ID(), "subscriber_id", subID, "lane", a.Lane,
		"attempt", a.Number, "status", a.StatusCode, "duration_ms", a.DurationMS, "outcome", res.Status, "error", a.Error)
}
