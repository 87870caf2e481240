package main_test

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// TestClientExitStatus runs the real binary as a script would and checks
// what main makes of the client's errors: the exit status and exactly one
// line on stderr, never the token.
func TestClientExitStatus(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()

	const token = "tok-process-client-secret"
	srv := serve(t, filepath.Join(t.TempDir(), "sluice.db"), token)
	env := []string{"SLUICE_URL=" + srv.URL, "SLUICE_API_TOKEN=" + token}

	for _, c := range []struct {
		name   string
		env    []string
		args   []string
		code   int
		stderr string // all of stderr
	}{
		{"ok", env, []string{"stats", "--json"}, 0, ""},
		{"connection refused", []string{"SLUICE_URL=" + closed, "SLUICE_API_TOKEN=" + token}, []string{"subscribers", "list"},
			3, "sluice: cannot reach " + closed + ": connection refused\n"},
		{"wrong token", []string{"SLUICE_URL=" + srv.URL, "SLUICE_API_TOKEN=tok-wrong"}, []string{"stats"},
			1, "sluice: 401 unauthorized: missing or invalid bearer token (check SLUICE_API_TOKEN or --api-token)\n"},
		{"not found", env, []string{"subscribers", "show", "ghost"}, 1, "sluice: 404 not_found: subscriber ghost: not found\n"},
		{"missing flag", env, []string{"send"}, 2, "sluice: send needs --type (or a \"type\" in --data): usage error\n"},
	} {
		out, errOut, code := runSluice(t, c.env, c.args...)
		if code != c.code || errOut != c.stderr {
			t.Errorf("%s: sluice %s: exit %d, stderr %q; want exit %d, stderr %q\nstdout: %s",
				c.name, strings.Join(c.args, " "), code, errOut, c.code, c.stderr, out)
		}
		if strings.Contains(out+errOut, token) {
			t.Errorf("%s: the token is printed", c.name)
		}
	}
}
