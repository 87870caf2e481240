// Package localedge runs the built edge Worker in real workerd through
// Miniflare (scripts/miniflare-edge.mjs, configured from wrangler.toml) on a
// free 127.0.0.1 port: the harness's canal --edge and the edge integration
// tests start it the same way.
package localedge

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Check reports what is missing to run the Worker from the module at root:
// Node on PATH and the npm packages `npm ci` installs.
func Check(root string) error {
	if _, err := exec.LookPath("node"); err != nil {
		return errors.New("node is not on PATH; the Worker runs in workerd through Node 20 (see README)")
	}
	for _, pkg := range []string{"miniflare", "wrangler"} {
		if _, err := os.Stat(filepath.Join(root, "node_modules", pkg, "package.json")); err != nil {
			return fmt.Errorf("node_modules/%s is missing: run `npm ci` in %s first", pkg, root)
		}
	}
	return nil
}

// Build builds the Worker into build/edge with `make edge`, so what runs is
// never a stale app.wasm.
func Build(ctx context.Context, root string) error {
	cmd := exec.CommandContext(ctx, "make", "-s", "edge")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("make edge: %v\n%s", err, out)
	}
	return nil
}

// Options say which Worker to run and how.
type Options struct {
	Root   string // the module's root: scripts/, node_modules/, build/edge
	Secret string // the origin↔edge secret (whsec_…)
	// Persist keeps Durable Object storage in this folder across restarts;
	// "" keeps it in memory.
	Persist string
}

// Worker is one Miniflare process serving the Worker.
type Worker struct {
	URL  string // http://127.0.0.1:N
	cmd  *exec.Cmd
	out  lines // Miniflare's and the Worker's output
	done chan struct{}
}

// readyTimeout bounds how long Start waits for the Worker to answer.
const readyTimeout = 60 * time.Second

// Start serves the built Worker and waits until it answers, or until ctx
// ends (then it stops it).
func Start(ctx context.Context, o Options) (*Worker, error) {
	// Wrangler's config and Miniflare's scratch space (TMPDIR) go in a
	// directory of our own, removed once the process exits: Miniflare
	// removes its scratch directory on a clean stop only, not after Kill.
	cfgHome, err := os.MkdirTemp("", "sluice-edge-xdg-")
	if err != nil {
		return nil, err
	}
	scratch := filepath.Join(cfgHome, "tmp")
	if err := os.Mkdir(scratch, 0o700); err != nil {
		os.RemoveAll(cfgHome)
		return nil, err
	}
	args := []string{"scripts/miniflare-edge.mjs", "--port", "0"}
	if o.Persist != "" {
		args = append(args, "--persist", o.Persist)
	}
	cmd := exec.Command("node", args...)
	cmd.Dir = o.Root
	cmd.Env = append(os.Environ(),
		"SLUICE_EDGE_SECRET="+o.Secret,
		"WRANGLER_SEND_METRICS=false",
		"CLOUDFLARE_CF_FETCH_ENABLED=false",
		"WRANGLER_HIDE_BANNER=true",
		"XDG_CONFIG_HOME="+cfgHome,
		"TMPDIR="+scratch,
	)
	// Its own process group, so a stuck workerd child ends with it.
	cmd.SysProcAttr = groupAttr()
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		os.RemoveAll(cfgHome)
		return nil, fmt.Errorf("starting Miniflare: %w", err)
	}
	w := &Worker{cmd: cmd, done: make(chan struct{})}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			w.out.add(line)
			var r struct{ URL string }
			if strings.HasPrefix(line, `{"url":`) && json.Unmarshal([]byte(line), &r) == nil {
				select {
				case ready <- r.URL:
				default:
				}
			}
		}
		// A line too long for the scanner must not block Miniflare's writes.
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		_ = cmd.Wait()
		pw.Close()
		os.RemoveAll(cfgHome)
		close(w.done)
	}()
	select {
	case w.URL = <-ready:
		return w, nil
	case <-w.done:
		return nil, fmt.Errorf("Miniflare exited before it was ready:\n%s", w.Output())
	case <-time.After(readyTimeout):
		w.Kill()
		<-w.done
		return nil, fmt.Errorf("Miniflare not ready after %s:\n%s", readyTimeout, w.Output())
	case <-ctx.Done():
		w.Kill()
		<-w.done
		return nil, ctx.Err()
	}
}

// Done is closed once Miniflare has exited.
func (w *Worker) Done() <-chan struct{} { return w.done }

// Output is everything Miniflare and the Worker wrote so far.
func (w *Worker) Output() string { return w.out.String() }

// Stop asks Miniflare to dispose of workerd (SIGTERM) and waits; after 15 s
// it ends the process group.
func (w *Worker) Stop() error {
	_ = w.cmd.Process.Signal(terminate)
	select {
	case <-w.done:
		return nil
	case <-time.After(15 * time.Second):
		w.Kill()
		<-w.done
		return errors.New("Miniflare ignored SIGTERM for 15s; killed")
	}
}

// Kill ends Miniflare and workerd at once, as a crash would.
func (w *Worker) Kill() { killGroup(w.cmd) }

// lines collects output written from the reader goroutine.
type lines struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *lines) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.WriteString(line)
	l.buf.WriteByte('\n')
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
