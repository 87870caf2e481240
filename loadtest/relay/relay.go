// Package relay is the floor sluice's latency is measured against: an HTTP
// server that answers each POST at once and then forwards its body to one
// URL, with no ledger, no signature and no limits. Whatever latency it shows
// on a machine, under the same load, is what net/http and the scheduler
// cost there before sluice does any of its work.
package relay

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"time"
)

// Relay forwards what it accepts to To.
type Relay struct {
	To     string
	Client *http.Client
}

// New returns a relay to url with a connection pool sized for many
// concurrent forwards.
func New(url string) *Relay {
	tr := &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}
	return &Relay{To: url, Client: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

// ServeHTTP answers 202 as soon as the body is read, then forwards it with
// its webhook-id.
func (r *Relay) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		http.Error(w, `{"error":{"code":"method_not_allowed","message":"POST only"}}`, http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	if err != nil {
		http.Error(w, `{"error":{"code":"bad_request","message":"unreadable body"}}`, http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusAccepted)
	go r.forward(req.Header.Get(idHeader), body)
}

// idHeader is passed on, so a receiver can tell deliveries apart.
const idHeader = "webhook-id"

func (r *Relay) forward(id string, body []byte) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, r.To, bytes.NewReader(body))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	if id != "" {
		req.Header.Set(idHeader, id)
	}
	resp, err := r.Client.Do(req)
	if err != nil {
		return
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}
