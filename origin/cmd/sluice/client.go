package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
)

// defaultAPIURL is where the client commands look for the API when neither
// --url nor SLUICE_URL says otherwise: serve's default --addr.
const defaultAPIURL = "http://127.0.0.1:8080"

// requestTimeout bounds one API call; lists make one call per page.
const requestTimeout = 30 * time.Second

// exitStatus is the process exit status for err: 2 for a usage error, 3 when
// the API could not be reached, 1 for anything else (the API said no, or a
// server error). Scripts rely on these numbers.
// exitStatusAfter is exitStatus, but for a command a signal (Ctrl-C,
// SIGTERM) cut short 128 + its number, as shells report it, not a refusal
// by the API or a server that cannot be reached. cause is the run's
// context's; an error that is not the cancellation keeps its own status.
func exitStatusAfter(err, cause error) int {
	var s signalled
	if errors.As(cause, &s) && errors.Is(err, context.Canceled) {
		if n, ok := s.sig.(syscall.Signal); ok {
			return 128 + int(n)
		}
	}
	return exitStatus(err)
}

func exitStatus(err error) int {
	var ue *unreachableError
	if errors.As(err, &ue) {
		return 3
	}
	return exitCode(err)
}

// apiError is a 4xx or 5xx answer, shown on one line as
// "<status> <code>: <message>" with a hint when one helps.
type apiError struct {
	Status  int
	Code    string
	Message string
	hint    string
}

func (e *apiError) Error() string {
	s := fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
	if e.hint != "" {
		s += " (" + e.hint + ")"
	}
	return s
}

// unreachableError is a request that got no HTTP answer at all: refused,
// unresolvable, timed out, TLS failure.
type unreachableError struct {
	url    string // redacted base URL
	reason string
	err    error
}

func (e *unreachableError) Error() string { return "cannot reach " + e.url + ": " + e.reason }
func (e *unreachableError) Unwrap() error { return e.err }

// apiClient calls one sluice API with one bearer token.
type apiClient struct {
	base  *url.URL
	token string
	http  *http.Client
}

// newAPIClient checks the base URL; a URL that is not http(s)://host is a
// usage error, not a connection failure.
func newAPIClient(rawURL, token string) (*apiClient, error) {
	u, err := url.Parse(strings.TrimSpace(rawURL))
	if !strings.Contains(rawURL, ":/") {
		return nil, fmt.Errorf("--url (or SLUICE_URL) needs its scheme: http:// or https://, as in %s: %w", defaultAPIURL, errUsage)
	}
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("--url (or SLUICE_URL) %s is not an http:// or https:// base URL such as %s: %w",
			shownURL(rawURL), defaultAPIURL, errUsage)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("--url (or SLUICE_URL) %s has no valid port: %w", shownURL(rawURL), errUsage)
		}
	}
	// A token from a file may end in a newline, which is trimmed; one that
	// holds a control character inside could never be sent, and is a
	// mistake to fix, not a server to retry.
	token = strings.TrimSpace(token)
	if strings.ContainsFunc(token, unicode.IsControl) {
		return nil, fmt.Errorf("--api-token (or SLUICE_API_TOKEN) holds a control character no HTTP request can carry: %w", errUsage)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	tr := http.DefaultTransport.(*http.Transport).Clone()
	return &apiClient{
		base:  u,
		token: token,
		http:  &http.Client{Transport: tr, Timeout: requestTimeout},
	}, nil
}

// shownURL is raw as an error may quote it: with any password masked, and
// not at all when it does not parse, since then nothing can be masked.
func shownURL(raw string) string {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "(unreadable)"
	}
	return strconv.Quote(u.Redacted())
}

// close drops idle connections: a command makes a few calls and exits.
func (c *apiClient) close() { c.http.CloseIdleConnections() }

// do sends one request and returns the body of a 2xx answer. Any other answer
// is an *apiError; no answer is an *unreachableError.
func (c *apiClient) do(ctx context.Context, method, path string, query url.Values, body []byte) ([]byte, error) {
	u := *c.base
	u.Path += path
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "sluice-cli/"+version)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		// A deadline the command set (health's) is a server that did not
		// answer in time; only a cancel is the operator's interrupt.
		if errors.Is(ctx.Err(), context.Canceled) {
			return nil, fmt.Errorf("%s %s: interrupted: %w", method, path, ctx.Err())
		}
		return nil, &unreachableError{url: c.base.Redacted(), reason: transportReason(err), err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		if errors.Is(ctx.Err(), context.Canceled) {
			return nil, fmt.Errorf("%s %s: interrupted: %w", method, path, ctx.Err())
		}
		return nil, &unreachableError{url: c.base.Redacted(), reason: "the answer was cut off: " + transportReason(err), err: err}
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return raw, nil
	}
	return nil, c.answerError(resp, raw)
}

// answerError reads the API's {"error": {"code", "message"}}, or makes one
// from the status when something else (a proxy) answered.
func (c *apiClient) answerError(resp *http.Response, raw []byte) *apiError {
	e := &apiError{Status: resp.StatusCode}
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &body) == nil && body.Error.Code != "" {
		e.Code, e.Message = body.Error.Code, body.Error.Message
	} else {
		e.Code = strings.ToLower(strings.ReplaceAll(http.StatusText(resp.StatusCode), " ", "_"))
		if e.Code == "" {
			e.Code = "error"
		}
		e.Message = strings.TrimSpace(string(raw))
		if len(e.Message) > 200 {
			e.Message = e.Message[:200] + "…"
		}
		if e.Message == "" {
			e.Message = "the server answered " + resp.Status
		}
	}
	e.Code, e.Message = oneLine(e.Code), oneLine(e.Message) // whatever SLUICE_URL points at wrote them
	if resp.StatusCode == http.StatusUnauthorized {
		if c.token == "" {
			e.hint = "no API token given: set SLUICE_API_TOKEN or pass --api-token"
		} else {
			e.hint = "check SLUICE_API_TOKEN or --api-token"
		}
	}
	return e
}

// transportReason says in a few words why no answer came, without a Go
// error chain ("dial tcp …: connect: …").
func transportReason(err error) string {
	var dnsErr *net.DNSError
	var netErr net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "no route to host"
	case errors.As(err, &dnsErr):
		return "cannot resolve " + dnsErr.Name
	case errors.As(err, &netErr) && netErr.Timeout():
		return "timed out"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "the connection closed without an answer"
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return oneLine(err.Error())
}

// oneLine folds s onto a single line of printable characters.
func oneLine(s string) string { return strings.Join(strings.Fields(printable(s)), " ") }

// getJSON GETs path and decodes the answer into out; it returns the raw
// answer too, for --json.
func (c *apiClient) getJSON(ctx context.Context, path string, query url.Values, out any) ([]byte, error) {
	raw, err := c.do(ctx, http.MethodGet, path, query, nil)
	if err != nil {
		return nil, err
	}
	return raw, decodeAnswer(path, raw, out)
}

// sendJSON sends in (already encoded, or a value to encode) and decodes the
// answer into out when out is not nil.
func (c *apiClient) sendJSON(ctx context.Context, method, path string, in any, out any) ([]byte, error) {
	body, ok := in.([]byte)
	if !ok {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return nil, err
		}
	}
	raw, err := c.do(ctx, method, path, nil, body)
	if err != nil {
		return nil, err
	}
	if out == nil {
		return raw, nil
	}
	return raw, decodeAnswer(path, raw, out)
}

func decodeAnswer(path string, raw []byte, out any) error {
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("the API's answer to %s is not what this client expects: %v", path, err)
	}
	return nil
}

// page is what the list routes answer.
type page struct {
	Data       []json.RawMessage `json:"data"`
	NextCursor string            `json:"next_cursor,omitempty"`
}

// listAll follows next_cursor, from the cursor from ("" for the start),
// until it has limit items (0: no limit) or the last page. more reports that
// items exist beyond the ones returned; next is the cursor to continue from
// when the API gave one.
func (c *apiClient) listAll(ctx context.Context, path string, query url.Values, limit int, from string) (items []json.RawMessage, next string, more bool, err error) {
	const maxPage = 1000 // the API's largest page
	q := url.Values{}
	for k, v := range query {
		q[k] = v
	}
	seen := map[string]bool{}
	next = from
	for {
		size := maxPage
		if limit > 0 {
			size = min(size, limit-len(items))
		}
		q.Set("limit", strconv.Itoa(size))
		if next != "" {
			q.Set("cursor", next)
		}
		var p page
		if _, err := c.getJSON(ctx, path, q, &p); err != nil {
			return nil, "", false, err
		}
		items = append(items, p.Data...)
		if limit > 0 && len(items) > limit {
			// A route without paging answered everything at once.
			return items[:limit], "", true, nil
		}
		next = p.NextCursor
		if next == "" {
			return items, "", false, nil
		}
		if limit > 0 && len(items) == limit {
			return items, next, true, nil
		}
		if seen[next] || len(p.Data) == 0 {
			return nil, "", false, fmt.Errorf("GET %s: the API's next_cursor %q does not advance", path, next)
		}
		seen[next] = true
	}
}

// connection is what every client command needs to reach the API.
type connection struct {
	url, token string
	json       bool
}

// cmdFlags is a client command's flag set. Only the connection flags are read
// from the environment: a variable like SLUICE_ID silently filling --id of
// every command would surprise more than it helps.
type cmdFlags struct {
	*flag.FlagSet
	name, syntax, summary string
	env                   map[string]string // flag name → the variable it falls back to
	conn                  connection
	stderr                io.Writer
	// quiet keeps stray arguments out of errors: a command that takes
	// secrets may be given one where a flag was meant.
	quiet bool
}

// newCmdFlags makes the flag set of "sluice <name>". urlFlag names the flag
// holding the API's URL: "url" everywhere except where --url means something
// else (subscribers add, whose --url is the subscriber's endpoint).
func newCmdFlags(name, syntax, summary, urlFlag string, stderr io.Writer) *cmdFlags {
	f := &cmdFlags{FlagSet: newFlags(name, summary, stderr), name: name, syntax: syntax, summary: summary,
		env: map[string]string{}, stderr: stderr}
	f.StringVar(&f.conn.url, urlFlag, defaultAPIURL, "the sluice API's base URL")
	f.env[urlFlag] = envName("url")
	f.StringVar(&f.conn.token, "api-token", "", "bearer token for the API (never printed)")
	f.env["api-token"] = envName("api-token")
	f.BoolVar(&f.conn.json, "json", false, "print the API's JSON instead of a table")
	f.Usage = f.usage
	return f
}

func (f *cmdFlags) usage() {
	syntax := f.syntax
	if syntax != "" {
		syntax = " " + syntax
	}
	fmt.Fprintf(f.stderr, "Usage: sluice %s%s [flags]\n\n%s\n\nFlags (a flag wins over its environment variable):\n", f.name, syntax, f.summary)
	f.VisitAll(func(fl *flag.Flag) {
		def := ""
		if fl.DefValue != "" && fl.DefValue != "false" && fl.DefValue != "0" && fl.DefValue != "0s" {
			def = fmt.Sprintf(" (default %s)", fl.DefValue)
		}
		fmt.Fprintf(f.stderr, "  --%-26s %s%s\n", fl.Name, fl.Usage, def)
		if env, ok := f.env[fl.Name]; ok {
			fmt.Fprintf(f.stderr, "      env %s\n", env)
		}
	})
}

// parseArgs parses flags and positional arguments in any order ("show ID
// --json" and "show --json ID"), fills the connection flags from the
// environment, and requires exactly the positional arguments named in want.
func (f *cmdFlags) parseArgs(args []string, getenv func(string) string, want ...string) ([]string, error) {
	var pos []string
	rest := args
	for {
		if err := parseFlags(f.FlagSet, rest); err != nil {
			return nil, err
		}
		if f.NArg() == 0 {
			break
		}
		pos = append(pos, f.Arg(0))
		rest = f.Args()[1:]
	}
	envOnly := func(name string) string {
		for flagName, env := range f.env {
			if envName(flagName) == name {
				return getenv(env)
			}
		}
		return ""
	}
	// Every flag is already parsed; parse only adds the environment.
	if err := parse(f.FlagSet, nil, envOnly); err != nil {
		return nil, err
	}
	if len(pos) < len(want) {
		return nil, fmt.Errorf("%s needs %s (see --help): %w", f.name, strings.Join(want, " "), errUsage)
	}
	if len(pos) > len(want) {
		if f.quiet {
			return nil, fmt.Errorf("%s: unexpected argument (not shown: it may be a secret; flags start with --): %w", f.name, errUsage)
		}
		return nil, fmt.Errorf("%s: %s: %w", f.name, strayArg(pos[len(want)]), errUsage)
	}
	return pos, nil
}

// given reports whether the flag was set on the command line.
func (f *cmdFlags) given(name string) bool {
	set := false
	f.Visit(func(fl *flag.Flag) { set = set || fl.Name == name })
	return set
}

// client returns the API client for the parsed connection flags.
func (f *cmdFlags) client() (*apiClient, error) { return newAPIClient(f.conn.url, f.conn.token) }

// call makes a command's one API request (a GET when in is nil) and
// decodes the answer into out; with --json it prints the answer as it came
// instead and reports printed, leaving the command nothing to do.
func (c *cli) call(ctx context.Context, f *cmdFlags, method, path string, in, out any) (printed bool, err error) {
	api, err := f.client()
	if err != nil {
		return false, err
	}
	defer api.close()
	var raw []byte
	if method == http.MethodGet {
		raw, err = api.getJSON(ctx, path, nil, out)
	} else {
		raw, err = api.sendJSON(ctx, method, path, in, out)
	}
	if err != nil {
		return false, err
	}
	if f.conn.json {
		return true, writeRaw(c.stdout, raw)
	}
	return false, nil
}
