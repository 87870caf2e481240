package ledger

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/sluice-dev/sluice/origin/breaker"
	"github.com/sluice-dev/sluice/shared/bucket"
)

// Errors the ledger returns; the API maps them to HTTP statuses in one table.
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("conflict")
	// ErrTooLarge is a write the ledger refuses for its size alone.
	ErrTooLarge = errors.New("too large")
	ErrLocked   = errors.New("database is in use by another sluice process")
	// ErrWriteFailed is a batch that could not commit (a full disk, an I/O
	// error): nothing of it was stored, and the same write may succeed
	// later.
	ErrWriteFailed = errors.New("the ledger could not commit the write")
)

// Status is a delivery's state.
type Status string

// Delivery states. The dispatcher moves pending → inflight when it claims a
// delivery; the attempt's result moves inflight → sent, back to pending (retry)
// or dead. Start-up moves every inflight row back to pending, and an operator's
// retry or recover moves dead → pending.
const (
	StatusPending  Status = "pending"
	StatusInflight Status = "inflight"
	StatusSent     Status = "sent"
	StatusDead     Status = "dead"
)

// Valid reports whether s is one of the delivery states.
func (s Status) Valid() bool {
	switch s {
	case StatusPending, StatusInflight, StatusSent, StatusDead:
		return true
	}
	return false
}

// Lane says which side made an attempt.
type Lane string

// Lanes an attempt can take.
const (
	LaneOrigin Lane = "origin"
	LaneEdge   Lane = "edge"
)

// Rate is a subscriber's advertised limit.
type Rate struct {
	PerSecond float64 `json:"per_second"`
	Burst     float64 `json:"burst"`
	// EdgeShare is the part of the rate given to the edge lane when the
	// subscriber can receive events through both lanes.
	EdgeShare float64 `json:"edge_share"`
	// BurstGiven is whether the operator set Burst; an unset one follows
	// the rate when only the rate changes.
	BurstGiven bool `json:"-"`
}

// Bucket converts r to the token-bucket arithmetic's terms.
func (r Rate) Bucket() bucket.Rate { return bucket.Rate{PerSecond: r.PerSecond, Burst: r.Burst} }

// Subscriber is a webhook endpoint and the limits sluice keeps for it.
type Subscriber struct {
	ID          string    `json:"id"`
	URL         string    `json:"url"`
	EventTypes  []string  `json:"event_types"`
	Rate        Rate      `json:"rate"`
	MaxAttempts int       `json:"max_attempts"`
	TimeoutMS   int       `json:"timeout_ms"`
	Secret      string    `json:"secret"`
	Paused      bool      `json:"paused"`
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`

	// Previous are the secrets rotated out within their grace period, newest
	// first: each still signs beside Secret until its Until, so receivers
	// can roll their verification over without dropping events.
	Previous []PreviousSecret `json:"-"`

	// Delivery state the dispatcher keeps and persists.
	PausedUntil time.Time       `json:"paused_until,omitzero"`
	Breaker     breaker.Breaker `json:"breaker"`
}

// PreviousSecret is a rotated-out secret and when it stops signing.
type PreviousSecret struct {
	Secret string
	Until  time.Time
}

// MaxPreviousSecrets bounds how many rotated-out secrets sign beside the
// current one, and so the length of the signature header: a rotation beyond
// it stops the oldest before its grace period ends.
const MaxPreviousSecrets = 4

// Secrets lists the secrets that sign a message sent at now: the current one,
// then those rotated out whose grace period has not ended, newest first.
func (s *Subscriber) Secrets(now time.Time) []string {
	out := []string{s.Secret}
	for _, p := range s.Previous {
		if now.Before(p.Until) {
			out = append(out, p.Secret)
		}
	}
	return out
}

// Rotate makes secret the current one; the current one keeps signing for
// grace. Previous secrets whose grace has ended at now, or that are secret
// itself, are dropped. Rotating to the current secret changes nothing.
func (s *Subscriber) Rotate(secret string, now time.Time, grace time.Duration) {
	if secret == s.Secret {
		return
	}
	kept := []PreviousSecret{{Secret: s.Secret, Until: now.Add(grace)}}
	for _, p := range s.Previous {
		if now.Before(p.Until) && p.Secret != secret && len(kept) < MaxPreviousSecrets {
			kept = append(kept, p)
		}
	}
	s.Secret, s.Previous = secret, kept
}

// SecretsChange is when, after now, a previous secret stops signing (zero
// when none will): until then Secrets(now) stays the same.
func (s *Subscriber) SecretsChange(now time.Time) time.Time {
	var next time.Time
	for _, p := range s.Previous {
		if p.Until.After(now) && (next.IsZero() || p.Until.Before(next)) {
			next = p.Until
		}
	}
	return next
}

// RotationEnds is when the last previous secret stops signing (zero when
// none signs at now).
func (s *Subscriber) RotationEnds(now time.Time) time.Time {
	var last time.Time
	for _, p := range s.Previous {
		if p.Until.After(now) && p.Until.After(last) {
			last = p.Until
		}
	}
	return last
}

// Event is an accepted event: its id, type and the body as the producer sent it.
type Event struct {
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	Body      json.RawMessage `json:"body"`
	CreatedAt time.Time       `json:"created_at"`
}

// Delivery is one event owed to one subscriber.
type Delivery struct {
	ID            string     `json:"id"`
	EventID       string     `json:"event_id"`
	EventType     string     `json:"event_type"`
	SubscriberID  string     `json:"subscriber_id"`
	Status        Status     `json:"status"`
	Attempts      int        `json:"attempt_count"`
	Deferrals     int        `json:"deferrals"`
	NextAttemptAt time.Time  `json:"next_attempt_at,omitzero"`
	CreatedAt     time.Time  `json:"created_at"`
	UpdatedAt     time.Time  `json:"updated_at"`
	SentAt        *time.Time `json:"sent_at,omitempty"`
	DeadAt        *time.Time `json:"dead_at,omitempty"`
	LastError     string     `json:"last_error,omitempty"`
	History       []Attempt  `json:"-"` // filled only when read alone

	seq int64
}

// Attempt is the record of one try at a delivery.
type Attempt struct {
	Number       int       `json:"number"`
	At           time.Time `json:"at"`
	Lane         Lane      `json:"lane"`
	StatusCode   int       `json:"status_code"`
	Error        string    `json:"error"` // "" when the subscriber answered
	DurationMS   int64     `json:"duration_ms"`
	RetryAfterMS *int64    `json:"retry_after_ms"` // null without a Retry-After
	Response     string    `json:"response"`
}
