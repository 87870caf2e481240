//go:build edge

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

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
	sharedEdge *edgeProc // one Worker for the tests that need no restart
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
	if _, err := exec.LookPath("node"); err != nil {
		return 0, errors.New("node is not on PATH; these tests run the Worker in workerd through Node 20 (see README)")
	}
	for _, pkg := range []string{"miniflare", "wrangler"} {
		if _, err := os.Stat(filepath.Join(root, "node_modules", pkg, "package.json")); err != nil {
			return 0, fmt.Errorf("node_modules/%s is missing: run `npm ci` in %s first, or `make edge-test`", pkg, root)
		}
	}
	// Build what the tests run, so they never test a stale app.wasm.
	build := exec.Command("make", "-s", "edge")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("make edge: %v\n%s", err, out)
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

// edgeProc is one Miniflare process serving the Worker.
type edgeProc struct {
	URL  string
	cmd  *exec.Cmd
	out  *syncBuffer // the process's stdout and stderr: Miniflare's and the Worker's logs
	done chan struct{}
}

// startEdge serves the Worker on a free 127.0.0.1 port with Durable Object
// storage persisted in persistDir (in memory when it is ""), and waits until
// it answers.
func startEdge(persistDir string) (*edgeProc, error) {
	cfgHome, err := os.MkdirTemp("", "sluice-edge-xdg-")
	if err != nil {
		return nil, err
	}
	args := []string{"scripts/miniflare-edge.mjs", "--port", "0"}
	if persistDir != "" {
		args = append(args, "--persist", persistDir)
	}
	cmd := exec.Command("node", args...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(),
		"SLUICE_EDGE_SECRET="+edgeSecret,
		"WRANGLER_SEND_METRICS=false",
		"CLOUDFLARE_CF_FETCH_ENABLED=false",
		"WRANGLER_HIDE_BANNER=true",
		"XDG_CONFIG_HOME="+cfgHome,
	)
	// Its own process group, so a stuck workerd child can be ended with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting Miniflare: %w", err)
	}
	e := &edgeProc{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			e.out.WriteLine(line)
			var r struct{ URL string }
			if strings.HasPrefix(line, `{"url":`) && json.Unmarshal([]byte(line), &r) == nil {
				select {
				case ready <- r.URL:
				default:
				}
			}
		}
	}()
	go func() {
		_ = cmd.Wait()
		pw.Close()
		os.RemoveAll(cfgHome)
		close(e.done)
	}()
	select {
	case e.URL = <-ready:
		return e, nil
	case <-e.done:
		return nil, fmt.Errorf("Miniflare exited before it was ready:\n%s", e.out)
	case <-time.After(60 * time.Second):
		e.kill()
		return nil, fmt.Errorf("Miniflare not ready after 60s:\n%s", e.out)
	}
}

// Stop asks Miniflare to dispose of workerd (SIGTERM) and waits; after 15s it
// ends the process group.
func (e *edgeProc) Stop() error {
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.done:
		return nil
	case <-time.After(15 * time.Second):
		e.kill()
		<-e.done
		return errors.New("Miniflare ignored SIGTERM for 15s; killed")
	}
}

func (e *edgeProc) kill() { _ = syscall.Kill(-e.cmd.Process.Pid, syscall.SIGKILL) }

// waitForLog waits until the Worker's output contains s.
func (e *edgeProc) waitForLog(t *testing.T, s string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := e.out.String()
		if strings.Contains(out, s) {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the Worker's output after 10s:\n%s", s, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) WriteLine(line string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.WriteString(line)
	s.buf.WriteByte('\n')
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// client is the origin's side of the lane, as far as these tests need it.
var client = &http.Client{Timeout: 30 * time.Second}

// deliver signs dr with the origin↔edge secret at now and posts it.
func deliver(t testing.TB, e *edgeProc, dr edgewire.DeliverRequest) (int, []byte) {
	t.Helper()
	body, err := json.Marshal(dr)
	if err != nil {
		t.Fatal(err)
	}
	return post(t, e, dr.DeliveryID, body, edgeSecret, time.Now())
}

// post sends body to the Worker, signed with secret at ts ("" sends it unsigned).
func post(t testing.TB, e *edgeProc, id string, body []byte, secret string, ts time.Time) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.URL+edgewire.DeliverPath, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if secret != "" {
		s, err := signature.NewSigner(secret)
		if err != nil {
			t.Fatal(err)
		}
		s.Set(req.Header, id, ts, body)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", edgewire.DeliverPath, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}
