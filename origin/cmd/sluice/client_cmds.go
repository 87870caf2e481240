package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/origin/api"
)

// cli is what the client commands share: the environment and the streams.
type cli struct {
	getenv         func(string) string
	stdin          io.Reader // for send --file -
	stdout, stderr io.Writer
}

// subcommand is one "sluice <group> <name>" command.
type subcommand struct {
	name, summary string
	run           func(c *cli, ctx context.Context, args []string) error
}

var subscriberCommands = []subcommand{
	{"add", "create a subscriber", (*cli).subscribersAdd},
	{"list", "list subscribers", (*cli).subscribersList},
	{"show", "show one subscriber", (*cli).subscribersShow},
	{"rm", "remove a subscriber", (*cli).subscribersRm},
	{"pause", "hold a subscriber's deliveries until it is resumed", (*cli).subscribersPause},
	{"resume", "let a paused subscriber's deliveries go again", (*cli).subscribersResume},
	{"rotate-secret", "sign with a new secret; the old one signs beside it for 24 h", (*cli).subscribersRotate},
}

var dlqCommands = []subcommand{
	{"list", "list dead deliveries", (*cli).dlqList},
	{"retry", "run one dead delivery again with a fresh attempt budget", (*cli).dlqRetry},
	{"recover", "requeue a subscriber's dead deliveries since a time", (*cli).dlqRecover},
}

// client runs the API client commands: subscribers, send, deliveries, dlq, stats.
func client(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	c := &cli{getenv: getenv, stdin: stdin, stdout: stdout, stderr: stderr}
	err := c.dispatch(ctx, args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

func (c *cli) dispatch(ctx context.Context, args []string) error {
	switch args[0] {
	case "subscribers":
		return c.group(ctx, "subscribers", subscriberCommands, args[1:])
	case "dlq":
		return c.group(ctx, "dlq", dlqCommands, args[1:])
	case "deliveries":
		if len(args) > 1 && args[1] == "show" {
			return c.deliveriesShow(ctx, args[2:])
		}
		return c.deliveriesList(ctx, args[1:])
	case "send":
		return c.send(ctx, args[1:])
	case "stats":
		return c.stats(ctx, args[1:])
	case "health":
		return c.health(ctx, args[1:])
	}
	return fmt.Errorf("unknown command %q: %w", args[0], errUsage)
}

func (c *cli) group(ctx context.Context, group string, cmds []subcommand, args []string) error {
	usage := func(w io.Writer) {
		fmt.Fprintf(w, "Usage: sluice %s COMMAND [flags]\n\nCommands:\n", group)
		for _, sc := range cmds {
			fmt.Fprintf(w, "  %-14s %s\n", sc.name, sc.summary)
		}
		fmt.Fprintf(w, "\nRun \"sluice %s COMMAND --help\" for a command's flags.\n", group)
	}
	if len(args) == 0 {
		usage(c.stderr)
		return fmt.Errorf("%s needs a command: %w", group, errUsage)
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		usage(c.stdout)
		return nil
	}
	for _, sc := range cmds {
		if sc.name == args[0] {
			return sc.run(c, ctx, args[1:])
		}
	}
	usage(c.stderr)
	return fmt.Errorf("unknown command %q for sluice %s: %w", args[0], group, errUsage)
}

// API shapes the tables read. --json prints the API's own bytes instead, so
// a field added to the API reaches scripts without a client release.

type subscriberJSON struct {
	ID         string   `json:"id"`
	URL        string   `json:"url"`
	EventTypes []string `json:"event_types"`
	Rate       struct {
		PerSecond float64  `json:"per_second"`
		Burst     float64  `json:"burst"`
		EdgeShare *float64 `json:"edge_share"` // shown where it can matter
	} `json:"rate"`
	MaxAttempts int        `json:"max_attempts"`
	TimeoutMS   int        `json:"timeout_ms"`
	Secret      string     `json:"secret"`
	Paused      bool       `json:"paused"`
	CreatedAt   *time.Time `json:"created_at"`
	UpdatedAt   *time.Time `json:"updated_at"`
	PausedUntil *time.Time `json:"paused_until"`
	Breaker     struct {
		State    string     `json:"state"`
		Failures int        `json:"failures"`
		OpenedAt *time.Time `json:"opened_at"`
	} `json:"breaker"`
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
}

func (s *subscriberJSON) rate() string {
	return number(s.Rate.PerSecond) + "/s"
}

func (s *subscriberJSON) breaker() string {
	if s.Breaker.State == "" {
		return "closed"
	}
	return s.Breaker.State
}

type deliveryJSON struct {
	ID            string        `json:"id"`
	EventID       string        `json:"event_id"`
	EventType     string        `json:"event_type"`
	SubscriberID  string        `json:"subscriber_id"`
	Status        string        `json:"status"`
	Attempts      int           `json:"attempt_count"`
	Deferrals     int           `json:"deferrals"`
	NextAttemptAt *time.Time    `json:"next_attempt_at"`
	CreatedAt     *time.Time    `json:"created_at"`
	UpdatedAt     *time.Time    `json:"updated_at"`
	SentAt        *time.Time    `json:"sent_at"`
	DeadAt        *time.Time    `json:"dead_at"`
	LastError     string        `json:"last_error"`
	History       []attemptJSON `json:"attempts"`
}

type attemptJSON struct {
	Number       int        `json:"number"`
	At           *time.Time `json:"at"`
	Lane         string     `json:"lane"`
	StatusCode   int        `json:"status_code"`
	Error        string     `json:"error"`
	DurationMS   int64      `json:"duration_ms"`
	RetryAfterMS *int64     `json:"retry_after_ms"`
	Response     string     `json:"response"`
}

// ---- subscribers

// finite reports whether v is a number JSON can carry (flag's float parser
// also takes NaN and Inf).
func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func (c *cli) subscribersAdd(ctx context.Context, args []string) error {
	// --url is the subscriber's endpoint here, as in the API's body, so the
	// API's address moves to --api-url; it still falls back to SLUICE_URL.
	f := newCmdFlags("subscribers add", "--url ENDPOINT",
		"Creates a subscriber: an endpoint sluice POSTs matching events to, signed with its secret.", "api-url", c.stderr)
	endpoint := f.String("url", "", "the subscriber's endpoint, http(s)://… (required; not read from SLUICE_URL)")
	id := f.String("id", "", "subscriber id (generated as sub_… when empty)")
	types := f.String("types", "", `comma-separated event types or patterns, e.g. video.trending,invoice.paid (default "*")`)
	rate := f.Float64("rate", 0, "deliveries per second at most (API default 50)")
	burst := f.Float64("burst", 0, "token-bucket burst (default twice --rate)")
	maxAttempts := f.Int("max-attempts", 0, "attempts before a delivery is dead-lettered (API default 8)")
	timeout := f.Duration("timeout", 0, "attempt timeout, e.g. 5s (API default 5s)")
	secret := f.String("secret", "", "signing secret, whsec_… (generated when empty)")
	if _, err := f.parseArgs(args, c.getenv); err != nil {
		return err
	}
	if strings.TrimSpace(*endpoint) == "" {
		return fmt.Errorf("subscribers add needs --url, the subscriber's endpoint: %w", errUsage)
	}
	in := map[string]any{"url": *endpoint}
	if f.given("id") {
		in["id"] = *id
	}
	if f.given("types") {
		var list []string
		for _, t := range strings.Split(*types, ",") {
			if t = strings.TrimSpace(t); t != "" {
				list = append(list, t)
			}
		}
		if len(list) == 0 {
			return fmt.Errorf("--types lists no event type: %w", errUsage)
		}
		in["event_types"] = list
	}
	if f.given("rate") || f.given("burst") {
		if !finite(*rate) || !finite(*burst) {
			return fmt.Errorf("--rate and --burst must be numbers such as 10 or 0.5: %w", errUsage)
		}
		r := map[string]float64{}
		if f.given("rate") {
			r["per_second"] = *rate
		}
		if f.given("burst") {
			r["burst"] = *burst
		}
		in["rate"] = r
	}
	if f.given("max-attempts") {
		in["max_attempts"] = *maxAttempts
	}
	if f.given("timeout") {
		if *timeout < time.Millisecond {
			return fmt.Errorf("--timeout must be at least 1ms: %w", errUsage)
		}
		in["timeout_ms"] = timeout.Round(time.Millisecond).Milliseconds()
	}
	if f.given("secret") {
		in["secret"] = *secret
	}
	var s subscriberJSON
	if printed, err := c.call(ctx, f, http.MethodPost, "/v1/subscribers", in, &s); err != nil || printed {
		return err
	}
	// The secret is shown in full here: the operator has to hand it to the
	// receiver, and "show" masks it.
	return c.subscriberFields(&s, true)
}

// subscriberStates are what subscribers list --status filters on.
var subscriberStates = map[string]func(*subscriberJSON) bool{
	"active":    func(s *subscriberJSON) bool { return !s.Paused && s.breaker() == "closed" },
	"paused":    func(s *subscriberJSON) bool { return s.Paused },
	"open":      func(s *subscriberJSON) bool { return s.breaker() == "open" },
	"half_open": func(s *subscriberJSON) bool { return s.breaker() == "half_open" },
}

func (c *cli) subscribersList(ctx context.Context, args []string) error {
	f := newCmdFlags("subscribers list", "", "Lists subscribers.", "url", c.stderr)
	status := f.String("status", "", "only subscribers in this state: active (not paused, breaker closed), paused (by an operator), or with the breaker open or half_open")
	sub := f.String("subscriber", "", "only this subscriber")
	limit, cursor := pageFlags(f, "subscribers")
	if _, err := f.parseArgs(args, c.getenv); err != nil {
		return err
	}
	in, ok := subscriberStates[*status]
	if !ok && *status != "" {
		return fmt.Errorf("--status must be active, paused, open or half_open: %w", errUsage)
	}
	var keep func(json.RawMessage) (bool, error)
	if *status != "" || *sub != "" {
		keep = func(it json.RawMessage) (bool, error) {
			var s subscriberJSON
			if err := decodeAnswer("/v1/subscribers", it, &s); err != nil {
				return false, err
			}
			return (in == nil || in(&s)) && (*sub == "" || s.ID == *sub), nil
		}
	}
	return c.list(ctx, f, "/v1/subscribers", nil, *limit, *cursor, keep, "subscribers", func(items []json.RawMessage) error {
		t := newTable(c.stdout, "ID", "URL", "EVENT TYPES", "RATE", "BURST", "MAX ATTEMPTS", "TIMEOUT", "PAUSED", "BREAKER")
		for _, it := range items {
			var s subscriberJSON
			if err := decodeAnswer("/v1/subscribers", it, &s); err != nil {
				return err
			}
			t.row(s.ID, s.URL, strings.Join(s.EventTypes, ","), s.rate(), number(s.Rate.Burst),
				fmt.Sprint(s.MaxAttempts), millis(int64(s.TimeoutMS)), yesNo(s.Paused), s.breaker())
		}
		return t.flush()
	})
}

func (c *cli) subscribersShow(ctx context.Context, args []string) error {
	f := newCmdFlags("subscribers show", "ID", "Shows one subscriber: endpoint, types, limits and delivery state.", "url", c.stderr)
	reveal := f.Bool("show-secret", false, "print the signing secret instead of masking it")
	pos, err := f.parseArgs(args, c.getenv, "ID")
	if err != nil {
		return err
	}
	var s subscriberJSON
	if printed, err := c.call(ctx, f, http.MethodGet, "/v1/subscribers/"+url.PathEscape(pos[0]), nil, &s); err != nil || printed {
		return err
	}
	return c.subscriberFields(&s, *reveal)
}

func (c *cli) subscriberFields(s *subscriberJSON, reveal bool) error {
	secret := s.Secret
	if !reveal && secret != "" {
		secret = "whsec_… (hidden; --show-secret or --json to print it)"
	}
	rate := s.rate() + ", burst " + number(s.Rate.Burst)
	if s.Rate.EdgeShare != nil {
		rate += ", edge share " + number(*s.Rate.EdgeShare)
	}
	kv := []string{
		"ID", s.ID,
		"URL", s.URL,
		"EVENT TYPES", strings.Join(s.EventTypes, ", "),
		"RATE", rate,
		"MAX ATTEMPTS", fmt.Sprint(s.MaxAttempts),
		"TIMEOUT", millis(int64(s.TimeoutMS)),
		"PAUSED", yesNo(s.Paused),
		"BREAKER", fmt.Sprintf("%s (%d consecutive failures)", s.breaker(), s.Breaker.Failures),
	}
	if s.PausedUntil != nil && s.PausedUntil.After(time.Now()) {
		kv = append(kv, "PAUSED UNTIL", when(s.PausedUntil))
	}
	kv = append(kv, "SECRET", secret)
	if s.PreviousSecretExpiresAt != nil {
		kv = append(kv, "OLD SECRET SIGNS UNTIL", when(s.PreviousSecretExpiresAt))
	}
	kv = append(kv, "CREATED", when(s.CreatedAt), "UPDATED", when(s.UpdatedAt))
	return fields(c.stdout, kv...)
}

func (c *cli) subscribersRm(ctx context.Context, args []string) error {
	f := newCmdFlags("subscribers rm", "ID", "Removes a subscriber and, with it, its deliveries and their attempts; sluice stops delivering to it.\n"+
		"To stop deliveries and keep the history, use \"sluice subscribers pause\".", "url", c.stderr)
	pos, err := f.parseArgs(args, c.getenv, "ID")
	if err != nil {
		return err
	}
	api, err := f.client()
	if err != nil {
		return err
	}
	defer api.close()
	if _, err := api.do(ctx, http.MethodDelete, "/v1/subscribers/"+url.PathEscape(pos[0]), nil, nil); err != nil {
		return err
	}
	if f.conn.json {
		// The API answers 204 without a body; scripts still get an object.
		return writeJSON(c.stdout, map[string]any{"id": pos[0], "deleted": true})
	}
	fmt.Fprintf(c.stdout, "removed subscriber %s\n", pos[0])
	return nil
}

func (c *cli) subscribersPause(ctx context.Context, args []string) error {
	return c.setPaused(ctx, args, "subscribers pause",
		"Pauses a subscriber: its deliveries wait, spending no attempt, until \"sluice subscribers resume\".", true)
}

func (c *cli) subscribersResume(ctx context.Context, args []string) error {
	return c.setPaused(ctx, args, "subscribers resume",
		"Resumes a paused subscriber: the deliveries it held go out at its rate, once any pause its own\n"+
			"Retry-After asked for has ended.", false)
}

func (c *cli) setPaused(ctx context.Context, args []string, name, doc string, paused bool) error {
	f := newCmdFlags(name, "ID", doc, "url", c.stderr)
	pos, err := f.parseArgs(args, c.getenv, "ID")
	if err != nil {
		return err
	}
	var s subscriberJSON
	in := map[string]bool{"paused": paused}
	if printed, err := c.call(ctx, f, http.MethodPatch, "/v1/subscribers/"+url.PathEscape(pos[0]), in, &s); err != nil || printed {
		return err
	}
	done := "resumed"
	if s.Paused {
		done = "paused"
	}
	fmt.Fprintf(c.stdout, "%s subscriber %s\n", done, s.ID)
	if !s.Paused && s.PausedUntil != nil {
		fmt.Fprintf(c.stdout, "its Retry-After still holds deliveries until %s\n", s.PausedUntil.UTC().Format(time.RFC3339))
	}
	return nil
}

func (c *cli) subscribersRotate(ctx context.Context, args []string) error {
	f := newCmdFlags("subscribers rotate-secret", "ID",
		"Gives a subscriber a new signing secret and prints it; the old one keeps signing beside it for 24 h, so the receiver can switch.",
		"url", c.stderr)
	secret := f.String("secret", "", "the new secret (whsec_ and base64 of at least 24 bytes); generated when unset")
	pos, err := f.parseArgs(args, c.getenv, "ID")
	if err != nil {
		return err
	}
	in := map[string]string{}
	if *secret != "" {
		in["secret"] = *secret
	}
	var s subscriberJSON
	if printed, err := c.call(ctx, f, http.MethodPost, "/v1/subscribers/"+url.PathEscape(pos[0])+"/rotate-secret", in, &s); err != nil || printed {
		return err
	}
	kv := []string{"ID", s.ID, "SECRET", s.Secret}
	if s.PreviousSecretExpiresAt != nil {
		kv = append(kv, "OLD SECRET SIGNS UNTIL", when(s.PreviousSecretExpiresAt))
	}
	return fields(c.stdout, kv...)
}

// ---- send

func (c *cli) send(ctx context.Context, args []string) error {
	f := newCmdFlags("send", "--type TYPE",
		"Sends one event: sluice delivers it to every subscriber of its type.\n"+
			"The event is a JSON object: --data or --file gives its fields, --type and --id are added to them.", "url", c.stderr)
	typ := f.String("type", "", "the event's type, e.g. invoice.paid (required unless the data has \"type\")")
	data := f.String("data", "", `the event's other fields as a JSON object, e.g. '{"k":"v"}'`)
	file := f.String("file", "", "read the event object from a file (- for standard input)")
	id := f.String("id", "", "the event's id, for idempotency (generated as evt_… when empty)")
	if _, err := f.parseArgs(args, c.getenv); err != nil {
		return err
	}
	if f.given("data") && f.given("file") {
		return fmt.Errorf("give --data or --file, not both: %w", errUsage)
	}
	body := []byte("{}")
	source := "--data"
	switch {
	case f.given("data"):
		body = []byte(*data)
	case f.given("file"):
		source = "--file"
		var err error
		if body, err = c.readFile(ctx, *file); err != nil {
			return err
		}
	}
	body, err := eventBody(body, source, *typ, *id)
	if err != nil {
		return err
	}
	var res struct {
		ID         string `json:"id"`
		Deliveries int    `json:"deliveries"`
		Duplicate  bool   `json:"duplicate"`
	}
	if printed, err := c.call(ctx, f, http.MethodPost, "/v1/events", body, &res); err != nil || printed {
		return err
	}
	t := newTable(c.stdout, "EVENT", "DELIVERIES", "DUPLICATE")
	t.row(res.ID, fmt.Sprint(res.Deliveries), yesNo(res.Duplicate))
	return t.flush()
}

// readFile reads the event for --file. Opening and reading run beside ctx,
// so a signal ends a command waiting on a terminal, a pipe that never
// closes or a FIFO no one writes to; anything that cannot be read is the
// caller's mistake (exit 2), since no request was made.
func (c *cli) readFile(ctx context.Context, path string) ([]byte, error) {
	if path == "-" && c.stdin == nil {
		return nil, fmt.Errorf("--file -: no standard input: %w", errUsage)
	}
	type read struct {
		b   []byte
		err error
	}
	done := make(chan read, 1)
	go func() {
		r := c.stdin
		if path != "-" {
			f, err := os.Open(path)
			if err != nil {
				done <- read{nil, err}
				return
			}
			defer f.Close()
			r = f
		}
		b, err := io.ReadAll(io.LimitReader(r, maxByteSize+1))
		done <- read{b, err}
	}()
	select {
	case <-ctx.Done():
		return nil, fmt.Errorf("--file %s: %w", path, ctx.Err())
	case got := <-done:
		switch {
		case got.err != nil:
			return nil, fmt.Errorf("--file %s: %w: %w", path, got.err, errUsage)
		case len(got.b) > maxByteSize:
			limit := byteSize(maxByteSize)
			return nil, fmt.Errorf("--file %s: larger than %s, the most a server takes: %w", path, limit.String(), errUsage)
		}
		return got.b, nil
	}
}

// eventBody adds type and id (when given) to the JSON object obj. An object
// that needs nothing added is sent byte for byte, as subscribers will get it.
func eventBody(obj []byte, source, typ, id string) ([]byte, error) {
	obj = bytes.TrimSpace(obj)
	var fieldsIn map[string]json.RawMessage
	if !json.Valid(obj) || len(obj) == 0 || obj[0] != '{' || json.Unmarshal(obj, &fieldsIn) != nil {
		return nil, fmt.Errorf("%s must be a JSON object such as '{\"k\":\"v\"}': %w", source, errUsage)
	}
	var add []string
	for _, kv := range [][2]string{{"type", typ}, {"id", id}} {
		if kv[1] == "" {
			continue
		}
		if _, dup := fieldsIn[kv[0]]; dup {
			return nil, fmt.Errorf("%s already has %q; drop it or --%s: %w", source, kv[0], kv[0], errUsage)
		}
		v, _ := json.Marshal(kv[1])
		add = append(add, fmt.Sprintf("%q:%s", kv[0], v))
	}
	if _, ok := fieldsIn["type"]; !ok && typ == "" {
		return nil, fmt.Errorf("send needs --type (or a \"type\" in %s): %w", source, errUsage)
	}
	if len(add) == 0 {
		return obj, nil
	}
	inner := bytes.TrimSpace(obj[1 : len(obj)-1])
	out := "{" + strings.Join(add, ",")
	if len(inner) > 0 {
		out += "," + string(inner)
	}
	return []byte(out + "}"), nil
}

// ---- deliveries

func (c *cli) deliveriesList(ctx context.Context, args []string) error {
	f := newCmdFlags("deliveries", "", "Lists deliveries, newest first. \"sluice deliveries show ID\" shows one with its attempts.", "url", c.stderr)
	status := f.String("status", "", "only deliveries in this state: pending, inflight, sent or dead")
	sub := f.String("subscriber", "", "only deliveries to this subscriber")
	limit, cursor := pageFlags(f, "deliveries")
	if _, err := f.parseArgs(args, c.getenv); err != nil {
		return err
	}
	switch *status {
	case "", "pending", "inflight", "sent", "dead":
	default:
		return fmt.Errorf("--status must be pending, inflight, sent or dead: %w", errUsage)
	}
	return c.deliveryTable(ctx, f, *status, *sub, *limit, *cursor, false)
}

func (c *cli) deliveryTable(ctx context.Context, f *cmdFlags, status, sub string, limit int, cursor string, dead bool) error {
	q := url.Values{}
	if status != "" {
		q.Set("status", status)
	}
	if sub != "" {
		q.Set("subscriber_id", sub)
	}
	return c.list(ctx, f, "/v1/deliveries", q, limit, cursor, nil, "deliveries", func(items []json.RawMessage) error {
		var t *table
		if dead {
			t = newTable(c.stdout, "ID", "EVENT", "TYPE", "SUBSCRIBER", "ATTEMPTS", "DIED", "LAST ERROR")
		} else {
			t = newTable(c.stdout, "ID", "EVENT", "TYPE", "SUBSCRIBER", "STATUS", "ATTEMPTS", "UPDATED", "LAST ERROR")
		}
		for _, it := range items {
			var d deliveryJSON
			if err := decodeAnswer("/v1/deliveries", it, &d); err != nil {
				return err
			}
			if dead {
				t.row(d.ID, d.EventID, d.EventType, d.SubscriberID, fmt.Sprint(d.Attempts), when(d.DeadAt), truncate(d.LastError, 60))
			} else {
				t.row(d.ID, d.EventID, d.EventType, d.SubscriberID, d.Status, fmt.Sprint(d.Attempts), when(d.UpdatedAt), truncate(d.LastError, 60))
			}
		}
		return t.flush()
	})
}

func (c *cli) deliveriesShow(ctx context.Context, args []string) error {
	f := newCmdFlags("deliveries show", "ID", "Shows one delivery with every attempt: time, lane, status, duration, error, response.", "url", c.stderr)
	pos, err := f.parseArgs(args, c.getenv, "ID")
	if err != nil {
		return err
	}
	var d deliveryJSON
	if printed, err := c.call(ctx, f, http.MethodGet, "/v1/deliveries/"+url.PathEscape(pos[0]), nil, &d); err != nil || printed {
		return err
	}
	kv := []string{
		"ID", d.ID,
		"EVENT", d.EventID,
		"TYPE", d.EventType,
		"SUBSCRIBER", d.SubscriberID,
		"STATUS", d.Status,
		"ATTEMPTS", fmt.Sprint(d.Attempts),
		"DEFERRALS", fmt.Sprint(d.Deferrals),
	}
	if d.Status == "pending" {
		kv = append(kv, "NEXT ATTEMPT", when(d.NextAttemptAt))
	}
	kv = append(kv, "CREATED", when(d.CreatedAt), "UPDATED", when(d.UpdatedAt))
	if d.SentAt != nil {
		kv = append(kv, "SENT", when(d.SentAt))
	}
	if d.DeadAt != nil {
		kv = append(kv, "DIED", when(d.DeadAt))
	}
	if d.LastError != "" {
		kv = append(kv, "LAST ERROR", oneLine(d.LastError))
	}
	if err := fields(c.stdout, kv...); err != nil {
		return err
	}
	fmt.Fprintln(c.stdout)
	if len(d.History) == 0 {
		fmt.Fprintln(c.stdout, "no attempts yet")
		return nil
	}
	t := newTable(c.stdout, "#", "AT", "LANE", "STATUS", "DURATION", "RETRY-AFTER", "ERROR", "RESPONSE")
	for _, a := range d.History {
		code, retryAfter := "", ""
		if a.StatusCode != 0 {
			code = fmt.Sprint(a.StatusCode)
		}
		if a.RetryAfterMS != nil {
			retryAfter = millis(*a.RetryAfterMS)
		}
		t.row(fmt.Sprint(a.Number), when(a.At), a.Lane, code, millis(a.DurationMS), retryAfter,
			truncate(a.Error, 60), truncate(a.Response, 40))
	}
	return t.flush()
}

// ---- dlq

func (c *cli) dlqList(ctx context.Context, args []string) error {
	f := newCmdFlags("dlq list", "", "Lists dead deliveries (the dead-letter queue), newest first.", "url", c.stderr)
	status := f.String("status", "dead", "dead, the only state in the dead-letter queue (\"sluice deliveries --status\" lists the others)")
	sub := f.String("subscriber", "", "only dead deliveries to this subscriber")
	limit, cursor := pageFlags(f, "deliveries")
	if _, err := f.parseArgs(args, c.getenv); err != nil {
		return err
	}
	if *status != "dead" {
		return fmt.Errorf("--status %q: the dead-letter queue holds dead deliveries only; \"sluice deliveries --status %s\" lists those: %w",
			*status, *status, errUsage)
	}
	return c.deliveryTable(ctx, f, "dead", *sub, *limit, *cursor, true)
}

func (c *cli) dlqRetry(ctx context.Context, args []string) error {
	f := newCmdFlags("dlq retry", "ID", "Runs a dead (or pending) delivery again now, with a fresh attempt budget.", "url", c.stderr)
	pos, err := f.parseArgs(args, c.getenv, "ID")
	if err != nil {
		return err
	}
	var d deliveryJSON
	if printed, err := c.call(ctx, f, http.MethodPost, "/v1/deliveries/"+url.PathEscape(pos[0])+"/retry", []byte("{}"), &d); err != nil || printed {
		return err
	}
	fmt.Fprintf(c.stdout, "requeued %s to %s (now %s)\n", d.ID, d.SubscriberID, d.Status)
	return nil
}

func (c *cli) dlqRecover(ctx context.Context, args []string) error {
	f := newCmdFlags("dlq recover", "SUBSCRIBER --since TIME",
		"Requeues every dead delivery of a subscriber that died at or after --since, with fresh attempt budgets.", "url", c.stderr)
	sinceFlag := f.String("since", "", "RFC 3339 time (2025-01-02T15:04:05Z), or a duration meaning that long ago (2h) (required)")
	pos, err := f.parseArgs(args, c.getenv, "SUBSCRIBER")
	if err != nil {
		return err
	}
	since, err := parseSince(*sinceFlag, time.Now())
	if err != nil {
		return err
	}
	var res struct {
		Requeued int `json:"requeued"`
	}
	in := map[string]string{"since": since.Format(time.RFC3339Nano)}
	if printed, err := c.call(ctx, f, http.MethodPost, "/v1/subscribers/"+url.PathEscape(pos[0])+"/recover", in, &res); err != nil || printed {
		return err
	}
	noun := "deliveries"
	if res.Requeued == 1 {
		noun = "delivery"
	}
	fmt.Fprintf(c.stdout, "requeued %d dead %s of %s\n", res.Requeued, noun, pos[0])
	return nil
}

// parseSince reads --since: an RFC 3339 time, or a duration before now.
func parseSince(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, fmt.Errorf("dlq recover needs --since, an RFC 3339 time or a duration ago (2h): %w", errUsage)
	}
	if t, err := api.ParseTime(s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("--since %q is neither an RFC 3339 time (2025-01-02T15:04:05Z) nor a duration (2h): %w", s, errUsage)
}

// ---- stats

func (c *cli) stats(ctx context.Context, args []string) error {
	f := newCmdFlags("stats", "", "Shows per-subscriber counts, success rate and latency over the last minutes, breaker and bucket state.", "url", c.stderr)
	if _, err := f.parseArgs(args, c.getenv); err != nil {
		return err
	}
	type counts struct {
		Pending     int      `json:"pending"`
		Inflight    int      `json:"inflight"`
		Sent        int      `json:"sent"`
		Dead        int      `json:"dead"`
		Attempts    int      `json:"attempts_5m"`
		SuccessRate *float64 `json:"success_rate"`
	}
	var st struct {
		Subscribers []struct {
			counts
			ID          string     `json:"subscriber_id"`
			P50MS       *int64     `json:"p50_ms"`
			P99MS       *int64     `json:"p99_ms"`
			Breaker     string     `json:"breaker"`
			Paused      bool       `json:"paused"`
			PausedUntil *time.Time `json:"paused_until"`
			Tokens      float64    `json:"tokens"`
		} `json:"subscribers"`
		Totals struct {
			counts
			P50MS *int64 `json:"p50_ms"`
			P99MS *int64 `json:"p99_ms"`
		} `json:"totals"`
		WindowSeconds int `json:"window_seconds"`
	}
	if printed, err := c.call(ctx, f, http.MethodGet, "/v1/stats", nil, &st); err != nil || printed {
		return err
	}
	window := (time.Duration(st.WindowSeconds) * time.Second).String()
	if st.WindowSeconds > 0 && st.WindowSeconds%60 == 0 {
		window = fmt.Sprintf("%dm", st.WindowSeconds/60)
	}
	rate := func(r *float64) string {
		if r == nil {
			return ""
		}
		return fmt.Sprintf("%.1f%%", 100**r)
	}
	// The API answers null when nothing was delivered in the window.
	latency := func(ms *int64) string {
		if ms == nil {
			return ""
		}
		return millis(*ms)
	}
	t := newTable(c.stdout, "SUBSCRIBER", "PENDING", "INFLIGHT", "SENT", "DEAD", "ATTEMPTS "+window,
		"SUCCESS "+window, "P50", "P99", "BREAKER", "PAUSED", "TOKENS")
	for _, s := range st.Subscribers {
		// Paused by an operator until resumed, or by a Retry-After until a time.
		paused := when(s.PausedUntil)
		if s.Paused {
			paused = "yes"
		}
		t.row(s.ID, fmt.Sprint(s.Pending), fmt.Sprint(s.Inflight), fmt.Sprint(s.Sent), fmt.Sprint(s.Dead),
			fmt.Sprint(s.Attempts), rate(s.SuccessRate), latency(s.P50MS), latency(s.P99MS),
			s.Breaker, paused, fmt.Sprintf("%.1f", s.Tokens))
	}
	tt := st.Totals
	t.row("TOTAL", fmt.Sprint(tt.Pending), fmt.Sprint(tt.Inflight), fmt.Sprint(tt.Sent), fmt.Sprint(tt.Dead),
		fmt.Sprint(tt.Attempts), rate(tt.SuccessRate), latency(tt.P50MS), latency(tt.P99MS), "", "", "")
	return t.flush()
}

// ---- shared

// pageFlags adds a list command's --limit and --cursor.
func pageFlags(f *cmdFlags, what string) (limit *int, cursor *string) {
	limit = f.Int("limit", 100, "most "+what+" to list (0 for all)")
	cursor = f.String("cursor", "", "start where an earlier page ended: its next_cursor")
	return limit, cursor
}

// list fetches up to limit items of a list route, from cursor on, then
// prints them as JSON or through table. When more remain it says so on
// stderr, so the table on stdout stays clean. keep, when set, filters on the
// client where the API has no filter: every page is read, and limit counts
// what it kept.
func (c *cli) list(ctx context.Context, f *cmdFlags, path string, q url.Values, limit int, cursor string,
	keep func(json.RawMessage) (bool, error), what string, table func([]json.RawMessage) error) error {
	if limit < 0 {
		return fmt.Errorf("--limit must be 0 (all) or more: %w", errUsage)
	}
	api, err := f.client()
	if err != nil {
		return err
	}
	defer api.close()
	fetch := limit
	if keep != nil {
		fetch = 0
	}
	items, next, more, err := api.listAll(ctx, path, q, fetch, cursor)
	if err != nil {
		return err
	}
	if keep != nil {
		var kept []json.RawMessage
		for _, it := range items {
			ok, err := keep(it)
			if err != nil {
				return err
			}
			if ok {
				kept = append(kept, it)
			}
		}
		items, next, more = kept, "", false
		if limit > 0 && len(items) > limit {
			items, more = items[:limit], true
		}
	}
	if f.conn.json {
		if items == nil {
			items = []json.RawMessage{}
		}
		if err := writeJSON(c.stdout, page{Data: items, NextCursor: next}); err != nil {
			return err
		}
	} else if err := table(items); err != nil {
		return err
	}
	// JSON with a next_cursor says so itself; a filtered list has none.
	if more && (!f.conn.json || next == "") {
		how := "raise --limit, or --limit 0 for all"
		if next != "" {
			how = "--cursor " + oneLine(next) + " for the next page, or --limit 0 for all"
		}
		fmt.Fprintf(c.stderr, "sluice: showing %d %s; more remain (%s)\n", limit, what, how)
	}
	return nil
}

// health checks GET /healthz: exit 0 when the server and its database
// answer. It is the container's HEALTHCHECK, since the image has no shell.
func (c *cli) health(ctx context.Context, args []string) error {
	f := newCmdFlags("health", "", "Checks that a sluice server and its database answer (exit 0), for health checks.", "url", c.stderr)
	if _, err := f.parseArgs(args, c.getenv); err != nil {
		return err
	}
	api, err := f.client()
	if err != nil {
		return err
	}
	defer api.close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	raw, err := api.do(ctx, http.MethodGet, "/healthz", nil, nil)
	if err != nil {
		return err
	}
	if f.conn.json {
		return writeRaw(c.stdout, raw)
	}
	fmt.Fprintln(c.stdout, "ok")
	return nil
}
