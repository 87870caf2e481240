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
	ErrLocked   = errors.New("database is in use by another sluice process")
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

	// PreviousSecret still signs beside Secret until PreviousUntil, so
	// receivers can roll their verification over without dropping events.
	PreviousSecret string    `json:"-"`
	PreviousUntil  time.Time `json:"-"`

	// Delivery state the dispatcher keeps and persists.
	PausedUntil time.Time       `json:"paused_until,omitzero"`
	Breaker     breaker.Breaker `json:"breaker"`
}

// Secrets lists the secrets that sign a message sent at now: the current one
// and, during a rotation's grace period, the previous one.
func (s *Subscriber) Secrets(now time.Time) []string {
	if s.PreviousSecret != "" && now.Before(s.PreviousUntil) {
		return []string{s.Secret, s.PreviousSecret}
	}
	return []string{s.Secret}
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
	Error        string    `json:"error,omitempty"`
	DurationMS   int64     `json:"duration_ms"`
	RetryAfterMS *int64    `json:"retry_after_ms,omitempty"`
	Response     string    `json:"response,omitempty"`
}
