// Package edgeclient is the origin's side of the edge lane: it signs one
// attempt with the origin↔edge secret, sends it to the Worker, and reads the
// Worker's answer. Any failure of the lane itself (unreachable, refused,
// garbled) is ErrLane: the subscriber was not called and must not be
// charged.
package edgeclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/shared/edgewire"
	"github.com/sluice-dev/sluice/shared/signature"
)

// ErrLane wraps every failure of the edge lane itself.
var ErrLane = errors.New("edge lane failed")

// errRefused is ErrLane for one request alone (edgewire.ErrRefused).
var errRefused = fmt.Errorf("%w: %w", ErrLane, edgewire.ErrRefused)

// margin is how much longer than the subscriber's timeout the origin waits
// for the Worker, which adds its own Durable Object round trip.
const margin = 5 * time.Second

// sendBy is how soon after the origin sends a request the Worker must start
// the subscriber's call: the call's timeout later, its answer still has a
// second to come back before the origin stops waiting.
const sendBy = margin - time.Second

// Client sends attempts through one Worker.
type Client struct {
	deliverURL string
	signer     *signature.Signer
	http       *http.Client
	now        func() time.Time
}

// New returns a client for the Worker at edgeURL, signing with secret
// (whsec_…). A nil hc gets a client tuned for many concurrent attempts; now
// nil is time.Now.
func New(edgeURL, secret string, hc *http.Client, now func() time.Time) (*Client, error) {
	if err := signature.CheckSecret(secret); err != nil {
		return nil, fmt.Errorf("edge secret: %w", err)
	}
	signer, err := signature.NewSigner(secret)
	if err != nil {
		return nil, fmt.Errorf("edge secret: %w", err)
	}
	if !strings.HasPrefix(edgeURL, "http://") && !strings.HasPrefix(edgeURL, "https://") {
		return nil, errors.New("edge url must be an http or https URL")
	}
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{
			MaxIdleConns: 512, MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second,
			ForceAttemptHTTP2: true,
		}}
	}
	// A signed call to the Worker carries the subscriber's URL, headers and
	// body: a redirect must not carry them to another host. A 3xx answer is
	// a lane failure like any other the Worker should not give.
	noRedirects := *hc
	noRedirects.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	hc = &noRedirects
	if now == nil {
		now = time.Now
	}
	return &Client{deliverURL: strings.TrimSuffix(edgeURL, "/") + edgewire.DeliverPath, signer: signer, http: hc, now: now}, nil
}

// Deliver sends one attempt. It returns deferFor > 0 when the Worker's
// bucket for the subscriber was empty (202: nothing was sent), or the
// subscriber's result (200).
func (c *Client) Deliver(ctx context.Context, req edgewire.DeliverRequest) (deferFor time.Duration, res edgewire.Result, err error) {
	if err := req.Validate(); err != nil {
		return 0, res, fmt.Errorf("%w: %w", errRefused, err)
	}
	sent := c.now()
	req.SendByMS = sent.Add(sendBy).UnixMilli()
	body, err := json.Marshal(req)
	if err != nil {
		return 0, res, fmt.Errorf("%w: %w", errRefused, err)
	}
	if len(body) > edgewire.MaxRequestBytes {
		// The Worker would refuse it unread, and may reset the connection
		// while it is still being sent: refuse it here.
		return 0, res, fmt.Errorf("%w: the request is %d bytes, over the Worker's %d", errRefused, len(body), edgewire.MaxRequestBytes)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(req.Timeout())*time.Millisecond+margin)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.deliverURL, bytes.NewReader(body))
	if err != nil {
		return 0, res, fmt.Errorf("%w: %w", ErrLane, err)
	}
	hr.Header.Set("Content-Type", "application/json")
	c.signer.Set(hr.Header, req.DeliveryID, sent, body)
	resp, err := c.http.Do(hr)
	if err != nil {
		var ue interface{ Unwrap() error }
		if errors.As(err, &ue) {
			err = ue.Unwrap() // drop the URL
		}
		return 0, res, fmt.Errorf("%w: %w", ErrLane, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return 0, res, fmt.Errorf("%w: reading the answer: %w", ErrLane, err)
	}
	switch resp.StatusCode {
	case http.StatusAccepted:
		var d edgewire.Deferred
		if err := json.Unmarshal(raw, &d); err != nil || !d.Deferred {
			return 0, res, fmt.Errorf("%w: unreadable deferral", ErrLane)
		}
		return deferral(d.RetryInMS), res, nil
	case http.StatusOK:
		if err := json.Unmarshal(raw, &res); err != nil {
			return 0, res, fmt.Errorf("%w: unreadable result", ErrLane)
		}
		return 0, res, nil
	}
	// 401, 404 and 405 say the lane is misconfigured, 5xx that it is
	// failing, 400 that the Worker could not read what the origin signed (a
	// Worker of another version, say): every request may meet the same. 413
	// and 422 are about this request alone.
	failed := ErrLane
	switch resp.StatusCode {
	case http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		failed = errRefused
	}
	var e edgewire.Error
	if json.Unmarshal(raw, &e) == nil && e.Error.Code != "" {
		return 0, res, fmt.Errorf("%w: worker answered %d %s", failed, resp.StatusCode, e.Error.Code)
	}
	return 0, res, fmt.Errorf("%w: worker answered %d", failed, resp.StatusCode)
}

// A Worker's word on when to come back is held between minDeferral and
// maxDeferral: one answering 0 would otherwise send each delivery back and
// forth, a ledger write each time, hundreds of times a second, and one
// answering years would park its deliveries until then (an hour is what a
// Retry-After may pause a subscriber for).
const (
	minDeferral = 10 * time.Millisecond
	maxDeferral = time.Hour
)

func deferral(ms int64) time.Duration {
	switch {
	case ms >= maxDeferral.Milliseconds():
		return maxDeferral
	case ms <= minDeferral.Milliseconds(): // before a large negative overflows
		return minDeferral
	}
	return time.Duration(ms) * time.Millisecond
}
