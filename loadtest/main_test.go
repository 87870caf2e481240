package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestRunUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		nil,
		{"bogus"},
		{"scenario"},
		{"scenario", "flood"},
		{"flood"},
		{"flood", "--url", "http://192.0.2.1/hook"},
		{"flood", "--url", "http://127.0.0.1:9/", "--duration", "-1s"},
		{"flood", "--url", "http://127.0.0.1:9/", "--workers", "0"},
		{"flood", "--url", "http://127.0.0.1:9/", "--requests", "0"},
		{"flood", "--url", "http://127.0.0.1:9/v1/deliver", "--to", "http://127.0.0.1:9/hook"}, // no --secret
		{"flood", "--url", "http://127.0.0.1:9/v1/deliver", "--to", "http://192.0.2.1/hook", "--secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
		{"naive", "--sluice", "bin/sluice"}, // naive runs no sluice
		{"naive", "--live"},                 // nor the live view of its stats
		{"scenario", "canal", "--edge", "--naive"},
		{"scenario", "canal", "--events", "0"},
		{"partner", "--behaviour", "grumpy"},
		{"scenario", "chaos", "--kills", "0"},
		{"scenario", "chaos", "--duration", "1ns"},
		{"scenario", "canal", "--jitter", "-3s"},
		{"scenario", "canal", "--jitter", "1h"},
		{"scenario", "canal", "--workers", "100000000"},
		{"scenario", "canal", "--naive-workers", "0"},
		{"naive", "--loops", "-1"},
		{"partner", "--jitter", "-5s"},
		{"partner", "--behaviour", "limited", "--rate", "1e308", "--burst", "1e308"},
		{"partner", "--rate", "-5", "--burst", "-3"},
		{"partner", "--error", "2"},
		{"partner", "--error", "0.6", "--reset", "0.6"},
		{"partner", "--ban-for", "-1s"},
		{"partner", "--ban-after", "-3"},
		{"partner", "--delay", "-1s"},
		{"relay"},
		{"relay", "--to", "http://192.0.2.1/hook"},
		{"flood", "--url", "http://127.0.0.1:9/", "--secret", "nope"},
		{"flood", "--url", "http://127.0.0.1:9/", "--json", "/nonexistent-folder/x.json"},
		{"scenario", "canal", "--json", "/nonexistent-folder/x.json"},
		{"bench", "--json", "/nonexistent-folder/x.json"},
		{"partner", "--json", "/nonexistent-folder/x.json"},
	} {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), args, &out, &errOut); !errors.Is(err, errUsage) {
			t.Errorf("run %q = %v, want a usage error", args, err)
		}
	}
}

func TestEveryCommandHasHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"flood", "--help"}, {"partner", "--help"}, {"scenario", "canal", "--help"},
		{"scenario", "chaos", "--help"}, {"naive", "--help"}, {"relay", "--help"}, {"scenario", "--help"},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), args, &out, &errOut)
		// Help asked for is output: on stdout, with nothing on stderr.
		if !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "Usage: go run ./loadtest "+strings.Join(args[:len(args)-1], " ")) || errOut.Len() > 0 {
			t.Errorf("run %q = %v, help:\n%s\nstderr: %s", args, err, out.String(), errOut.String())
		}
	}
}

// A flood at an endpoint that never answers says so and fails too: its
// requests, cut off by the end of the run, are counted as unanswered.
func TestFloodOfAnEndpointThatNeverAnswersFails(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	mute := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	defer mute.Close()
	defer close(release) // first: Close waits for the handlers
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"flood", "--url", mute.URL, "--duration", "200ms", "--workers", "2", "--timeout", "1h"}, &out, &errOut)
	if !errors.Is(err, errFailed) || !strings.Contains(out.String(), "unanswered=2") {
		t.Errorf("flood of an endpoint that never answers = %v\n%s%s", err, out.String(), errOut.String())
	}
}

// A flood that no request survives says so and fails: a wrong URL is not a
// finding about a limiter.
func TestFloodWithNoAnswerFails(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String() + "/"
	ln.Close() // nothing listens there now
	var out, errOut bytes.Buffer
	err = run(context.Background(), []string{"flood", "--url", url, "--duration", "200ms", "--workers", "2"}, &out, &errOut)
	if !errors.Is(err, errFailed) || !strings.Contains(errOut.String(), "no request got an answer") {
		t.Errorf("flood of a closed port = %v\n%s%s", err, out.String(), errOut.String())
	}
}
