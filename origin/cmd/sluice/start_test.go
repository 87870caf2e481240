package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A stop signalled while serve is still starting (migrating, say) is a stop
// like one while serving: exit 0, with the ledger left whole.
func TestASignalWhileStartingIsAStop(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the signal came before the database was opened
	db := filepath.Join(t.TempDir(), "s.db")
	var out, errOut bytes.Buffer
	err := run(ctx, []string{"serve", "--db", db, "--addr", "127.0.0.1:0", "--api-token", "t"}, func(string) string { return "" }, &out, &errOut)
	if err != nil {
		t.Fatalf("serve stopped while starting: %v (exit %d); want exit 0\n%s", err, exitStatus(err), errOut.String())
	}
	if !strings.Contains(errOut.String(), "stopped by a signal while starting") {
		t.Errorf("stderr does not say why it stopped:\n%s", errOut.String())
	}
	// What did run of the migrations committed whole: a later start opens it.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	var out2 bytes.Buffer
	if err := run(ctx2, []string{"migrate", "--db", db}, func(string) string { return "" }, &out2, &errOut); err != nil {
		t.Fatalf("migrate after the stop: %v", err)
	}
}

// The shell that runs the Worker locally exports SLUICE_EDGE_SECRET; a
// plain serve there has no edge lane and says so, rather than refusing.
func TestAnEdgeSecretWithoutAURLIsOnlyAWarning(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	env := map[string]string{"SLUICE_EDGE_SECRET": edgeTestSecret}
	var out, errOut bytes.Buffer
	err := run(ctx, []string{"serve", "--db", filepath.Join(t.TempDir(), "s.db"), "--addr", "127.0.0.1:0", "--api-token", "t"},
		func(k string) string { return env[k] }, &out, &errOut)
	if err != nil {
		t.Fatalf("serve with SLUICE_EDGE_SECRET alone: %v; want it to start without an edge lane", err)
	}
	if !strings.Contains(errOut.String(), "no effect without --edge-url") {
		t.Errorf("no warning that the secret does nothing:\n%s", errOut.String())
	}
	err = run(ctx, []string{"serve", "--db", filepath.Join(t.TempDir(), "s.db"), "--edge-url", "http://127.0.0.1:9"},
		func(string) string { return "" }, &out, &errOut)
	if exitStatus(err) != 2 || !strings.Contains(err.Error(), "--edge-url needs --edge-secret") {
		t.Errorf("serve with --edge-url alone: %v; want a usage error naming the secret", err)
	}
}

// Only the stop itself exits 0: a start that failed for its own reason
// (here a busy port) fails, signal or not.
func TestASignalDoesNotHideAFailedStart(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errOut bytes.Buffer
	err = run(ctx, []string{"serve", "--db", filepath.Join(t.TempDir(), "s.db"), "--addr", busy.Addr().String(), "--api-token", "t"},
		func(string) string { return "" }, &out, &errOut)
	if err == nil || exitStatus(err) == 0 {
		t.Fatalf("serve on a busy port with a signal in: %v; want the failure", err)
	}
}

// The exit status of a command a signal cut short is the shell's 128 + the
// signal; any other failure keeps its own, signal or not.
func TestExitStatusAfterASignal(t *testing.T) {
	t.Parallel()
	cut := fmt.Errorf("GET /v1/stats: interrupted: %w", context.Canceled)
	refused := &apiError{Status: 401, Code: "unauthorized", Message: "no"}
	for _, tc := range []struct {
		err   error
		cause error
		want  int
	}{
		{cut, signalled{syscall.SIGINT}, 130},
		{cut, signalled{syscall.SIGTERM}, 143},
		{refused, signalled{syscall.SIGINT}, 1},
		{cut, nil, 1},
		{fmt.Errorf("x: %w", errUsage), signalled{syscall.SIGTERM}, 2},
	} {
		if got := exitStatusAfter(tc.err, tc.cause); got != tc.want {
			t.Errorf("exitStatusAfter(%v, %v) = %d, want %d", tc.err, tc.cause, got, tc.want)
		}
	}
}
