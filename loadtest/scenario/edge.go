package scenario

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"

	"github.com/sluice-dev/sluice/loadtest/localedge"
	"github.com/sluice-dev/sluice/shared/signature"
)

// startWorker builds the edge Worker of the module at root and serves it in
// workerd on 127.0.0.1, with a fresh origin↔edge secret, and returns the
// serve flags that send milestoneType events through it.
func startWorker(ctx context.Context, root string, log io.Writer) (*localedge.Worker, []string, error) {
	if err := localedge.Check(root); err != nil {
		return nil, nil, err
	}
	fmt.Fprintln(log, "building the edge Worker (make edge)")
	if err := localedge.Build(ctx, root); err != nil {
		return nil, nil, err
	}
	secret, err := signature.NewSecret(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	w, err := localedge.Start(ctx, localedge.Options{Root: root, Secret: secret})
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(log, "edge Worker on %s\n", w.URL)
	return w, []string{"--edge-url", w.URL, "--edge-secret", secret, "--edge-types", milestoneType}, nil
}
