package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"strings"
	"syscall"
	"time"
	"unicode"

	"golang.org/x/net/netutil"

	"github.com/sluice-dev/sluice/origin/api"
	"github.com/sluice-dev/sluice/origin/breaker"
	"github.com/sluice-dev/sluice/origin/delivery"
	"github.com/sluice-dev/sluice/origin/edgeclient"
	"github.com/sluice-dev/sluice/origin/egress"
	"github.com/sluice-dev/sluice/origin/ledger"
	"github.com/sluice-dev/sluice/origin/metrics"
	"github.com/sluice-dev/sluice/shared/event"
)

type serveConfig struct {
	addr, db, apiToken     string
	allowPrivate           bool
	edgeURL, edgeSecret    string
	edgeTypes              string
	workers                int
	retryBase, retryCap    time.Duration
	breakerThreshold       int
	breakerCooldown, drain time.Duration
	retention              time.Duration
	maxBody                byteSize
	logFormat, logLevel    string
}

func serveFlags(stderr io.Writer) (*flag.FlagSet, *serveConfig) {
	c := &serveConfig{maxBody: 256 << 10}
	fs := newFlags("serve", "Runs the origin: the API, the dispatcher and its workers. Applies migrations first.", stderr)
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8080", "API listen address")
	fs.StringVar(&c.db, "db", "./data/sluice.db", "SQLite database file (created with its folder)")
	fs.StringVar(&c.apiToken, "api-token", "", "bearer token for /v1; when unset, one is generated and printed once, and the database keeps its digest")
	fs.BoolVar(&c.allowPrivate, "allow-private-endpoints", false, "allow subscriber URLs on loopback, private and link-local addresses")
	fs.StringVar(&c.edgeURL, "edge-url", "", "the edge Worker's URL; no edge lane when unset")
	fs.StringVar(&c.edgeSecret, "edge-secret", "", "the origin-edge signing secret (whsec_…)")
	fs.StringVar(&c.edgeTypes, "edge-types", "", "comma-separated event types or patterns (video.*) delivered through the edge lane")
	fs.IntVar(&c.workers, "workers", 64, "concurrent delivery attempts in total")
	fs.DurationVar(&c.retryBase, "retry-base", time.Second, "full-jitter backoff base")
	fs.DurationVar(&c.retryCap, "retry-cap", 30*time.Minute, "full-jitter backoff cap")
	fs.IntVar(&c.breakerThreshold, "breaker-threshold", 5, "consecutive failures that open a subscriber's breaker")
	fs.DurationVar(&c.breakerCooldown, "breaker-cooldown", 60*time.Second, "time a breaker stays open before its half-open probe")
	fs.Var(&c.maxBody, "max-body", "largest event accepted (413 beyond)")
	fs.DurationVar(&c.drain, "drain-timeout", 30*time.Second, "how long shutdown waits for attempts and API requests in flight")
	fs.DurationVar(&c.retention, "retention", 0, "remove events whose every delivery was sent longer ago than this, with their deliveries and attempts (0: keep all; pending and dead ones always stay)")
	fs.StringVar(&c.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return fs, c
}

func (c *serveConfig) validate() error {
	var errs []error
	if strings.TrimSpace(c.db) == "" {
		errs = append(errs, errors.New("--db must name a file"))
	}
	if c.workers < 1 {
		errs = append(errs, errors.New("--workers must be at least 1"))
	}
	if c.retryBase <= 0 || c.retryCap < c.retryBase {
		errs = append(errs, errors.New("--retry-base must be positive and --retry-cap at least --retry-base"))
	}
	if c.drain <= 0 {
		errs = append(errs, errors.New("--drain-timeout must be positive"))
	}
	if !validAddr(c.addr) {
		errs = append(errs, fmt.Errorf("--addr %q must be host:port (a port number or service name)", c.addr))
	}
	if c.retention < 0 {
		errs = append(errs, errors.New("--retention must be 0 (keep everything) or more"))
	}
	if c.breakerThreshold < 1 || c.breakerCooldown <= 0 {
		errs = append(errs, errors.New("--breaker-threshold must be at least 1 and --breaker-cooldown positive"))
	}
	if c.logFormat != "text" && c.logFormat != "json" {
		errs = append(errs, errors.New("--log-format must be text or json"))
	}
	if _, err := logLevel(c.logLevel); err != nil {
		errs = append(errs, errors.New("--log-level must be debug, info, warn or error"))
	}
	// A token read from a file often ends in a newline no client sends
	// (the CLI and HTTP itself trim it); one that is blank once trimmed, or
	// holds a control character, could never be sent at all.
	if given := c.apiToken; given != "" {
		c.apiToken = strings.TrimSpace(given)
		if c.apiToken == "" || strings.ContainsFunc(c.apiToken, unicode.IsControl) {
			errs = append(errs, errors.New("--api-token must be printable text that is not blank"))
		}
	}
	// A secret alone is common (the shell that runs make edge-dev exports
	// SLUICE_EDGE_SECRET) and serve warns of it; a URL alone cannot sign.
	if c.edgeURL != "" && c.edgeSecret == "" {
		errs = append(errs, errors.New("--edge-url needs --edge-secret (or SLUICE_EDGE_SECRET), the whsec_ secret the Worker checks"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", errors.Join(errs...), errUsage)
	}
	return nil
}

// apiReadTimeout bounds how long one request may take to arrive, body
// included: a client that sends headers and then trickles or withholds its
// body would otherwise hold its connection (and, after a 401, net/http's
// read of the unread body) for ever. A minute, or long enough for the
// largest batch --max-body allows at 256 KiB/s.
func apiReadTimeout(maxBody int64) time.Duration {
	return max(time.Minute, time.Duration(api.BatchBodyLimit(maxBody)/(256<<10))*time.Second)
}

// apiServer serves h with the timeouts that keep slow or idle clients from
// holding connections: headers within 10 s, the whole request within
// readFor, and 120 s between requests.
func apiServer(h http.Handler, readFor time.Duration) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: readFor, IdleTimeout: 120 * time.Second}
}

// maxAPIConns is how many API connections serve holds at once: half the
// file descriptors the process may open (Go raises the soft limit to the
// hard one at start-up), so clients that open connections and never finish
// a request cannot take those the database and the deliveries need. The
// rest wait in the kernel's accept queue.
func maxAPIConns() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 4096
	}
	return int(min(max(rl.Cur/2, 64), 1<<16))
}

// validAddr reports whether net.Listen could take addr: host:port, where
// the port may be empty (any), a number or a service name.
func validAddr(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	if err == nil && port != "" {
		_, err = net.LookupPort("tcp", port)
	}
	return err == nil
}

// logLevel reads --log-level as slog does: debug, info, warn or error, in
// any case, optionally with an offset (info+2).
func logLevel(s string) (slog.Level, error) {
	var lv slog.Level
	err := lv.UnmarshalText([]byte(s))
	return lv, err
}

// newLogger takes a level validate accepted.
func newLogger(format, level string, w io.Writer) *slog.Logger {
	lv, _ := logLevel(level)
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// tuneGC lets the heap grow to five times what is live before collecting
// (GOGC=400) under a 256 MiB soft limit, unless GOGC or GOMEMLIMIT say
// otherwise. sluice's live heap is small (a few MiB even with a million
// deliveries pending: they wait in SQLite), and at the default the
// collector ran dozens of times a second under load.
func tuneGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(256 << 20)
	}
}

func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) (err error) {
	fs, c := serveFlags(stderr)
	if err := parse(fs, args, getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if err := c.validate(); err != nil {
		return err
	}
	// SIGTERM or SIGINT while starting (migrating a large ledger, say) is a
	// stop like any other: every migration commits or rolls back whole, and
	// nothing was accepted yet, so it exits 0 as a stop while serving does.
	serving := false
	defer func() {
		if err != nil && !serving && ctx.Err() != nil && errors.Is(err, context.Canceled) {
			fmt.Fprintln(stderr, "sluice: stopped by a signal while starting; nothing was accepted")
			err = nil
		}
	}()
	log := newLogger(c.logFormat, c.logLevel, stderr)
	tuneGC(getenv)
	// The edge lane's settings are checked before the database is touched.
	var edge delivery.EdgeLane
	var edgeTypes []string
	if c.edgeURL != "" {
		ec, err := edgeclient.New(c.edgeURL, c.edgeSecret, nil, nil)
		if err != nil {
			return fmt.Errorf("--edge-url/--edge-secret: %w: %w", err, errUsage)
		}
		edge = ec
		for _, t := range strings.Split(c.edgeTypes, ",") {
			if t = strings.TrimSpace(t); t == "" {
				continue
			}
			if !event.ValidPattern(t) {
				return fmt.Errorf("--edge-types: %q is neither an event type nor a pattern (\"*\", \"video.*\"): %w", t, errUsage)
			}
			edgeTypes = append(edgeTypes, t)
		}
		if len(edgeTypes) == 0 {
			log.Warn("edge lane on, but --edge-types names no event type: every event goes by the origin lane")
		} else {
			log.Info("edge lane on", "edge_types", strings.Join(edgeTypes, ","))
		}
	}
	if c.edgeURL == "" {
		for name, given := range map[string]bool{"--edge-types": strings.TrimSpace(c.edgeTypes) != "", "--edge-secret": c.edgeSecret != ""} {
			if given {
				log.Warn(name + " has no effect without --edge-url: every event goes by the origin lane")
			}
		}
	}

	// Bind before the database is touched, so a busy port leaves nothing
	// behind (not even a generated token).
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", c.addr, err)
	}
	defer ln.Close()

	l, err := ledger.Open(ctx, c.db, ledger.Options{})
	if err != nil {
		if errors.Is(err, ledger.ErrLocked) {
			return fmt.Errorf("%s is in use by another sluice process; stop it or choose another --db", c.db)
		}
		return fmt.Errorf("open %s: %w", c.db, err)
	}
	defer l.Close()
	if n := l.Released(); n > 0 {
		log.Warn("took back deliveries a stopped process left in flight; each goes again, so receivers may see it twice", "deliveries", n)
	}

	token, err := apiToken(ctx, l, c.apiToken, stdout)
	if err != nil {
		return err
	}
	if err := l.ScrubWAL(ctx); err != nil {
		// The value is erased from the tables; only the WAL's old frames
		// may still hold it, until a start that finds no outside reader.
		log.Warn("erased data may remain in the WAL", "err", err)
	}

	policy := egress.Policy{AllowPrivate: c.allowPrivate}
	m := metrics.New()
	disp := delivery.New(l, delivery.Config{
		Observer:     m,
		Edge:         edge,
		EdgeTypes:    edgeTypes,
		Workers:      c.workers,
		RetryBase:    c.retryBase,
		RetryCap:     c.retryCap,
		Breaker:      breaker.Settings{Threshold: c.breakerThreshold, Cooldown: c.breakerCooldown},
		DrainTimeout: c.drain,
		UserAgent:    "sluice/" + version,
		Client:       policy.Client(),
		Logger:       log,
	})
	if err := disp.Load(ctx); err != nil {
		return fmt.Errorf("load subscribers: %w", err)
	}
	m.Watch(disp, l, log)
	handler := api.New(api.Config{
		Ledger: l, Dispatcher: disp, Egress: policy, TokenSHA256: token,
		MaxBody: int64(c.maxBody), Logger: log, Metrics: m.Handler(), EdgeLane: edge != nil,
	})

	srv := apiServer(handler, apiReadTimeout(int64(c.maxBody)))
	serving = true
	fmt.Fprintf(stdout, "sluice %s listening on http://%s\n", version, ln.Addr())
	log.Info("serving", "addr", ln.Addr().String(), "workers", c.workers, "allow_private_endpoints", c.allowPrivate)

	dispCtx, stopDispatch := context.WithCancel(context.WithoutCancel(ctx))
	dispDone := make(chan error, 1)
	go func() { dispDone <- disp.Run(dispCtx) }()
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Serve(netutil.LimitListener(ln, maxAPIConns())) }()
	retainCtx, stopRetain := context.WithCancel(ctx)
	retained := make(chan struct{})
	go func() {
		defer close(retained)
		if c.retention > 0 {
			retain(retainCtx, l, c.retention, time.Now, log)
		}
	}()
	defer func() { stopRetain(); <-retained }() // before the ledger closes

	select {
	case <-ctx.Done():
	case err := <-srvDone:
		stopDispatch()
		<-dispDone
		return fmt.Errorf("http server: %w", err)
	}
	log.Info("shutting down: refusing new requests, draining attempts in flight")
	// The dispatcher stops claiming at once, whatever API requests are
	// still open: an event they commit now waits pending for the next
	// start. Both drains share --drain-timeout; a client still sending its
	// request after that is cut off, which is no failure of the stop.
	stopDispatch()
	shutCtx, cancel := context.WithTimeout(context.Background(), c.drain)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil {
		log.Warn("API requests still open after the drain timeout were cut off", "drain_timeout", c.drain.String())
		srv.Close()
	}
	if err := <-dispDone; err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("stopped")
	return nil
}

// retainEvery is how often serve prunes delivered events past --retention.
const retainEvery = time.Minute

// pruneBatch is how many events one Prune looks at. Each is one write that
// holds the ledger's writer; retain rests four times as long as a batch took
// before the next, so pruning a long history takes a fifth of the writer at
// most, and claims and records go on meanwhile.
const pruneBatch = 100

// retain removes delivered events older than keep, at start and then every
// retainEvery, until ctx ends.
func retain(ctx context.Context, l *ledger.Ledger, keep time.Duration, now func() time.Time, log *slog.Logger) {
	t := time.NewTicker(retainEvery)
	defer t.Stop()
	for {
		total := 0
		for {
			began := time.Now()
			n, more, err := l.Prune(ctx, now().Add(-keep), pruneBatch)
			total += n
			if err != nil {
				if ctx.Err() == nil {
					log.Warn("retention: pruning failed; trying again later", "err", err)
				}
				break
			}
			if !more || !rest(ctx, 4*time.Since(began)) {
				break
			}
		}
		if total > 0 {
			log.Info("retention: removed delivered events", "events", total, "older_than", keep.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// rest waits d, and reports false if ctx ended first.
func rest(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// tokenPrefix starts every generated API token, so one pasted where it
// does not belong can be told and kept out of messages.
const tokenPrefix = "sk_"

// apiToken returns the SHA-256 of the configured token, or the one kept in
// the database, generating it and printing it once when there is none. The
// database keeps only the digest, so a copy of the file does not carry a
// working token; a plaintext token left by an earlier version is replaced by
// its digest here.
func apiToken(ctx context.Context, l *ledger.Ledger, given string, stdout io.Writer) ([32]byte, error) {
	if err := digestLegacyToken(ctx, l); err != nil {
		return [32]byte{}, err
	}
	if given != "" {
		return sha256.Sum256([]byte(given)), nil
	}
	stored, err := l.Setting(ctx, tokenDigestKey)
	if err != nil {
		return [32]byte{}, err
	}
	if stored != "" {
		b, err := hex.DecodeString(stored)
		if err != nil || len(b) != sha256.Size {
			return [32]byte{}, errors.New("the API token kept in the database is unreadable; set --api-token or SLUICE_API_TOKEN")
		}
		var d [32]byte
		copy(d[:], b)
		fmt.Fprintln(stdout, "sluice: using the API token kept in the database (set --api-token or SLUICE_API_TOKEN to choose one)")
		return d, nil
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return [32]byte{}, err
	}
	token := tokenPrefix + hex.EncodeToString(b)
	d := sha256.Sum256([]byte(token))
	if err := l.SetSetting(ctx, tokenDigestKey, hex.EncodeToString(d[:])); err != nil {
		return [32]byte{}, err
	}
	fmt.Fprintf(stdout, "sluice: generated an API token (shown once; the database keeps only its digest):\n  %s\n", token)
	return d, nil
}

// tokenDigestKey names the setting that holds the API token's SHA-256, in
// hex; legacyTokenKey the one that held the token itself.
const (
	tokenDigestKey = "api_token_sha256"
	legacyTokenKey = "api_token"
)

// digestLegacyToken replaces a plaintext token by its digest, and erases it
// from the file. The digest is written before the token is removed, so a
// crash between the two leaves both and the next start finishes the job.
func digestLegacyToken(ctx context.Context, l *ledger.Ledger) error {
	legacy, err := l.Setting(ctx, legacyTokenKey)
	if err != nil || legacy == "" {
		return err
	}
	d := sha256.Sum256([]byte(legacy))
	if err := l.SetSetting(ctx, tokenDigestKey, hex.EncodeToString(d[:])); err != nil {
		return err
	}
	if err := l.EraseSetting(ctx, legacyTokenKey); err != nil && !errors.Is(err, ledger.ErrScrubPending) {
		return err // a pending scrub is retried, and reported, by serve
	}
	return nil
}

func migrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("migrate", "Applies the database migrations that have not run yet, then exits.", stderr)
	db := fs.String("db", "./data/sluice.db", "SQLite database file (created with its folder)")
	if err := parse(fs, args, getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if strings.TrimSpace(*db) == "" {
		return fmt.Errorf("--db must name a file: %w", errUsage)
	}
	applied, err := ledger.Migrate(ctx, *db, time.Now())
	if err != nil {
		if errors.Is(err, ledger.ErrLocked) {
			return fmt.Errorf("%s is in use by another sluice process", *db)
		}
		return err
	}
	if len(applied) == 0 {
		fmt.Fprintln(stdout, "sluice: database is up to date")
	}
	for _, name := range applied {
		fmt.Fprintln(stdout, "sluice: applied", name)
	}
	return nil
}
