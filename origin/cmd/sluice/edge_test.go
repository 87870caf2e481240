package main

// sluice edge tests: the commands run in-process through run() against an
// httptest server on 127.0.0.1 that plays Cloudflare's API for exactly the
// endpoints sluice uses, answering in Cloudflare's envelope and recording
// every request it gets.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	edgeTestAccount = "023e105f4ecef8ad9ca31a8372d0c353"
	edgeTestToken   = "cf-tok-Sn3lZJTBX6kkg7OdcBUAxOO963GEIyGQ"
	// whsec_ + base64 of 32 bytes.
	edgeTestSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw0123456789A="
)

// cfRequest is one request the fake Cloudflare API received.
type cfRequest struct {
	Method, Path, Query, Auth, ContentType string
	Body                                   string
}

// cfAnswer is a canned answer: a status and a body, JSON unless
// contentType says otherwise; header adds response headers.
type cfAnswer struct {
	status      int
	body        string
	contentType string
	header      map[string]string
}

// fakeCloudflare answers "METHOD /path" from a queue of canned answers per
// route; the last answer of a route repeats.
type fakeCloudflare struct {
	t   *testing.T
	URL string

	mu      sync.Mutex
	reqs    []cfRequest
	answers map[string][]cfAnswer
}

func newFakeCloudflare(t *testing.T, answers map[string][]cfAnswer) *fakeCloudflare {
	t.Helper()
	f := &fakeCloudflare{t: t, answers: answers}
	srv := httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(srv.Close)
	f.URL = srv.URL
	return f
}

func (f *fakeCloudflare) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.reqs = append(f.reqs, cfRequest{
		Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery,
		Auth: r.Header.Get("Authorization"), ContentType: r.Header.Get("Content-Type"), Body: string(body),
	})
	key := r.Method + " " + r.URL.Path
	queue := f.answers[key]
	var a cfAnswer
	switch {
	case len(queue) == 0:
		f.t.Errorf("fake Cloudflare: unexpected request %s", key)
		a = cfAnswer{status: 404, body: `{"success":false,"errors":[{"code":7003,"message":"Could not route to ` + r.URL.Path + `"}],"messages":[],"result":null}`}
	case len(queue) == 1:
		a = queue[0]
	default:
		a, f.answers[key] = queue[0], queue[1:]
	}
	f.mu.Unlock()
	ct := a.contentType
	if ct == "" {
		ct = "application/json"
	}
	w.Header().Set("Content-Type", ct)
	for k, v := range a.header {
		w.Header().Set(k, v)
	}
	w.WriteHeader(a.status)
	io.WriteString(w, a.body)
}

// requests returns what the fake received so far.
func (f *fakeCloudflare) requests() []cfRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]cfRequest(nil), f.reqs...)
}

// expect checks the method, path, query and Authorization of every request,
// in order, and that there were no others.
func (f *fakeCloudflare) expect(want ...cfRequest) []cfRequest {
	f.t.Helper()
	got := f.requests()
	if len(got) != len(want) {
		f.t.Fatalf("fake Cloudflare got %d requests, want %d:\n%+v", len(got), len(want), got)
	}
	for i := range want {
		g := got[i]
		w := want[i]
		if g.Method != w.Method || g.Path != w.Path || g.Query != w.Query {
			f.t.Errorf("request %d = %s %s?%s, want %s %s?%s", i, g.Method, g.Path, g.Query, w.Method, w.Path, w.Query)
		}
		if g.Auth != w.Auth {
			// Not printed: it holds a token.
			f.t.Errorf("request %d: Authorization is not %q with the expected token", i, "Bearer …")
		}
		if w.Method == http.MethodGet && g.Body != "" {
			f.t.Errorf("request %d: GET with a body %q", i, g.Body)
		}
	}
	return got
}

// envelope wraps result the way Cloudflare's API does.
func envelope(result string) string {
	return `{"success":true,"errors":[],"messages":[],"result":` + result + `}`
}

// runEdge runs one command with env as its whole environment, and fails the
// test if the API token or the edge secret shows anywhere in what it printed.
func runEdge(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	err := run(ctx, args, func(k string) string { return env[k] }, &out, &errOut)
	r := result{stdout: out.String(), stderr: errOut.String(), err: err}
	for _, secret := range []string{edgeTestToken, edgeTestSecret, strings.TrimPrefix(edgeTestSecret, "whsec_")} {
		for name, s := range map[string]string{"stdout": r.stdout, "stderr": r.stderr, "error": r.message()} {
			if strings.Contains(s, secret) {
				t.Errorf("sluice %s: a secret shows on %s:\n%s", strings.Join(args, " "), name, s)
			}
		}
	}
	return r
}

// cfEnv is the environment of a command that talks to fake.
func cfEnv() map[string]string {
	return map[string]string{
		"CLOUDFLARE_ACCOUNT_ID": edgeTestAccount,
		"CLOUDFLARE_API_TOKEN":  edgeTestToken,
		"SLUICE_EDGE_SECRET":    edgeTestSecret,
	}
}

const edgeSecretsPath = "/accounts/" + edgeTestAccount + "/workers/scripts/sluice-edge/secrets"

var secretAnswer = cfAnswer{status: 200, body: envelope(`{"name":"SLUICE_EDGE_SECRET","type":"secret_text"}`)}

// checkSecretBody checks the body of a put-secret request, field by field:
// exactly name, text and type.
func checkSecretBody(t *testing.T, req cfRequest) {
	t.Helper()
	if req.ContentType != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", req.ContentType)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(req.Body), &got); err != nil {
		t.Fatalf("body is not JSON: %v", err)
	}
	want := map[string]any{"name": "SLUICE_EDGE_SECRET", "text": edgeTestSecret, "type": "secret_text"}
	if !reflect.DeepEqual(got, want) {
		// Not printed with the secret in it.
		t.Errorf("body has keys %v, want exactly name, text = the secret, type = secret_text", reflect.ValueOf(got).MapKeys())
	}
}

func TestEdgePutSecret(t *testing.T) {
	t.Parallel()
	cf := newFakeCloudflare(t, map[string][]cfAnswer{"PUT " + edgeSecretsPath: {secretAnswer}})
	r := runEdge(t, cfEnv(), "edge", "put-secret", "--cf-base-url", cf.URL)
	if r.err != nil {
		t.Fatalf("put-secret: %s\n%s", r.message(), r.stderr)
	}
	reqs := cf.expect(cfRequest{Method: "PUT", Path: edgeSecretsPath, Auth: "Bearer " + edgeTestToken})
	checkSecretBody(t, reqs[0])
	want := "put secret SLUICE_EDGE_SECRET on Worker sluice-edge (account " + edgeTestAccount + ")\n"
	if r.stdout != want {
		t.Errorf("stdout = %q, want %q", r.stdout, want)
	}
}

func TestEdgePutSecretFlagsWinAndJSON(t *testing.T) {
	t.Parallel()
	const account = "0123456789abcdef0123456789abcdef"
	path := "/accounts/" + account + "/workers/scripts/my-edge/secrets"
	cf := newFakeCloudflare(t, map[string][]cfAnswer{"PUT " + path: {secretAnswer}})
	env := cfEnv()
	env["SLUICE_EDGE_SCRIPT"] = "from-env"
	env["CLOUDFLARE_API_TOKEN"] = "env-token-not-used"
	r := runEdge(t, env, "edge", "put-secret", "--json", "--cf-base-url", cf.URL,
		"--account-id", account, "--script", "my-edge", "--cf-api-token", edgeTestToken)
	if r.err != nil {
		t.Fatalf("put-secret: %s", r.message())
	}
	reqs := cf.expect(cfRequest{Method: "PUT", Path: path, Auth: "Bearer " + edgeTestToken})
	checkSecretBody(t, reqs[0])
	var out map[string]string
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("--json output: %v\n%s", err, r.stdout)
	}
	want := map[string]string{"account_id": account, "script": "my-edge", "name": "SLUICE_EDGE_SECRET", "type": "secret_text"}
	if !reflect.DeepEqual(out, want) {
		t.Errorf("--json = %v, want %v", out, want)
	}

	// The script's variable is read when the flag is absent.
	path = "/accounts/" + edgeTestAccount + "/workers/scripts/from-env/secrets"
	cf = newFakeCloudflare(t, map[string][]cfAnswer{"PUT " + path: {secretAnswer}})
	if r := runEdge(t, env, "edge", "put-secret", "--cf-base-url", cf.URL); r.err != nil {
		t.Fatalf("put-secret: %s", r.message())
	}
	cf.expect(cfRequest{Method: "PUT", Path: path, Auth: "Bearer env-token-not-used"})
}

// A rate-limited call is retried after Cloudflare's Retry-After, with the
// same request.
func TestEdgePutSecretRetriesRateLimit(t *testing.T) {
	t.Parallel()
	limited := cfAnswer{status: 429, header: map[string]string{"Retry-After-Ms": "1"},
		body: `{"success":false,"errors":[{"code":971,"message":"Please wait and consider throttling your request speed"}],"messages":[],"result":null}`}
	cf := newFakeCloudflare(t, map[string][]cfAnswer{"PUT " + edgeSecretsPath: {limited, secretAnswer}})
	if r := runEdge(t, cfEnv(), "edge", "put-secret", "--cf-base-url", cf.URL); r.err != nil {
		t.Fatalf("put-secret: %s", r.message())
	}
	want := cfRequest{Method: "PUT", Path: edgeSecretsPath, Auth: "Bearer " + edgeTestToken}
	for _, req := range cf.expect(want, want) {
		checkSecretBody(t, req)
	}
}

func TestEdgePutSecretRefusesBadInput(t *testing.T) {
	t.Parallel()
	cf := newFakeCloudflare(t, nil)
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"not base64", map[string]string{"SLUICE_EDGE_SECRET": "whsec_not*base64"}, nil,
			"sluice: --edge-secret: signature: invalid secret: not standard base64: usage error"},
		{"no whsec_", nil, []string{"--edge-secret", "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"},
			"sluice: --edge-secret: signature: invalid secret: want whsec_ followed by base64: usage error"},
		{"too short", nil, []string{"--edge-secret", "whsec_c2hvcnQ="},
			"sluice: --edge-secret: signature: invalid secret: key is 5 bytes, want at least 24: usage error"},
		{"missing", map[string]string{"SLUICE_EDGE_SECRET": ""}, nil,
			"sluice: edge put-secret needs --edge-secret (or SLUICE_EDGE_SECRET), the whsec_ secret serve uses: usage error"},
		{"no account", map[string]string{"CLOUDFLARE_ACCOUNT_ID": ""}, nil,
			"sluice: edge put-secret: needs --account-id (or CLOUDFLARE_ACCOUNT_ID): usage error"},
		{"no token", map[string]string{"CLOUDFLARE_API_TOKEN": " "}, nil,
			"sluice: edge put-secret: needs --cf-api-token (or CLOUDFLARE_API_TOKEN): usage error"},
		{"path in script", nil, []string{"--script", "../zones"},
			`sluice: edge put-secret: --script is not a Worker name (letters, digits, - and _; at most 63): usage error`},
		// Values given in the wrong place may be secrets: none is echoed.
		{"stray argument", nil, []string{"whsec_c2VjcmV0LWdpdmVuLXdoZXJlLWEtZmxhZy13YXMtbWVhbnQ="},
			`sluice: edge put-secret: unexpected argument (not shown: it may be a secret; flags start with --): usage error`},
		{"token as account", map[string]string{"CLOUDFLARE_ACCOUNT_ID": "Sn3lZkT0kenNotAnAccount0123456789abcdef"}, nil,
			"sluice: edge put-secret: --account-id is not a Cloudflare account id (32 hex digits): usage error"},
		{"second of two secrets", nil, []string{"--edge-secret", edgeTestSecret + " whsec_c2hvcnQ="},
			"sluice: --edge-secret: secret 2 of 2: signature: invalid secret: key is 5 bytes, want at least 24: usage error"},
	}
	for _, tc := range cases {
		env := cfEnv()
		for k, v := range tc.env {
			env[k] = v
		}
		args := append([]string{"edge", "put-secret", "--cf-base-url", cf.URL}, tc.args...)
		r := runEdge(t, env, args...)
		if r.code() != 2 || r.message() != tc.want {
			t.Errorf("%s: exit %d, %q; want exit 2, %q", tc.name, r.code(), r.message(), tc.want)
		}
	}
	cf.expect() // not one request
}

const (
	edgeDeploymentsPath = "/accounts/" + edgeTestAccount + "/workers/scripts/sluice-edge/deployments"
	edgeNamespacesPath  = "/accounts/" + edgeTestAccount + "/workers/durable_objects/namespaces"
	edgeDeploymentID    = "bcf48806-b317-4351-9ee7-36e7d557d4de"
	edgeVersionA        = "18f97339-c287-4872-9bdd-e2135c07ec12"
	edgeVersionB        = "2c1d3f5e-77aa-4e2f-9b7c-0d4a1f6e9b20"
	edgeNamespaceID     = "5ee3a1f0b8f54a1c9c3e2d7f6a4b8c90"
)

var (
	deploymentsAnswer = cfAnswer{status: 200, body: envelope(`{"deployments":[
		{"id":"` + edgeDeploymentID + `","created_on":"2026-04-20T10:11:12.123456Z","source":"wrangler",
		 "strategy":"percentage","author_email":"ops@example.com",
		 "annotations":{"workers/message":"canary of the new bucket","workers/triggered_by":"deployment"},
		 "versions":[{"version_id":"` + edgeVersionA + `","percentage":90},{"version_id":"` + edgeVersionB + `","percentage":10}]},
		{"id":"0f0e0d0c-0b0a-4909-8807-060504030201","created_on":"2026-04-01T08:00:00Z","source":"api",
		 "strategy":"percentage","versions":[{"version_id":"` + edgeVersionA + `","percentage":100}]}]}`)}
	namespacesAnswer = cfAnswer{status: 200, body: `{"success":true,"errors":[],"messages":[],"result":[
		{"id":"` + edgeNamespaceID + `","name":"sluice-edge_SubscriberBucket","script":"sluice-edge","class":"SubscriberBucket","use_sqlite":true},
		{"id":"9a8b7c6d5e4f40312233445566778899","name":"other_Counter","script":"other-worker","class":"Counter","use_sqlite":false}],
		"result_info":{"page":1,"per_page":1000,"count":2,"total_count":2}}`}
)

func statusRequests() []cfRequest {
	return []cfRequest{
		{Method: "GET", Path: edgeDeploymentsPath, Auth: "Bearer " + edgeTestToken},
		{Method: "GET", Path: edgeNamespacesPath, Query: "page=1&per_page=1000", Auth: "Bearer " + edgeTestToken},
	}
}

func TestEdgeStatusTable(t *testing.T) {
	t.Parallel()
	cf := newFakeCloudflare(t, map[string][]cfAnswer{
		"GET " + edgeDeploymentsPath: {deploymentsAnswer},
		"GET " + edgeNamespacesPath:  {namespacesAnswer},
	})
	r := runEdge(t, cfEnv(), "edge", "status", "--cf-base-url", cf.URL)
	if r.err != nil {
		t.Fatalf("status: %s", r.message())
	}
	cf.expect(statusRequests()...)
	created := time.Date(2026, 4, 20, 10, 11, 12, 123456000, time.UTC)
	want := strings.Join([]string{
		"WORKER      sluice-edge",
		"ACCOUNT     " + edgeTestAccount,
		"DEPLOYMENT  " + edgeDeploymentID,
		"CREATED     " + when(&created),
		"SOURCE      wrangler",
		"AUTHOR      ops@example.com",
		"MESSAGE     canary of the new bucket",
		"",
		"VERSION                               TRAFFIC",
		edgeVersionA + "  90%",
		edgeVersionB + "  10%",
		"",
		"NAMESPACE                         NAME                          CLASS             STORAGE",
		edgeNamespaceID + "  sluice-edge_SubscriberBucket  SubscriberBucket  sqlite",
		"",
	}, "\n")
	if r.stdout != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, want)
	}
}

func TestEdgeStatusJSON(t *testing.T) {
	t.Parallel()
	cf := newFakeCloudflare(t, map[string][]cfAnswer{
		"GET " + edgeDeploymentsPath: {deploymentsAnswer},
		"GET " + edgeNamespacesPath:  {namespacesAnswer},
	})
	r := runEdge(t, cfEnv(), "edge", "status", "--json", "--cf-base-url", cf.URL)
	if r.err != nil {
		t.Fatalf("status --json: %s", r.message())
	}
	cf.expect(statusRequests()...)
	var out struct {
		AccountID  string `json:"account_id"`
		Script     string `json:"script"`
		Deployment struct {
			ID        string    `json:"id"`
			CreatedOn time.Time `json:"created_on"`
			Versions  []struct {
				VersionID  string  `json:"version_id"`
				Percentage float64 `json:"percentage"`
			} `json:"versions"`
			Annotations map[string]string `json:"annotations"`
		} `json:"deployment"`
		Namespaces []map[string]any `json:"durable_object_namespaces"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("--json output: %v\n%s", err, r.stdout)
	}
	d := out.Deployment
	if out.AccountID != edgeTestAccount || out.Script != "sluice-edge" || d.ID != edgeDeploymentID ||
		!d.CreatedOn.Equal(time.Date(2026, 4, 20, 10, 11, 12, 123456000, time.UTC)) ||
		len(d.Versions) != 2 || d.Versions[0].VersionID != edgeVersionA || d.Versions[0].Percentage != 90 ||
		d.Versions[1].VersionID != edgeVersionB || d.Versions[1].Percentage != 10 ||
		d.Annotations["workers/triggered_by"] != "deployment" {
		t.Errorf("--json deployment = %+v\n%s", out, r.stdout)
	}
	wantNS := []map[string]any{{"id": edgeNamespaceID, "name": "sluice-edge_SubscriberBucket",
		"script": "sluice-edge", "class": "SubscriberBucket", "use_sqlite": true}}
	if !reflect.DeepEqual(out.Namespaces, wantNS) {
		t.Errorf("--json namespaces = %v, want %v", out.Namespaces, wantNS)
	}
}

func TestEdgeStatusNotDeployed(t *testing.T) {
	t.Parallel()
	cf := newFakeCloudflare(t, map[string][]cfAnswer{
		"GET " + edgeDeploymentsPath: {{status: 200, body: envelope(`{"deployments":[]}`)}},
		"GET " + edgeNamespacesPath:  {{status: 200, body: envelope(`[]`)}},
	})
	r := runEdge(t, cfEnv(), "edge", "status", "--cf-base-url", cf.URL)
	if r.err != nil {
		t.Fatalf("status: %s", r.message())
	}
	cf.expect(statusRequests()...)
	for _, want := range []string{"DEPLOYMENT  none: the Worker has no deployment\n", "no Durable Object namespace belongs to sluice-edge\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
		}
	}
	r = runEdge(t, cfEnv(), "edge", "status", "--json", "--cf-base-url", cf.URL)
	want := `{"account_id":"` + edgeTestAccount + `","script":"sluice-edge","deployment":null,"durable_object_namespaces":[]}` + "\n"
	if r.err != nil || r.stdout != want {
		t.Errorf("status --json: %s\n%q, want %q", r.message(), r.stdout, want)
	}
}

// Cloudflare's error envelope becomes one line and exit 1, without retries.
func TestEdgeAPIErrors(t *testing.T) {
	t.Parallel()
	authErr := cfAnswer{status: 403, body: `{"success":false,"errors":[{"code":10000,"message":"Authentication error"}],"messages":[],"result":null}`}
	notFound := cfAnswer{status: 404, body: `{"success":false,"errors":[{"code":10007,"message":"This Worker does not exist on your account."}],"messages":[],"result":null}`}
	proxy := cfAnswer{status: 502, contentType: "text/html", body: "<html><body>Bad gateway</body></html>"}
	put := cfRequest{Method: "PUT", Path: edgeSecretsPath, Auth: "Bearer " + edgeTestToken}
	cases := []struct {
		name    string
		args    []string
		answers map[string][]cfAnswer
		want    string
		reqs    []cfRequest
	}{
		{"put-secret 403", []string{"put-secret"}, map[string][]cfAnswer{"PUT " + edgeSecretsPath: {authErr}},
			"sluice: cloudflare: 403 Authentication error (code 10000) (check --cf-api-token or CLOUDFLARE_API_TOKEN and --account-id; the token needs Workers Scripts: Edit)",
			[]cfRequest{put}},
		{"status 404", []string{"status"}, map[string][]cfAnswer{"GET " + edgeDeploymentsPath: {notFound}},
			"sluice: cloudflare: 404 This Worker does not exist on your account. (code 10007)",
			statusRequests()[:1]},
		{"namespaces 403", []string{"status"}, map[string][]cfAnswer{
			"GET " + edgeDeploymentsPath: {deploymentsAnswer}, "GET " + edgeNamespacesPath: {authErr}},
			"sluice: cloudflare: 403 Authentication error (code 10000) (check --cf-api-token or CLOUDFLARE_API_TOKEN and --account-id; the token needs Workers Scripts: Read)",
			statusRequests()},
		{"not an envelope", []string{"put-secret", "--cf-retries", "0"}, map[string][]cfAnswer{"PUT " + edgeSecretsPath: {proxy}},
			"sluice: cloudflare: 502 Bad Gateway",
			[]cfRequest{put}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cf := newFakeCloudflare(t, tc.answers)
			r := runEdge(t, cfEnv(), append(append([]string{"edge"}, tc.args...), "--cf-base-url", cf.URL)...)
			if r.code() != 1 || r.message() != tc.want {
				t.Errorf("exit %d, %q; want exit 1, %q", r.code(), r.message(), tc.want)
			}
			if r.stdout != "" {
				t.Errorf("stdout = %q, want nothing", r.stdout)
			}
			cf.expect(tc.reqs...)
		})
	}
}

func TestEdgeUnreachable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	ln.Close()
	for _, cmd := range []string{"put-secret", "status"} {
		r := runEdge(t, cfEnv(), "edge", cmd, "--cf-base-url", base, "--cf-retries", "0")
		want := "sluice: cloudflare: cannot reach " + base + ": connection refused"
		if r.code() != 3 || r.message() != want {
			t.Errorf("%s: exit %d, %q; want exit 3, %q", cmd, r.code(), r.message(), want)
		}
	}
}

func TestEdgeUsage(t *testing.T) {
	t.Parallel()
	cf := newFakeCloudflare(t, nil)
	for _, args := range [][]string{
		{"edge"},
		{"edge", "deploy"},
		{"edge", "status", "--nope"},
		{"edge", "status", "--cf-base-url", "ftp://example.com"},
		{"edge", "status", "--cf-base-url", cf.URL, "--account-id", "acc/../../zones"},
		{"edge", "status", "--cf-base-url", cf.URL, "--cf-retries", "-1"},
		{"edge", "status", "--cf-base-url", cf.URL, "--cf-api-token", "abc\nsecret-tok"},
		{"edge", "status", "--cf-base-url", strings.Replace(cf.URL, "://", "://secret-user:secret-pass@", 1)},
	} {
		r := runEdge(t, cfEnv(), args...)
		if r.code() != 2 {
			t.Errorf("sluice %s: exit %d (%s), want 2", strings.Join(args, " "), r.code(), r.message())
		}
		if msg := r.message() + r.stdout; strings.Contains(msg, "secret-") {
			t.Errorf("sluice %s printed a credential: %s", strings.Join(args, " "), msg)
		}
	}
	cf.expect()

	// cloudflare-go's own variable names the base URL too.
	env := cfEnv()
	env["CLOUDFLARE_BASE_URL"] = "ftp://example.com"
	if r := runEdge(t, env, "edge", "status"); r.code() != 2 || !strings.Contains(r.message(), "ftp://example.com") {
		t.Errorf("edge status with CLOUDFLARE_BASE_URL=ftp://example.com: exit %d (%s), want 2 naming it", r.code(), r.message())
	}

	r := runEdge(t, cfEnv(), "edge", "put-secret", "--help")
	if r.err != nil {
		t.Fatalf("put-secret --help: %s", r.message())
	}
	for _, want := range []string{"Usage: sluice edge put-secret [flags]", "--edge-secret", "env SLUICE_EDGE_SECRET",
		"--account-id", "env CLOUDFLARE_ACCOUNT_ID", "--cf-api-token", "env CLOUDFLARE_API_TOKEN",
		"--script", "env SLUICE_EDGE_SCRIPT", "(default sluice-edge)", "Workers Scripts: Edit"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("put-secret --help lacks %q on stdout:\n%s", want, r.stdout)
		}
	}
	r = runEdge(t, cfEnv(), "edge", "--help")
	if r.err != nil || !strings.Contains(r.stdout, "put-secret") || !strings.Contains(r.stdout, "status") {
		t.Errorf("edge --help: %s\n%s", r.message(), r.stdout)
	}
}

// An answer that does not confirm success fails the command (exit 1), even
// with a 200: cloudflare-go takes any 200 as a result.
func TestEdgeAnswersThatConfirmNothingFail(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		route, body, want string
		args              []string
	}{
		"put-secret, null":            {"PUT " + edgeSecretsPath, `null`, "no success envelope", []string{"put-secret"}},
		"put-secret, empty object":    {"PUT " + edgeSecretsPath, `{}`, "no success envelope", []string{"put-secret"}},
		"put-secret, success false":   {"PUT " + edgeSecretsPath, `{"success":false,"errors":[{"code":10000,"message":"nope"}],"result":null}`, "cloudflare: 200 nope (code 10000)", []string{"put-secret"}},
		"put-secret, another name":    {"PUT " + edgeSecretsPath, envelope(`{"name":"OTHER","type":"secret_text"}`), `names the secret "OTHER"`, []string{"put-secret"}},
		"status, null deployments":    {"GET " + edgeDeploymentsPath, `null`, "no success envelope", []string{"status"}},
		"status, deployments refused": {"GET " + edgeDeploymentsPath, `{"success":false,"errors":[],"result":null}`, "did not succeed", []string{"status"}},
	} {
		cf := newFakeCloudflare(t, map[string][]cfAnswer{c.route: {{status: 200, body: c.body}}})
		r := runEdge(t, cfEnv(), append([]string{"edge"}, append(c.args, "--cf-base-url", cf.URL, "--cf-retries", "0")...)...)
		if r.code() != 1 || !strings.Contains(r.message(), c.want) || r.stdout != "" {
			t.Errorf("%s: exit %d, %q, stdout %q; want exit 1 saying %q and nothing on stdout", name, r.code(), r.message(), r.stdout, c.want)
		}
	}
}

// A Retry-After longer than a command should sit through fails at once and
// says when to try again, where cloudflare-go would sleep it out.
func TestEdgeLongRetryAfterFailsAtOnce(t *testing.T) {
	t.Parallel()
	for value, want := range map[string]string{"3600": "1h0m0s", "3600.5": "1h0m1s"} {
		limited := cfAnswer{status: 429, header: map[string]string{"Retry-After": value},
			body: `{"success":false,"errors":[{"code":971,"message":"Please wait"}],"messages":[],"result":null}`}
		cf := newFakeCloudflare(t, map[string][]cfAnswer{"PUT " + edgeSecretsPath: {limited}})
		r := runEdge(t, cfEnv(), "edge", "put-secret", "--cf-base-url", cf.URL)
		if r.code() != 1 || !strings.Contains(r.message(), "Cloudflare asks to wait "+want) {
			t.Fatalf("Retry-After %s: exit %d, %q; want exit 1 saying Cloudflare asks to wait %s", value, r.code(), r.message(), want)
		}
		cf.expect(cfRequest{Method: "PUT", Path: edgeSecretsPath, Auth: "Bearer " + edgeTestToken})
	}
}

// Two secrets, space-separated, go to the Worker as one value it splits:
// it then accepts either while serve switches.
func TestEdgePutSecretTakesTwoSecrets(t *testing.T) {
	t.Parallel()
	const second = "whsec_c2Vjb25kLXNlY3JldC1mb3ItdGhlLXJvdGF0aW9uLXRlc3Q="
	cf := newFakeCloudflare(t, map[string][]cfAnswer{"PUT " + edgeSecretsPath: {secretAnswer}})
	r := runEdge(t, cfEnv(), "edge", "put-secret", "--cf-base-url", cf.URL, "--edge-secret", "  "+edgeTestSecret+"   "+second+" ")
	if r.err != nil {
		t.Fatalf("put-secret: %s", r.message())
	}
	reqs := cf.expect(cfRequest{Method: "PUT", Path: edgeSecretsPath, Auth: "Bearer " + edgeTestToken})
	var body struct{ Text string }
	if err := json.Unmarshal([]byte(reqs[0].Body), &body); err != nil || body.Text != edgeTestSecret+" "+second {
		t.Errorf("the secret put is not the two secrets joined by one space (%v)", err)
	}
}

// An answer that quotes back what it was sent (a proxy, a debugging API)
// does not get the secret or the token printed: runEdge fails the test if
// either shows.
func TestEdgeErrorsNeverRepeatTheSecretOrTheToken(t *testing.T) {
	t.Parallel()
	echo := fmt.Sprintf(`{"success":false,"errors":[{"code":1,"message":"bad value: {\"text\":\"%s\"} with Bearer %s"}],"messages":[],"result":null}`,
		edgeTestSecret, edgeTestToken)
	for _, status := range []int{400, 200} { // an error answer, and a 200 whose envelope says it failed
		cf := newFakeCloudflare(t, map[string][]cfAnswer{"PUT " + edgeSecretsPath: {{status: status, body: echo}}})
		r := runEdge(t, cfEnv(), "edge", "put-secret", "--cf-base-url", cf.URL)
		if r.err == nil || !strings.Contains(r.message(), "[redacted]") {
			t.Errorf("%d quoting the request: %s; want a failure with the quoted values redacted", status, r)
		}
	}
}
