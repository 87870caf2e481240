package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/loadtest/partner"
	"github.com/sluice-dev/sluice/loadtest/report"
	"github.com/sluice-dev/sluice/shared/bucket"
	"github.com/sluice-dev/sluice/shared/signature"
)

func runPartner(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("partner", "Serves one fake webhook subscriber on 127.0.0.1 until --duration passes or Ctrl-C, then reports\n"+
		"deliveries, duplicates, missing ids (with --expect-file), the busiest 1-second window against the\n"+
		"advertised rate, and the 429s it sent. Every request's Standard Webhooks signature is verified.\n\n"+
		"Behaviours:\n"+
		"  honest   accepts everything at once\n"+
		"  limited  enforces --rate/--burst itself: 429 + Retry-After beyond it, and a ban (403 for --ban-for)\n"+
		"           after --ban-after requests that ignore a Retry-After\n"+
		"  slow     answers after --delay\n"+
		"  down     refuses connections (--down refuse) or answers 503 (--down 503, with --retry-after)\n"+
		"  flaky    random 500s, resets and timeouts (--error, --reset, --timeouts) from a --seed-ed source", stderr)
	var (
		behaviour, name, secret, addr, down, expectFile, jsonOut string
		rate, burst                                              float64
		cfg                                                      partner.Config
		duration                                                 time.Duration
	)
	fs.StringVar(&behaviour, "behaviour", "honest", "honest, limited, slow, down or flaky")
	fs.StringVar(&name, "name", "partner", "the partner's name (its URL is /hooks/<name>)")
	fs.StringVar(&secret, "secret", "", "the subscriber's whsec_ secret (default: a new one, printed)")
	fs.StringVar(&addr, "addr", "127.0.0.1:0", "loopback address to listen on")
	fs.Float64Var(&rate, "rate", 10, "advertised requests per second (checked in every 1-second window)")
	fs.Float64Var(&burst, "burst", 20, "advertised burst")
	fs.IntVar(&cfg.BanAfter, "ban-after", 5, "limited: requests during a Retry-After that earn a ban (0: never)")
	fs.DurationVar(&cfg.BanFor, "ban-for", time.Hour, "limited: how long a ban lasts")
	fs.DurationVar(&cfg.Delay, "delay", 2*time.Second, "slow: time to answer")
	fs.StringVar(&down, "down", "refuse", "down: refuse (connection refused) or 503")
	fs.DurationVar(&cfg.DownRetryAfter, "retry-after", 0, "down 503: Retry-After to send (0: none)")
	fs.Float64Var(&cfg.Faults.Error, "error", 0.05, "flaky: odds of a 500")
	fs.Float64Var(&cfg.Faults.Reset, "reset", 0.02, "flaky: odds of a connection reset")
	fs.Float64Var(&cfg.Faults.Timeout, "timeouts", 0.01, "flaky: odds of never answering (held up to --hold)")
	fs.DurationVar(&cfg.Faults.Hold, "hold", 30*time.Second, "flaky: how long a timeout holds a request")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "flaky: fault source seed")
	fs.DurationVar(&cfg.Jitter, "jitter", 50*time.Millisecond, "arrival spread the rate check allows for")
	fs.DurationVar(&duration, "duration", 5*time.Minute, "serve this long at most (at most 24h)")
	fs.StringVar(&expectFile, "expect-file", "", "file of expected webhook-ids, one a line, for the missing-id check")
	fs.StringVar(&jsonOut, "json", "", "also write the report as JSON to this file")
	if err := parse(fs, args); err != nil {
		return err
	}
	if duration <= 0 || duration > 24*time.Hour {
		return fmt.Errorf("--duration must be between 0 and 24h: %w", errUsage)
	}
	if err := checkJitter(cfg.Jitter); err != nil {
		return err
	}
	f := cfg.Faults
	switch {
	case !(rate > 0 && rate <= maxRate) || !(burst >= 1 && burst <= maxRate):
		return fmt.Errorf("--rate must be above 0 and --burst at least 1, both at most %d: %w", maxRate, errUsage)
	case cfg.BanAfter < 0 || cfg.BanFor <= 0:
		return fmt.Errorf("--ban-after must be 0 (never) or more and --ban-for positive: %w", errUsage)
	case cfg.Delay < 0 || cfg.DownRetryAfter < 0 || f.Hold < 0:
		return fmt.Errorf("--delay, --retry-after and --hold must not be negative: %w", errUsage)
	case !(f.Error >= 0 && f.Reset >= 0 && f.Timeout >= 0 && f.Error+f.Reset+f.Timeout <= 1):
		return fmt.Errorf("--error, --reset and --timeouts are odds from 0 to 1 that add up to 1 at most: %w", errUsage)
	}
	cfg.Name, cfg.Addr = name, addr
	cfg.Advertised = bucket.Rate{PerSecond: rate, Burst: burst}
	keepFaults := cfg.Faults
	cfg.Faults = partner.Faults{Hold: keepFaults.Hold}
	delay := cfg.Delay
	cfg.Delay = 0
	mode := partner.Up
	switch behaviour {
	case "honest":
	case "limited":
		cfg.Enforce = true
		if !cfg.Advertised.Valid() {
			return fmt.Errorf("limited needs --rate > 0 and --burst ≥ 1: %w", errUsage)
		}
	case "slow":
		cfg.Delay = delay
	case "down":
		switch down {
		case "refuse":
			mode = partner.Refusing
		case "503":
			mode = partner.Unavailable
		default:
			return fmt.Errorf("--down must be refuse or 503: %w", errUsage)
		}
	case "flaky":
		cfg.Faults = keepFaults
	default:
		return fmt.Errorf("unknown --behaviour %q: %w", behaviour, errUsage)
	}
	if secret == "" {
		var err error
		if secret, err = signature.NewSecret(rand.Reader); err != nil {
			return err
		}
	}
	if _, err := signature.DecodeSecret(secret); err != nil {
		return fmt.Errorf("--secret: %v: %w", err, errUsage)
	}
	if err := checkJSONOut(jsonOut); err != nil {
		return err
	}
	cfg.Secret = secret
	var expected []string
	if expectFile != "" {
		b, err := os.ReadFile(expectFile)
		if err != nil {
			return err
		}
		expected = strings.Fields(string(b))
	}

	p, err := partner.Start(cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	if err := p.SetMode(mode); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "partner %s (%s) listening on %s\nsecret %s\nadvertised %g/s burst %g; Ctrl-C or %s to stop\n",
		name, behaviour, p.URL(), secret, rate, burst, duration)
	t := time.NewTimer(duration)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	r := p.Report(expected)
	fmt.Fprintf(stdout, "\nrequests %d, delivered %d, duplicates %d", r.Requests, r.Delivered, r.Duplicates)
	if expected != nil {
		fmt.Fprintf(stdout, ", missing %d of %d", len(r.Missing), len(expected))
	}
	verdict := "ok"
	if r.Violation {
		verdict = "EXCEEDED"
	}
	fmt.Fprintf(stdout, "\nbusiest second %d requests (limit %d: %s) from %s\n", r.MaxWindow, r.Limit, verdict, r.WindowStart.Format(time.RFC3339Nano))
	fmt.Fprintf(stdout, "sent 429 ×%d, 403 ×%d, 503 ×%d, 500 ×%d, resets %d, timeouts %d; bad signatures %d, bad bodies %d; banned %v\n",
		r.Sent429, r.Sent403, r.Sent503, r.Sent500, r.Resets, r.Timeouts, r.BadSignatures, r.BadBodies, r.Banned)
	fmt.Fprintf(stdout, "enqueue→delivery p50 %s p99 %s\n", report.Short(time.Duration(r.P50)), report.Short(time.Duration(r.P99)))
	for _, pr := range r.Problems {
		fmt.Fprintf(stdout, "problem: %s\n", pr)
	}
	return writeJSON(jsonOut, r)
}
