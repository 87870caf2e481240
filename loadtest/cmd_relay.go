package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/loadtest/relay"
)

func runRelay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("relay", "A bare HTTP relay on 127.0.0.1: it answers each POST with 202 at once, then forwards the body\n"+
		"to --to. No ledger, no signatures, no limits: make bench offers it the same load as sluice, and\n"+
		"its latency is the floor of this machine. Prints its URL on the first line, then serves until\n"+
		"Ctrl-C or SIGTERM.", stderr)
	var to, addr string
	fs.StringVar(&to, "to", "", "where to forward every body (required, a loopback http URL)")
	fs.StringVar(&addr, "addr", "127.0.0.1:0", "loopback address to listen on")
	if err := parse(fs, args); err != nil {
		return err
	}
	if !strings.HasPrefix(to, "http://127.0.0.1:") {
		return fmt.Errorf("--to must be a loopback URL (http://127.0.0.1:PORT/...): %w", errUsage)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
		ln.Close()
		return fmt.Errorf("--addr must be a loopback address: %w", errUsage)
	}
	srv := &http.Server{Handler: relay.New(to), ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	fmt.Fprintf(stdout, "http://%s\n", ln.Addr())
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
