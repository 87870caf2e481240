package api

import (
	"crypto/rand"
	"io"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/origin/delivery"
	"github.com/sluice-dev/sluice/origin/egress"
	"github.com/sluice-dev/sluice/origin/ledger"
	"github.com/sluice-dev/sluice/shared/event"
	"github.com/sluice-dev/sluice/shared/signature"
)

// Subscriber defaults and bounds.
const (
	defaultPerSecond   = 50
	defaultBurst       = 100
	defaultEdgeShare   = 0.5
	defaultMaxAttempts = 8
	defaultTimeoutMS   = 5000
	maxAttemptsLimit   = 100
	minTimeoutMS       = 100
	maxTimeoutMS       = int(egress.ConnectTimeout / time.Millisecond) // no attempt outlasts a dial's bound
	maxPerSecond       = 1_000_000
	maxEventTypes      = 100
	// maxOperatorBody bounds the bodies of the subscriber routes (create,
	// change, rotate, recover): --max-body is about events, and a small one
	// must not refuse a subscriber with many event types or a long URL.
	maxOperatorBody = 64 << 10
	rotationGrace   = 24 * time.Hour
)

type rateInput struct {
	PerSecond *float64 `json:"per_second"`
	Burst     *float64 `json:"burst"`
	EdgeShare *float64 `json:"edge_share"`
}

// changes is r without a per_second and burst that both repeat the stored
// rate, as a client sends back what a GET showed with perhaps another
// edge_share: repeated, they change nothing and must not pin a burst that
// follows the rate. A burst given alone, or with a new rate, is the
// operator setting it. nil when nothing is left.
func (r *rateInput) changes(stored ledger.Rate) *rateInput {
	if r == nil || r.PerSecond == nil || r.Burst == nil || *r.PerSecond != stored.PerSecond || *r.Burst != stored.Burst {
		return r
	}
	if r.EdgeShare == nil {
		return nil
	}
	return &rateInput{EdgeShare: r.EdgeShare}
}

type subscriberInput struct {
	ID          *string    `json:"id"`
	URL         *string    `json:"url"`
	EventTypes  *[]string  `json:"event_types"`
	Rate        *rateInput `json:"rate"`
	MaxAttempts *float64   `json:"max_attempts"` // any JSON number: 1e3 or 1.5 is a bad value (422), not bad JSON
	TimeoutMS   *float64   `json:"timeout_ms"`
	Secret      *string    `json:"secret"`
	Paused      *bool      `json:"paused"`
}

func (s *Server) random() io.Reader {
	if s.Rand != nil {
		return s.Rand
	}
	return rand.Reader
}

// checkURL checks the URL in, if any, before anything is locked: the
// lookup may wait on DNS.
func (s *Server) checkURL(c echo.Context, in subscriberInput) error {
	if in.URL == nil {
		return nil
	}
	return s.Egress.CheckURL(c.Request().Context(), strings.TrimSpace(*in.URL))
}

// derivedBurst is the burst a rate gets when none is given: twice the rate,
// as the default 50/s has 100.
func derivedBurst(perSecond float64) float64 { return min(max(1, 2*perSecond), maxPerSecond) }

// apply validates in, its URL aside (checkURL does that first), and copies
// it onto sub; nothing is changed on error.
func (s *Server) apply(c echo.Context, in subscriberInput, sub *ledger.Subscriber) error {
	next := *sub
	if in.URL != nil {
		next.URL = strings.TrimSpace(*in.URL) // checked by checkURL
	}
	if in.EventTypes != nil {
		types := *in.EventTypes
		if len(types) == 0 || len(types) > maxEventTypes {
			return invalid("event_types must list 1 to %d types or patterns", maxEventTypes)
		}
		for _, t := range types {
			if !event.ValidPattern(t) {
				return invalid("event_types: %q is not a type, a prefix pattern like \"video.*\", or \"*\"", clip(t))
			}
		}
		next.EventTypes = append([]string(nil), types...)
	}
	if r := in.Rate; r != nil {
		if r.PerSecond != nil {
			// A burst never set follows the rate, as the default 50/s has
			// 100: a subscriber moved from 50/s to 2/s is not left a burst
			// of 100. One the operator set stays, whatever its value.
			if !next.Rate.BurstGiven {
				next.Rate.Burst = derivedBurst(*r.PerSecond)
			}
			next.Rate.PerSecond = *r.PerSecond
		}
		if r.Burst != nil {
			next.Rate.Burst = *r.Burst
			next.Rate.BurstGiven = true
		}
		if r.EdgeShare != nil {
			next.Rate.EdgeShare = *r.EdgeShare
		}
		if !(next.Rate.PerSecond > 0 && next.Rate.PerSecond <= maxPerSecond) {
			return invalid("rate.per_second must be above 0 and at most %d", maxPerSecond)
		}
		if !(next.Rate.Burst >= 1 && next.Rate.Burst <= maxPerSecond) {
			return invalid("rate.burst must be at least 1 and at most %d", maxPerSecond)
		}
		if !(next.Rate.EdgeShare >= 0 && next.Rate.EdgeShare <= 1) {
			return invalid("rate.edge_share must be between 0 and 1")
		}
	}
	if in.MaxAttempts != nil {
		n, ok := wholeIn(*in.MaxAttempts, 1, maxAttemptsLimit)
		if !ok {
			return invalid("max_attempts must be a whole number between 1 and %d", maxAttemptsLimit)
		}
		next.MaxAttempts = n
	}
	if in.TimeoutMS != nil {
		n, ok := wholeIn(*in.TimeoutMS, minTimeoutMS, maxTimeoutMS)
		if !ok {
			return invalid("timeout_ms must be a whole number between %d and %d", minTimeoutMS, maxTimeoutMS)
		}
		next.TimeoutMS = n
	}
	if in.Paused != nil {
		next.Paused = *in.Paused
	}
	*sub = next
	return nil
}

// wholeIn returns v as an int when it is a whole number from lo to hi.
func wholeIn(v float64, lo, hi int) (int, bool) {
	if v != math.Trunc(v) || v < float64(lo) || v > float64(hi) {
		return 0, false
	}
	return int(v), true
}

func (s *Server) createSubscriber(c echo.Context) error {
	body, err := readBody(c, maxOperatorBody)
	if err != nil {
		return err
	}
	var in subscriberInput
	if err := decodeStrict(body, &in); err != nil {
		return err
	}
	if in.URL == nil {
		return badRequest("url is required")
	}
	sub := ledger.Subscriber{
		EventTypes:  []string{"*"},
		Rate:        ledger.Rate{PerSecond: defaultPerSecond, Burst: defaultBurst, EdgeShare: defaultEdgeShare},
		MaxAttempts: defaultMaxAttempts,
		TimeoutMS:   defaultTimeoutMS,
	}
	if in.ID != nil {
		if !event.ValidID(*in.ID) {
			return invalid("id must be 1 to 64 characters of A-Z a-z 0-9 _ . : -")
		}
		sub.ID = *in.ID
	} else {
		sub.ID = event.NewID("sub", s.Now(), s.random())
	}
	if sub.Secret, err = s.secret(in.Secret); err != nil {
		return err
	}
	if err := s.checkURL(c, in); err != nil {
		return err
	}
	if err := s.apply(c, in, &sub); err != nil {
		return err
	}
	s.subs.Lock()
	defer s.subs.Unlock()
	if err := s.Ledger.CreateSubscriber(c.Request().Context(), &sub); err != nil {
		return err
	}
	s.Dispatcher.Upsert(sub)
	return c.JSON(http.StatusCreated, s.view(sub, s.Dispatcher.Snapshot()))
}

// subscriberView is a subscriber as the API shows it.
type subscriberView struct {
	ledger.Subscriber
	Rate                rateView   `json:"rate"`
	SecretRotatingUntil *time.Time `json:"previous_secret_expires_at,omitempty"`
}

// view shows sub with the dispatcher's state of it from snaps, taken once
// per answer.
func (s *Server) view(sub ledger.Subscriber, snaps map[string]delivery.SubscriberSnapshot) subscriberView {
	v := subscriberView{Subscriber: sub, Rate: rateView{PerSecond: sub.Rate.PerSecond, Burst: sub.Rate.Burst}}
	if s.EdgeLane || sub.Rate.EdgeShare != defaultEdgeShare {
		share := sub.Rate.EdgeShare
		v.Rate.EdgeShare = &share
	}
	if snap, ok := snaps[sub.ID]; ok {
		v.Breaker, v.PausedUntil = snap.Breaker, millis(snap.PausedUntil)
		v.Breaker.OpenedAt = millis(v.Breaker.OpenedAt)
	}
	if !v.PausedUntil.After(s.Now()) {
		v.PausedUntil = time.Time{} // a Retry-After pause that has ended
	}
	if t := sub.RotationEnds(s.Now()); !t.IsZero() {
		t = millis(t)
		v.SecretRotatingUntil = &t
	}
	return v
}

func (s *Server) listSubscribers(c echo.Context) error {
	limit, err := pageLimit(c)
	if err != nil {
		return err
	}
	cursor := c.QueryParam("cursor")
	if cursor != "" && !event.ValidID(cursor) {
		return badRequest("cursor is not one this API gave")
	}
	page, next, err := s.Ledger.SubscriberPage(c.Request().Context(), cursor, limit)
	if err != nil {
		return err
	}
	out := make([]subscriberView, 0, len(page))
	snaps := s.Dispatcher.Snapshot()
	for _, sub := range page {
		out = append(out, s.view(sub, snaps))
	}
	body := map[string]any{"data": out}
	if next != "" {
		body["next_cursor"] = next
	}
	return c.JSON(http.StatusOK, body)
}

func (s *Server) getSubscriber(c echo.Context) error {
	sub, err := s.Ledger.Subscriber(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, s.view(sub, s.Dispatcher.Snapshot()))
}

func (s *Server) patchSubscriber(c echo.Context) error {
	body, err := readBody(c, maxOperatorBody)
	if err != nil {
		return err
	}
	// A subscriber that is not there is 404 whatever the body says; the
	// lookup under the lock below still decides.
	if _, err := s.Ledger.Subscriber(c.Request().Context(), c.Param("id")); err != nil {
		return err
	}
	var in subscriberInput
	if err := decodeStrict(body, &in); err != nil {
		return err
	}
	// The id it already has may come back with a GET's fields; a new one
	// may not.
	if (in.ID != nil && *in.ID != c.Param("id")) || in.Secret != nil {
		return badRequest("id and secret cannot be changed here (use rotate-secret for the secret)")
	}
	if err := s.checkURL(c, in); err != nil {
		return err
	}
	ctx := c.Request().Context()
	s.subs.Lock()
	defer s.subs.Unlock()
	cur, err := s.Ledger.Subscriber(ctx, c.Param("id"))
	if err != nil {
		return err
	}
	before := cur.Paused
	in.Rate = in.Rate.changes(cur.Rate)
	if err := s.apply(c, in, &cur); err != nil {
		return err
	}
	updated, err := s.Ledger.UpdateSubscriber(ctx, cur.ID, func(sub *ledger.Subscriber) {
		sub.URL, sub.EventTypes, sub.Rate = cur.URL, cur.EventTypes, cur.Rate
		sub.MaxAttempts, sub.TimeoutMS, sub.Paused = cur.MaxAttempts, cur.TimeoutMS, cur.Paused
	})
	if err != nil {
		return err
	}
	s.Dispatcher.Upsert(updated)
	if updated.Paused != before {
		if updated.Paused {
			s.log.Info("subscriber paused by the operator", "subscriber_id", updated.ID)
		} else {
			s.log.Info("subscriber resumed by the operator", "subscriber_id", updated.ID)
		}
	}
	return c.JSON(http.StatusOK, s.view(updated, s.Dispatcher.Snapshot()))
}

func (s *Server) deleteSubscriber(c echo.Context) error {
	id := c.Param("id")
	s.subs.Lock()
	defer s.subs.Unlock()
	if err := s.Ledger.DeleteSubscriber(c.Request().Context(), id); err != nil {
		return err
	}
	s.Dispatcher.Remove(id)
	return c.NoContent(http.StatusNoContent)
}

// secret validates a secret a client gave, or makes one when it gave none.
func (s *Server) secret(given *string) (string, error) {
	if given == nil {
		return signature.NewSecret(s.random())
	}
	if err := signature.CheckSecret(*given); err != nil {
		return "", invalid("secret must be whsec_ followed by base64 of at least 24 bytes")
	}
	return *given, nil
}

// rotateSecret makes a new secret current, the one given in the body or a
// generated one; the secrets it replaces keep signing for rotationGrace.
func (s *Server) rotateSecret(c echo.Context) error {
	body, err := readBody(c, maxOperatorBody)
	if err != nil {
		return err
	}
	var in struct {
		Secret *string `json:"secret"`
	}
	if len(strings.TrimSpace(string(body))) > 0 {
		if err := decodeStrict(body, &in); err != nil {
			return err
		}
	}
	secret, err := s.secret(in.Secret)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	s.subs.Lock()
	defer s.subs.Unlock()
	cur, err := s.Ledger.Subscriber(ctx, c.Param("id"))
	if err != nil {
		return err
	}
	if secret == cur.Secret {
		return invalid("secret is already the current one")
	}
	now := s.Now()
	updated, err := s.Ledger.UpdateSubscriber(ctx, cur.ID, func(sub *ledger.Subscriber) {
		sub.Rotate(secret, now, rotationGrace)
	})
	if err != nil {
		return err
	}
	s.Dispatcher.Upsert(updated)
	return c.JSON(http.StatusOK, s.view(updated, s.Dispatcher.Snapshot()))
}

func (s *Server) recoverSubscriber(c echo.Context) error {
	body, err := readBody(c, maxOperatorBody)
	if err != nil {
		return err
	}
	if _, err := s.Ledger.Subscriber(c.Request().Context(), c.Param("id")); err != nil {
		return err // 404 before the body's faults, as PATCH
	}
	var in struct {
		Since *string `json:"since"`
	}
	if err := decodeStrict(body, &in); err != nil {
		return err
	}
	if in.Since == nil {
		return badRequest("since is required (RFC 3339)")
	}
	since, err := ParseTime(*in.Since)
	if err != nil {
		return invalid("since must be an RFC 3339 time")
	}
	id := c.Param("id")
	n, err := s.Ledger.Recover(c.Request().Context(), id, since)
	if err != nil {
		return err
	}
	if n > 0 {
		s.Dispatcher.ProbeNow(id)
	}
	return c.JSON(http.StatusOK, map[string]int{"requeued": n})
}

// ParseTime reads an RFC 3339 time as the RFC has it, which Go's layout
// does not quite: "t" and "z" may be lower case (§5.6), and a space may
// stand for the "T" (its note to §5.6).
func ParseTime(s string) (time.Time, error) {
	if len(s) > len("2006-01-02") && (s[10] == ' ' || s[10] == 't') {
		s = s[:10] + "T" + s[11:]
	}
	if strings.HasSuffix(s, "z") {
		s = strings.TrimSuffix(s, "z") + "Z"
	}
	return time.Parse(time.RFC3339Nano, s)
}
