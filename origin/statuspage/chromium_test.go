//go:build chromium

// The status page in real headless Chromium (Debian's chromium package)
// against a real origin. Run with: go test -tags chromium ./origin/statuspage/
// The test fails, not skips, when Chromium is missing: the build tag is the
// opt-in. SLUICE_CHROMIUM names another binary; SLUICE_SCREENSHOT_DIR, when
// set, receives a copy of the screenshot.

package statuspage_test

import (
	"bytes"
	"context"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// chromiumLimit bounds one Chromium run, start to exit.
const chromiumLimit = 90 * time.Second

// chromiumFlags are what Chromium needs here: root without a sandbox, no
// GPU, and none of the background connections a closed network refuses.
var chromiumFlags = []string{
	"--headless",
	"--no-sandbox",
	"--disable-gpu",
	"--disable-quic",
	"--no-first-run",
	"--disable-background-networking",
	"--disable-component-update",
	"--disable-sync",
	"--disable-extensions",
	"--disable-default-apps",
	"--hide-scrollbars",
	"--mute-audio",
}

type browser struct{ bin string }

func findChromium(t *testing.T) browser {
	t.Helper()
	if p := os.Getenv("SLUICE_CHROMIUM"); p != "" {
		return browser{bin: p}
	}
	p, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium not found (%v): install Debian's package with `apt-get install -y chromium`, "+
			"or point SLUICE_CHROMIUM at a Chromium binary", err)
	}
	return browser{bin: p}
}

// run starts Chromium on url with a fresh profile and returns what it
// printed on stdout (the DOM, with --dump-dom).
func (br browser) run(t *testing.T, url string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), chromiumLimit)
	defer cancel()
	argv := append(append([]string{"--user-data-dir=" + t.TempDir()}, chromiumFlags...), args...)
	cmd := exec.CommandContext(ctx, br.bin, append(argv, url)...)
	// Chromium forks renderers and helpers: on a timeout, end the whole
	// process group it leads, not only the browser process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "TZ=UTC")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	t.Logf("chromium %s: %s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("chromium on %s: %v (after %s)\nstderr (last lines):\n%s", url, err, time.Since(start).Round(time.Millisecond), tail(stderr.String(), 20))
	}
	return stdout.String()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// page is what a dumped DOM shows.
type page struct{ dom string }

var (
	bodyState = regexp.MustCompile(`<body[^>]*\sdata-state="([^"]*)"`)
	refreshes = regexp.MustCompile(`<body[^>]*\sdata-refreshes="(\d+)"`)
	rowTag    = regexp.MustCompile(`<tr [^>]*data-subscriber="([^"]*)"[^>]*>`)
	attr      = regexp.MustCompile(`\sdata-([a-z]+)="([^"]*)"`)
	tagText   = regexp.MustCompile(`<[^>]*>`)
)

func (p page) state() string {
	if m := bodyState.FindStringSubmatch(p.dom); m != nil {
		return m[1]
	}
	return ""
}

func (p page) refreshes() int {
	if m := refreshes.FindStringSubmatch(p.dom); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n
	}
	return 0
}

// rows maps each subscriber row to its data-* attributes.
func (p page) rows() map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, m := range rowTag.FindAllStringSubmatch(p.dom, -1) {
		attrs := map[string]string{}
		for _, a := range attr.FindAllStringSubmatch(m[0], -1) {
			attrs[a[1]] = html.UnescapeString(a[2])
		}
		out[m[1]] = attrs
	}
	return out
}

// rowText is the visible text of a subscriber's row.
func (p page) rowText(id string) string {
	start := strings.Index(p.dom, `data-subscriber="`+id+`"`)
	if start < 0 {
		return ""
	}
	end := strings.Index(p.dom[start:], "</tr>")
	if end < 0 {
		return ""
	}
	text := tagText.ReplaceAllString(p.dom[start:start+end], " ")
	return strings.Join(strings.Fields(html.UnescapeString(text)), " ")
}

func (p page) requireLive(t *testing.T) {
	t.Helper()
	if got := p.state(); got != "live" {
		t.Fatalf("page state %q, want live; DOM:\n%s", got, p.dom)
	}
}

// receiver is a subscriber endpoint answering every delivery with one
// status (and Retry-After, when set).
func receiver(t *testing.T, status int, retryAfter string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/hook"
}

type statsJSON struct {
	Subscribers []struct {
		ID          string  `json:"subscriber_id"`
		Pending     int     `json:"pending"`
		Sent        int     `json:"sent"`
		Dead        int     `json:"dead"`
		Breaker     string  `json:"breaker"`
		PausedUntil *string `json:"paused_until"`
	} `json:"subscribers"`
}

// waitStats polls GET /v1/stats until cond holds.
func (b *bundle) waitStats(t *testing.T, what string, cond func(statsJSON) bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var st statsJSON
	for {
		b.do(t, http.MethodGet, "/v1/stats", "", http.StatusOK, &st)
		if cond(st) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; last stats: %+v", waitLimit, what, st)
		}
		<-tick.C
	}
}

// sendBatch posts n events of type typ in one batch.
func (b *bundle) sendBatch(t *testing.T, typ string, n int) {
	t.Helper()
	if err := b.postBatch(typ, n); err != nil {
		t.Fatal(err)
	}
}

// postBatch posts n events of type typ in one batch; safe off the test's
// goroutine.
func (b *bundle) postBatch(typ string, n int) error {
	if n == 0 {
		return nil
	}
	evs := make([]string, n)
	for i := range evs {
		evs[i] = fmt.Sprintf(`{"type":%q,"n":%d}`, typ, i)
	}
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/v1/events/batch",
		strings.NewReader(`{"events":[`+strings.Join(evs, ",")+`]}`))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.srv.Client().Do(req)
	if err != nil {
		return fmt.Errorf("post %d %s events: %w", n, typ, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("post %d %s events: status %d: %s", n, typ, resp.StatusCode, body)
	}
	return nil
}

// sentOf reads a subscriber's sent count from the ledger itself, so the
// stats hook can wait without calling the stats route it is hooked on.
func (b *bundle) sentOf(t *testing.T, id string) int {
	t.Helper()
	st, err := b.ledger.Stats(context.Background(), time.Now())
	if err != nil {
		t.Errorf("ledger stats: %v", err)
		return -1
	}
	if s, ok := st[id]; ok {
		return s.Sent
	}
	return 0
}

func TestStatusPageInChromium(t *testing.T) {
	br := findChromium(t)
	b := setup(t)

	// Three partners in three states: one healthy, one that asked to be left
	// alone for ten minutes (429 + Retry-After), one that fails until its
	// breaker opens and its deliveries die.
	b.do(t, http.MethodPost, "/v1/subscribers", `{"id":"shop-orders","url":"`+receiver(t, http.StatusNoContent, "")+
		`","event_types":["order.*"],"rate":{"per_second":100}}`, http.StatusCreated, nil)
	b.do(t, http.MethodPost, "/v1/subscribers", `{"id":"crm-sync","url":"`+receiver(t, http.StatusTooManyRequests, "600")+
		`","event_types":["customer.*"],"rate":{"per_second":5}}`, http.StatusCreated, nil)
	b.do(t, http.MethodPost, "/v1/subscribers", `{"id":"legacy-erp","url":"`+receiver(t, http.StatusInternalServerError, "")+
		`","event_types":["invoice.*"],"max_attempts":1,"rate":{"per_second":10}}`, http.StatusCreated, nil)

	pageURL := b.srv.URL + "/status#token=" + testToken
	dump := func(t *testing.T, budget time.Duration, extra ...string) page {
		t.Helper()
		args := append([]string{"--virtual-time-budget=" + strconv.FormatInt(budget.Milliseconds(), 10), "--dump-dom"}, extra...)
		return page{dom: br.run(t, pageURL, args...)}
	}

	// 1. The page loads, takes the token from the fragment and lists every
	// subscriber with its allowed rate, nothing sent yet.
	p := dump(t, 3*time.Second)
	p.requireLive(t)
	rows := p.rows()
	for id, allowed := range map[string]string{"shop-orders": "100", "crm-sync": "5", "legacy-erp": "10"} {
		r, ok := rows[id]
		if !ok {
			t.Fatalf("no row for %s; rows: %v", id, rows)
		}
		if r["sent"] != "0" || r["allowed"] != allowed || r["breaker"] != "closed" {
			t.Errorf("%s before any event: row %v, want sent 0, allowed %s, breaker closed", id, r, allowed)
		}
	}
	if txt := p.rowText("shop-orders"); !strings.Contains(txt, "/ 100 /s") {
		t.Errorf("shop-orders row text %q lacks the allowed rate 100/s", txt)
	}
	if strings.Contains(p.dom, testToken) {
		t.Errorf("the token shows in the DOM")
	}

	// 2. Deliveries happen; the page shows them.
	b.sendBatch(t, "order.created", 25)
	b.sendBatch(t, "customer.updated", 3)
	b.sendBatch(t, "invoice.issued", 8)
	// How many of legacy-erp's 8 die before its breaker opens depends on
	// how many were already in flight; the rest wait behind the breaker.
	erpDead := 0
	b.waitStats(t, "25 sent to shop-orders, crm-sync paused, legacy-erp's breaker open", func(st statsJSON) bool {
		ok := 0
		for _, s := range st.Subscribers {
			switch {
			case s.ID == "shop-orders" && s.Sent == 25,
				s.ID == "crm-sync" && s.PausedUntil != nil:
				ok++
			case s.ID == "legacy-erp" && s.Breaker == "open" && s.Dead >= 5 && s.Dead+s.Pending == 8:
				erpDead = s.Dead
				ok++
			}
		}
		return ok == 3
	})
	p = dump(t, 3*time.Second)
	p.requireLive(t)
	rows = p.rows()
	if r := rows["shop-orders"]; r["sent"] != "25" || r["pending"] != "0" || r["health"] != "ok" {
		t.Errorf("shop-orders after 25 deliveries: row %v, want sent 25, pending 0, health ok", r)
	}
	if r := rows["legacy-erp"]; r["breaker"] != "open" || r["dead"] != strconv.Itoa(erpDead) || r["health"] != "bad" {
		t.Errorf("legacy-erp after its failures: row %v, want breaker open, dead %d, health bad", r, erpDead)
	}
	if r := rows["crm-sync"]; r["pending"] != "3" || r["health"] != "warn" {
		t.Errorf("crm-sync after a 429: row %v, want pending 3, health warn", r)
	}
	if txt := p.rowText("crm-sync"); !regexp.MustCompile(`\d\d:\d\d:\d\d \(in (9m \d+s|10m)\)`).MatchString(txt) {
		t.Errorf("crm-sync row %q does not show its paused-until time and countdown", txt)
	}

	// 3. Live: the page refreshes every 2 s of its (virtual) time while
	// events keep coming. Headless virtual time runs faster than the real
	// one but stops while a fetch is pending, so the traffic is paced by the
	// page's own refreshes: before each stats answer, a batch is delivered
	// whole. The page then sees batch/2 s as the current rate.
	plan := []int{20, 60, 100, 72, 120, 88, 40, 80, 112, 60}
	var mu sync.Mutex
	calls, total, answered := 0, 25, []int{}
	b.setBeforeStats(func() {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		if calls > 0 { // the first refresh only sets the baseline
			n = plan[(calls-1)%len(plan)]
		}
		calls++
		if err := b.postBatch("order.created", n); err != nil {
			t.Errorf("stats hook: %v", err) // Errorf, not Fatal: this runs on a server goroutine
		}
		if calls%3 == 0 {
			// legacy-erp's backlog grows behind its open breaker
			if err := b.postBatch("invoice.issued", 2); err != nil {
				t.Errorf("stats hook: %v", err)
			}
		}
		total += n
		deadline := time.Now().Add(waitLimit)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for b.sentOf(t, "shop-orders") < total && time.Now().Before(deadline) {
			<-tick.C
		}
		answered = append(answered, total)
	})
	shot := filepath.Join(t.TempDir(), "status-page.png")
	start := time.Now()
	p = dump(t, 2*time.Duration(len(plan))*time.Second+time.Second,
		"--window-size=1440,560", "--screenshot="+shot)
	b.setBeforeStats(nil)
	elapsed := time.Since(start).Round(time.Millisecond)
	p.requireLive(t)
	if n := p.refreshes(); n < 4 {
		t.Errorf("the page refreshed %d times in its live run, want at least 4", n)
	}
	r := p.rows()["shop-orders"]
	mu.Lock()
	seen := answered
	t.Logf("live run: %d stats calls in %s", calls, elapsed)
	mu.Unlock()
	sent, _ := strconv.Atoi(r["sent"])
	if sent <= 25 || !containsInt(seen, sent) {
		t.Errorf("shop-orders shows sent %q after the live run; the stats answered %v", r["sent"], seen)
	}
	if txt := p.rowText("shop-orders"); !regexp.MustCompile(`[1-9][0-9.]* / 100 /s`).MatchString(txt) {
		t.Errorf("shop-orders row %q shows no current rate against its allowed 100/s", txt)
	}
	if n := strings.Count(p.dom, `class="spark"`); n != 15 {
		t.Errorf("%d sparklines, want 5 for each of 3 subscribers", n)
	}
	if !regexp.MustCompile(`<path class="line" d="M[0-9.]+ [0-9.]+(L[0-9.]+ [0-9.]+){3,}`).MatchString(p.dom) {
		t.Errorf("no sparkline has at least four points")
	}

	keepScreenshot(t, shot)

	// 4. A wrong token brings the prompt back with the reason, and the page
	// forgets it.
	loginShot := filepath.Join(t.TempDir(), "status-login.png")
	bad := page{dom: br.run(t, b.srv.URL+"/status#token=not-the-token", "--virtual-time-budget=3000", "--dump-dom",
		"--window-size=1440,560", "--screenshot="+loginShot)}
	if got := bad.state(); got != "login" {
		t.Fatalf("with a wrong token: page state %q, want login; DOM:\n%s", got, bad.dom)
	}
	if !strings.Contains(bad.dom, "refused (401)") {
		t.Errorf("with a wrong token: the prompt does not say the token was refused; DOM:\n%s", bad.dom)
	}
	if strings.Contains(bad.dom, `data-subscriber=`) {
		t.Errorf("with a wrong token: subscriber rows are shown")
	}
	keepScreenshot(t, loginShot)
}

// keepScreenshot checks that Chromium wrote a PNG at path and copies it to
// $SLUICE_SCREENSHOT_DIR when that is set.
func keepScreenshot(t *testing.T, path string) {
	t.Helper()
	png, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("chromium wrote no screenshot: %v", err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || len(png) < 5_000 {
		t.Fatalf("screenshot %s is not a plausible PNG (%d bytes)", path, len(png))
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
	dir := os.Getenv("SLUICE_SCREENSHOT_DIR")
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("SLUICE_SCREENSHOT_DIR: %v", err)
	}
	dst := filepath.Join(dir, filepath.Base(path))
	if err := os.WriteFile(dst, png, 0o644); err != nil {
		t.Fatalf("copy screenshot: %v", err)
	}
	t.Logf("screenshot copied to %s", dst)
}

func containsInt(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}
