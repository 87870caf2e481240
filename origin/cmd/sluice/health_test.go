package main

import (
	"net"
	"strings"
	"testing"
)

func TestHealthCommand(t *testing.T) {
	t.Parallel()
	o := newOrigin(t)
	// No token needed: health checks run where no secret should be.
	r := sluiceEnv(t, map[string]string{"SLUICE_URL": o.URL}, "health")
	if r.err != nil || strings.TrimSpace(r.stdout) != "ok" {
		t.Fatalf("health against a live server: %s", r)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	if r := sluiceEnv(t, nil, "health", "--url", dead); r.code() != 3 {
		t.Fatalf("health against a closed port: %s; want exit 3", r)
	}
	// A server that takes the connection and never answers is unreachable
	// too once health's own deadline passes: not an interrupt, not a refusal.
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	go func() {
		for {
			c, err := mute.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	if r := sluiceEnv(t, nil, "health", "--url", "http://"+mute.Addr().String()); r.code() != 3 || !strings.Contains(r.message(), "timed out") {
		t.Fatalf("health against a server that never answers: %s; want exit 3 and \"timed out\"", r)
	}
}
