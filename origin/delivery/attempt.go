package delivery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"time"

	"github.com/sluice-dev/sluice/origin/backoff"
	"github.com/sluice-dev/sluice/origin/breaker"
	"github.com/sluice-dev/sluice/origin/egress"
	"github.com/sluice-dev/sluice/origin/ledger"
	"github.com/sluice-dev/sluice/shared/edgewire"
	"github.com/sluice-dev/sluice/shared/retryafter"
	"github.com/sluice-dev/sluice/shared/signature"
)

// reply is what one HTTP attempt learned.
type reply struct {
	status     int
	retryAfter string
	body       string
	err        error
}

// attempt sends one claimed delivery of owner, whose configuration s was
// when it was dispatched, and hands its outcome to the recorder.
func (d *Dispatcher) attempt(ctx context.Context, owner *sub, s ledger.Subscriber, signer *signature.Signer, c ledger.Claimed) {
	defer d.running.Done()
	start := d.cfg.Clock.Now()
	r := d.post(ctx, s, signer, c, start)
	end := d.cfg.Clock.Now()
	if r.err != nil && ctx.Err() != nil {
		d.abandoned(owner, c, ledger.LaneOrigin, start, end)
		return
	}
	a := &ledger.Attempt{
		Number:     c.Attempts + 1,
		At:         start,
		Lane:       ledger.LaneOrigin,
		StatusCode: r.status,
		DurationMS: end.Sub(start).Milliseconds(),
		Response:   r.body,
	}
	if r.err != nil {
		a.Error = describe(r.err, time.Duration(s.TimeoutMS)*time.Millisecond)
	}
	results, known := d.settle(owner, c, a, r.retryAfter, end)
	d.observe(ctx, s.ID, c, a, results[0], end, known)
	d.finish(results, known)
}

// post makes the HTTP request of an attempt.
func (d *Dispatcher) post(ctx context.Context, s ledger.Subscriber, signer *signature.Signer, c ledger.Claimed, now time.Time) reply {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(s.TimeoutMS)*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, bytes.NewReader(c.Body))
	if err != nil {
		return reply{err: err}
	}
	h := req.Header
	h["Content-Type"] = []string{"application/json"}
	h["User-Agent"] = []string{d.cfg.UserAgent}
	signer.Set(h, c.EventID, now, c.Body)
	resp, err := d.cfg.Client.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	buf := make([]byte, edgewire.ResponseSnippet)
	n, _ := io.ReadFull(resp.Body, buf)
	// Read a little more so the connection can be reused, but never let a
	// subscriber stream an endless answer at us.
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return reply{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: edgewire.Snippet(buf[:n])}
}

// settle turns an attempt into its ledger result and updates the
// subscriber's breaker and pause at once, so the next plan already obeys
// them. It returns the result first, then any releases of queued work the
// outcome put on hold; known is whether s is still there.
func (d *Dispatcher) settle(s *sub, c ledger.Claimed, a *ledger.Attempt, retryAfter string, now time.Time) (out []ledger.Result, known bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	defer d.poke()
	res := d.outcomeLocked(s, c, a, retryAfter, now)
	out = []ledger.Result{res}
	d.freeLocked(s, c.Seq)
	if known = d.liveLocked(s); known {
		s.ended(c.Seq)
		s.noteAnswer(now.Sub(a.At), now)
		out = append(out, d.holdLocked(s, now)...)
	}
	d.dispatchLocked(now)
	return out, known
}

// outcomeLocked classifies an attempt: sent, retry at a time, or dead.
func (d *Dispatcher) outcomeLocked(s *sub, c ledger.Claimed, a *ledger.Attempt, retryAfter string, now time.Time) ledger.Result {
	res := ledger.Result{Seq: c.Seq, SubscriberID: s.cfg.ID, Attempt: a, EnqueuedAt: c.CreatedAt}
	ok := a.Error == "" && a.StatusCode >= 200 && a.StatusCode < 300
	if !d.liveLocked(s) {
		res.Status = ledger.StatusDead // the subscriber was removed; finish drops it
		return res
	}
	var pause time.Duration
	if seen, parsed := retryafter.Parse(retryAfter, now); parsed {
		// The history keeps what was asked, whatever the status; only a
		// 429 or 503 is obeyed, capped, and then the whole subscriber waits,
		// not just this delivery.
		ms := seen.Milliseconds()
		a.RetryAfterMS = &ms
		if a.StatusCode == http.StatusTooManyRequests || a.StatusCode == http.StatusServiceUnavailable {
			pause = min(seen, backoff.MaxPause)
			if until := now.Add(pause); pause > 0 && until.After(s.cfg.PausedUntil) {
				if !s.cfg.PausedUntil.After(now) {
					d.cfg.Logger.Info("subscriber paused by its Retry-After", "subscriber_id", s.cfg.ID, "status", a.StatusCode,
						"retry_after", seen.String(), "until", until.UTC().Format(time.RFC3339Nano))
				}
				s.cfg.PausedUntil = until
				d.persistState(s)
			}
		}
	}
	// A 429 that says when to come back is pacing us, not failing: the
	// breaker neither counts it nor resets for it, or five of them would
	// turn a Retry-After of 1 s into the breaker's cooldown. A 503 is an
	// endpoint that is down, whatever it asks: it counts, so an outage
	// opens the breaker instead of spending every delivery's attempts.
	paced := pause > 0 && a.StatusCode == http.StatusTooManyRequests
	// A failure of an attempt started before the breaker last moved afresh
	// (opened, or an operator's probe or new URL) says nothing new: it must
	// not reopen the breaker in the probe's place, nor count against a new
	// URL. A late success still closes it, as the endpoint answers; unless
	// the URL changed since, when it is about another endpoint.
	counts := s.fresh(c.Seq) || ok && s.sameURL(c.Seq)
	if from := s.cfg.Breaker.State; !paced && counts && s.cfg.Breaker.Record(ok, now, d.cfg.Breaker) {
		if s.cfg.Breaker.State == breaker.Open {
			s.newEpoch()
		}
		d.persistState(s)
		d.breakerMoved(s, from)
	}
	if ok {
		res.Status = ledger.StatusSent
		return res
	}
	spent := a.Number - c.BudgetFrom
	if spent >= s.cfg.MaxAttempts {
		res.Status = ledger.StatusDead
		return res
	}
	res.Status = ledger.StatusPending
	if pause > 0 {
		res.NextAttemptAt = now.Add(pause)
	} else {
		res.NextAttemptAt = now.Add(backoff.FullJitter(spent-1, d.cfg.RetryBase, d.cfg.RetryCap, d.cfg.Rand))
	}
	return res
}

// breakerMoved logs a change of s's breaker from the state from: an open
// breaker stops a subscriber's traffic, and the operator should not have
// to poll the stats to learn it.
func (d *Dispatcher) breakerMoved(s *sub, from breaker.State) {
	b := s.cfg.Breaker
	switch {
	case b.State == from:
	case b.State == breaker.Open:
		_, probe, _ := b.Limit(b.OpenedAt, d.cfg.Breaker) // b is a copy
		d.cfg.Logger.Warn("breaker opened: deliveries wait without spending attempts", "subscriber_id", s.cfg.ID,
			"failures", b.Failures, "probe_at", probe.UTC().Format(time.RFC3339Nano))
	case b.State == breaker.HalfOpen:
		d.cfg.Logger.Info("breaker half-open: one probe goes", "subscriber_id", s.cfg.ID)
	default:
		d.cfg.Logger.Info("breaker closed", "subscriber_id", s.cfg.ID)
	}
}

// abandoned frees the slots of an attempt shutdown cut off after the drain
// timeout and records it: its outcome is unknown, so the history keeps it
// but it spends nothing and counts as no failure (the breaker does not see
// it), and the delivery is sent again after the next start.
func (d *Dispatcher) abandoned(owner *sub, c ledger.Claimed, lane ledger.Lane, start, end time.Time) {
	d.mu.Lock()
	d.freeLocked(owner, c.Seq)
	known := d.liveLocked(owner)
	if known {
		owner.ended(c.Seq)
	}
	subID := owner.cfg.ID
	d.mu.Unlock()
	a := &ledger.Attempt{Number: c.Attempts + 1, At: start, Lane: lane, DurationMS: end.Sub(start).Milliseconds(),
		Error: "abandoned at shutdown after the drain timeout; outcome unknown"}
	d.cfg.Logger.Warn("attempt abandoned at shutdown; sent again after the next start", "delivery_id", c.ID(),
		"subscriber_id", subID, "lane", lane)
	d.finish([]ledger.Result{{Seq: c.Seq, SubscriberID: subID, Attempt: a, Unknown: true,
		Status: ledger.StatusPending, NextAttemptAt: end}}, known)
}

// liveLocked reports whether owner is still the subscriber its id names.
// One removed while an attempt was out is not, nor is it once created
// again under the same id: the late outcome must not touch the new one's
// attempts in flight, breaker or pause.
func (d *Dispatcher) liveLocked(owner *sub) bool { return d.subs[owner.cfg.ID] == owner }

// describe names a transport failure without the URL (which may carry a
// token in its query) so it can be stored and shown.
func describe(err error, timeout time.Duration) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ne net.Error
	switch {
	case errors.Is(err, egress.ErrForbiddenAddress):
		return "refused: the endpoint resolves to a private address"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout after " + timeout.String()
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection reset"
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return "host does not resolve"
	}
	return fmt.Sprintf("request failed: %v", err)
}
