package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/loadtest/instance"
)

// node is one `sluice serve` on its own temp database, driven over HTTP
// with a connection pool big enough for the benchmark's clients.
type node struct {
	inst  *instance.Instance
	dir   string
	token string
	hc    *http.Client
	log   *os.File
	now   func() time.Time
}

// maxConns bounds the harness's connections to one sluice.
const maxConns = 256

// startNode starts sluice on a fresh database. Its log (warnings and
// errors only, so attempt logs cost nothing) goes to a file whose tail is
// shown if something fails.
func startNode(ctx context.Context, o *Options) (*node, error) {
	dir, err := os.MkdirTemp("", "sluice-bench-")
	if err != nil {
		return nil, err
	}
	var b [16]byte
	rand.Read(b[:])
	n := &node{dir: dir, token: "bench-" + hex.EncodeToString(b[:]), now: o.Now}
	if n.log, err = os.Create(filepath.Join(dir, "sluice.log")); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	args := append([]string{"--log-level", "warn"}, o.ServeArgs...)
	n.inst, err = instance.Start(ctx, instance.Options{
		Bin: o.Sluice, DB: filepath.Join(dir, "sluice.db"), Token: n.token, Args: args, Log: n.log,
	})
	if err != nil {
		n.log.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	n.hc = newClient()
	return n, nil
}

// newClient is the harness's HTTP client, pooled for many concurrent posts.
func newClient() *http.Client {
	return &http.Client{
		Timeout:   60 * time.Second,
		Transport: &http.Transport{MaxIdleConns: maxConns, MaxIdleConnsPerHost: maxConns, MaxConnsPerHost: maxConns},
	}
}

// startWithSink starts sluice and a sink, and subscribes s with the sink's
// URL; stop closes both.
func startWithSink(ctx context.Context, o *Options, s subscriber) (n *node, sk *sink, stop func(), err error) {
	if n, err = startNode(ctx, o); err != nil {
		return nil, nil, nil, err
	}
	if sk, err = startSink(o.Now); err != nil {
		n.close()
		return nil, nil, nil, err
	}
	s.URL = sk.url
	if err := n.subscribe(ctx, s); err != nil {
		err = n.fail(err)
		sk.close()
		n.close()
		return nil, nil, nil, err
	}
	return n, sk, func() { sk.close(); n.close() }, nil
}

// close stops sluice (SIGTERM, then SIGKILL) and removes its folder.
func (n *node) close() {
	n.hc.CloseIdleConnections()
	// A graceful stop of a sluice with a million rows owed can take a
	// while; the numbers are taken, so do not wait long.
	n.inst.Stop(5 * time.Second)
	n.log.Close()
	os.RemoveAll(n.dir)
}

// fail wraps err with the end of sluice's log.
func (n *node) fail(err error) error {
	if t := strings.TrimSpace(n.inst.Tail()); t != "" {
		return fmt.Errorf("%w\nsluice log:\n%s", err, t)
	}
	return err
}

// do sends body to sluice and returns the status and answer.
func (n *node) do(ctx context.Context, method, path string, body []byte) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, n.inst.URL+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+n.token)
	resp, err := n.hc.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	return resp.StatusCode, out, nil
}

// expect sends a request that must answer want.
func (n *node) expect(ctx context.Context, method, path string, in any, want int) ([]byte, error) {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return nil, err
		}
	}
	status, out, err := n.do(ctx, method, path, body)
	if err != nil {
		return nil, err
	}
	if status != want {
		return nil, fmt.Errorf("%s %s: status %d, want %d: %.300s", method, path, status, want, out)
	}
	return out, nil
}

// subscriber is what the benchmark subscribes: every event, to url, at
// perSecond with burst.
type subscriber struct {
	ID        string
	URL       string
	PerSecond float64
	Burst     float64
	Paused    bool
}

func (n *node) subscribe(ctx context.Context, s subscriber) error {
	_, err := n.expect(ctx, http.MethodPost, "/v1/subscribers", map[string]any{
		"id": s.ID, "url": s.URL, "event_types": []string{"*"},
		"rate":   map[string]float64{"per_second": s.PerSecond, "burst": s.Burst},
		"paused": s.Paused, "timeout_ms": 5000,
	}, http.StatusCreated)
	return err
}

// patch changes a subscriber (PATCH /v1/subscribers/:id).
func (n *node) patch(ctx context.Context, id string, change map[string]any) error {
	_, err := n.expect(ctx, http.MethodPatch, "/v1/subscribers/"+id, change, http.StatusOK)
	return err
}

// postBatch posts a prepared {"events": [...]} body.
func (n *node) postBatch(ctx context.Context, body []byte) error {
	status, out, err := n.do(ctx, http.MethodPost, "/v1/events/batch", body)
	if err != nil {
		return err
	}
	if status != http.StatusAccepted {
		return fmt.Errorf("POST /v1/events/batch: status %d: %.300s", status, out)
	}
	return nil
}

// fire posts count events from first on in batches of up to 1,000, one
// batch after the other.
func (n *node) fire(ctx context.Context, prefix string, first, count int) error {
	for lo := first; lo < first+count; lo += batchSize {
		hi := min(lo+batchSize, first+count)
		if err := n.postBatch(ctx, batchBody(prefix, lo, hi, n.now())); err != nil {
			return err
		}
	}
	return nil
}

// scrape reads /metrics.
func (n *node) scrape(ctx context.Context) (Scrape, error) {
	status, out, err := n.do(ctx, http.MethodGet, "/metrics", nil)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: status %d: %.300s", status, out)
	}
	return ParseMetrics(string(out))
}

// rss is sluice's resident set size now, from /proc/<pid>/status (Linux),
// and its peak (VmHWM); 0 where there is no /proc.
func (n *node) rss() (now, peak int64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", n.inst.Pid()))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	return parseStatus(f)
}

// parseStatus reads VmRSS and VmHWM (in kB) from a /proc/<pid>/status.
func parseStatus(r io.Reader) (rss, hwm int64) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			continue
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		if name == "VmRSS" {
			rss = kb << 10
		} else {
			hwm = kb << 10
		}
	}
	return rss, hwm
}

// batchSize is the most events one POST /v1/events/batch takes.
const batchSize = 1000

// eventBody is a video.trending event shaped like the seed's (about 190
// bytes), stamped with sent_ns so the sink can time its delivery.
func eventBody(b []byte, prefix string, i int, sent time.Time) []byte {
	b = append(b, `{"id":"`...)
	b = append(b, prefix...)
	b = append(b, '_')
	b = strconv.AppendInt(b, int64(i), 10)
	b = append(b, `","type":"video.trending","video_id":"vv_9f31c2","region":"NL","velocity":`...)
	b = strconv.AppendFloat(b, 224+float64(i%1000)/100, 'f', 2, 64)
	b = append(b, `,"occurred_at":"2026-07-11T08:14:02Z","sent_ns":`...)
	b = strconv.AppendInt(b, sent.UnixNano(), 10)
	return append(b, '}')
}

// batchBody is {"events": [...]} holding events lo … hi-1.
func batchBody(prefix string, lo, hi int, sent time.Time) []byte {
	b := make([]byte, 0, (hi-lo)*200+16)
	b = append(b, `{"events":[`...)
	for i := lo; i < hi; i++ {
		if i > lo {
			b = append(b, ',')
		}
		b = eventBody(b, prefix, i, sent)
	}
	return append(b, "]}"...)
}

// userHZ is the unit of /proc/<pid>/stat's CPU times: USER_HZ, 100 on every
// Linux ABI Go supports.
const userHZ = 100

// parseStatCPU reads the user + system CPU time from a /proc/<pid>/stat
// line: fields 14 and 15, counted after the command name, which may itself
// hold spaces and parentheses.
func parseStatCPU(stat string) (time.Duration, bool) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * time.Second / userHZ, true
}

func procCPU(pid string) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, false
	}
	return parseStatCPU(string(b))
}

// cpuMark is the CPU time sluice and the harness had used at a moment,
// and the machine's CPU counters then.
type cpuMark struct {
	at             time.Time
	sluice, self   time.Duration
	haveS, haveOwn bool
	host           hostCPU
}

func (n *node) cpuMark() cpuMark { return markCPU(n.now, n.inst.Pid()) }

// markCPU reads the CPU time process pid (sluice, or the relay; none when
// 0) and the harness have used so far.
func markCPU(now func() time.Time, pid int) cpuMark {
	m := cpuMark{at: now()}
	if pid != 0 {
		m.sluice, m.haveS = procCPU(strconv.Itoa(pid))
	}
	m.self, m.haveOwn = procCPU("self")
	m.host = readHostCPU()
	return m
}

// cpuText says how many cores sluice and the harness used between two
// marks ("" where /proc is missing).
func cpuText(a, b cpuMark) string { return cpuTextOf("sluice", a, b) }

// cpuTextOf is cpuText for the process called name; for the harness alone
// when name is "".
func cpuTextOf(name string, a, b cpuMark) string {
	wall := b.at.Sub(a.at).Seconds()
	if !a.haveOwn || !b.haveOwn || wall <= 0 {
		return ""
	}
	var text string
	switch {
	case name == "":
		text = fmt.Sprintf("CPU: the harness %.2f cores", (b.self-a.self).Seconds()/wall)
	case !a.haveS || !b.haveS:
		return ""
	default:
		text = fmt.Sprintf("CPU: %s %.2f cores, the harness %.2f", name, (b.sluice-a.sluice).Seconds()/wall, (b.self-a.self).Seconds()/wall)
	}
	if st, ok := stealBetween(a.host, b.host); ok {
		text += ", " + stealText(st)
	}
	return text
}
