package main

import (
	"strings"
	"testing"
)

// Command-line mistakes are usage errors (exit 2) told in one line that
// names the flag as the docs do, and never repeat a secret.
func TestMistakesAreOneLineUsageErrors(t *testing.T) {
	t.Parallel()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string // in the error
	}{
		{"a bad duration", nil, []string{"serve", "--retry-cap", "1"}, "invalid value (not shown) for flag --retry-cap"},
		{"an unknown flag", nil, []string{"migrate", "--json"}, "flag provided but not defined: --json"},
		{"a stray secret to serve", nil, []string{"serve", "--edge-url", "http://127.0.0.1:9", secret}, "not shown: it may be a secret"},
		{"a stray token to migrate", nil, []string{"migrate", "sk_0123456789abcdef"}, "not shown: it may be a secret"},
		{"an empty --db", nil, []string{"migrate", "--db", ""}, "--db must name a file"},
		{"a blank --db to serve", nil, []string{"serve", "--db", " "}, "--db must name a file"},
		{"a duration without its unit", nil, []string{"serve", "--retry-base", "5"}, "--retry-base: want a duration such as 500ms"},
		{"a number where a duration goes, from the environment", map[string]string{"SLUICE_BREAKER_COOLDOWN": "60"}, []string{"serve"},
			"SLUICE_BREAKER_COOLDOWN: want a duration such as 500ms, 30s or 2m (see sluice serve --help)"},
		{"a word where a boolean goes", map[string]string{"SLUICE_ALLOW_PRIVATE_ENDPOINTS": "yes"}, []string{"serve"}, "want true or false"},
		{"a fraction where a whole number goes", nil, []string{"serve", "--workers", "1.5"}, "--workers: want a whole number"},
		{"a secret given to the wrong flag", nil, []string{"edge", "put-secret", "--cf-retries", secret}, "flag --cf-retries"},
		{"a token in a bad environment value", map[string]string{"SLUICE_WORKERS": "sk_0123456789abcdef"}, []string{"serve"}, "SLUICE_WORKERS"},
		// Any value, not only one that looks like a secret: a Cloudflare
		// token or a chosen API token has no telltale prefix.
		{"any token given to the wrong flag", nil, []string{"edge", "status", "--cf-retries", "cfTok\"en-0123456789"}, "flag --cf-retries"},
		{"a flag without its value", nil, []string{"migrate", "--db"}, "flag needs an argument: --db"},
		{"a stray token of no telltale form", nil, []string{"stats", "--json", "cfTok0123456789"}, "not shown"},
		{"a stray word", nil, []string{"stats", "totals"}, `unexpected argument "totals"`},
		{"a token with a newline inside", map[string]string{"SLUICE_API_TOKEN": "sk_abc\ndef"}, []string{"stats"}, "control character"},
		{"a port out of range", nil, []string{"stats", "--url", "http://127.0.0.1:99999"}, "no valid port"},
	}
	for _, tc := range cases {
		r := sluiceEnv(t, tc.env, tc.args...)
		if r.err == nil || r.code() != 2 || !strings.Contains(r.err.Error(), tc.want) {
			t.Errorf("%s: %s\nwant exit 2 and %q", tc.name, r, tc.want)
			continue
		}
		if strings.Contains(r.stderr, "Flags (each also read") || strings.Contains(r.err.Error(), secret) || strings.Contains(r.err.Error(), "sk_0123") ||
			strings.Contains(r.err.Error(), "0123456789") {
			t.Errorf("%s: the flag list or the secret was printed: %s", tc.name, r)
		}
	}
	// --help still prints the flags.
	if r := sluiceEnv(t, nil, "migrate", "--help"); r.err != nil || !strings.Contains(r.stdout, "--db") {
		t.Errorf("migrate --help: %s", r)
	}
}
