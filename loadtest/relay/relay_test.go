package relay

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestRelayAnswersThenForwards(t *testing.T) {
	got := make(chan string, 1)
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- r.Header.Get("webhook-id") + " " + string(b)
	}))
	defer sink.Close()
	srv := httptest.NewServer(New(sink.URL))
	defer srv.Close()

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/events", strings.NewReader(`{"id":"a"}`))
	req.Header.Set("webhook-id", "a")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d, want 202", resp.StatusCode)
	}
	select {
	case b := <-got:
		if b != `a {"id":"a"}` {
			t.Fatalf("forwarded %q", b)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("nothing was forwarded")
	}
	resp, err = http.Get(srv.URL + "/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET: status %d, want 405", resp.StatusCode)
	}
}
