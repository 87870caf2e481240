// Package instance runs a real `sluice serve` process for the harness — build,
// start, kill -9, restart, stop — and talks to it only through its HTTP API,
// as an operator would.
package instance

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Build compiles ./origin/cmd/sluice of the module containing dir into out.
func Build(ctx context.Context, dir, out string) error {
	root, err := ModuleRoot(ctx, dir)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./origin/cmd/sluice")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./origin/cmd/sluice: %w\n%s", err, b)
	}
	return nil
}

// ModuleRoot is the folder holding the go.mod that governs dir.
func ModuleRoot(ctx context.Context, dir string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "env", "GOMOD")
	cmd.Dir = dir
	b, err := cmd.Output()
	gomod := strings.TrimSpace(string(b))
	if err != nil || gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("cannot find the sluice module from %s (go env GOMOD: %q, %v)", dir, gomod, err)
	}
	return filepath.Dir(gomod), nil
}

// Options start one sluice process.
type Options struct {
	Bin   string   // the sluice binary
	DB    string   // its database file
	Token string   // --api-token
	Args  []string // more serve flags, e.g. --retry-base
	// Log receives the process's stderr (its logs); nil discards them.
	Log io.Writer
	// Ready bounds the wait for the "listening on" line (default 30s).
	Ready time.Duration
}

var listeningRE = regexp.MustCompile(`^sluice \S+ listening on (http://\S+)$`)

// Instance is one running sluice process.
type Instance struct {
	URL string // the API's base URL

	cmd    *exec.Cmd
	exited chan struct{}
	mu     sync.Mutex
	tail   bytes.Buffer // the last of stderr, for errors
}

// Start launches `sluice serve` on opts.DB at a free loopback port, and
// returns once it listens. The process dies with the harness (Pdeathsig on
// Linux) so an interrupted run leaves nothing behind.
func Start(ctx context.Context, opts Options) (*Instance, error) {
	args := []string{"serve", "--addr", "127.0.0.1:0", "--db", opts.DB, "--allow-private-endpoints", "--api-token", opts.Token}
	args = append(args, opts.Args...)
	bin := opts.Bin
	if strings.ContainsRune(bin, filepath.Separator) {
		// sluice runs in the database's folder; a relative path would miss.
		abs, err := filepath.Abs(bin)
		if err != nil {
			return nil, err
		}
		bin = abs
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = filepath.Dir(opts.DB)
	cmd.Env = childEnv()
	cmd.SysProcAttr = sysProcAttr()
	in := &Instance{cmd: cmd, exited: make(chan struct{})}
	logw := opts.Log
	if logw == nil {
		logw = io.Discard
	}
	cmd.Stderr = io.MultiWriter(logw, tailWriter{in})
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", opts.Bin, err)
	}
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := listeningRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case listening <- m[1]:
				default:
				}
			}
		}
		io.Copy(io.Discard, out)
		cmd.Wait()
		close(in.exited)
	}()
	ready := opts.Ready
	if ready <= 0 {
		ready = 30 * time.Second
	}
	timer := time.NewTimer(ready)
	defer timer.Stop()
	select {
	case u := <-listening:
		in.URL = u
		return in, nil
	case <-in.exited:
		return nil, fmt.Errorf("sluice exited (%v) before listening:\n%s", cmd.ProcessState, in.Tail())
	case <-timer.C:
		in.Kill()
		return nil, fmt.Errorf("sluice did not listen within %s:\n%s", ready, in.Tail())
	case <-ctx.Done():
		in.Kill()
		return nil, ctx.Err()
	}
}

// childEnv is the harness's environment without SLUICE_ variables, so a
// developer's shell cannot change what the scenario measures.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLUICE_") {
			env = append(env, kv)
		}
	}
	return env
}

type tailWriter struct{ in *Instance }

const tailSize = 8 << 10

func (w tailWriter) Write(p []byte) (int, error) {
	w.in.mu.Lock()
	defer w.in.mu.Unlock()
	w.in.tail.Write(p)
	if n := w.in.tail.Len(); n > 2*tailSize {
		b := bytes.Clone(w.in.tail.Bytes()[n-tailSize:])
		w.in.tail.Reset()
		w.in.tail.Write(b)
	}
	return len(p), nil
}

// Tail is the end of the process's stderr.
func (in *Instance) Tail() string {
	in.mu.Lock()
	defer in.mu.Unlock()
	b := in.tail.Bytes()
	if len(b) > tailSize {
		b = b[len(b)-tailSize:]
	}
	return string(b)
}

// Pid is the process id.
func (in *Instance) Pid() int { return in.cmd.Process.Pid }

// Exited is closed once the process is gone.
func (in *Instance) Exited() <-chan struct{} { return in.exited }

// Kill is a crash: SIGKILL, then wait until the process is gone.
func (in *Instance) Kill() error {
	select {
	case <-in.exited:
		return nil
	default:
	}
	if err := in.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-in.exited
	return nil
}

// Stop asks for a graceful shutdown (SIGTERM) and kills the process if it
// has not exited within grace.
func (in *Instance) Stop(grace time.Duration) error {
	select {
	case <-in.exited:
		return nil
	default:
	}
	if err := in.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return in.Kill()
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-in.exited:
		return nil
	case <-t.C:
		in.Kill()
		return fmt.Errorf("sluice did not stop within %s of SIGTERM; killed", grace)
	}
}
