package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
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
		{"scenario", "canal", "--events", "0"},
		{"partner", "--behaviour", "grumpy"},
		{"scenario", "chaos", "--kills", "0"},
		{"relay"},
		{"relay", "--to", "http://192.0.2.1/hook"},
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
		{"scenario", "chaos", "--help"}, {"naive", "--help"}, {"relay", "--help"},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), args, &out, &errOut)
		if !errors.Is(err, flag.ErrHelp) || !strings.Contains(errOut.String(), "Usage: go run ./loadtest "+strings.Join(args[:len(args)-1], " ")) {
			t.Errorf("run %q = %v, help:\n%s", args, err, errOut.String())
		}
	}
}
