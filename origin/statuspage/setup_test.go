package statuspage_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/origin/delivery"
	"github.com/sluice-dev/sluice/origin/ledger"
	"github.com/sluice-dev/sluice/origin/origintest"
)

const testToken = "status-token-0123456789"

// waitLimit bounds every wait for an asynchronous delivery.
const waitLimit = 15 * time.Second

// bundle is one real sluice origin: ledger file, running dispatcher, API on
// 127.0.0.1.
type bundle struct {
	ledger *ledger.Ledger
	disp   *delivery.Dispatcher
	api    http.Handler
	srv    *httptest.Server

	mu sync.Mutex
	// beforeStats, when set, runs before each GET /v1/stats is answered.
	beforeStats func()
}

// setup builds a fresh bundle, as origin/api's tests do.
func setup(t *testing.T) *bundle {
	t.Helper()
	o := origintest.Start(t, testToken, origintest.Options{})
	b := &bundle{ledger: o.Ledger, disp: o.Dispatcher, api: o.API}
	b.srv = httptest.NewServer(http.HandlerFunc(b.serve))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *bundle) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/stats" {
		b.mu.Lock()
		hook := b.beforeStats
		b.mu.Unlock()
		if hook != nil {
			hook()
		}
	}
	b.api.ServeHTTP(w, r)
}

// setBeforeStats installs (or, with nil, removes) the stats hook.
func (b *bundle) setBeforeStats(f func()) {
	b.mu.Lock()
	b.beforeStats = f
	b.mu.Unlock()
}

// response is an answer, read whole.
type response struct {
	status int
	header http.Header
	body   []byte
}

// get sends a GET with the given headers (no token unless given).
func (b *bundle) get(t *testing.T, path string, hdr map[string]string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, b.srv.URL+path, nil)
	if err != nil {
		t.Fatalf("build GET %s: %v", path, err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return b.send(t, req)
}

func (b *bundle) send(t *testing.T, req *http.Request) response {
	t.Helper()
	resp, err := b.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", req.Method, req.URL.Path, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: raw}
}

// do sends an API request with the token, asserts the status and decodes
// the JSON answer into out (when out is not nil).
func (b *bundle) do(t *testing.T, method, path, body string, want int, out any) {
	t.Helper()
	r := b.send(t, origintest.NewRequest(t, method, b.srv.URL+path, testToken, body))
	if r.status != want {
		t.Fatalf("%s %s: status %d, want %d; body: %s", method, path, r.status, want, r.body)
	}
	if out != nil {
		if err := json.Unmarshal(r.body, out); err != nil {
			t.Fatalf("%s %s: decode %s: %v", method, path, r.body, err)
		}
	}
}
