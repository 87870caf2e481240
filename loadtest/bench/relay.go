package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-dev/sluice/shared/signature"
)

// relayProc is a `loadtest relay` process forwarding to a sink.
type relayProc struct {
	cmd *exec.Cmd
	url string
	hc  *http.Client
}

// startRelay runs bin's relay command and waits for the URL it prints.
func startRelay(ctx context.Context, bin, to string) (*relayProc, error) {
	cmd := exec.Command(bin, "relay", "--to", to)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	r := &relayProc{cmd: cmd, hc: newClient()}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		io.Copy(io.Discard, out)
	}()
	select {
	case u, ok := <-line:
		if ok && strings.HasPrefix(u, "http://127.0.0.1:") {
			r.url = u
			return r, nil
		}
	case <-time.After(10 * time.Second):
	case <-ctx.Done():
	}
	r.close()
	return nil, fmt.Errorf("%s relay did not start: %s", bin, strings.TrimSpace(stderr.String()))
}

func (r *relayProc) pid() int { return r.cmd.Process.Pid }

// post sends one event body to the relay; anything but 202 fails.
func (r *relayProc) post(ctx context.Context, body []byte) error {
	return postEvent(ctx, r.hc, r.url+"/v1/events", body, http.StatusAccepted)
}

// postEvent POSTs an event body to url, with the event's id as its
// webhook-id (the sink tells deliveries apart by it, as receivers do);
// any status but want fails.
func postEvent(ctx context.Context, hc *http.Client, url string, body []byte, want int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if id, ok := strings.CutPrefix(string(body), `{"id":"`); ok {
		id, _, _ = strings.Cut(id, `"`)
		req.Header.Set(signature.HeaderID, id)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != want {
		return fmt.Errorf("%s: status %d", url, resp.StatusCode)
	}
	return nil
}

// close stops the relay.
func (r *relayProc) close() {
	r.hc.CloseIdleConnections()
	r.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { r.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		r.cmd.Process.Kill()
		<-done
	}
}
