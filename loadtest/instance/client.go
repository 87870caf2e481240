package instance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/sluice-dev/sluice/shared/bucket"
)

// Client calls sluice's /v1 API.
type Client struct {
	URL   string // base URL, e.g. http://127.0.0.1:41234
	Token string
	HTTP  *http.Client // default: one with a 30s timeout
}

// APIError is a non-expected answer from the API.
type APIError struct {
	Method, Path string
	Status       int
	Body         string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s %s: status %d: %.300s", e.Method, e.Path, e.Status, e.Body)
}

var defaultHTTP = &http.Client{Timeout: 30 * time.Second}

// do sends in as JSON (when not nil), requires status want and decodes the
// answer into out (when not nil).
func (c *Client) do(ctx context.Context, method, path string, in any, want int, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.URL+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	hc := c.HTTP
	if hc == nil {
		hc = defaultHTTP
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode != want {
		return &APIError{Method: method, Path: path, Status: resp.StatusCode, Body: string(b)}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: decoding %.200s: %w", method, path, b, err)
		}
	}
	return nil
}

// NewSubscriber is what POST /v1/subscribers takes.
type NewSubscriber struct {
	ID          string       `json:"id,omitempty"`
	URL         string       `json:"url"`
	EventTypes  []string     `json:"event_types,omitempty"`
	Rate        *bucket.Rate `json:"rate,omitempty"`
	MaxAttempts int          `json:"max_attempts,omitempty"`
	TimeoutMS   int          `json:"timeout_ms,omitempty"`
	Secret      string       `json:"secret,omitempty"`
}

// Subscriber is a stored subscriber, as the API shows it.
type Subscriber struct {
	ID          string      `json:"id"`
	URL         string      `json:"url"`
	EventTypes  []string    `json:"event_types"`
	Rate        bucket.Rate `json:"rate"`
	MaxAttempts int         `json:"max_attempts"`
	TimeoutMS   int         `json:"timeout_ms"`
	Secret      string      `json:"secret"`
}

// CreateSubscriber registers a subscriber.
func (c *Client) CreateSubscriber(ctx context.Context, s NewSubscriber) (Subscriber, error) {
	var out Subscriber
	err := c.do(ctx, http.MethodPost, "/v1/subscribers", s, http.StatusCreated, &out)
	return out, err
}

// BatchResult is POST /v1/events/batch's answer.
type BatchResult struct {
	Accepted   int `json:"accepted"`
	Duplicates int `json:"duplicates"`
	Deliveries int `json:"deliveries"`
}

// SendBatch posts up to 1,000 events in one transaction.
func (c *Client) SendBatch(ctx context.Context, events []json.RawMessage) (BatchResult, error) {
	var out BatchResult
	err := c.do(ctx, http.MethodPost, "/v1/events/batch", map[string]any{"events": events}, http.StatusAccepted, &out)
	return out, err
}

// SubscriberStats is one subscriber's line of GET /v1/stats.
type SubscriberStats struct {
	ID          string     `json:"subscriber_id"`
	Pending     int        `json:"pending"`
	Inflight    int        `json:"inflight"`
	Sent        int        `json:"sent"`
	Dead        int        `json:"dead"`
	Attempts    int        `json:"attempts_5m"`
	SuccessRate *float64   `json:"success_rate"`
	P50MS       int64      `json:"p50_ms"`
	P99MS       int64      `json:"p99_ms"`
	Breaker     string     `json:"breaker"`
	PausedUntil *time.Time `json:"paused_until"`
	Tokens      float64    `json:"tokens"`
}

// Stats is GET /v1/stats.
type Stats struct {
	Subscribers []SubscriberStats `json:"subscribers"`
	Totals      struct {
		Pending  int `json:"pending"`
		Inflight int `json:"inflight"`
		Sent     int `json:"sent"`
		Dead     int `json:"dead"`
	} `json:"totals"`
}

// Of returns the stats of subscriber id (zero when absent).
func (s Stats) Of(id string) SubscriberStats {
	for _, v := range s.Subscribers {
		if v.ID == id {
			return v
		}
	}
	return SubscriberStats{ID: id}
}

// Stats reads GET /v1/stats.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	var out Stats
	err := c.do(ctx, http.MethodGet, "/v1/stats", nil, http.StatusOK, &out)
	return out, err
}

// Delivery is a delivery as GET /v1/deliveries lists it.
type Delivery struct {
	ID           string `json:"id"`
	EventID      string `json:"event_id"`
	SubscriberID string `json:"subscriber_id"`
	Status       string `json:"status"`
	Attempts     int    `json:"attempt_count"`
	LastError    string `json:"last_error"`
}

// maxPages bounds a listing walk (1,000 rows a page).
const maxPages = 1000

// EventIDs lists the event ids of subscriberID's deliveries in status,
// walking every page.
func (c *Client) EventIDs(ctx context.Context, subscriberID, status string) (map[string]bool, error) {
	out := map[string]bool{}
	cursor := ""
	for range maxPages {
		q := url.Values{"limit": {"1000"}, "status": {status}, "subscriber_id": {subscriberID}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page struct {
			Data       []Delivery `json:"data"`
			NextCursor string     `json:"next_cursor"`
		}
		if err := c.do(ctx, http.MethodGet, "/v1/deliveries?"+q.Encode(), nil, http.StatusOK, &page); err != nil {
			return nil, err
		}
		for _, d := range page.Data {
			out[d.EventID] = true
		}
		if page.NextCursor == "" {
			return out, nil
		}
		cursor = page.NextCursor
	}
	return nil, fmt.Errorf("GET /v1/deliveries: more than %d pages; the cursor does not advance", maxPages)
}

// EventDeliveries reads GET /v1/events/:id's deliveries.
func (c *Client) EventDeliveries(ctx context.Context, eventID string) ([]Delivery, error) {
	var out struct {
		Deliveries []Delivery `json:"deliveries"`
	}
	err := c.do(ctx, http.MethodGet, "/v1/events/"+url.PathEscape(eventID), nil, http.StatusOK, &out)
	return out.Deliveries, err
}
