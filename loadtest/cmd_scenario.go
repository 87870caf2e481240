package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/sluice-dev/sluice/loadtest/scenario"
)

// commonFlags are the flags every scenario takes.
type commonFlags struct {
	o         scenario.Options
	jsonOut   string
	sluiceLog string
	workers   int
	live      bool
	verbose   bool
}

func (c *commonFlags) register(fs interface {
	StringVar(*string, string, string, string)
	IntVar(*int, string, int, string)
	DurationVar(*time.Duration, string, time.Duration, string)
	Uint64Var(*uint64, string, uint64, string)
	BoolVar(*bool, string, bool, string)
}, events int, timeout time.Duration, withSluice bool) {
	if withSluice { // naive runs no sluice
		fs.StringVar(&c.o.Sluice, "sluice", "", "the sluice binary (default: go build ./origin/cmd/sluice into a temp folder)")
		fs.IntVar(&c.workers, "workers", 0, "sluice serve --workers (0: sluice's default)")
		fs.StringVar(&c.sluiceLog, "sluice-log", "", "write sluice's own log (its stderr) to this file")
		// The live view reads sluice's stats; naive has none to show.
		fs.BoolVar(&c.live, "live", false, "show per-subscriber progress every second")
	}
	fs.IntVar(&c.o.Events, "events", events, "events to send (canal: one burst; chaos: batches over the run)")
	fs.DurationVar(&c.o.Timeout, "timeout", timeout, "how long to wait for deliveries (bounded run)")
	fs.StringVar(&c.jsonOut, "json", "", "also write the result as JSON to this file")
	fs.Uint64Var(&c.o.Seed, "seed", 1, "seed of the partners' faults")
	fs.DurationVar(&c.o.Jitter, "jitter", 50*time.Millisecond, "arrival-time spread the rate check allows for")
	fs.BoolVar(&c.verbose, "v", false, "log the harness's steps to stderr")
}

// Bounds the commands hold flags to, so that a typo cannot start a million
// goroutines or make a rate check pass or fail whatever happened.
const (
	maxLoops  = 4096        // naive loops, sluice workers
	maxJitter = time.Second // arrival spread a rate check allows for
	maxRate   = 1_000_000   // an advertised rate or burst
)

// checkJitter holds --jitter between 0 and maxJitter: a negative one fails
// every window, and a large one lets any rate pass.
func checkJitter(d time.Duration) error {
	if d < 0 || d > maxJitter {
		return fmt.Errorf("--jitter must be 0 to %s: %w", maxJitter, errUsage)
	}
	return nil
}

func (c *commonFlags) apply(stdout, stderr io.Writer) error {
	if err := checkJSONOut(c.jsonOut); err != nil {
		return err
	}
	if c.o.Events <= 0 || c.o.Events > 1_000_000 {
		return fmt.Errorf("--events must be between 1 and 1,000,000: %w", errUsage)
	}
	if c.o.Timeout <= 0 || c.o.Timeout > 2*time.Hour {
		return fmt.Errorf("--timeout must be between 0 and 2h: %w", errUsage)
	}
	if err := checkJitter(c.o.Jitter); err != nil {
		return err
	}
	if c.workers < 0 || c.workers > maxLoops {
		return fmt.Errorf("--workers must be 0 (sluice's default) to %d: %w", maxLoops, errUsage)
	}
	if c.workers > 0 {
		c.o.ServeArgs = append(c.o.ServeArgs, "--workers", strconv.Itoa(c.workers))
	}
	if c.live {
		c.o.Live = stdout
		f, ok := stdout.(*os.File)
		c.o.LiveTTY = ok && isTTY(f)
		if c.o.LiveTTY {
			c.o.LiveWidth = termWidth(f)
		}
	}
	if c.verbose {
		c.o.Log = stderr
		f, ok := stderr.(*os.File)
		c.o.LogTTY = ok && isTTY(f)
	}
	if c.sluiceLog != "" {
		f, err := os.Create(c.sluiceLog)
		if err != nil {
			return err
		}
		// Closed by the process's exit; sluice writes to it until then.
		c.o.SluiceLog = f
	}
	return nil
}

func runCanal(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("scenario canal", "The seed's incident end to end: starts a real `sluice serve` on a temp database and five\n"+
		"partners on 127.0.0.1 — partner-dash (advertises 10/s burst 20, 429s beyond it and bans clients that\n"+
		"ignore Retry-After), slack-relay (answers in 2 s), analytics-a and analytics-b (fast), crm (random 500s,\n"+
		"resets and timeouts) — subscribes them with the rates they advertise, posts --events video.trending\n"+
		"events in one burst through /v1/events/batch, waits up to --timeout for every delivery to reach its\n"+
		"partner or the dead letters, and prints a per-subscriber table.\n\n"+
		"An event is lost only when it was neither delivered, nor still pending or in flight in sluice, nor\n"+
		"dead-lettered. Exit status 1 when anything was lost, an advertised rate was exceeded, a signed body was\n"+
		"not its event, or a subscriber too slow to drain got under half of what its rate and answer time allowed.\n\n"+
		"--edge also builds the edge Worker and runs it in workerd through Miniflare (run from the repository\n"+
		"root after `npm ci`), serves sluice with --edge-types video.view_milestone, subscribes every partner to\n"+
		"both types, and puts a video.view_milestone event after every four video.trending ones in the burst:\n"+
		"those go through the Worker, and each partner's rate still holds summed over both lanes.", stderr)
	var c commonFlags
	c.register(fs, 12000, 60*time.Second, true)
	fs.BoolVar(&c.o.Edge, "edge", false, "also route video.view_milestone events through a local edge Worker (needs Node and the npm packages: npm ci)")
	var withNaive bool
	var naiveWorkers int
	fs.BoolVar(&withNaive, "naive", false, "then run the seed's naive loop against fresh partners and print both tables")
	fs.IntVar(&naiveWorkers, "naive-workers", 64, "loops the naive run uses")
	if err := parse(fs, args); err != nil {
		return err
	}
	if naiveWorkers < 1 || naiveWorkers > maxLoops {
		return fmt.Errorf("--naive-workers must be 1 to %d: %w", maxLoops, errUsage)
	}
	if c.o.Edge && withNaive {
		return fmt.Errorf("--naive compares the video.trending burst alone; run it without --edge: %w", errUsage)
	}
	if err := c.apply(stdout, stderr); err != nil {
		return err
	}
	if c.o.Live != nil {
		fmt.Fprintf(stdout, "sluice canal demo: %d video.trending events in one burst to 5 subscribers; up to %s\n\n", c.o.Events, c.o.Timeout)
		if c.o.Edge {
			fmt.Fprintf(stdout, "with a video.view_milestone event after every four, through a local edge Worker\n\n")
		}
	}
	res, err := scenario.Canal(ctx, c.o)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	if err := res.Write(stdout); err != nil {
		return err
	}
	out := any(res)
	if withNaive {
		nres, err := scenario.Naive(ctx, c.o, naiveWorkers)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout)
		if err := nres.Write(stdout); err != nil {
			return err
		}
		out = map[string]any{"canal": res, "naive": nres}
	}
	if err := writeJSON(c.jsonOut, out); err != nil {
		return err
	}
	if !res.Pass {
		return errFailed
	}
	return nil
}

func runChaos(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("scenario chaos", "A bounded run under faults: a real `sluice serve` and five partners (the banning 10/s one,\n"+
		"a fast sink, a flaky CRM, a 300 ms relay, and one that refuses connections then answers 503 mid-run).\n"+
		"--events arrive in batches over the first 60% of --duration while the harness kill -9s and restarts\n"+
		"sluice --kills times; then it waits up to --timeout for the subscribers (all but the 10/s one) to drain.\n"+
		"Passes when nothing is lost, no advertised rate is exceeded and there are no more duplicates than\n"+
		"deliveries in flight at the kills. sluice runs with --retry-base 250ms --retry-cap 5s\n"+
		"--breaker-cooldown 3s so faults heal within the run.", stderr)
	var c commonFlags
	c.register(fs, 3000, 60*time.Second, true)
	var co scenario.ChaosOptions
	fs.DurationVar(&co.Duration, "duration", 30*time.Second, "the phase with events, kills and outages")
	fs.IntVar(&co.Kills, "kills", 3, "kill -9 and restart sluice this many times")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := c.apply(stdout, stderr); err != nil {
		return err
	}
	if co.Duration < 5*time.Second || co.Duration > time.Hour || co.Kills < 1 || co.Kills > 100 {
		return fmt.Errorf("--duration must be 5s to 1h (sluice starts again after each kill) and --kills between 1 and 100: %w", errUsage)
	}
	co.Options = c.o
	res, err := scenario.Chaos(ctx, co)
	if err != nil {
		return err
	}
	if err := res.Write(stdout); err != nil {
		return err
	}
	if err := writeJSON(c.jsonOut, res); err != nil {
		return err
	}
	if !res.Pass {
		return errFailed
	}
	return nil
}

func runNaive(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("naive", "The seed's starting point, for comparison: dequeue an event, POST it to the subscriber, move on —\n"+
		"no rate limit, no Retry-After, no retries. Runs against the same five partners as the canal scenario\n"+
		"and reports what it lost and how hard it hammered the 10/s partner. Its failures are the point: the\n"+
		"exit status is 0 unless the harness itself fails.", stderr)
	var c commonFlags
	c.register(fs, 12000, 60*time.Second, false)
	var workers int
	fs.IntVar(&workers, "loops", 64, "naive loops running side by side")
	if err := parse(fs, args); err != nil {
		return err
	}
	if workers < 1 || workers > maxLoops {
		return fmt.Errorf("--loops must be 1 to %d: %w", maxLoops, errUsage)
	}
	if err := c.apply(stdout, stderr); err != nil {
		return err
	}
	res, err := scenario.Naive(ctx, c.o, workers)
	if err != nil {
		return err
	}
	if err := res.Write(stdout); err != nil {
		return err
	}
	return writeJSON(c.jsonOut, res)
}
