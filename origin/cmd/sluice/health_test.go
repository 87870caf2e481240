package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
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

// A client that sends a request's headers and then withholds its body is
// cut off after the read timeout, even once it has had its 401: net/http
// reads an unread body to reuse the connection, and without a deadline it
// waits for ever, one file descriptor per such client.
func TestAPIServerDropsARequestThatNeverArrives(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := apiServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
	}), 300*time.Millisecond)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(conn)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the server still held the connection after 10 s (read %q)", got)
	}
	if !strings.HasPrefix(string(got), "HTTP/1.1 401") {
		t.Errorf("answer %q, want the 401 before the connection closed", got)
	}
}
