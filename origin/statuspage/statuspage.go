// Package statuspage is the operator's status page: an HTML shell, a script
// and a stylesheet, embedded in the binary and served by the origin at
// /status. The shell needs no token; the script asks for the API token once,
// keeps it in sessionStorage and reads /v1/stats with it every 2 s, so the
// page shows exactly what the token-protected API would.
//
// Every URL in the assets is relative to /status ("status/app.js",
// "v1/stats"), so the page keeps working behind a proxy that mounts the
// origin under a prefix, and it loads nothing from anywhere else.
package statuspage

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"time"
)

//go:embed assets
var assets embed.FS

// Path is where the page is served; its assets live right below it.
const Path = "/status"

// csp allows the page its own script, stylesheet and API calls, and nothing
// else: no inline script, no other origin, no framing.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; " +
	"img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// file is one embedded asset, ready to serve.
type file struct {
	name        string
	contentType string
	body        []byte
	etag        string
}

// files maps each route to its asset; Routes lists them in this order.
var files = []struct{ route, name, contentType string }{
	{Path, "index.html", "text/html; charset=utf-8"},
	{Path + "/app.js", "app.js", "text/javascript; charset=utf-8"},
	{Path + "/style.css", "style.css", "text/css; charset=utf-8"},
}

// Routes lists the paths the page answers GET on: the page, then its assets.
func Routes() []string {
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = f.route
	}
	return out
}

// Handler serves the page and its assets at Routes, and 404 elsewhere.
func Handler() http.Handler {
	byRoute := make(map[string]file, len(files))
	for _, f := range files {
		body, err := fs.ReadFile(assets, "assets/"+f.name)
		if err != nil {
			panic("statuspage: embedded asset missing: " + f.name) // a build without its assets is broken
		}
		sum := sha256.Sum256(body)
		byRoute[f.route] = file{
			name:        f.name,
			contentType: f.contentType,
			body:        body,
			etag:        `"` + hex.EncodeToString(sum[:8]) + `"`,
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := byRoute[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		h := w.Header()
		h.Set("Content-Type", f.contentType)
		h.Set("ETag", f.etag)
		// Revalidate every time: a new binary must not run an old script
		// against a newer API.
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Content-Security-Policy", csp)
		// A zero modtime leaves conditional requests to the ETag.
		http.ServeContent(w, r, f.name, time.Time{}, bytes.NewReader(f.body))
	})
}
