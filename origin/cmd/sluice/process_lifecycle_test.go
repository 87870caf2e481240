package main_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSecondProcessOnSameDatabaseIsRefused: one process owns a database
// file; a second serve (or migrate) beside it fails at once and says why,
// and the owner is not disturbed.
func TestSecondProcessOnSameDatabaseIsRefused(t *testing.T) {
	t.Parallel()
	const token = "tok-owner"
	db := filepath.Join(t.TempDir(), "sluice.db")
	first := serve(t, db, token)

	for _, args := range [][]string{serveArgs(db, token), {"migrate", "--db", db}} {
		second := launch(t, args)
		code, exited := second.waitExit(10 * time.Second)
		if !exited {
			t.Fatalf("sluice %s beside a running serve still runs after 10s\nstdout:\n%s", args[0], second.Stdout())
		}
		if code == 0 {
			t.Errorf("sluice %s beside a running serve exited 0, want non-zero", args[0])
		}
		if msg := strings.ToLower(second.Stderr()); !strings.Contains(msg, "in use") {
			t.Errorf("sluice %s stderr does not say the database is in use:\n%s", args[0], second.Stderr())
		}
		if strings.Contains(second.Stdout(), "listening on") {
			t.Errorf("sluice %s beside a running serve listened:\n%s", args[0], second.Stdout())
		}
	}

	if status, body := first.request(http.MethodGet, "/healthz", "", nil); status != http.StatusOK {
		t.Errorf("the first process after the refusals: GET /healthz %d: %s", status, body)
	}
	first.addSubscriber("http://127.0.0.1:9/hook", nil) // it still writes
}

// TestSIGTERMDrainsAndExitsZero: SIGTERM stops claiming, lets the attempts
// in flight get their answers, records them and exits 0; a restart on the
// same database then resends nothing that was answered.
func TestSIGTERMDrainsAndExitsZero(t *testing.T) {
	t.Parallel()
	const (
		token  = "tok-term"
		events = 10
	)
	rec, hook := newReceiver(t, 300*time.Millisecond)
	db := filepath.Join(t.TempDir(), "sluice.db")
	first := serve(t, db, token)
	first.addSubscriber(hook, nil)
	for i := range events {
		var res struct {
			ID         string `json:"id"`
			Deliveries int    `json:"deliveries"`
		}
		first.call(http.MethodPost, "/v1/events", map[string]any{"id": fmt.Sprintf("term-%02d", i), "type": "test.term"},
			http.StatusAccepted, &res)
		if res.Deliveries != 1 {
			t.Fatalf("POST /v1/events: %+v, want 1 delivery", res)
		}
	}
	if !eventually(10*time.Second, time.Millisecond, func() bool { return rec.inFlight() >= 1 }) {
		t.Fatal("no delivery reached the receiver within 10s")
	}

	sentAt := time.Now()
	if err := first.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, exited := first.waitExit(10 * time.Second)
	took := time.Since(sentAt)
	if !exited {
		t.Fatalf("still running 10s after SIGTERM (in flight at the receiver: %d)", rec.inFlight())
	}
	if code != 0 {
		t.Errorf("exit status %d after SIGTERM, want 0", code)
	}
	if took > 5*time.Second {
		t.Errorf("took %v to exit after SIGTERM, want a few seconds at most", took)
	}
	_, answered, abandoned, problems := rec.snapshot()
	for _, p := range problems {
		t.Errorf("receiver: %s", p)
	}
	if abandoned > 0 {
		t.Errorf("%d requests were dropped by sluice while the receiver held them; shutdown should wait for their answers", abandoned)
	}
	if len(answered) == 0 {
		t.Fatal("the receiver answered nothing before the process exited")
	}
	t.Logf("exited %d in %v after SIGTERM with %d answered deliveries", code, took.Round(time.Millisecond), len(answered))

	second := serve(t, db, token)
	var last totals
	if !eventually(15*time.Second, 20*time.Millisecond, func() bool {
		last = second.totals()
		return last == totals{Sent: events}
	}) {
		t.Errorf("after the restart GET /v1/stats totals %+v, want all %d sent", last, events)
	}
	for _, d := range second.deliveries("") {
		if answered[d.EventID] > 0 && (d.Status != "sent" || d.Attempts != 1) {
			t.Errorf("delivery %s of %s, answered 200 before the shutdown, is %s after %d attempts; want sent after 1",
				d.ID, d.EventID, d.Status, d.Attempts)
		}
	}
	arrivals, _, _, _ := rec.snapshot()
	for id := range answered {
		if n := len(arrivals[id]); n != 1 {
			t.Errorf("%s, answered 200 before the shutdown, reached the receiver %d times; the shutdown did not record it", id, n)
		}
	}
}

// TestSIGTERMStopsClaimingWhileAPIRequestsFinish: an API request still
// arriving when SIGTERM comes neither keeps the dispatcher sending nor
// turns the stop into a failure: no new attempt starts after the signal,
// and past --drain-timeout the request is cut off and serve exits 0.
func TestSIGTERMStopsClaimingWhileAPIRequestsFinish(t *testing.T) {
	t.Parallel()
	const token = "tok-slow-client"
	rec, hook := newReceiver(t, 0)
	c := serve(t, filepath.Join(t.TempDir(), "sluice.db"), token, "--drain-timeout", "1s")
	c.addSubscriber(hook, map[string]float64{"per_second": 5, "burst": 1})
	events := make([]map[string]any, 50)
	for i := range events {
		events[i] = map[string]any{"id": fmt.Sprintf("paced-%02d", i), "type": "test.paced"}
	}
	c.call(http.MethodPost, "/v1/events/batch", map[string]any{"events": events}, http.StatusAccepted, nil)
	if !eventually(10*time.Second, 5*time.Millisecond, func() bool { return rec.distinct() >= 2 }) {
		t.Fatal("the paced deliveries did not start within 10s")
	}

	// A client that sends its headers and half its body, then nothing.
	u, err := url.Parse(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/events HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"type\":",
		u.Host, token)
	// A request on another connection, answered after this one was
	// accepted, lets the server get to reading it.
	if status, body := c.request(http.MethodGet, "/healthz", "", nil); status != http.StatusOK {
		t.Fatalf("GET /healthz %d: %s", status, body)
	}

	sentAt := time.Now()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, exited := c.waitExit(10 * time.Second)
	took := time.Since(sentAt)
	if !exited || code != 0 {
		t.Fatalf("after SIGTERM with a request still arriving: exited %v with status %d after %v, want 0 soon after the 1s drain timeout",
			exited, code, took.Round(time.Millisecond))
	}
	if took > 5*time.Second {
		t.Errorf("took %v to exit, want about the 1s drain timeout", took.Round(time.Millisecond))
	}
	// At 5/s with a burst of 1, one attempt may be out when the signal
	// comes; a dispatcher that kept claiming through the second of drain
	// would have sent about five more.
	arrivals, _, _, _ := rec.snapshot()
	var after []string
	for id, at := range arrivals {
		for _, a := range at {
			if a.After(sentAt) {
				after = append(after, fmt.Sprintf("%s at +%v", id, a.Sub(sentAt).Round(time.Millisecond)))
			}
		}
	}
	if len(after) > 1 {
		t.Errorf("%d deliveries arrived after SIGTERM (%v): the dispatcher kept claiming", len(after), after)
	}
}

// runSluice runs a sluice command to its end (30s at most).
func runSluice(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, sluiceBin, args...)
	cmd.Dir = t.TempDir()
	cmd.Env = childEnv(env...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("sluice %s did not finish within 30s", strings.Join(args, " "))
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("sluice %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}

// TestMigrate: migrate creates the database (and its folder), lists what it
// applied, and says so when there is nothing left to apply.
func TestMigrate(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "nested", "folder", "sluice.db")
	applied := regexp.MustCompile(`^sluice: applied (\d+_\w+\.sql)$`)

	out, errOut, code := runSluice(t, nil, "migrate", "--db", db)
	if code != 0 {
		t.Fatalf("migrate on a fresh database: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		m := applied.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("migrate on a fresh database printed %q, want only \"sluice: applied NNNN_name.sql\" lines", line)
			continue
		}
		names = append(names, m[1])
	}
	if len(names) == 0 || !strings.HasPrefix(names[0], "0001_") {
		t.Errorf("migrate on a fresh database applied %v, want the migrations from 0001 on", names)
	}
	if _, err := os.Stat(db); err != nil {
		t.Errorf("migrate did not create the database: %v", err)
	}

	out, errOut, code = runSluice(t, nil, "migrate", "--db", db)
	if code != 0 {
		t.Fatalf("second migrate: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "up to date") || strings.Contains(out, "applied") {
		t.Errorf("second migrate printed %q, want only that the database is up to date", out)
	}

	// serve accepts the migrated database as is.
	c := serve(t, db, "tok-migrate")
	if status, body := c.request(http.MethodGet, "/healthz", "", nil); status != http.StatusOK {
		t.Errorf("serve on a migrated database: GET /healthz %d: %s", status, body)
	}
}

// TestServeRunsOnTheDefaultDatabase: with no --db, serve makes and opens
// ./data/sluice.db where it runs, as `make run` does on a fresh clone.
func TestServeRunsOnTheDefaultDatabase(t *testing.T) {
	t.Parallel()
	c := launch(t, []string{"serve", "--addr", "127.0.0.1:0", "--api-token", "tok-default"})
	c.waitListening()
	if status, body := c.request(http.MethodGet, "/healthz", "", nil); status != http.StatusOK {
		t.Errorf("GET /healthz %d: %s", status, body)
	}
	if _, err := os.Stat(filepath.Join(c.cmd.Dir, "data", "sluice.db")); err != nil {
		t.Errorf("no database at ./data/sluice.db: %v", err)
	}
}

var generatedTokenRE = regexp.MustCompile(`(?m)^\s+(sk_[0-9a-f]{48})$`)

// TestGeneratedTokenIsShownOnceAndOnlyItsDigestIsKept: serve without a
// token prints a generated one; it opens /v1, survives a restart without
// being printed again, and the database file never holds it.
func TestGeneratedTokenIsShownOnceAndOnlyItsDigestIsKept(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "sluice.db")
	first := serve(t, db, "")
	m := generatedTokenRE.FindStringSubmatch(first.Stdout())
	if m == nil {
		t.Fatalf("no generated token on stdout:\n%s", first.Stdout())
	}
	token := m[1]
	if status, body := first.request(http.MethodGet, "/v1/stats", token, nil); status != http.StatusOK {
		t.Fatalf("GET /v1/stats with the generated token: %d %s", status, body)
	}
	if status, _ := first.request(http.MethodGet, "/v1/stats", token+"0", nil); status != http.StatusUnauthorized {
		t.Fatalf("GET /v1/stats with a wrong token: %d, want 401", status)
	}
	if err := first.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, exited := first.waitExit(10 * time.Second); !exited || code != 0 {
		t.Fatalf("after SIGTERM: exited %v, code %d", exited, code)
	}

	second := serve(t, db, "")
	if strings.Contains(second.Stdout(), token) || generatedTokenRE.MatchString(second.Stdout()) {
		t.Errorf("the restart printed a token:\n%s", second.Stdout())
	}
	if status, body := second.request(http.MethodGet, "/v1/stats", token, nil); status != http.StatusOK {
		t.Fatalf("GET /v1/stats after the restart: %d %s", status, body)
	}
	for _, f := range []string{db, db + "-wal"} {
		b, err := os.ReadFile(f)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		if strings.Contains(string(b), token) {
			t.Errorf("%s holds the token in plaintext", filepath.Base(f))
		}
	}
}

// The version make build stamps with -X is the one the binary reports (and
// puts in every subscriber's user-agent): -X sets only a variable whose
// initial value is a constant.
func TestStampedVersionIsReported(t *testing.T) {
	t.Parallel()
	out, errOut, code := runSluice(t, nil, "version")
	if code != 0 || strings.TrimSpace(out) != "sluice "+stampedVersion {
		t.Errorf("sluice version: exit %d, %q %q; want \"sluice %s\"", code, out, errOut, stampedVersion)
	}
}

// A client command cut short by Ctrl-C exits 130, as shells report an
// interrupted command: not 1 (the API refused) nor 3 (unreachable),
// whether it was waiting for the answer or reading it.
func TestAnInterruptedClientExits130(t *testing.T) {
	t.Parallel()
	for name, answer := range map[string]string{
		"waiting for the answer": "",
		"reading the answer":     "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		accepted := make(chan net.Conn, 1)
		go func() {
			if c, err := ln.Accept(); err == nil {
				c.Read(make([]byte, 4096)) // the request
				c.Write([]byte(answer))    // then held open, never finished
				accepted <- c
			}
		}()
		cmd := exec.Command(sluiceBin, "stats", "--url", "http://"+ln.Addr().String())
		cmd.Env = childEnv()
		var errOut strings.Builder
		cmd.Stderr = &errOut
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		select {
		case c := <-accepted:
			defer c.Close()
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("%s: the client never connected", name)
		}
		time.Sleep(100 * time.Millisecond) // let it read what was sent
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
		if code := cmd.ProcessState.ExitCode(); code != 130 {
			t.Errorf("%s: exit %d after Ctrl-C, want 130\n%s", name, code, errOut.String())
		}
	}
}
