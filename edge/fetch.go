//go:build js && wasm

package main

import (
	"io"
	"net/http"
	"strconv"
	"syscall/js"
	"time"
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
	// Only the status and Retry-After are used: let the body go unread.
	if b := res.Get("body"); b.Type() == js.TypeObject {
		b.Call("cancel")
	}
	status := res.Get("status").Int()
	return &http.Response{
		Status:     strconv.Itoa(status) + " " + http.StatusText(status),
		StatusCode: status,
		Header:     h,
		Body:       http.NoBody,
		Request:    req,
	}, nil
}
