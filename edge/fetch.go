//go:build js && wasm

package main

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"syscall/js"
	"time"

	"github.com/sluice-dev/sluice/shared/edgewire"
)

// fetchClient sends a subscriber request with the runtime's fetch, following
// no redirects. The request context's deadline becomes an
// AbortSignal.timeout: the goroutine waits on the fetch promise alone, never
// on a Go timer, whose wake-up could come in another request's context once
// one Go instance serves the whole isolate.
type fetchClient struct{}

func (fetchClient) Do(req *http.Request) (resp *http.Response, err error) {
	defer recoverJS(&err)
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	headers := js.Global().Get("Headers").New()
	for name, values := range req.Header {
		for _, v := range values {
			headers.Call("append", name, v)
		}
	}
	init := js.Global().Get("Object").New()
	init.Set("method", req.Method)
	init.Set("headers", headers)
	init.Set("redirect", "manual")
	if len(body) > 0 {
		b := js.Global().Get("Uint8Array").New(len(body))
		js.CopyBytesToJS(b, body)
		init.Set("body", b)
	}
	if deadline, ok := req.Context().Deadline(); ok {
		left := max(time.Until(deadline).Milliseconds(), 1)
		init.Set("signal", js.Global().Get("AbortSignal").Call("timeout", left))
	}
	res, err := await(js.Global().Call("fetch", req.URL.String(), init))
	if err != nil {
		return nil, err
	}
	h := http.Header{}
	if ra := res.Get("headers").Call("get", "retry-after"); ra.Type() == js.TypeString {
		h.Set("Retry-After", ra.String())
	}
	status := res.Get("status").Int()
	return &http.Response{
		Status:     strconv.Itoa(status) + " " + http.StatusText(status),
		StatusCode: status,
		Header:     h,
		Body:       io.NopCloser(bytes.NewReader(firstBytes(res.Get("body")))),
		Request:    req,
	}, nil
}

// firstBytes reads the start of a fetch body, as much as an attempt keeps,
// and cancels the rest unread: a subscriber's long answer costs the Worker
// neither the time nor the memory to download it.
func firstBytes(body js.Value) []byte {
	if body.Type() != js.TypeObject {
		return nil
	}
	reader := body.Call("getReader")
	var out []byte
	for len(out) < edgewire.ResponseSnippet {
		chunk, err := await(reader.Call("read"))
		if err != nil || chunk.Get("done").Bool() {
			return out // the stream is over: nothing to cancel
		}
		v := chunk.Get("value")
		buf := make([]byte, min(v.Get("length").Int(), edgewire.ResponseSnippet-len(out)))
		js.CopyBytesToGo(buf, v)
		out = append(out, buf...)
	}
	reader.Call("cancel")
	return out
}
