package main

import "testing"

// --addr takes what net.Listen takes, and nothing it would refuse.
func TestValidAddr(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"127.0.0.1:8080":                 true,
		":8080":                          true,
		"localhost:":                     true, // any port
		"127.0.0.1:http":                 true, // a service name
		"[::1]:0":                        true,
		"nope":                           false,
		"127.0.0.1:99999":                false,
		"127.0.0.1:-1":                   false,
		"127.0.0.1:no-such-service-name": false,
	} {
		if got := validAddr(addr); got != want {
			t.Errorf("validAddr(%q) = %v, want %v", addr, got, want)
		}
	}
}
