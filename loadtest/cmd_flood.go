package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/sluice-dev/sluice/loadtest/flood"
	"github.com/sluice-dev/sluice/loadtest/report"
	"github.com/sluice-dev/sluice/shared/signature"
)

func runFlood(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("flood", "N workers POST to one loopback URL as fast as they can for a bounded time, and report\n"+
		"accepted (2xx), throttled (429), rejected (other statuses), errors (no answer), those still unanswered\n"+
		"when the run ended, the achieved rate and latency. Point it at a partner (with --secret) or at the edge\n"+
		"Worker's deliver path (with --to, and --secret the origin↔edge secret) to see whether a limiter limits:\n"+
		"each request is then a delivery to --to for one subscriber at --rate and --burst; the Worker's 202\n"+
		"deferral (its bucket was empty) counts as throttled, and for a delivery it made, the subscriber's\n"+
		"answer counts: accepted (2xx), rejected (any other) or unreached (none).", stderr)
	var (
		o       flood.Options
		d       flood.Deliver
		body    string
		jsonOut string
	)
	fs.StringVar(&o.URL, "url", "", "the URL to flood (loopback only; required)")
	fs.IntVar(&o.Workers, "workers", 64, "concurrent clients")
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "how long to flood")
	fs.IntVar(&o.MaxRequests, "requests", 1_000_000, "stop after this many requests in all")
	fs.DurationVar(&o.Timeout, "timeout", 5*time.Second, "per-request timeout")
	fs.StringVar(&o.Secret, "secret", "", "sign each request with this whsec_ secret (Standard Webhooks) and a fresh webhook-id")
	fs.StringVar(&body, "body", "", "request body (default: a small video.trending event)")
	fs.StringVar(&jsonOut, "json", "", "also write the result as JSON to this file")
	fs.StringVar(&d.To, "to", "", "Worker flood: the subscriber URL the Worker delivers to (loopback); --url is then the Worker's /v1/deliver")
	fs.StringVar(&d.SubscriberID, "subscriber", "flood", "Worker flood: the subscriber id, whose bucket the Worker keeps")
	fs.Float64Var(&d.Rate.PerSecond, "rate", 10, "Worker flood: the subscriber's edge rate per second")
	fs.Float64Var(&d.Rate.Burst, "burst", 20, "Worker flood: the subscriber's edge burst")
	fs.StringVar(&d.SubscriberSecret, "subscriber-secret", "", "Worker flood: sign each event with the subscriber's whsec_ secret, for a partner that checks it")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := checkJSONOut(jsonOut); err != nil {
		return err
	}
	for _, sec := range []struct{ flag, value string }{{"--secret", o.Secret}, {"--subscriber-secret", d.SubscriberSecret}} {
		if _, err := signature.DecodeSecret(sec.value); sec.value != "" && err != nil {
			return fmt.Errorf("%s: %v: %w", sec.flag, err, errUsage)
		}
	}
	if d.To != "" {
		if err := flood.CheckLoopback(d.To); err != nil {
			return fmt.Errorf("--to: %v: %w", err, errUsage)
		}
		if o.Secret == "" || !d.Rate.Valid() || d.Rate.PerSecond > maxRate || d.Rate.Burst > maxRate {
			return fmt.Errorf("a Worker flood (--to) needs --secret, the origin↔edge secret, and --rate above 0 with --burst at least 1: %w", errUsage)
		}
		o.Deliver = &d
	}
	if o.URL == "" {
		return fmt.Errorf("--url is required: %w", errUsage)
	}
	if err := flood.CheckLoopback(o.URL); err != nil {
		return fmt.Errorf("%v: %w", err, errUsage)
	}
	if o.Duration <= 0 || o.Duration > time.Hour || o.Workers < 1 || o.Workers > 4096 || o.MaxRequests < 1 || o.Timeout <= 0 {
		return fmt.Errorf("--duration must be above 0 and at most 1h, --workers 1 to 4096, --requests and --timeout above 0: %w", errUsage)
	}
	if body != "" {
		o.Body = []byte(body)
	}
	res, err := flood.Run(ctx, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "requests=%d accepted=%d throttled=%d rejected=%d errors=%d unanswered=%d elapsed=%s\n",
		res.Requests, res.Accepted, res.Throttled, res.Rejected, res.Errors, res.Unanswered, report.Short(time.Duration(res.Elapsed)))
	fmt.Fprintf(stdout, "achieved=%.1f rps (offered %.1f rps) latency p50=%s p99=%s statuses=%v\n",
		res.Achieved, res.Offered, report.Short(time.Duration(res.P50)), report.Short(time.Duration(res.P99)), res.Statuses)
	if o.Deliver != nil {
		fmt.Fprintf(stdout, "the subscriber at --to: unreached=%d statuses=%v\n", res.Unreached, res.SubscriberStatuses)
	}
	if err := writeJSON(jsonOut, res); err != nil {
		return err
	}
	if o.Deliver != nil && res.Unreached > 0 && res.Accepted+res.Rejected == 0 {
		fmt.Fprintf(stderr, "flood: the Worker answered, but the subscriber never did (%d unreached); is --to %s the right URL?\n",
			res.Unreached, o.Deliver.To)
		return errFailed
	}
	if res.Requests > 0 && res.Accepted+res.Throttled+res.Rejected+res.Unreached == 0 {
		// Nothing answered at all: a wrong URL, or an endpoint that never
		// answers within the run, not a finding about a limiter.
		fmt.Fprintf(stderr, "flood: no request got an answer (%d refused, reset or timed out; %d unanswered when the run ended); is %s the right URL?\n",
			res.Errors, res.Unanswered, o.URL)
		return errFailed
	}
	return nil
}

// checkJSONOut refuses a --json path that cannot be written, before a run
// whose result would otherwise be lost at its end.
func checkJSONOut(path string) error {
	if path == "" {
		return nil
	}
	if st, err := os.Stat(filepath.Dir(path)); err != nil || !st.IsDir() {
		return fmt.Errorf("--json %s: its folder does not exist: %w", path, errUsage)
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return fmt.Errorf("--json %s is a folder: %w", path, errUsage)
	}
	return nil
}

// writeJSON writes v, indented, to path (nothing when path is empty).
func writeJSON(path string, v any) error {
	if path == "" {
		return nil
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
