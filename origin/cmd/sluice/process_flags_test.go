package main_test

import (
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// serveFlags are the flags DESIGN.md promises for `sluice serve`.
var serveFlags = []string{
	"addr", "db", "api-token", "allow-private-endpoints", "edge-url", "edge-secret", "edge-types",
	"workers", "retry-base", "retry-cap", "breaker-threshold", "breaker-cooldown", "max-body", "retention",
}

func TestServeFlagsAndEnvironment(t *testing.T) {
	t.Parallel()

	t.Run("help lists every flag with its variable", func(t *testing.T) {
		t.Parallel()
		out, errOut, code := runSluice(t, nil, "serve", "--help")
		if code != 0 || errOut != "" {
			t.Fatalf("serve --help: exit %d, want 0 and nothing on stderr\n%s%s", code, out, errOut)
		}
		help := out
		for _, name := range serveFlags {
			if !regexp.MustCompile(`(?m)^\s*--` + regexp.QuoteMeta(name) + `\b[^-]`).MatchString(help) {
				t.Errorf("serve --help does not list --%s", name)
			}
			env := "SLUICE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
			if !regexp.MustCompile(`\b` + env + `\b`).MatchString(help) {
				t.Errorf("serve --help does not name %s for --%s", env, name)
			}
		}
		if t.Failed() {
			t.Logf("serve --help:\n%s", help)
		}
	})

	t.Run("unknown flag exits 2", func(t *testing.T) {
		t.Parallel()
		out, errOut, code := runSluice(t, nil, "serve", "--no-such-flag")
		if code != 2 {
			t.Errorf("serve --no-such-flag: exit %d, want 2\n%s%s", code, out, errOut)
		}
		if !strings.Contains(errOut, "no-such-flag") {
			t.Errorf("serve --no-such-flag: stderr does not name the flag:\n%s", errOut)
		}
	})

	t.Run("bad environment value exits 2", func(t *testing.T) {
		t.Parallel()
		db := filepath.Join(t.TempDir(), "sluice.db")
		out, errOut, code := runSluice(t, []string{"SLUICE_WORKERS=many"}, serveArgs(db, "tok")...)
		if code != 2 {
			t.Errorf("SLUICE_WORKERS=many serve: exit %d, want 2\n%s%s", code, out, errOut)
		}
		if !strings.Contains(errOut, "SLUICE_WORKERS") {
			t.Errorf("SLUICE_WORKERS=many serve: stderr does not name the variable:\n%s", errOut)
		}
	})

	t.Run("bad values exit 2 and name the flag", func(t *testing.T) {
		t.Parallel()
		db := filepath.Join(t.TempDir(), "sluice.db")
		for _, bad := range [][]string{
			{"--log-level", "loud"},
			{"--log-format", "xml"},
			{"--workers", "0"},
			{"--retry-base", "1s", "--retry-cap", "1ms"},
			{"--breaker-threshold", "0"},
			{"--retention", "-1h"},
			{"--edge-url", "http://127.0.0.1:9"},
			{"--edge-url", "http://127.0.0.1:9", "--edge-secret", "not-a-whsec-secret"},
			{"--edge-url", "http://127.0.0.1:9", "--edge-secret", "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"}, // base64 without whsec_
			{"--edge-url", "http://127.0.0.1:9", "--edge-secret", "whsec_ZWRnZS1zZWNyZXQtZm9yLXRlc3RzLW9ubHktMzI=", "--edge-types", "video*"},
			{"--drain-timeout", "-1s"},
			{"--drain-timeout", "0"},
			{"--addr", "nope"},
			{"--addr", "127.0.0.1:99999"},
			{"--api-token", " \n"},
			{"--api-token", "tok\x01en"},
		} {
			out, errOut, code := runSluice(t, nil, serveArgs(db, "tok", bad...)...)
			if code != 2 || !strings.Contains(errOut, bad[len(bad)-2]) {
				t.Errorf("serve %s: exit %d, want 2 with a message naming %s\n%s%s", strings.Join(bad, " "), code, bad[len(bad)-2], out, errOut)
			}
		}
		if _, err := os.Stat(db); !os.IsNotExist(err) {
			t.Errorf("a refused serve left %s behind (%v)", db, err)
		}
		// A port in use fails before the database is made.
		busy, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer busy.Close()
		args := serveArgs(db, "")
		args = append(args, "--addr", busy.Addr().String())
		if out, errOut, code := runSluice(t, nil, args...); code == 0 || !strings.Contains(errOut, busy.Addr().String()) {
			t.Errorf("serve on a busy port: exit %d, want a failure naming the address\n%s%s", code, out, errOut)
		}
		if _, err := os.Stat(db); !os.IsNotExist(err) {
			t.Errorf("serve on a busy port left %s behind (%v)", db, err)
		}
		// slog's level names are read in any case: this one starts and listens,
		// and says that --edge-types alone changes nothing.
		c := serve(t, filepath.Join(t.TempDir(), "sluice.db"), "tok", "--log-level", "DEBUG", "--edge-types", "video.view")
		if !strings.Contains(c.Stderr(), "--edge-types has no effect") {
			t.Errorf("serve --edge-types without --edge-url: no warning in\n%s", c.Stderr())
		}
	})

	t.Run("environment configures serve", func(t *testing.T) {
		t.Parallel()
		db := filepath.Join(t.TempDir(), "sluice.db")
		c := launch(t, []string{"serve"},
			"SLUICE_ADDR=127.0.0.1:0", "SLUICE_DB="+db, "SLUICE_API_TOKEN=tok-env\n", "SLUICE_ALLOW_PRIVATE_ENDPOINTS=true")
		c.token = "tok-env"
		c.waitListening()
		u, err := url.Parse(c.URL)
		if err != nil || u.Hostname() != "127.0.0.1" || u.Port() == "" || u.Port() == "0" {
			t.Fatalf("SLUICE_ADDR=127.0.0.1:0: listening on %q, want 127.0.0.1 and a chosen port", c.URL)
		}
		// SLUICE_API_TOKEN is the token (without the newline a file read
		// into it ends in); SLUICE_ALLOW_PRIVATE_ENDPOINTS lets a loopback URL in.
		c.addSubscriber("http://127.0.0.1:9/hook", nil)
		if status, body := c.request(http.MethodGet, "/v1/subscribers", "tok-other", nil); status != http.StatusUnauthorized {
			t.Errorf("GET /v1/subscribers with a token other than SLUICE_API_TOKEN: %d, want 401: %s", status, body)
		}
		// SLUICE_DB is the file: a second process on it is refused.
		other := launch(t, serveArgs(db, "tok-env"))
		if code, exited := other.waitExit(10 * time.Second); !exited || code == 0 {
			t.Errorf("serve --db on the SLUICE_DB file beside the first: exited %v, code %d; want a refusal", exited, code)
		}
	})

	t.Run("flag wins over environment", func(t *testing.T) {
		t.Parallel()
		db := filepath.Join(t.TempDir(), "sluice.db")
		// serveArgs gives --addr 127.0.0.1:0; the variable would not even parse.
		c := launch(t, serveArgs(db, "tok-flag"), "SLUICE_ADDR=not-an-address", "SLUICE_API_TOKEN=tok-env")
		c.token = "tok-flag"
		c.waitListening()
		c.call(http.MethodGet, "/v1/subscribers", nil, http.StatusOK, nil)
		if status, _ := c.request(http.MethodGet, "/v1/subscribers", "tok-env", nil); status != http.StatusUnauthorized {
			t.Errorf("SLUICE_API_TOKEN beside --api-token: its token answers %d, want 401", status)
		}
	})

	t.Run("generated token is printed once and kept", func(t *testing.T) {
		t.Parallel()
		db := filepath.Join(t.TempDir(), "sluice.db")
		first := serve(t, db, "")
		m := regexp.MustCompile(`(?m)^\s*(sk_\S+)\s*$`).FindStringSubmatch(first.Stdout())
		if m == nil {
			t.Fatalf("serve without --api-token printed no generated token:\n%s", first.Stdout())
		}
		token := m[1]
		first.token = token
		first.call(http.MethodGet, "/v1/subscribers", nil, http.StatusOK, nil)
		if err := first.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code, exited := first.waitExit(10 * time.Second); !exited || code != 0 {
			t.Fatalf("first serve after SIGTERM: exited %v, code %d", exited, code)
		}

		second := serve(t, db, "")
		second.token = token
		second.call(http.MethodGet, "/v1/subscribers", nil, http.StatusOK, nil)
		for _, wrong := range []string{"", "sk_wrong", token + "x"} {
			if status, body := second.request(http.MethodGet, "/v1/subscribers", wrong, nil); status != http.StatusUnauthorized {
				t.Errorf("GET /v1/subscribers with token %q: %d, want 401: %s", wrong, status, body)
			}
		}
		if strings.Contains(second.Stdout(), token) || strings.Contains(second.Stderr(), token) {
			t.Errorf("the second start printed the stored token again:\n%s\n%s", second.Stdout(), second.Stderr())
		}
	})
}
