package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/sluice-dev/sluice/loadtest/flood"
	"github.com/sluice-dev/sluice/loadtest/report"
)

func runFlood(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("flood", "N workers POST to one loopback URL as fast as they can for a bounded time, and report\n"+
		"accepted (2xx), throttled (429), rejected (other statuses), errors, the achieved rate and latency.\n"+
		"Point it at a partner (with --secret) or at the edge Worker's deliver path to see whether a limiter limits.", stderr)
	var (
		o       flood.Options
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
	if err := parse(fs, args); err != nil {
		return err
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
	fmt.Fprintf(stdout, "requests=%d accepted=%d throttled=%d rejected=%d errors=%d elapsed=%s\n",
		res.Requests, res.Accepted, res.Throttled, res.Rejected, res.Errors, report.Short(time.Duration(res.Elapsed)))
	fmt.Fprintf(stdout, "achieved=%.1f rps (offered %.1f rps) latency p50=%s p99=%s statuses=%v\n",
		res.Achieved, res.Offered, report.Short(time.Duration(res.P50)), report.Short(time.Duration(res.P99)), res.Statuses)
	if err := writeJSON(jsonOut, res); err != nil {
		return err
	}
	if res.Requests > 0 && res.Errors == res.Requests {
		// Nothing answered at all: a wrong URL, not a finding about a limiter.
		fmt.Fprintf(stderr, "flood: no request got an answer (refused, reset or timed out); is %s the right URL?\n", o.URL)
		return errFailed
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
