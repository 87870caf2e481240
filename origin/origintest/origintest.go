// Package origintest assembles a real origin for other packages' tests: a
// ledger on a temporary SQLite file with the production pragmas, a running
// dispatcher and the API, wired the way sluice serve wires them, and torn
// down at the end of the test.
package origintest

import (
	"context"
	"crypto/sha256"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/origin/api"
	"github.com/sluice-dev/sluice/origin/delivery"
	"github.com/sluice-dev/sluice/origin/egress"
	"github.com/sluice-dev/sluice/origin/ledger"
)

// Origin is a running origin. Serve API with httptest (127.0.0.1).
type Origin struct {
	Ledger     *ledger.Ledger
	Dispatcher *delivery.Dispatcher
	Config     api.Config // as the API was built
	API        *echo.Echo
}

// Options adjust the dispatcher's and the API's configuration before they
// start; both allow private endpoints, since receivers listen on 127.0.0.1.
type Options struct {
	Delivery func(*delivery.Config)
	API      func(*api.Config)
}

// stopLimit bounds how long the cleanup waits for the dispatcher to drain.
const stopLimit = 10 * time.Second

// Start builds and runs an origin whose API takes token. Logs at warn and
// above go to the test's output.
func Start(t testing.TB, token string, o Options) *Origin {
	t.Helper()
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))

	l, err := ledger.Open(ctx, filepath.Join(t.TempDir(), "sluice.db"), ledger.Options{})
	if err != nil {
		t.Fatalf("open ledger: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("close ledger: %v", err)
		}
	})

	dcfg := delivery.Config{
		Client:       egress.Policy{AllowPrivate: true}.Client(),
		DrainTimeout: 5 * time.Second,
		Logger:       log,
	}
	if o.Delivery != nil {
		o.Delivery(&dcfg)
	}
	disp := delivery.New(l, dcfg)
	if err := disp.Load(ctx); err != nil {
		t.Fatalf("load dispatcher: %v", err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- disp.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-runErr:
			if err != nil {
				t.Errorf("dispatcher Run: %v", err)
			}
		case <-time.After(stopLimit):
			t.Errorf("dispatcher Run did not return within %s of cancel", stopLimit)
		}
	})

	acfg := api.Config{
		Ledger:      l,
		Dispatcher:  disp,
		Egress:      egress.Policy{AllowPrivate: true},
		TokenSHA256: sha256.Sum256([]byte(token)),
		Logger:      log,
	}
	if o.API != nil {
		o.API(&acfg)
	}
	return &Origin{Ledger: l, Dispatcher: disp, Config: acfg, API: api.New(acfg)}
}

// NewRequest is an API request to url with token as its bearer and body,
// when not empty, as its JSON.
func NewRequest(t testing.TB, method, url, token, body string) *http.Request {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatalf("build %s %s: %v", method, url, err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}
