package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
)

func TestBenchFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"bench", "--only", "ingest,bogus"},
		{"bench", "--pending", "0"},
		{"bench", "--ingest-for", "2h"},
		{"bench", "--latency-rate", "1000000"},
		{"bench", "extra"},
	} {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), args, &out, &errOut); !errors.Is(err, errUsage) {
			t.Errorf("run %q = %v, want a usage error", args, err)
		}
	}
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"bench", "--help"}, &out, &errOut)
	if !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "Usage: go run ./loadtest bench") || errOut.Len() > 0 {
		t.Errorf("bench --help = %v, want its usage on stdout alone:\n%s\nstderr: %s", err, out.String(), errOut.String())
	}
}
