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
}
