// Command loadtest is sluice's load and chaos harness: fake partners, floods,
// the seed's canal burst and chaos runs against a real `sluice serve`, and the
// seed's naive loop for comparison. It only ever talks to 127.0.0.1, and every
// run is bounded in count and time.
//
//	go run ./loadtest flood --url http://127.0.0.1:9000/hooks/x --workers 64 --duration 10s
//	go run ./loadtest partner --behaviour limited --rate 10 --burst 20
//	go run ./loadtest scenario canal --events 12000 --timeout 60s --json out.json
//	go run ./loadtest scenario chaos --kills 3
//	go run ./loadtest naive --events 12000
//	go run ./loadtest bench --json bin/bench.json
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// errUsage marks a command-line mistake (exit status 2); errFailed a run
// that broke a promise (exit status 1).
var (
	errUsage  = errors.New("usage error")
	errFailed = errors.New("the run failed")
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	interrupted := ctx.Err() != nil
	stop()
	switch {
	case err == nil:
	case interrupted:
		fmt.Fprintln(os.Stderr, "loadtest: interrupted; everything it started is stopped")
		os.Exit(130)
	case errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(2)
	case errors.Is(err, errFailed):
		os.Exit(1)
	default:
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
}

const scenarioUsage = `Usage: go run ./loadtest scenario canal|chaos [flags]

  canal   the seed's burst (12,000 video.trending events) through a real sluice
  chaos   kill -9 restarts of sluice and partner outages under load

Run "loadtest scenario canal --help" or "loadtest scenario chaos --help" for the flags.
`

const usage = `Usage: go run ./loadtest <command> [flags]

sluice's load and chaos harness. Loopback only; every run is bounded.

Commands:
  flood            N workers hammer a loopback URL for a bounded time
  partner          serve one fake subscriber on 127.0.0.1 and report what it saw
  scenario canal   the seed's burst (12,000 video.trending events) through a real sluice
  scenario chaos   kill -9 restarts of sluice and partner outages under load
  naive            the seed's naive loop against the canal partners, for comparison
  bench            this build's numbers on this machine in one table (what make bench runs)
  relay            a bare HTTP relay with no ledger: the latency floor bench compares sluice with

Run "go run ./loadtest <command> --help" for a command's flags.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("no command: %w", errUsage)
	}
	if asksHelp(args[1:]) {
		stderr = stdout // help asked for is the output; a usage after a mistake is not
	}
	switch args[0] {
	case "flood":
		return runFlood(ctx, args[1:], stdout, stderr)
	case "partner":
		return runPartner(ctx, args[1:], stdout, stderr)
	case "scenario":
		if len(args) < 2 {
			fmt.Fprint(stderr, scenarioUsage)
			return fmt.Errorf("scenario needs a name (canal or chaos): %w", errUsage)
		}
		switch args[1] {
		case "canal":
			return runCanal(ctx, args[2:], stdout, stderr)
		case "chaos":
			return runChaos(ctx, args[2:], stdout, stderr)
		case "-h", "--help", "help":
			fmt.Fprint(stdout, scenarioUsage)
			return flag.ErrHelp
		}
		return fmt.Errorf("unknown scenario %q (canal or chaos): %w", args[1], errUsage)
	case "naive":
		return runNaive(ctx, args[1:], stdout, stderr)
	case "bench":
		return runBench(ctx, args[1:], stdout, stderr)
	case "relay":
		return runRelay(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q: %w", args[0], errUsage)
}

// asksHelp reports whether args hold -h or --help before any "--".
func asksHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "--h", "-help", "--help":
			return true
		}
	}
	return false
}

// newFlags returns a flag set whose usage names the command and says what it does.
func newFlags(name, summary string, w io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(w)
	fs.Usage = func() {
		fmt.Fprintf(w, "Usage: go run ./loadtest %s [flags]\n\n%s\n\nFlags:\n", name, summary)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args; a mistake is a usage error.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%v: %w", err, errUsage)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: %w", fs.Arg(0), errUsage)
	}
	return nil
}

// isTTY reports whether f is a terminal that understands ANSI escapes.
func isTTY(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0 && os.Getenv("TERM") != "dumb"
}
