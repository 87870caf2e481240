package main

// Client command tests: each runs the commands in-process through run()
// against a real origin (SQLite ledger in t.TempDir, running dispatcher, the
// API behind httptest) and real receivers on 127.0.0.1.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unicode"

	"github.com/sluice-dev/sluice/origin/origintest"
)

const clientTestToken = "tok-client-test-0123456789"

// origin is one real sluice origin for a test.
type origin struct {
	t   *testing.T
	URL string
}

func newOrigin(t *testing.T) *origin {
	t.Helper()
	o := origintest.Start(t, clientTestToken, origintest.Options{})
	srv := httptest.NewServer(o.API)
	t.Cleanup(srv.Close)
	return &origin{t: t, URL: srv.URL}
}

// result is what one command did.
type result struct {
	stdout, stderr string
	err            error
}

// code is the exit status main would give.
func (r result) code() int {
	if r.err == nil {
		return 0
	}
	return exitStatus(r.err)
}

// message is the line main prints on stderr for the error.
func (r result) message() string {
	if r.err == nil {
		return ""
	}
	return "sluice: " + r.err.Error()
}

func (r result) String() string {
	return "exit " + strconv.Itoa(r.code()) + "; " + r.message() + "\n--- stdout\n" + r.stdout + "--- stderr\n" + r.stderr
}

// sluiceEnv runs one command with env as its whole environment.
func sluiceEnv(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	err := run(ctx, args, func(k string) string { return env[k] }, &out, &errOut)
	return result{stdout: out.String(), stderr: errOut.String(), err: err}
}

// sluice runs one command against o with the right token, from the environment.
func (o *origin) sluice(args ...string) result {
	o.t.Helper()
	return sluiceEnv(o.t, map[string]string{"SLUICE_URL": o.URL, "SLUICE_API_TOKEN": clientTestToken}, args...)
}

// ok runs a command that must succeed.
func (o *origin) ok(args ...string) result {
	o.t.Helper()
	r := o.sluice(args...)
	if r.err != nil {
		o.t.Fatalf("sluice %s: %s", strings.Join(args, " "), r)
	}
	return r
}

// okJSON runs a command with --json and decodes its output into out.
func (o *origin) okJSON(out any, args ...string) {
	o.t.Helper()
	r := o.ok(append(args, "--json")...)
	if err := json.Unmarshal([]byte(r.stdout), out); err != nil {
		o.t.Fatalf("sluice %s --json: %v\n%s", strings.Join(args, " "), err, r.stdout)
	}
}

type listedDelivery struct {
	ID           string `json:"id"`
	EventID      string `json:"event_id"`
	SubscriberID string `json:"subscriber_id"`
	Status       string `json:"status"`
	Attempts     int    `json:"attempt_count"`
}

// waitDeliveries polls "sluice deliveries --json" until want holds.
func (o *origin) waitDeliveries(what string, want func([]listedDelivery) bool, args ...string) []listedDelivery {
	o.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var p struct{ Data []listedDelivery }
		o.okJSON(&p, append([]string{"deliveries"}, args...)...)
		if want(p.Data) {
			return p.Data
		}
		if time.Now().After(deadline) {
			o.t.Fatalf("waiting for %s: deliveries are %+v", what, p.Data)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func allStatus(n int, status string) func([]listedDelivery) bool {
	return func(ds []listedDelivery) bool {
		if len(ds) != n {
			return false
		}
		for _, d := range ds {
			if d.Status != status {
				return false
			}
		}
		return true
	}
}

// receiver answers with its current status and keeps the bodies it got.
type receiver struct {
	status atomic.Int32
	mu     sync.Mutex
	bodies map[string]string // webhook-id → body
}

func newReceiver(t *testing.T, status int) (*receiver, string) {
	r := &receiver{bodies: map[string]string{}}
	r.status.Store(int32(status))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.bodies[req.Header.Get("webhook-id")] = string(b)
		r.mu.Unlock()
		w.WriteHeader(int(r.status.Load()))
		io.WriteString(w, "receiver says "+http.StatusText(int(r.status.Load())))
	}))
	t.Cleanup(srv.Close)
	return r, srv.URL + "/hook"
}

func (r *receiver) body(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bodies[id]
}

// header returns the first line of a table, split into its columns.
func header(t *testing.T, out string) []string {
	t.Helper()
	first, _, _ := strings.Cut(out, "\n")
	return regexp.MustCompile(` {2,}`).Split(strings.TrimSpace(first), -1)
}

func wantColumns(t *testing.T, cmd, out string, cols ...string) {
	t.Helper()
	got := header(t, out)
	if strings.Join(got, "|") != strings.Join(cols, "|") {
		t.Errorf("%s: columns %q, want %q\n%s", cmd, got, cols, out)
	}
}

// rowOf returns the table line whose first column is key, split on runs of spaces.
func rowOf(out, key string) []string {
	for _, line := range strings.Split(out, "\n") {
		cols := regexp.MustCompile(` {2,}`).Split(strings.TrimSpace(line), -1)
		if len(cols) > 0 && cols[0] == key {
			return cols
		}
	}
	return nil
}

const testSecret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="

func TestClientSubscribersRoundTrip(t *testing.T) {
	t.Parallel()
	o := newOrigin(t)
	_, hook := newReceiver(t, 200)

	r := o.ok("subscribers", "add", "--url", hook, "--id", "partner-a", "--types", "video.trending, invoice.paid",
		"--rate", "10", "--burst", "20", "--max-attempts", "3", "--timeout", "2s", "--secret", testSecret)
	for key, want := range map[string]string{
		"ID": "partner-a", "URL": hook, "EVENT TYPES": "video.trending, invoice.paid",
		"RATE": "10/s, burst 20", "MAX ATTEMPTS": "3", "TIMEOUT": "2s", "PAUSED": "no",
		"SECRET": testSecret,
	} {
		if row := rowOf(r.stdout, key); len(row) != 2 || row[1] != want {
			t.Errorf("subscribers add: %s is %q, want %q\n%s", key, row, want, r.stdout)
		}
	}

	var b struct {
		ID         string   `json:"id"`
		URL        string   `json:"url"`
		EventTypes []string `json:"event_types"`
		Secret     string   `json:"secret"`
		Rate       struct {
			PerSecond float64 `json:"per_second"`
			Burst     float64 `json:"burst"`
		} `json:"rate"`
	}
	o.okJSON(&b, "subscribers", "add", "--url", hook)
	if !strings.HasPrefix(b.ID, "sub_") || b.URL != hook || len(b.EventTypes) != 1 || b.EventTypes[0] != "*" ||
		!strings.HasPrefix(b.Secret, "whsec_") || b.Rate.PerSecond != 50 || b.Rate.Burst != 100 {
		t.Errorf("subscribers add --json with defaults: %+v", b)
	}
	generated := b.ID

	r = o.ok("subscribers", "list")
	wantColumns(t, "subscribers list", r.stdout, "ID", "URL", "EVENT TYPES", "RATE", "BURST", "MAX ATTEMPTS", "TIMEOUT", "PAUSED", "BREAKER")
	if row := rowOf(r.stdout, "partner-a"); strings.Join(row, "|") != "partner-a|"+hook+"|video.trending,invoice.paid|10/s|20|3|2s|no|closed" {
		t.Errorf("subscribers list: partner-a's row is %q\n%s", row, r.stdout)
	}
	if rowOf(r.stdout, generated) == nil {
		t.Errorf("subscribers list: no row for %s\n%s", generated, r.stdout)
	}
	if strings.Contains(r.stdout, testSecret) {
		t.Errorf("subscribers list prints a secret:\n%s", r.stdout)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	o.okJSON(&list, "subscribers", "list")
	if len(list.Data) != 2 {
		t.Errorf("subscribers list --json: %d subscribers, want 2", len(list.Data))
	}
	r = o.ok("subscribers", "list", "--limit", "1")
	if n := strings.Count(strings.TrimSpace(r.stdout), "\n"); n != 1 || !strings.Contains(r.stderr, "more remain") {
		t.Errorf("subscribers list --limit 1: %d rows, stderr %q; want 1 row and a note\n%s", n, r.stderr, r.stdout)
	}

	// A filter reads every page, then --limit cuts what it kept, and says so
	// even under --json, which has no next_cursor to give.
	for _, args := range [][]string{{"--status", "active", "--limit", "1"}, {"--status", "active", "--limit", "1", "--json"}} {
		r = o.ok(append([]string{"subscribers", "list"}, args...)...)
		if strings.Contains(r.stdout, "next_cursor") || !strings.Contains(r.stderr, "more remain") {
			t.Errorf("subscribers list %s: stderr %q; want the note that more remain\n%s", strings.Join(args, " "), r.stderr, r.stdout)
		}
	}
	req, _ := http.NewRequest(http.MethodPatch, o.URL+"/v1/subscribers/partner-a", strings.NewReader(`{"paused":true}`))
	req.Header.Set("Authorization", "Bearer "+clientTestToken)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("pausing partner-a: %v %v", resp, err)
	}
	r = o.ok("stats")
	if a, g := rowOf(r.stdout, "partner-a"), rowOf(r.stdout, generated); len(a) != 12 || a[10] != "yes" || len(g) != 12 || g[10] != "-" {
		t.Errorf("stats: PAUSED of partner-a (paused) and %s (not) in %q and %q\n%s", generated, a, g, r.stdout)
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--status", "paused"}, []string{"partner-a"}},
		{[]string{"--status", "active"}, []string{generated}},
		{[]string{"--status", "open"}, nil},
		{[]string{"--subscriber", generated}, []string{generated}},
		{[]string{"--subscriber", generated, "--status", "paused"}, nil},
	} {
		list.Data = nil
		o.okJSON(&list, append([]string{"subscribers", "list"}, c.args...)...)
		var got []string
		for _, d := range list.Data {
			got = append(got, d.ID)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("subscribers list %s --json: %q, want %q", strings.Join(c.args, " "), got, c.want)
		}
	}

	r = o.ok("subscribers", "show", "partner-a")
	if row := rowOf(r.stdout, "SECRET"); len(row) != 2 || strings.Contains(r.stdout, testSecret) {
		t.Errorf("subscribers show: the secret is not masked: %q\n%s", row, r.stdout)
	}
	if row := rowOf(r.stdout, "BREAKER"); len(row) != 2 || !strings.HasPrefix(row[1], "closed") {
		t.Errorf("subscribers show: BREAKER row %q", row)
	}
	if r = o.ok("subscribers", "show", "partner-a", "--show-secret"); !strings.Contains(r.stdout, testSecret) {
		t.Errorf("subscribers show --show-secret does not print the secret:\n%s", r.stdout)
	}
	o.okJSON(&b, "subscribers", "show", "--json", "partner-a")
	if b.ID != "partner-a" || b.Secret != testSecret || b.Rate.PerSecond != 10 {
		t.Errorf("subscribers show --json: %+v", b)
	}

	if r = o.ok("subscribers", "rm", "partner-a"); strings.TrimSpace(r.stdout) != "removed subscriber partner-a" {
		t.Errorf("subscribers rm: %q", r.stdout)
	}
	r = o.sluice("subscribers", "show", "partner-a")
	if r.code() != 1 || r.message() != "sluice: 404 not_found: subscriber partner-a: not found" {
		t.Errorf("subscribers show after rm: %s", r)
	}
	var rm struct {
		ID      string `json:"id"`
		Deleted bool   `json:"deleted"`
	}
	o.okJSON(&rm, "subscribers", "rm", generated)
	if o.okJSON(&list, "subscribers", "list"); len(list.Data) != 0 || !rm.Deleted {
		t.Errorf("after removing both: %+v left, rm said %+v", list.Data, rm)
	}
}

func TestClientSendAndDeliveries(t *testing.T) {
	t.Parallel()
	o := newOrigin(t)
	recv, hook := newReceiver(t, 200)
	o.ok("subscribers", "add", "--url", hook, "--id", "s1", "--types", "video.trending")

	r := o.ok("send", "--type", "video.trending", "--data", `{"k":"v","n":[1,2]}`, "--id", "evt_one")
	wantColumns(t, "send", r.stdout, "EVENT", "DELIVERIES", "DUPLICATE")
	if row := rowOf(r.stdout, "evt_one"); strings.Join(row, "|") != "evt_one|1|no" {
		t.Errorf("send: row %q\n%s", row, r.stdout)
	}
	var sent struct {
		ID         string `json:"id"`
		Deliveries int    `json:"deliveries"`
		Duplicate  bool   `json:"duplicate"`
	}
	o.okJSON(&sent, "send", "--type", "video.trending", "--id", "evt_one")
	// A duplicate enqueues nothing and says so.
	if sent.ID != "evt_one" || !sent.Duplicate || sent.Deliveries != 0 {
		t.Errorf("send of the same id again: %+v, want a duplicate that enqueued nothing", sent)
	}
	file := filepath.Join(t.TempDir(), "event.json")
	if err := os.WriteFile(file, []byte(`{"type":"video.trending","id":"evt_file","x":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	o.ok("send", "--file", file)
	// An event whose type no subscriber takes is accepted with no delivery.
	if o.okJSON(&sent, "send", "--type", "invoice.paid"); sent.Deliveries != 0 || !strings.HasPrefix(sent.ID, "evt_") {
		t.Errorf("send --type invoice.paid: %+v", sent)
	}

	ds := o.waitDeliveries("both deliveries sent", allStatus(2, "sent"))
	if got := recv.body("evt_one"); got != `{"type":"video.trending","id":"evt_one","k":"v","n":[1,2]}` {
		t.Errorf("the receiver got %s", got)
	}
	if got := recv.body("evt_file"); got != `{"type":"video.trending","id":"evt_file","x":1}` {
		t.Errorf("send --file: the receiver got %s, want the file byte for byte", got)
	}

	r = o.ok("deliveries")
	wantColumns(t, "deliveries", r.stdout, "ID", "EVENT", "TYPE", "SUBSCRIBER", "STATUS", "ATTEMPTS", "UPDATED", "LAST ERROR")
	var one string
	for _, d := range ds {
		if d.EventID == "evt_one" {
			one = d.ID
		}
	}
	if row := rowOf(r.stdout, one); len(row) != 8 || strings.Join(row[1:6], "|") != "evt_one|video.trending|s1|sent|1" {
		t.Errorf("deliveries: %s's row is %q\n%s", one, row, r.stdout)
	}
	for _, args := range [][]string{{"--status", "pending"}, {"--subscriber", "nobody"}} {
		var p struct{ Data []listedDelivery }
		if o.okJSON(&p, append([]string{"deliveries"}, args...)...); len(p.Data) != 0 {
			t.Errorf("deliveries %s: %+v, want none", args, p.Data)
		}
	}
	o.waitDeliveries("the filter by subscriber", allStatus(2, "sent"), "--subscriber", "s1", "--status", "sent")
	// --limit 1 follows no further than one delivery and says more remain.
	r = o.ok("deliveries", "--limit", "1")
	if n := strings.Count(strings.TrimSpace(r.stdout), "\n"); n != 1 || !strings.Contains(r.stderr, "more remain") {
		t.Errorf("deliveries --limit 1: %d rows, stderr %q", n, r.stderr)
	}
	var p struct {
		Data       []listedDelivery `json:"data"`
		NextCursor string           `json:"next_cursor"`
	}
	if o.okJSON(&p, "deliveries", "--limit", "1"); len(p.Data) != 1 || p.NextCursor == "" {
		t.Errorf("deliveries --limit 1 --json: %+v, want one and a next_cursor", p)
	}

	r = o.ok("deliveries", "show", one)
	for key, want := range map[string]string{"ID": one, "EVENT": "evt_one", "SUBSCRIBER": "s1", "STATUS": "sent", "ATTEMPTS": "1"} {
		if row := rowOf(r.stdout, key); len(row) != 2 || row[1] != want {
			t.Errorf("deliveries show: %s is %q, want %q\n%s", key, row, want, r.stdout)
		}
	}
	_, attempts, _ := strings.Cut(r.stdout, "\n\n")
	wantColumns(t, "deliveries show (attempts)", attempts, "#", "AT", "LANE", "STATUS", "DURATION", "RETRY-AFTER", "ERROR", "RESPONSE")
	if row := rowOf(attempts, "1"); len(row) != 8 || row[2] != "origin" || row[3] != "200" || row[7] != "receiver says OK" {
		t.Errorf("deliveries show: attempt 1 is %q\n%s", row, r.stdout)
	}
	var shown struct {
		ID       string `json:"id"`
		Attempts []struct {
			Number     int    `json:"number"`
			Lane       string `json:"lane"`
			StatusCode int    `json:"status_code"`
		} `json:"attempts"`
	}
	o.okJSON(&shown, "deliveries", "show", one)
	if shown.ID != one || len(shown.Attempts) != 1 || shown.Attempts[0].StatusCode != 200 || shown.Attempts[0].Lane != "origin" {
		t.Errorf("deliveries show --json: %+v", shown)
	}

	// Pages: the first ends with a cursor, and --cursor goes on from there.
	var first, second struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
		NextCursor string `json:"next_cursor"`
	}
	o.okJSON(&first, "deliveries", "--subscriber", "s1", "--limit", "1")
	if len(first.Data) != 1 || first.NextCursor == "" {
		t.Fatalf("deliveries --limit 1 --json: %+v, want one delivery and a next_cursor", first)
	}
	o.okJSON(&second, "deliveries", "--subscriber", "s1", "--limit", "1", "--cursor", first.NextCursor)
	if len(second.Data) != 1 || second.Data[0].ID == first.Data[0].ID {
		t.Errorf("deliveries --cursor %s: %+v, want the delivery after %s", first.NextCursor, second, first.Data[0].ID)
	}
	if r = o.ok("deliveries", "--subscriber", "s1", "--limit", "1"); !strings.Contains(r.stderr, "--cursor "+first.NextCursor) {
		t.Errorf("deliveries --limit 1: stderr %q, want the --cursor that continues", r.stderr)
	}

	r = o.ok("stats")
	wantColumns(t, "stats", r.stdout, "SUBSCRIBER", "PENDING", "INFLIGHT", "SENT", "DEAD", "ATTEMPTS 5m",
		"SUCCESS 5m", "P50", "P99", "BREAKER", "PAUSED", "TOKENS")
	if row := rowOf(r.stdout, "s1"); len(row) != 12 || strings.Join(row[1:7], "|") != "0|0|2|0|2|100.0%" || row[9] != "closed" {
		t.Errorf("stats: s1's row is %q\n%s", row, r.stdout)
	}
	if row := rowOf(r.stdout, "TOTAL"); len(row) < 7 || strings.Join(row[1:7], "|") != "0|0|2|0|2|100.0%" {
		t.Errorf("stats: TOTAL row is %q\n%s", row, r.stdout)
	}
	var st struct {
		Totals struct {
			Sent int `json:"sent"`
		} `json:"totals"`
	}
	if o.okJSON(&st, "stats"); st.Totals.Sent != 2 {
		t.Errorf("stats --json: totals %+v", st.Totals)
	}
}

func TestClientDeadLetters(t *testing.T) {
	t.Parallel()
	o := newOrigin(t)
	recv, hook := newReceiver(t, 500)
	o.ok("subscribers", "add", "--url", hook, "--id", "flaky", "--max-attempts", "1")
	before := time.Now().Add(-time.Second).Format(time.RFC3339)
	o.ok("send", "--type", "a.b", "--id", "evt_1")
	o.ok("send", "--type", "a.b", "--id", "evt_2")
	ds := o.waitDeliveries("two dead deliveries", allStatus(2, "dead"))

	r := o.ok("dlq", "list")
	wantColumns(t, "dlq list", r.stdout, "ID", "EVENT", "TYPE", "SUBSCRIBER", "ATTEMPTS", "DIED", "LAST ERROR")
	for _, d := range ds {
		row := rowOf(r.stdout, d.ID)
		if len(row) != 7 || row[3] != "flaky" || row[4] != "1" || !strings.Contains(row[6], "500") {
			t.Errorf("dlq list: %s's row is %q\n%s", d.ID, row, r.stdout)
		}
	}
	var dead struct {
		Data []listedDelivery `json:"data"`
	}
	if o.okJSON(&dead, "dlq", "list", "--status", "dead", "--subscriber", "flaky"); len(dead.Data) != 2 {
		t.Errorf("dlq list --status dead --subscriber flaky --json: %+v, want the 2 dead deliveries", dead.Data)
	}
	dead.Data = nil
	if o.okJSON(&dead, "dlq", "list", "--subscriber", "someone-else"); len(dead.Data) != 0 {
		t.Errorf("dlq list --subscriber someone-else --json: %+v, want none", dead.Data)
	}
	r = o.ok("deliveries", "show", ds[0].ID)
	_, attempts, _ := strings.Cut(r.stdout, "\n\n")
	if row := rowOf(attempts, "1"); len(row) < 8 || row[3] != "500" || row[len(row)-1] != "receiver says Internal Server Error" {
		t.Errorf("deliveries show of a dead delivery: attempt 1 is %q\n%s", row, r.stdout)
	}
	if row := rowOf(r.stdout, "STATUS"); len(row) != 2 || row[1] != "dead" || rowOf(r.stdout, "DIED") == nil {
		t.Errorf("deliveries show of a dead delivery:\n%s", r.stdout)
	}

	recv.status.Store(200)
	r = o.ok("dlq", "retry", ds[0].ID)
	if want := "requeued " + ds[0].ID + " to flaky (now pending)"; strings.TrimSpace(r.stdout) != want {
		t.Errorf("dlq retry: %q, want %q", r.stdout, want)
	}
	o.waitDeliveries("the retried delivery sent", func(d []listedDelivery) bool {
		return len(d) == 1 && d[0].ID == ds[0].ID && d[0].Attempts == 2
	}, "--status", "sent")
	// A sent delivery is not retried: 409, exit 1.
	if r = o.sluice("dlq", "retry", ds[0].ID); r.code() != 1 || !strings.HasPrefix(r.message(), "sluice: 409 conflict: ") {
		t.Errorf("dlq retry of a sent delivery: %s", r)
	}

	r = o.ok("dlq", "recover", "flaky", "--since", before)
	if strings.TrimSpace(r.stdout) != "requeued 1 dead delivery of flaky" {
		t.Errorf("dlq recover: %q", r.stdout)
	}
	o.waitDeliveries("every delivery sent", allStatus(2, "sent"))
	if r = o.ok("dlq", "list"); strings.TrimSpace(r.stdout) != strings.Join(header(t, r.stdout), "  ") {
		t.Errorf("dlq list after recovery is not empty:\n%s", r.stdout)
	}
	var rec struct {
		Requeued *int `json:"requeued"`
	}
	if o.okJSON(&rec, "dlq", "recover", "flaky", "--since", "1h"); rec.Requeued == nil || *rec.Requeued != 0 {
		t.Errorf("dlq recover --since 1h --json with nothing dead: %+v", rec)
	}
	if r = o.sluice("dlq", "recover", "nobody", "--since", before); r.message() != "sluice: 404 not_found: subscriber nobody: not found" {
		t.Errorf("dlq recover of an unknown subscriber: %s", r)
	}
}

func TestClientErrors(t *testing.T) {
	t.Parallel()
	o := newOrigin(t)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()

	t.Run("cannot connect", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{{"stats"}, {"subscribers", "list"}, {"dlq", "retry", "dlv_1"}, {"send", "--type", "a.b"}} {
			r := sluiceEnv(t, map[string]string{"SLUICE_URL": closed, "SLUICE_API_TOKEN": "tok-secret-value"}, args...)
			if want := "sluice: cannot reach " + closed + ": connection refused"; r.code() != 3 || r.message() != want {
				t.Errorf("%s against a closed port: %s\nwant exit 3 and %q", args, r, want)
			}
			if strings.Contains(r.message()+r.stdout+r.stderr, "tok-secret-value") {
				t.Errorf("%s: the token is printed", args)
			}
		}
	})

	t.Run("unauthorized", func(t *testing.T) {
		t.Parallel()
		r := sluiceEnv(t, map[string]string{"SLUICE_URL": o.URL, "SLUICE_API_TOKEN": "tok-wrong-value"}, "subscribers", "list")
		if r.code() != 1 || !strings.HasPrefix(r.message(), "sluice: 401 unauthorized: ") ||
			!strings.Contains(r.message(), "SLUICE_API_TOKEN") || strings.Contains(r.message(), "tok-wrong-value") ||
			strings.Contains(r.message(), "\n") || r.stdout != "" {
			t.Errorf("a wrong token: %s", r)
		}
		r = sluiceEnv(t, map[string]string{"SLUICE_URL": o.URL}, "stats")
		if r.code() != 1 || !strings.Contains(r.message(), "no API token given: set SLUICE_API_TOKEN") {
			t.Errorf("no token: %s", r)
		}
	})

	t.Run("not found", func(t *testing.T) {
		t.Parallel()
		for args, want := range map[string]string{
			"subscribers show ghost": "sluice: 404 not_found: subscriber ghost: not found",
			"subscribers rm ghost":   "sluice: 404 not_found: subscriber ghost: not found",
			"deliveries show dlv_99": "sluice: 404 not_found: delivery dlv_99: not found",
			"dlq retry dlv_99":       "sluice: 404 not_found: delivery dlv_99: not found",
		} {
			if r := o.sluice(strings.Fields(args)...); r.code() != 1 || r.message() != want {
				t.Errorf("%s: %s\nwant exit 1 and %q", args, r, want)
			}
		}
	})

	t.Run("the API refuses a value", func(t *testing.T) {
		t.Parallel()
		r := o.sluice("subscribers", "add", "--url", "http://127.0.0.1:9/hook", "--max-attempts", "0")
		if r.code() != 1 || r.message() != "sluice: 422 invalid_value: max_attempts must be a whole number between 1 and 100" {
			t.Errorf("add --max-attempts 0: %s", r)
		}
	})

	t.Run("usage", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{
			{"subscribers", "add"},                            // --url is required
			{"subscribers", "add", "--id", "x"},               // still no --url
			{"send"},                                          // --type is required
			{"send", "--data", "[1]", "--type", "a"},          // data is not an object
			{"send", "--data", "{}", "--file", "x"},           // one source
			{"send", "--type", "a", "--data", `{"type":"b"}`}, // type twice
			{"dlq", "recover", "s1"},                          // --since is required
			{"dlq", "recover", "s1", "--since", "yesterday"},  // not a time
			{"dlq", "retry"},                                  // no ID
			{"subscribers", "show"},                           // no ID
			{"subscribers", "show", "a", "b"},                 // one ID only
			{"subscribers", "list", "--no-such-flag"},
			{"subscribers", "list", "--status", "sleepy"},
			{"dlq", "list", "--status", "sent"}, // the queue holds dead ones only
			{"subscribers", "frobnicate"},
			{"subscribers"},
			{"dlq"},
			{"deliveries", "--limit", "-1"},
			{"deliveries", "--status", "bogus"},
			{"help", "bogus"},
			{"stats", "--url", "127.0.0.1:8080"}, // no scheme
			{"subscribers", "add", "--url", "http://127.0.0.1:9/hook", "--rate", "NaN"},
			{"subscribers", "add", "--url", "http://127.0.0.1:9/hook", "--burst", "Inf"},
		} {
			r := sluiceEnv(t, map[string]string{"SLUICE_URL": closed}, args...)
			if r.code() != 2 || strings.Contains(r.message(), "\n") {
				t.Errorf("%q: %s\nwant exit 2 with one line", args, r)
			}
		}
		// A URL without its scheme (as curl takes it) is told so.
		if r := sluiceEnv(t, map[string]string{"SLUICE_URL": "127.0.0.1:8080"}, "stats"); r.code() != 2 || !strings.Contains(r.message(), "http://") ||
			strings.Contains(r.message(), "unreadable") {
			t.Errorf("SLUICE_URL=127.0.0.1:8080: %s\nwant exit 2 and a hint at the scheme", r)
		}
		// One that has a scheme, however mangled, is not told it lacks one.
		if r := sluiceEnv(t, map[string]string{"SLUICE_URL": "http:/127.0.0.1:8080"}, "stats"); r.code() != 2 || strings.Contains(r.message(), "needs its scheme") {
			t.Errorf("SLUICE_URL=http:/127.0.0.1:8080: %s\nwant exit 2 without the missing-scheme hint", r)
		}
		// A URL refused for its form is quoted without its password.
		for _, bad := range []string{"ftp://me:s3cret@127.0.0.1/", "http://me:s3cret@127.0.0.1/%zz"} {
			r := sluiceEnv(t, map[string]string{"SLUICE_URL": bad}, "stats")
			if r.code() != 2 || strings.Contains(r.message(), "s3cret") {
				t.Errorf("SLUICE_URL=%s: %s\nwant exit 2 and no password", bad, r)
			}
		}
	})

	t.Run("a stray secret is not echoed", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{
			{"subscribers", "rotate-secret", "s1", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
			{"stats", "sk_0123456789abcdef"},
		} {
			r := sluiceEnv(t, map[string]string{"SLUICE_URL": closed}, args...)
			if secret := args[len(args)-1]; r.code() != 2 || strings.Contains(r.stdout+r.stderr+r.message(), secret) {
				t.Errorf("%q: %s\nwant exit 2 and the secret nowhere", args, r)
			}
		}
		if r := sluiceEnv(t, map[string]string{"SLUICE_URL": closed}, "subscribers", "show", "a", "b"); !strings.Contains(r.message(), `"b"`) {
			t.Errorf("subscribers show a b: %s\nwant the stray argument named", r)
		}
	})

	t.Run("a server that is not sluice", func(t *testing.T) {
		t.Parallel()
		// Whatever SLUICE_URL points at, its words reach the terminal
		// without control characters.
		const esc = "\x1b]0;owned\x07\x1b[2J"
		odd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			if r.URL.Path == "/v1/stats" {
				w.WriteHeader(http.StatusInternalServerError)
				json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": "boom" + esc, "message": "m" + esc}})
				return
			}
			json.NewEncoder(w).Encode(map[string]any{"data": []map[string]string{{"id": "s1"}}, "next_cursor": "c" + esc})
		}))
		defer odd.Close()
		env := map[string]string{"SLUICE_URL": odd.URL, "SLUICE_API_TOKEN": clientTestToken}
		for _, args := range [][]string{{"stats"}, {"subscribers", "list", "--limit", "1"}} {
			r := sluiceEnv(t, env, args...)
			if strings.ContainsAny(r.stdout+r.stderr+r.message(), "\x1b\x07") {
				t.Errorf("%q: control characters reach the terminal: %q %q %q", args, r.stdout, r.stderr, r.message())
			}
		}
	})

	t.Run("help", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{{"stats", "--help"}, {"subscribers", "add", "--help"}, {"deliveries", "show", "-h"}} {
			// Help asked for is output: on stdout, with nothing on stderr.
			r := sluiceEnv(t, nil, args...)
			if r.code() != 0 || !strings.Contains(r.stdout, "env SLUICE_URL") || !strings.Contains(r.stdout, "env SLUICE_API_TOKEN") || r.stderr != "" {
				t.Errorf("%q: %s\nwant exit 0 and the SLUICE_ variables on stdout alone", args, r)
			}
		}
		if r := sluiceEnv(t, nil, "subscribers", "add", "--help"); !regexp.MustCompile(`(?m)^\s+--api-url .*\n\s+env SLUICE_URL$`).MatchString(r.stdout) {
			t.Errorf("subscribers add --help: --api-url does not fall back to SLUICE_URL:\n%s", r.stdout)
		}
		// A mistake is one line pointing at --help, not output.
		if r := sluiceEnv(t, nil, "stats", "--bogus"); r.code() != 2 || r.stdout != "" || r.stderr != "" || !strings.Contains(r.message(), "--bogus (see sluice stats --help)") {
			t.Errorf("stats --bogus: %s\nwant exit 2 and one line naming the flag and --help", r)
		}
		if r := sluiceEnv(t, nil, "--help"); r.code() != 0 || !strings.Contains(r.stdout, "SLUICE_URL") || !strings.Contains(r.stdout, "sluice dlq") ||
			!strings.Contains(r.stdout, "sluice health") {
			t.Errorf("sluice --help: %s", r)
		}
		// "sluice help CMD" is "sluice CMD --help".
		if r := sluiceEnv(t, nil, "help", "stats"); r.code() != 0 || !strings.Contains(r.stdout, "env SLUICE_URL") {
			t.Errorf("sluice help stats: %s\nwant exit 0 and the flags of stats", r)
		}
	})

	t.Run("flags win over the environment", func(t *testing.T) {
		t.Parallel()
		env := map[string]string{"SLUICE_URL": closed, "SLUICE_API_TOKEN": "tok-wrong"}
		if r := sluiceEnv(t, env, "stats", "--url", o.URL, "--api-token", clientTestToken); r.err != nil {
			t.Errorf("stats with --url and --api-token beside wrong variables: %s", r)
		}
		// subscribers add: SLUICE_URL is the API, never the endpoint.
		env = map[string]string{"SLUICE_URL": o.URL, "SLUICE_API_TOKEN": clientTestToken}
		if r := sluiceEnv(t, env, "subscribers", "add", "--id", "x"); r.code() != 2 {
			t.Errorf("subscribers add without --url but with SLUICE_URL: %s", r)
		}
		r := sluiceEnv(t, map[string]string{"SLUICE_API_TOKEN": clientTestToken}, "subscribers", "add",
			"--api-url", o.URL, "--url", "http://127.0.0.1:9/hook", "--id", "via-api-url")
		if r.err != nil || rowOf(r.stdout, "ID") == nil {
			t.Errorf("subscribers add --api-url: %s", r)
		}
	})
}

func TestSendBody(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, typ, id, want string }{
		{`{}`, "a.b", "", `{"type":"a.b"}`},
		{` {"k":"v"} `, "a.b", "e1", `{"type":"a.b","id":"e1","k":"v"}`},
		{`{"type":"x","id":"y","z":{"q":[1]}}`, "", "", `{"type":"x","id":"y","z":{"q":[1]}}`},
		{`{"type":"x"}`, "", "e\"1", `{"id":"e\"1","type":"x"}`},
	} {
		got, err := eventBody([]byte(c.in), "--data", c.typ, c.id)
		if err != nil || string(got) != c.want || !json.Valid(got) {
			t.Errorf("eventBody(%s, %q, %q) = %s, %v; want %s", c.in, c.typ, c.id, got, err, c.want)
		}
	}
	// --file - reads standard input.
	c := &cli{stdin: strings.NewReader(`{"type":"from.stdin"}`)}
	if b, err := c.readFile(t.Context(), "-"); err != nil || string(b) != `{"type":"from.stdin"}` {
		t.Errorf("readFile(-) = %s, %v", b, err)
	}
}

// A signal ends a send waiting on an input that never ends, and a file that
// cannot be read is a usage error: no request was made.
func TestSendFileStopsOnSignalAndMissingIsUsage(t *testing.T) {
	t.Parallel()
	r, w := io.Pipe()
	t.Cleanup(func() { w.Close() })
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(signalled{syscall.SIGTERM})
	c := &cli{stdin: r}
	_, err := c.readFile(ctx, "-")
	if got := exitStatusAfter(err, context.Cause(ctx)); got != 143 {
		t.Errorf("readFile(-) of a pipe that never ends, after SIGTERM: %v, exit %d; want 143", err, got)
	}
	// A FIFO no one opens to write blocks the open itself.
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A writer that comes and goes ends the read left blocked in open.
		if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
	})
	_, err = c.readFile(ctx, fifo)
	if got := exitStatusAfter(err, context.Cause(ctx)); got != 143 {
		t.Errorf("readFile of a FIFO no one writes to, after SIGTERM: %v, exit %d; want 143", err, got)
	}
	_, err = c.readFile(t.Context(), filepath.Join(t.TempDir(), "missing.json"))
	if err == nil || exitStatus(err) != 2 {
		t.Errorf("readFile of a missing file: %v; want a usage error (exit 2)", err)
	}
}

// A subscriber's answer is shown to the operator, so what it could do to
// their terminal (colours, window title, clipboard) is shown as text.
func TestClientShowsNoControlCharactersFromSubscribers(t *testing.T) {
	t.Parallel()
	o := newOrigin(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, "red \x1b[31mRED\x1b[0m title \x1b]0;pwned\x07 \u202eflipped\u202c\u2028\u200bend")
	}))
	t.Cleanup(srv.Close)
	o.ok("subscribers", "add", "--url", srv.URL+"/hook", "--id", "hostile", "--max-attempts", "1")
	o.ok("send", "--type", "a.b", "--id", "evt_1")
	ds := o.waitDeliveries("a dead delivery", allStatus(1, "dead"))

	r := o.ok("deliveries", "show", ds[0].ID)
	if i := strings.IndexFunc(r.stdout, func(c rune) bool {
		return c != '\n' && unicode.In(c, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp)
	}); i >= 0 {
		t.Fatalf("deliveries show printed control character %U:\n%q", []rune(r.stdout[i:])[0], r.stdout)
	}
	if !strings.Contains(r.stdout, "red ?[31mRED?[0m title ?]0;pwned? ?flip") {
		t.Errorf("deliveries show does not show the response as text:\n%s", r.stdout)
	}
}

func TestClientPausesResumesAndRotates(t *testing.T) {
	t.Parallel()
	o := newOrigin(t)
	recv, hook := newReceiver(t, 200)
	o.ok("subscribers", "add", "--url", hook, "--id", "s1", "--secret", testSecret)

	if r := o.ok("subscribers", "pause", "s1"); strings.TrimSpace(r.stdout) != "paused subscriber s1" {
		t.Errorf("subscribers pause: %q", r.stdout)
	}
	o.ok("send", "--type", "a.b", "--id", "evt_held")
	var s struct {
		Paused bool `json:"paused"`
	}
	if o.okJSON(&s, "subscribers", "show", "s1"); !s.Paused {
		t.Fatal("subscribers show after pause: not paused")
	}
	resumed := time.Now().Truncate(time.Millisecond) // attempts keep milliseconds
	if r := o.ok("subscribers", "resume", "s1"); strings.TrimSpace(r.stdout) != "resumed subscriber s1" {
		t.Errorf("subscribers resume: %q", r.stdout)
	}
	ds := o.waitDeliveries("the held delivery sent", allStatus(1, "sent"), "--subscriber", "s1")
	var shown struct {
		Attempts []struct {
			At time.Time `json:"at"`
		} `json:"attempts"`
	}
	// Held until the resume: its one attempt came after it.
	if o.okJSON(&shown, "deliveries", "show", ds[0].ID); len(shown.Attempts) != 1 || shown.Attempts[0].At.Before(resumed) {
		t.Errorf("the delivery sent while paused: attempts %+v, want one after the resume at %s", shown.Attempts, resumed)
	}
	if body := recv.body("evt_held"); body == "" {
		t.Error("the receiver did not get the event held while paused")
	}

	r := o.ok("subscribers", "rotate-secret", "s1")
	row, until := rowOf(r.stdout, "SECRET"), rowOf(r.stdout, "OLD SECRET SIGNS UNTIL")
	if len(row) != 2 || !strings.HasPrefix(row[1], "whsec_") || row[1] == testSecret || len(until) != 2 {
		t.Errorf("subscribers rotate-secret printed:\n%s\nwant a new whsec_ secret and when the old one stops signing", r.stdout)
	}
	const chosen = "whsec_Y2hvc2VuLXNlY3JldC1mb3ItdGhlLWNsaS10ZXN0cw=="
	var rotated struct {
		Secret string `json:"secret"`
	}
	if o.okJSON(&rotated, "subscribers", "rotate-secret", "s1", "--secret", chosen); rotated.Secret != chosen {
		t.Errorf("rotate-secret --secret: the subscriber's secret is %q, want the chosen one", rotated.Secret)
	}
	if r := o.sluice("subscribers", "pause", "nobody"); r.code() != 1 || !strings.Contains(r.message(), "404 not_found") {
		t.Errorf("pause of an unknown subscriber: %s", r)
	}
}
