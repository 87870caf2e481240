// Command sluice is the origin of the sluice webhook delivery system: the
// server (serve), its schema tool (migrate), and a client of its API.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
)

// version is stamped by make build (-ldflags "-X main.version=…", which
// only sets a variable initialised to a constant); a plain go build in a
// checkout takes the commit Go records in the binary, in init.
var version = "dev"

func init() { version = builtVersion(version, debug.ReadBuildInfo) }

// builtVersion is stamped unless it is "dev" and the build recorded its
// commit: then the commit's first 12 digits, with "-dirty" for changes
// beside it, as git describe --always --dirty names it.
func builtVersion(stamped string, read func() (*debug.BuildInfo, bool)) string {
	info, ok := read()
	if stamped != "dev" || !ok {
		return stamped
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value[:min(12, len(s.Value))]
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "-dirty"
		}
	}
	if rev == "" {
		return stamped
	}
	return rev + dirty
}

func main() {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		// The first signal starts a graceful stop; restoring the default
		// handling lets a second one end the process at once.
		signal.Stop(sigs)
		cancel(signalled{sig})
	}()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "sluice:", err)
		os.Exit(exitStatusAfter(err, context.Cause(ctx)))
	}
}

// signalled is the cause of a stop a signal asked for.
type signalled struct{ sig os.Signal }

func (s signalled) Error() string { return "stopped by " + s.sig.String() }

const usage = `sluice delivers webhooks without exceeding any subscriber's rate,
losing an event, or letting one subscriber starve the others.

Usage:
  sluice serve [flags]     run the origin: API, dispatcher, workers
  sluice migrate [flags]   apply database migrations and exit
  sluice version           print the version

Client commands (talk to a running origin's API):
  sluice subscribers add|list|show|rm     manage subscribers
  sluice subscribers pause|resume|rotate-secret ID
                                          hold or release one; give it a new secret
  sluice send --type TYPE [--data JSON | --file PATH|-]
                                          send one event
  sluice deliveries [--status S] [--subscriber ID]
                                          list deliveries, newest first
  sluice deliveries show ID               one delivery with its attempt history
  sluice dlq list|retry ID|recover SUB --since TIME
                                          the dead-letter queue
  sluice stats                            per-subscriber counts, success rate, latency
  sluice health                           whether the origin and its database answer

Edge commands (talk to Cloudflare's API; CLOUDFLARE_ACCOUNT_ID, CLOUDFLARE_API_TOKEN):
  sluice edge put-secret|status           put SLUICE_EDGE_SECRET on the Worker; show its deployment

Environment (a flag wins over its variable):
  SLUICE_URL         the API the client commands call: --url (--api-url for subscribers add,
                     whose --url is the endpoint); default http://127.0.0.1:8080
  SLUICE_API_TOKEN   --api-token: the bearer token serve uses and the clients send
  SLUICE_<FLAG>      every flag of serve and migrate, e.g. SLUICE_DB for --db

Client commands print aligned tables; --json prints the API's JSON.
Exit status: 0 ok, 1 the API refused or failed, 2 usage error, 3 cannot reach the API,
128 + the signal's number when SIGINT (130) or SIGTERM (143) cut it short.

Run "sluice COMMAND --help" for a command's flags.
`

// run is main without the process: arguments, environment and output are
// passed in so tests can drive every command.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	if asksHelp(args[1:]) {
		// Help asked for is the output, so it goes where output goes and
		// can be piped; a usage printed for a mistake stays on stderr.
		stderr = stdout
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:], getenv, stdout, stderr)
	case "migrate":
		return migrate(ctx, args[1:], getenv, stdout, stderr)
	case "subscribers", "send", "deliveries", "dlq", "stats", "health":
		return client(ctx, args, getenv, os.Stdin, stdout, stderr)
	case "edge":
		return edge(ctx, args[1:], getenv, stdout, stderr)
	case "version", "--version":
		if len(args) > 1 && (args[1] == "-h" || args[1] == "-help" || args[1] == "--help") {
			fmt.Fprintln(stdout, "Usage: sluice version\n\nPrints sluice's version.")
			return nil
		}
		fmt.Fprintln(stdout, "sluice", version)
		return nil
	case "help", "-h", "--help":
		if len(args) > 1 && args[0] == "help" {
			// "sluice help serve" is "sluice serve --help".
			return run(ctx, []string{args[1], "--help"}, getenv, stdout, stderr)
		}
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
