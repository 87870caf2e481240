package main

// sluice edge: operations on the Cloudflare side of the edge lane, through
// cloudflare-go. Only the workers and durable_objects packages are imported,
// not the SDK's root package, which would compile and link every Cloudflare
// product into the binary.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/cloudflare/cloudflare-go/v6/durable_objects"
	"github.com/cloudflare/cloudflare-go/v6/option"
	"github.com/cloudflare/cloudflare-go/v6/workers"

	"github.com/sluice-dev/sluice/shared/retryafter"
	"github.com/sluice-dev/sluice/shared/signature"
)

const (
	// edgeSecretBinding is the Worker secret the edge reads its origin↔edge
	// secret from (wrangler.toml, edge/).
	edgeSecretBinding = "SLUICE_EDGE_SECRET"
	// defaultEdgeScript is the Worker's name in wrangler.toml.
	defaultEdgeScript = "sluice-edge"
	// defaultCFBaseURL is Cloudflare's API.
	defaultCFBaseURL = "https://api.cloudflare.com/client/v4/"
	// cfPageSize is the largest page the namespace list accepts.
	cfPageSize = 1000
	// cfMaxPages bounds the namespace listing should the API ignore paging.
	cfMaxPages = 100
)

// Account ids (Cloudflare's are 32 hex digits) and script names take
// letters, digits and, in names, dashes and underscores: cloudflare-go puts
// both into the path unescaped, so anything else is refused before a
// request is made.
var (
	cfAccountID  = regexp.MustCompile(`^[0-9a-fA-F]{32}$`)
	cfScriptName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,63}$`)
)

var edgeCommands = []subcommand{
	{"put-secret", "put the origin↔edge secret on the Worker as " + edgeSecretBinding, (*cli).edgePutSecret},
	{"status", "show the Worker's current deployment and Durable Object namespaces", (*cli).edgeStatus},
}

// edge runs "sluice edge …".
func edge(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	c := &cli{getenv: getenv, stdout: stdout, stderr: stderr}
	usage := func(w io.Writer) {
		fmt.Fprintf(w, "Usage: sluice edge COMMAND [flags]\n\nCommands:\n")
		for _, sc := range edgeCommands {
			fmt.Fprintf(w, "  %-11s %s\n", sc.name, sc.summary)
		}
		fmt.Fprintf(w, "\nRun \"sluice edge COMMAND --help\" for a command's flags.\n")
	}
	if len(args) == 0 {
		usage(stderr)
		return fmt.Errorf("edge needs a command: %w", errUsage)
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		usage(stdout)
		return nil
	}
	for _, sc := range edgeCommands {
		if sc.name == args[0] {
			err := sc.run(c, ctx, args[1:])
			if errors.Is(err, flag.ErrHelp) {
				return nil
			}
			return err
		}
	}
	usage(stderr)
	return fmt.Errorf("unknown command %q for sluice edge: %w", args[0], errUsage)
}

// cfConn is what every edge command needs to reach Cloudflare.
type cfConn struct {
	accountID, token, script, baseURL string
	retries                           int
}

// newEdgeFlags makes the flag set of "sluice edge <name>": the Cloudflare
// connection flags, read from the variables wrangler reads too, and --json.
func newEdgeFlags(name, summary string, conn *cfConn, stderr io.Writer) *cmdFlags {
	f := &cmdFlags{FlagSet: newFlags("edge "+name, summary, stderr), name: "edge " + name, summary: summary,
		env: map[string]string{}, stderr: stderr, quiet: true}
	f.StringVar(&conn.accountID, "account-id", "", "Cloudflare account id (required)")
	f.env["account-id"] = "CLOUDFLARE_ACCOUNT_ID"
	f.StringVar(&conn.token, "cf-api-token", "", "Cloudflare API token (required; never printed)")
	f.env["cf-api-token"] = "CLOUDFLARE_API_TOKEN"
	f.StringVar(&conn.script, "script", defaultEdgeScript, "the Worker's name")
	f.env["script"] = envName("edge-script")
	f.StringVar(&conn.baseURL, "cf-base-url", defaultCFBaseURL, "Cloudflare API base URL (tests, proxies)")
	f.env["cf-base-url"] = "CLOUDFLARE_BASE_URL" // cloudflare-go's own
	f.IntVar(&conn.retries, "cf-retries", 2, "retries of a call that hit a 408, a 409, a rate limit, a 5xx or a network error")
	f.BoolVar(&f.conn.json, "json", false, "print JSON instead of a table")
	f.Usage = f.usage
	return f
}

// check refuses a connection that cannot work, before any request.
func (c *cfConn) check() error {
	c.accountID = strings.TrimSpace(c.accountID)
	c.token = strings.TrimSpace(c.token)
	c.script = strings.TrimSpace(c.script)
	switch {
	case c.accountID == "":
		return fmt.Errorf("needs --account-id (or CLOUDFLARE_ACCOUNT_ID): %w", errUsage)
	case !cfAccountID.MatchString(c.accountID):
		// Not quoted: a token given here by mistake must not be printed.
		return fmt.Errorf("--account-id is not a Cloudflare account id (32 hex digits): %w", errUsage)
	case c.token == "":
		return fmt.Errorf("needs --cf-api-token (or CLOUDFLARE_API_TOKEN): %w", errUsage)
	case strings.ContainsFunc(c.token, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		// Not quoted, as for the account id.
		return fmt.Errorf("--cf-api-token has a space or control character, which no API token has: %w", errUsage)
	case !cfScriptName.MatchString(c.script):
		return fmt.Errorf("--script is not a Worker name (letters, digits, - and _; at most 63): %w", errUsage)
	case c.retries < 0 || c.retries > 10:
		return fmt.Errorf("--cf-retries must be between 0 and 10: %w", errUsage)
	}
	u, err := url.Parse(strings.TrimSpace(c.baseURL))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("--cf-base-url %s is not an http:// or https:// base URL such as %s: %w", shownURL(c.baseURL), defaultCFBaseURL, errUsage)
	}
	if u.User != nil {
		// Not shown: what sits there is a credential.
		return fmt.Errorf("--cf-base-url carries a user name or password; the API token goes in --cf-api-token: %w", errUsage)
	}
	c.baseURL = u.String()
	return nil
}

// cfClient holds the request options of one command's calls and remembers
// the last answer: its status, for errors whose body cloudflare-go cannot
// parse, and its body, whose envelope says whether the call succeeded.
type cfClient struct {
	conn       cfConn
	http       *http.Client
	opts       []option.RequestOption
	lastStatus int
	lastBody   []byte
	waitAsked  time.Duration // a Retry-After too long to wait out
	// hide lists what must never be printed (the API token, a secret being
	// put) even if an answer quotes it back.
	hide []string
}

// redact replaces in msg anything the client must not print.
func (c *cfClient) redact(msg string) string {
	for _, h := range c.hide {
		if h != "" {
			msg = strings.ReplaceAll(msg, h, "[redacted]")
		}
	}
	return msg
}

// cfMaxWait is the longest Retry-After a command waits out; beyond it, it
// fails and says when to try again.
const cfMaxWait = 30 * time.Second

// cfRetryAfter reads the wait an answer asks for, as cloudflare-go does:
// Retry-After-Ms first, then Retry-After in seconds (fractions too) or as a
// date.
func cfRetryAfter(h http.Header) (time.Duration, bool) {
	if ms, err := strconv.ParseFloat(h.Get("Retry-After-Ms"), 64); err == nil && ms >= 0 {
		return time.Duration(ms * float64(time.Millisecond)), true
	}
	if secs, err := strconv.ParseFloat(h.Get("Retry-After"), 64); err == nil && secs >= 0 {
		return time.Duration(secs * float64(time.Second)), true
	}
	return retryafter.Parse(h.Get("Retry-After"), time.Now())
}

// cfMaxAnswer is the largest answer read; these calls get a few KiB.
const cfMaxAnswer = 8 << 20

func newCFClient(conn cfConn) *cfClient {
	c := &cfClient{conn: conn, hide: []string{conn.token}, http: &http.Client{
		Transport: http.DefaultTransport.(*http.Transport).Clone(),
		Timeout:   requestTimeout,
	}}
	c.opts = []option.RequestOption{
		option.WithBaseURL(conn.baseURL),
		option.WithAPIToken(conn.token),
		option.WithHTTPClient(c.http),
		// The SDK's default is 10 retries with backoff up to 30 s: minutes
		// of silence for a command-line tool whose network is down.
		option.WithMaxRetries(conn.retries),
		option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			res, err := next(req)
			if res == nil {
				return res, err
			}
			c.lastStatus, c.lastBody, c.waitAsked = res.StatusCode, nil, 0
			if d, ok := cfRetryAfter(res.Header); ok && d > cfMaxWait {
				// cloudflare-go would sleep it out in silence.
				c.waitAsked = d
				res.Header.Set("x-should-retry", "false")
			}
			b, rerr := io.ReadAll(io.LimitReader(res.Body, cfMaxAnswer+1))
			res.Body.Close()
			if rerr != nil {
				// Headers came, then the body stalled or broke: no answer.
				return nil, &url.Error{Op: "read", URL: req.URL.Redacted(), Err: rerr}
			}
			if len(b) > cfMaxAnswer {
				return nil, fmt.Errorf("the answer is over %d MiB", cfMaxAnswer>>20)
			}
			c.lastBody = b
			res.Body = io.NopCloser(bytes.NewReader(b))
			return res, err
		}),
	}
	return c
}

func (c *cfClient) close() { c.http.CloseIdleConnections() }

// cfError is an error answer from Cloudflare's API, shown on one line as
// "cloudflare: <status> <message> (code n)".
type cfError struct {
	Status  int
	Message string
	hint    string
}

func (e *cfError) Error() string {
	s := fmt.Sprintf("cloudflare: %d %s", e.Status, e.Message)
	if e.hint != "" {
		s += " (" + e.hint + ")"
	}
	return s
}

// fail turns what cloudflare-go returned into sluice's error vocabulary:
// *cfError (exit 1) for an answer, *unreachableError (exit 3) for none.
// Neither the token nor a request body ever reaches the message.
func (c *cfClient) fail(ctx context.Context, what, scope string, err error) error {
	var apiErr *workers.Error
	var urlErr *url.Error
	switch {
	case errors.As(err, &apiErr):
		var msgs []string
		for _, e := range apiErr.Errors {
			m := oneLine(e.Message)
			if e.Code != 0 {
				m += fmt.Sprintf(" (code %d)", e.Code)
			}
			msgs = append(msgs, m)
		}
		ce := &cfError{Status: apiErr.StatusCode, Message: strings.Join(msgs, "; ")}
		if ce.Message == "" {
			ce.Message = http.StatusText(apiErr.StatusCode)
		}
		ce.Message = truncate(c.redact(ce.Message), 300)
		if ce.Status == http.StatusUnauthorized || ce.Status == http.StatusForbidden {
			ce.hint = "check --cf-api-token or CLOUDFLARE_API_TOKEN and --account-id; the token needs " + scope
		}
		if c.waitAsked > 0 {
			ce.hint = "Cloudflare asks to wait " + c.waitAsked.Round(time.Second).String() + " before trying again"
		}
		return ce
	case ctx.Err() != nil:
		return fmt.Errorf("cloudflare: %s: interrupted: %w", what, ctx.Err())
	case errors.As(err, &urlErr):
		base, _ := url.Parse(c.conn.baseURL)
		return fmt.Errorf("cloudflare: %w", &unreachableError{url: base.Redacted(), reason: transportReason(err), err: err})
	case c.lastStatus >= 400:
		// An error page cloudflare-go could not read as an envelope (a
		// proxy's HTML, say).
		ce := &cfError{Status: c.lastStatus, Message: http.StatusText(c.lastStatus)}
		if ce.Status == http.StatusUnauthorized || ce.Status == http.StatusForbidden {
			ce.hint = "check --cf-api-token or CLOUDFLARE_API_TOKEN and --account-id; the token needs " + scope
		}
		return ce
	}
	return fmt.Errorf("cloudflare: %s: the answer is not what this client expects: %s", what, truncate(c.redact(err.Error()), 200))
}

// succeeded checks the envelope of the last answer: cloudflare-go takes a
// 200 whose envelope says "success": false, or that has none, as a result.
func (c *cfClient) succeeded(what string) error {
	var env struct {
		Success *bool `json:"success"`
		Errors  []struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"errors"`
		Result json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(c.lastBody, &env); err != nil || env.Success == nil {
		return fmt.Errorf("cloudflare: %s: the answer is not what this client expects: no success envelope", what)
	}
	if !*env.Success {
		var msgs []string
		for _, e := range env.Errors {
			msgs = append(msgs, fmt.Sprintf("%s (code %d)", oneLine(e.Message), e.Code))
		}
		if len(msgs) == 0 {
			msgs = append(msgs, "the API says it did not succeed")
		}
		return &cfError{Status: c.lastStatus, Message: truncate(c.redact(strings.Join(msgs, "; ")), 300)}
	}
	if len(env.Result) == 0 || string(env.Result) == "null" {
		return fmt.Errorf("cloudflare: %s: the answer is not what this client expects: no result", what)
	}
	return nil
}

// ---- put-secret

func (c *cli) edgePutSecret(ctx context.Context, args []string) error {
	var conn cfConn
	f := newEdgeFlags("put-secret",
		"Puts the origin↔edge secret on the Worker as the secret "+edgeSecretBinding+" (what\n"+
			"\"wrangler secret put\" does). Give the Worker the same whsec_ secret as serve's --edge-secret.\n"+
			"The API token needs Workers Scripts: Edit.", &conn, c.stderr)
	secret := f.String("edge-secret", "", "the origin↔edge secret, whsec_… (required; never printed)")
	f.env["edge-secret"] = envName("edge-secret")
	if _, err := f.parseArgs(args, c.getenv); err != nil {
		return err
	}
	// Several secrets, space-separated, let the Worker accept the old and
	// the new one while serve switches.
	secrets := strings.Fields(*secret)
	if len(secrets) == 0 {
		return fmt.Errorf("edge put-secret needs --edge-secret (or SLUICE_EDGE_SECRET), the whsec_ secret serve uses: %w", errUsage)
	}
	for i, one := range secrets {
		if err := signature.CheckSecret(one); err != nil {
			which := ""
			if len(secrets) > 1 {
				which = fmt.Sprintf(" secret %d of %d:", i+1, len(secrets))
			}
			return fmt.Errorf("--edge-secret:%s %v: %w", which, err, errUsage)
		}
	}
	s := strings.Join(secrets, " ")
	if err := conn.check(); err != nil {
		return fmt.Errorf("edge put-secret: %w", err)
	}
	cf := newCFClient(conn)
	defer cf.close()
	for _, one := range secrets {
		cf.hide = append(cf.hide, one, strings.TrimPrefix(one, "whsec_"))
	}
	var p workers.ScriptSecretUpdateParams
	p.AccountID.Value, p.AccountID.Present = conn.accountID, true
	var body workers.ScriptSecretUpdateParamsBodyWorkersBindingKindSecretText
	body.Name.Value, body.Name.Present = edgeSecretBinding, true
	body.Text.Value, body.Text.Present = s, true
	body.Type.Value, body.Type.Present = workers.ScriptSecretUpdateParamsBodyWorkersBindingKindSecretTextTypeSecretText, true
	p.Body = body
	res, err := workers.NewScriptSecretService(cf.opts...).Update(ctx, conn.script, p)
	if err != nil {
		return cf.fail(ctx, "put secret", "Workers Scripts: Edit", err)
	}
	if err := cf.succeeded("put secret"); err != nil {
		return err
	}
	name, typ := res.Name, string(res.Type)
	if name != edgeSecretBinding {
		return fmt.Errorf("cloudflare: put secret: the answer names the secret %q, not %s: nothing confirms it was put", truncate(name, 64), edgeSecretBinding)
	}
	if f.conn.json {
		return writeJSON(c.stdout, map[string]string{
			"account_id": conn.accountID, "script": conn.script, "name": name, "type": typ,
		})
	}
	fmt.Fprintf(c.stdout, "put secret %s on Worker %s (account %s)\n", name, conn.script, conn.accountID)
	return nil
}

// ---- status

// edgeStatusJSON is what status --json prints: Cloudflare's own objects for
// the deployment and the namespaces, so scripts see every field it sends.
type edgeStatusJSON struct {
	AccountID  string            `json:"account_id"`
	Script     string            `json:"script"`
	Deployment json.RawMessage   `json:"deployment"`
	Namespaces []json.RawMessage `json:"durable_object_namespaces"`
}

func (c *cli) edgeStatus(ctx context.Context, args []string) error {
	var conn cfConn
	f := newEdgeFlags("status",
		"Shows the Worker's current deployment (its versions and their share of traffic) and the\n"+
			"Durable Object namespaces its classes back. The API token needs Workers Scripts: Read.", &conn, c.stderr)
	if _, err := f.parseArgs(args, c.getenv); err != nil {
		return err
	}
	if err := conn.check(); err != nil {
		return fmt.Errorf("edge status: %w", err)
	}
	cf := newCFClient(conn)
	defer cf.close()
	const scope = "Workers Scripts: Read"

	var acct workers.ScriptDeploymentListParams
	acct.AccountID.Value, acct.AccountID.Present = conn.accountID, true
	deps, err := workers.NewScriptDeploymentService(cf.opts...).List(ctx, conn.script, acct)
	if err != nil {
		return cf.fail(ctx, "list deployments", scope, err)
	}
	if err := cf.succeeded("list deployments"); err != nil {
		return err
	}
	namespaces, err := cf.namespaces(ctx, scope)
	if err != nil {
		return err
	}

	// Cloudflare lists the deployment serving traffic first.
	var dep *workers.Deployment
	if len(deps.Deployments) > 0 {
		dep = &deps.Deployments[0]
	}
	if f.conn.json {
		out := edgeStatusJSON{AccountID: conn.accountID, Script: conn.script,
			Deployment: json.RawMessage("null"), Namespaces: []json.RawMessage{}}
		if dep != nil {
			out.Deployment = rawOr(dep.JSON.RawJSON(), dep)
		}
		for _, ns := range namespaces {
			out.Namespaces = append(out.Namespaces, rawOr(ns.JSON.RawJSON(), ns))
		}
		return writeJSON(c.stdout, out)
	}

	kv := []string{"WORKER", conn.script, "ACCOUNT", conn.accountID}
	if dep == nil {
		kv = append(kv, "DEPLOYMENT", "none: the Worker has no deployment")
	} else {
		created := dep.CreatedOn
		kv = append(kv, "DEPLOYMENT", dep.ID, "CREATED", when(&created), "SOURCE", dep.Source)
		if dep.AuthorEmail != "" {
			kv = append(kv, "AUTHOR", dep.AuthorEmail)
		}
		if dep.Annotations.WorkersMessage != "" {
			kv = append(kv, "MESSAGE", truncate(dep.Annotations.WorkersMessage, 80))
		}
	}
	if err := fields(c.stdout, kv...); err != nil {
		return err
	}
	if dep != nil {
		fmt.Fprintln(c.stdout)
		t := newTable(c.stdout, "VERSION", "TRAFFIC")
		for _, v := range dep.Versions {
			t.row(v.VersionID, number(v.Percentage)+"%")
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(c.stdout)
	if len(namespaces) == 0 {
		fmt.Fprintf(c.stdout, "no Durable Object namespace belongs to %s\n", conn.script)
		return nil
	}
	t := newTable(c.stdout, "NAMESPACE", "NAME", "CLASS", "STORAGE")
	for _, ns := range namespaces {
		storage := "kv"
		if ns.UseSqlite {
			storage = "sqlite"
		}
		t.row(ns.ID, ns.Name, ns.Class, storage)
	}
	return t.flush()
}

// namespaces lists the account's Durable Object namespaces page by page and
// keeps the Worker's. Paging stops at a short page, not at an empty one, so
// a small account costs one request.
func (cf *cfClient) namespaces(ctx context.Context, scope string) ([]durable_objects.Namespace, error) {
	svc := durable_objects.NewNamespaceService(cf.opts...)
	var out []durable_objects.Namespace
	seen := map[string]bool{}
	for page := int64(1); page <= cfMaxPages; page++ {
		var p durable_objects.NamespaceListParams
		p.AccountID.Value, p.AccountID.Present = cf.conn.accountID, true
		p.Page.Value, p.Page.Present = page, true
		p.PerPage.Value, p.PerPage.Present = cfPageSize, true
		res, err := svc.List(ctx, p)
		if err != nil {
			return nil, cf.fail(ctx, "list Durable Object namespaces", scope, err)
		}
		if err := cf.succeeded("list Durable Object namespaces"); err != nil {
			return nil, err
		}
		fresh := 0
		for _, ns := range res.Result {
			if seen[ns.ID] {
				continue
			}
			seen[ns.ID] = true
			fresh++
			if ns.Script == cf.conn.script {
				out = append(out, ns)
			}
		}
		// A page with nothing new means the API ignores paging.
		if len(res.Result) < cfPageSize || fresh == 0 {
			break
		}
	}
	return out, nil
}

// rawOr is the JSON Cloudflare sent for v, or v re-encoded when the SDK kept
// none.
func rawOr(raw string, v any) json.RawMessage {
	if raw != "" && json.Valid([]byte(raw)) {
		return json.RawMessage(raw)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return json.RawMessage("null")
	}
	return b
}
