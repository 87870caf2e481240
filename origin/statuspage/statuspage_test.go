package statuspage_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/origin/statuspage"
)

// assets are the page's files as the origin serves them.
var assets = []struct {
	path, contentType string
}{
	{"/status", "text/html; charset=utf-8"},
	{"/status/app.js", "text/javascript; charset=utf-8"},
	{"/status/style.css", "text/css; charset=utf-8"},
}

func TestRoutesAreTheAssets(t *testing.T) {
	t.Parallel()
	var want []string
	for _, a := range assets {
		want = append(want, a.path)
	}
	if got := statuspage.Routes(); !slices.Equal(got, want) {
		t.Errorf("Routes() = %q, want %q", got, want)
	}
}

// The shell and its assets load without a token, with their content types
// and the headers that keep the page to its own origin; the stats it reads
// still need the token.
func TestServedByTheOriginWithoutToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, a := range assets {
		r := b.get(t, a.path, nil)
		if r.status != http.StatusOK {
			t.Fatalf("GET %s: status %d, want 200; body: %.200s", a.path, r.status, r.body)
		}
		if got := r.header.Get("Content-Type"); got != a.contentType {
			t.Errorf("GET %s: Content-Type %q, want %q", a.path, got, a.contentType)
		}
		if got := r.header.Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("GET %s: X-Content-Type-Options %q, want nosniff", a.path, got)
		}
		if got := r.header.Get("Cache-Control"); got != "no-cache" {
			t.Errorf("GET %s: Cache-Control %q, want no-cache", a.path, got)
		}
		if len(r.body) == 0 {
			t.Errorf("GET %s: empty body", a.path)
		}

		// The ETag lets a browser revalidate instead of downloading again.
		etag := r.header.Get("ETag")
		if etag == "" {
			t.Errorf("GET %s: no ETag", a.path)
			continue
		}
		if again := b.get(t, a.path, map[string]string{"If-None-Match": etag}); again.status != http.StatusNotModified {
			t.Errorf("GET %s with If-None-Match %s: status %d, want 304", a.path, etag, again.status)
		}
	}

	page := b.get(t, "/status", nil)
	for _, want := range []string{`<table class="subs">`, `id="login-form"`, `<script src="status/app.js" defer></script>`} {
		if !strings.Contains(string(page.body), want) {
			t.Errorf("GET /status: the shell lacks %s", want)
		}
	}
	csp := page.header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("GET /status: Content-Security-Policy %q lacks %q", csp, want)
		}
	}

	if r := b.get(t, "/v1/stats", nil); r.status != http.StatusUnauthorized {
		t.Errorf("GET /v1/stats without a token: status %d, want 401 (the page shows its prompt on it)", r.status)
	}
	for _, p := range []string{"/status/", "/status/index.html", "/status/../go.mod", "/status/app.js.map"} {
		if r := b.get(t, p, nil); r.status != http.StatusNotFound {
			t.Errorf("GET %s: status %d, want 404", p, r.status)
		}
	}
}

func TestHandlerAnswersOnlyItsRoutes(t *testing.T) {
	t.Parallel()
	h := statuspage.Handler()
	for _, p := range []string{"/", "/status/", "/status/assets/app.js", "/statusx"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p, nil))
		if rec.Code != http.StatusNotFound {
			t.Errorf("GET %s: status %d, want 404", p, rec.Code)
		}
	}
}

var (
	// htmlURL finds every src and href attribute's value.
	htmlURL = regexp.MustCompile(`\s(?:src|href)="([^"]*)"`)
	// jsString finds every string literal ('…', "…" and `…`).
	jsString = regexp.MustCompile("'(?:[^'\\\\\n]|\\\\.)*'|\"(?:[^\"\\\\\n]|\\\\.)*\"|`(?:[^`\\\\]|\\\\.)*`")
	// jsComment finds line comments (a "//" after a space or at the start
	// of a line, so "http://" inside a string is not one).
	jsComment = regexp.MustCompile(`(?m)(?:^|\s)//.*$`)
	// cssURL finds what a stylesheet could load.
	cssURL = regexp.MustCompile(`(?i)url\(|@import`)
)

// Every URL the page uses is relative to it, so the page works behind a
// proxy that mounts the origin under a prefix, and it reaches no other host
// (no CDN: it works offline).
func TestAssetsUseOnlyRelativeURLs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	html := string(b.get(t, "/status", nil).body)
	js := string(b.get(t, "/status/app.js", nil).body)
	css := string(b.get(t, "/status/style.css", nil).body)

	// Where each relative URL lands, from the page at /status and from the
	// same page behind a proxy prefix.
	for _, base := range []string{"http://origin.test/status", "http://proxy.test/sluice/status"} {
		prefix := strings.TrimSuffix(base, "/status")
		baseURL, err := url.Parse(base)
		if err != nil {
			t.Fatal(err)
		}
		var loaded []string
		for _, m := range htmlURL.FindAllStringSubmatch(html, -1) {
			ref := m[1]
			if ref == "data:," { // the empty favicon, so the browser asks for none
				continue
			}
			if !isRelative(ref) {
				t.Errorf("index.html: %q is not a relative URL", ref)
				continue
			}
			u, err := baseURL.Parse(ref)
			if err != nil {
				t.Errorf("index.html: %q: %v", ref, err)
				continue
			}
			loaded = append(loaded, strings.TrimPrefix(u.String(), prefix))
		}
		slices.Sort(loaded)
		want := []string{"/status/app.js", "/status/style.css"}
		if !slices.Equal(loaded, want) {
			t.Errorf("index.html under %s loads %q, want %q", base, loaded, want)
		}
	}

	const svgNamespace = `"http://www.w3.org/2000/svg"` // a name, never fetched
	var apiCalls []string
	code := jsComment.ReplaceAllString(js, "")
	for _, lit := range jsString.FindAllString(code, -1) {
		if lit == svgNamespace {
			continue
		}
		s := lit[1 : len(lit)-1]
		if strings.Contains(s, "://") || strings.HasPrefix(s, "/") {
			t.Errorf("app.js: string %s is an absolute URL or path", lit)
		}
		if strings.HasPrefix(s, "v1/") {
			apiCalls = append(apiCalls, s)
		}
	}
	slices.Sort(apiCalls)
	if want := []string{"v1/stats", "v1/subscribers?limit=1000"}; !slices.Equal(apiCalls, want) {
		t.Errorf("app.js calls %q, want %q", apiCalls, want)
	}
	// The page's base is /status, so these resolve to the API's /v1 routes.
	if u, _ := url.Parse("http://origin.test/status"); u != nil {
		if got, _ := u.Parse("v1/stats"); got.Path != "/v1/stats" {
			t.Errorf("v1/stats from /status resolves to %s", got.Path)
		}
	}
	for _, banned := range []string{"import(", "importScripts", "XMLHttpRequest", "eval(", "new Function", ".innerHTML", "document.write"} {
		if strings.Contains(js, banned) {
			t.Errorf("app.js uses %s", banned)
		}
	}
	if cssURL.MatchString(css) {
		t.Errorf("style.css loads something (url() or @import); it must be self-contained")
	}
}

func isRelative(ref string) bool {
	u, err := url.Parse(ref)
	return err == nil && u.Scheme == "" && u.Host == "" && !strings.HasPrefix(ref, "/")
}
