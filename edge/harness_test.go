//go:build edge

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/loadtest/localedge"
	"github.com/sluice-dev/sluice/shared/edgewire"
	"github.com/sluice-dev/sluice/shared/signature"
)

// The edge integration tests run the built Worker in real workerd through
// Miniflare (scripts/miniflare-edge.mjs), configured from wrangler.toml, and
// drive it over HTTP as the origin would. They need Node, `npm ci` and Make;
// without them they fail, loudly, rather than skip: run them with
// `make edge-test`.

const (
	edgeSecret       = "whsec_AQgPFh0kKzI5QEdOVVxjanF4f4aNlJuiqbC3vsXM09o="
	otherSecret      = "whsec_ZGtyeYCHjpWco6qxuL/GzdTb4unw9/4FDBMaISgvNj0="
	subscriberSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
)

var (
	repoRoot   string
	sharedEdge *localedge.Worker // one Worker for the tests that need no restart
)

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "edge integration tests:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	root, err := filepath.Abs("..")
	if err != nil {
		return 0, err
	}
	repoRoot = root
	if err := localedge.Check(root); err != nil {
		return 0, fmt.Errorf("%w (or run `make edge-test`)", err)
	}
	if err := localedge.Build(context.Background(), root); err != nil {
		return 0, err
	}
	dir, err := os.MkdirTemp("", "sluice-edge-test-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	sharedEdge, err = startEdge(dir)
	if err != nil {
		return 0, err
	}
	code := m.Run()
	if err := sharedEdge.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the shared Worker:", err)
	}
	return code, nil
}

// startEdge serves the Worker on a free 127.0.0.1 port with Durable Object
// storage persisted in persistDir (in memory when it is ""), and waits until
// it answers.
func startEdge(persistDir string) (*localedge.Worker, error) {
	return localedge.Start(context.Background(), localedge.Options{Root: repoRoot, Secret: edgeSecret, Persist: persistDir})
}

// waitForLog waits until the Worker's output contains s.
func waitForLog(t *testing.T, e *localedge.Worker, s string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := e.Output()
		if strings.Contains(out, s) {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the Worker's output after 10s:\n%s", s, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// client is the origin's side of the lane, as far as these tests need it.
var client = &http.Client{Timeout: 30 * time.Second}

// deliver signs dr with the origin↔edge secret at now and posts it.
func deliver(t testing.TB, e *localedge.Worker, dr edgewire.DeliverRequest) (int, []byte) {
	t.Helper()
	status, out, err := tryDeliver(e, dr)
	if err != nil {
		t.Fatal(err)
	}
	return status, out
}

// tryDeliver is deliver for a goroutine, which must not stop the test: it
// returns the error for the test to report.
func tryDeliver(e *localedge.Worker, dr edgewire.DeliverRequest) (int, []byte, error) {
	body, err := json.Marshal(dr)
	if err != nil {
		return 0, nil, err
	}
	return tryPost(e, dr.DeliveryID, body, edgeSecret, time.Now())
}

// post sends body to the Worker, signed with secret at ts ("" sends it unsigned).
func post(t testing.TB, e *localedge.Worker, id string, body []byte, secret string, ts time.Time) (int, []byte) {
	t.Helper()
	status, out, err := tryPost(e, id, body, secret, ts)
	if err != nil {
		t.Fatal(err)
	}
	return status, out
}

func tryPost(e *localedge.Worker, id string, body []byte, secret string, ts time.Time) (int, []byte, error) {
	req, err := http.NewRequest(http.MethodPost, e.URL+edgewire.DeliverPath, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if secret != "" {
		s, err := signature.NewSigner(secret)
		if err != nil {
			return 0, nil, err
		}
		s.Set(req.Header, id, ts, body)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("POST %s: %w", edgewire.DeliverPath, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}
