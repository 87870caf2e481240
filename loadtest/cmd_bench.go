package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/loadtest/bench"
	"github.com/sluice-dev/sluice/loadtest/instance"
)

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench", "This build's numbers on this machine, in one table: ingest (64 single-event clients; batches\n"+
		"of 1,000), deliveries/s end to end to a loopback receiver, p50/p99 enqueue→delivery at a fixed 5,000/s\n"+
		"(beside a bare relay's under the same load: this machine's floor), rate-cap accuracy over the 10 s\n"+
		"after a burst, ledger row writes per delivery while throttled, RSS and p99 claim latency with\n"+
		"1,000,000 deliveries pending, and the canal scenario beside the naive loop.\n"+
		"Every measurement starts its own `sluice serve` on a temp database and talks to it over HTTP on\n"+
		"127.0.0.1. About 3½ minutes on 2 cores. A missed target is a ✗ in the table, not a failure: the exit\n"+
		"status is 0 unless a measurement could not be taken.", stderr)
	var (
		o       bench.Options
		jsonOut string
		only    string
		workers int
	)
	fs.StringVar(&o.Sluice, "sluice", "", "the sluice binary (default: go build ./origin/cmd/sluice into a temp folder)")
	fs.StringVar(&jsonOut, "json", "", "also write the result as JSON to this file")
	fs.StringVar(&only, "only", "", "run only these sections, comma-separated: "+strings.Join(bench.Sections, ","))
	fs.IntVar(&workers, "workers", 0, "sluice serve --workers (0: sluice's default)")
	fs.DurationVar(&o.IngestFor, "ingest-for", 5*time.Second, "how long each ingest measurement runs")
	fs.IntVar(&o.Backlog, "backlog", 50_000, "events of the end-to-end delivery run")
	fs.IntVar(&o.LatencyRate, "latency-rate", 5000, "offered single-event POSTs per second in the latency run")
	fs.DurationVar(&o.LatencyFor, "latency-for", 5*time.Second, "measured part of the latency run (after a 1 s warm-up)")
	fs.IntVar(&o.Pending, "pending", 1_000_000, "deliveries pending in the memory and claim run")
	fs.DurationVar(&o.ClaimFor, "claim-for", 5*time.Second, "how long the unpaused backlog claims before the histogram is read")
	fs.IntVar(&o.CanalEvents, "canal-events", 12000, "events in the canal burst")
	fs.DurationVar(&o.CanalTimeout, "canal-timeout", 60*time.Second, "bound of the canal run and of the naive loop")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := checkJSONOut(jsonOut); err != nil {
		return err
	}
	switch {
	case o.IngestFor <= 0 || o.IngestFor > 5*time.Minute,
		o.LatencyFor <= 0 || o.LatencyFor > 5*time.Minute,
		o.ClaimFor <= 0 || o.ClaimFor > 5*time.Minute,
		o.CanalTimeout <= 0 || o.CanalTimeout > 30*time.Minute:
		return fmt.Errorf("--ingest-for, --latency-for and --claim-for must be between 0 and 5m, --canal-timeout at most 30m: %w", errUsage)
	case o.Backlog < 1 || o.Backlog > 10_000_000, o.Pending < 1 || o.Pending > 10_000_000,
		o.LatencyRate < 1 || o.LatencyRate > 100_000, o.CanalEvents < 1 || o.CanalEvents > 1_000_000:
		return fmt.Errorf("--backlog and --pending must be 1 to 10,000,000, --latency-rate 1 to 100,000, --canal-events 1 to 1,000,000: %w", errUsage)
	}
	if only != "" {
		o.Only = strings.Split(only, ",")
		for _, name := range o.Only {
			if !slices.Contains(bench.Sections, name) {
				return fmt.Errorf("--only: no section %q (have %s): %w", name, strings.Join(bench.Sections, ","), errUsage)
			}
		}
	}
	// The latency section runs this program's relay command as the floor.
	if exe, err := os.Executable(); err == nil {
		o.Relay = exe
	}
	if workers > 0 {
		o.ServeArgs = append(o.ServeArgs, "--workers", strconv.Itoa(workers))
	}
	if o.Sluice == "" {
		dir, err := os.MkdirTemp("", "sluice-bench-bin-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		o.Sluice = filepath.Join(dir, "sluice")
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		fmt.Fprintln(stderr, "bench: building sluice")
		if err := instance.Build(ctx, wd, o.Sluice); err != nil {
			return err
		}
	}
	o.Progress = stderr
	res, err := bench.Run(ctx, o)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	if err := res.Write(stdout); err != nil {
		return err
	}
	if err := writeJSON(jsonOut, res); err != nil {
		return err
	}
	if len(res.Errors) > 0 {
		return errFailed
	}
	return nil
}
