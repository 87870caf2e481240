package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
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
