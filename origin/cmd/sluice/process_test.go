package main_test

// Process-level tests: they build the real binary once and drive it as an
// operator would, through its flags, its environment, its stdout and its
// HTTP API, killing and restarting it on the same database file.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// sluiceBin is the binary TestMain builds for every test of this run.
var sluiceBin string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "sluice-process-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "process tests:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	if err != nil || root == "." || strings.TrimSpace(string(gomod)) == os.DevNull {
		fmt.Fprintf(os.Stderr, "process tests: cannot find the module root (go env GOMOD: %q, %v)\n", gomod, err)
		return 1
	}
	sluiceBin = filepath.Join(dir, "sluice")
	build := exec.Command("go", "build", "-ldflags", "-X main.version="+stampedVersion, "-o", sluiceBin, "./origin/cmd/sluice")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "process tests: go build: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// stampedVersion is what the process tests' build stamps, as make build
// stamps git describe's.
const stampedVersion = "v0.0.0-test"

var listeningRE = regexp.MustCompile(`^sluice \S+ listening on (http://\S+)$`)

// child is one sluice process started by a test.
type child struct {
	t     *testing.T
	cmd   *exec.Cmd
	URL   string // set once it listens
	token string

	listening chan string
	exited    chan struct{} // closed after Wait returned

	mu     sync.Mutex
	stdout []string
	stderr bytes.Buffer
}

// childEnv is the test's environment without any SLUICE_ variable, plus extra.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLUICE_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

type stderrWriter struct{ c *child }

func (w stderrWriter) Write(p []byte) (int, error) {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	return w.c.stderr.Write(p)
}

// launch starts sluice with args in a scratch working directory (so a
// default ./data/sluice.db can never land in the source tree) and kills it
// at cleanup if it is still running.
func launch(t *testing.T, args []string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(sluiceBin, args...)
	cmd.Dir = t.TempDir()
	cmd.Env = childEnv(env...)
	c := &child{t: t, cmd: cmd, listening: make(chan string, 1), exited: make(chan struct{})}
	cmd.Stderr = stderrWriter{c}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			c.mu.Lock()
			c.stdout = append(c.stdout, line)
			c.mu.Unlock()
			if m := listeningRE.FindStringSubmatch(line); m != nil {
				select {
				case c.listening <- m[1]:
				default:
				}
			}
		}
		io.Copy(io.Discard, out)
		cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			cmd.Process.Kill()
			<-c.exited
		}
		if t.Failed() {
			t.Logf("sluice %s (pid %d)\n--- stdout\n%s\n--- stderr\n%s", strings.Join(args, " "), cmd.Process.Pid,
				c.Stdout(), tail(c.Stderr(), 4000))
		}
	})
	return c
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// Stdout is everything the process printed on stdout so far.
func (c *child) Stdout() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.stdout, "\n")
}

// Stderr is everything the process printed on stderr so far.
func (c *child) Stderr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stderr.String()
}

// waitListening waits for the "listening on" line and keeps its URL.
func (c *child) waitListening() {
	c.t.Helper()
	select {
	case u := <-c.listening:
		c.URL = u
	case <-c.exited:
		c.t.Fatalf("sluice exited (%v) before listening\nstderr:\n%s", c.cmd.ProcessState, tail(c.Stderr(), 4000))
	case <-time.After(30 * time.Second):
		c.t.Fatalf("sluice did not print its listening line within 30s\nstderr:\n%s", tail(c.Stderr(), 4000))
	}
}

// waitExit waits up to d for the process to end and returns its exit code.
func (c *child) waitExit(d time.Duration) (code int, exited bool) {
	select {
	case <-c.exited:
		return c.cmd.ProcessState.ExitCode(), true
	case <-time.After(d):
		return 0, false
	}
}

// kill is a crash: SIGKILL, then wait until the process is gone.
func (c *child) kill() {
	c.t.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		c.t.Fatalf("kill: %v", err)
	}
	<-c.exited
}

// serveArgs are the arguments every served child gets.
func serveArgs(db, token string, extra ...string) []string {
	args := []string{"serve", "--addr", "127.0.0.1:0", "--db", db, "--allow-private-endpoints"}
	if token != "" {
		args = append(args, "--api-token", token)
	}
	return append(args, extra...)
}

// serve starts `sluice serve` on db and waits until it listens.
func serve(t *testing.T, db, token string, extra ...string) *child {
	t.Helper()
	c := launch(t, serveArgs(db, token, extra...))
	c.token = token
	c.waitListening()
	return c
}

var apiClient = &http.Client{Timeout: 15 * time.Second}

// request calls the API with token (none when empty) and returns the status
// and body; a transport error fails the test.
func (c *child) request(method, path, token string, body any) (int, []byte) {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			c.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.URL+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := apiClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("%s %s: reading the answer: %v", method, path, err)
	}
	return resp.StatusCode, out
}

// call makes an authorised call, requires status want, and decodes the
// answer into out when out is not nil.
func (c *child) call(method, path string, body any, want int, out any) {
	c.t.Helper()
	status, b := c.request(method, path, c.token, body)
	if status != want {
		c.t.Fatalf("%s %s: status %d, want %d: %s", method, path, status, want, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			c.t.Fatalf("%s %s: decoding %s: %v", method, path, b, err)
		}
	}
}

type subscriber struct {
	ID string `json:"id"`
}

func (c *child) addSubscriber(hookURL string, rate map[string]float64) subscriber {
	c.t.Helper()
	in := map[string]any{"url": hookURL}
	if rate != nil {
		in["rate"] = rate
	}
	var s subscriber
	c.call(http.MethodPost, "/v1/subscribers", in, http.StatusCreated, &s)
	if s.ID == "" {
		c.t.Fatal("POST /v1/subscribers answered no id")
	}
	return s
}

type totals struct {
	Pending  int `json:"pending"`
	Inflight int `json:"inflight"`
	Sent     int `json:"sent"`
	Dead     int `json:"dead"`
}

func (c *child) totals() totals {
	c.t.Helper()
	var st struct {
		Totals totals `json:"totals"`
	}
	c.call(http.MethodGet, "/v1/stats", nil, http.StatusOK, &st)
	return st.Totals
}

type deliveryRow struct {
	ID       string `json:"id"`
	EventID  string `json:"event_id"`
	Status   string `json:"status"`
	Attempts int    `json:"attempt_count"`
}

// deliveries reads every page of GET /v1/deliveries with the given status.
func (c *child) deliveries(status string) []deliveryRow {
	c.t.Helper()
	var all []deliveryRow
	cursor := ""
	for page := 0; ; page++ {
		if page > 100 {
			c.t.Fatal("GET /v1/deliveries: more than 100 pages; the cursor does not advance")
		}
		q := url.Values{"limit": {"1000"}}
		if status != "" {
			q.Set("status", status)
		}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var p struct {
			Data       []deliveryRow `json:"data"`
			NextCursor string        `json:"next_cursor"`
		}
		c.call(http.MethodGet, "/v1/deliveries?"+q.Encode(), nil, http.StatusOK, &p)
		all = append(all, p.Data...)
		if p.NextCursor == "" {
			return all
		}
		cursor = p.NextCursor
	}
}

// eventually polls cond every interval until it holds or d has passed.
func eventually(d, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}

// receiver is a partner endpoint: it records each webhook-id it gets with
// the time it arrived, holds the request for delay, then answers 200.
type receiver struct {
	delay time.Duration

	mu       sync.Mutex
	arrivals map[string][]time.Time
	// connected holds, for each arrival, when the connection it came on
	// was accepted: a request of a killed process can still be read after
	// the kill, but only on a connection that process opened before it.
	connected map[string][]time.Time
	answered  map[string]int
	abandoned int // requests whose client went away while held
	inflight  int
	problems  []string
}

// acceptedKey is the context key of a connection's accept time.
type acceptedKey struct{}

func newReceiver(t *testing.T, delay time.Duration) (*receiver, string) {
	r := &receiver{delay: delay, arrivals: map[string][]time.Time{}, connected: map[string][]time.Time{}, answered: map[string]int{}}
	srv := httptest.NewUnstartedServer(r)
	srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, acceptedKey{}, time.Now())
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return r, srv.URL + "/hook"
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	at := time.Now()
	id := req.Header.Get("webhook-id")
	body, err := io.ReadAll(req.Body)
	var ev struct {
		ID string `json:"id"`
	}
	r.mu.Lock()
	switch {
	case err != nil:
		r.problems = append(r.problems, fmt.Sprintf("%s: reading the body: %v", id, err))
	case id == "":
		r.problems = append(r.problems, "a request without webhook-id")
	case json.Unmarshal(body, &ev) != nil || ev.ID != id:
		r.problems = append(r.problems, fmt.Sprintf("webhook-id %s, body %.200s", id, body))
	}
	r.arrivals[id] = append(r.arrivals[id], at)
	accepted, _ := req.Context().Value(acceptedKey{}).(time.Time)
	r.connected[id] = append(r.connected[id], accepted)
	r.inflight++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.inflight--
		r.mu.Unlock()
	}()

	if r.delay > 0 {
		hold := time.NewTimer(r.delay)
		defer hold.Stop()
		select {
		case <-hold.C:
		case <-req.Context().Done():
			r.mu.Lock()
			r.abandoned++
			r.mu.Unlock()
			return
		}
	}
	w.WriteHeader(http.StatusOK)
	r.mu.Lock()
	r.answered[id]++
	r.mu.Unlock()
}

// distinct is how many different webhook-ids have arrived.
func (r *receiver) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.arrivals)
}

func (r *receiver) inFlight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inflight
}

// connections copies, per webhook-id, when the connection of each arrival
// was accepted (in arrival order).
func (r *receiver) connections() map[string][]time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string][]time.Time, len(r.connected))
	for id, ts := range r.connected {
		out[id] = append([]time.Time(nil), ts...)
	}
	return out
}

// snapshot copies what the receiver has recorded.
func (r *receiver) snapshot() (arrivals map[string][]time.Time, answered map[string]int, abandoned int, problems []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	arrivals = make(map[string][]time.Time, len(r.arrivals))
	for id, ts := range r.arrivals {
		arrivals[id] = append([]time.Time(nil), ts...)
	}
	answered = make(map[string]int, len(r.answered))
	for id, n := range r.answered {
		answered[id] = n
	}
	return arrivals, answered, r.abandoned, append([]string(nil), r.problems...)
}
