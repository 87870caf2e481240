//go:build js && wasm

package main

import (
	"bytes"
	"net/http"
	"syscall/js"
)

// serveFunc is the entry module's way into h:
//
//	serve(method, url, headers, body, respond)
//
// with headers a flat [name, value, …] array as the runtime gives them (one
// comma-joined value per name), body a Uint8Array or null, and respond called
// once with (status, headers, body) the same way. The request is read in
// full on the way in and the answer on the way out, both a few hundred
// bytes: no streams, so one request costs two crossings between JavaScript
// and Go plus those of its own awaits.
//
// It replaces syumai/workers' handleRequest, which splits every header value
// at its commas (webhook-signature is "v1,<mac>"), streams small bodies
// through goroutines and pipes, and leaves a js.Func behind on each awaited
// promise: harmless when every request gets a fresh Go instance, a leak when
// one instance serves the isolate.
func serveFunc(h http.Handler) js.Func {
	return js.FuncOf(func(_ js.Value, args []js.Value) any {
		if len(args) != 5 {
			panic("serve wants 5 arguments")
		}
		method, url, headers, body, respond := args[0].String(), args[1].String(), args[2], args[3], args[4]
		var buf []byte
		if body.Type() == js.TypeObject {
			buf = make([]byte, body.Length())
			js.CopyBytesToGo(buf, body)
		}
		req, err := http.NewRequest(method, url, bytes.NewReader(buf))
		if err != nil {
			w := &recorder{header: http.Header{"Content-Type": {"application/json"}}}
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"error":{"code":"bad_request","message":"unreadable request"}}`))
			respond.Invoke(w.status(), w.jsHeaders(), w.jsBody())
			return nil
		}
		for i, n := 0, headers.Length(); i+1 < n; i += 2 {
			req.Header.Add(headers.Index(i).String(), headers.Index(i+1).String())
		}
		// The goroutine runs before this call returns to JavaScript, up to
		// its first await; from then on, only this request's promises wake it.
		go func() {
			w := &recorder{header: http.Header{}}
			h.ServeHTTP(w, req)
			respond.Invoke(w.status(), w.jsHeaders(), w.jsBody())
		}()
		return nil
	})
}

// recorder is the http.ResponseWriter behind serveFunc: it keeps the answer
// until the handler returns.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (w *recorder) Header() http.Header { return w.header }

func (w *recorder) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

func (w *recorder) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(p)
}

func (w *recorder) status() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}

func (w *recorder) jsHeaders() js.Value {
	a := js.Global().Get("Array").New()
	for name, values := range w.header {
		for _, v := range values {
			a.Call("push", name, v)
		}
	}
	return a
}

func (w *recorder) jsBody() js.Value {
	if w.body.Len() == 0 {
		return js.Null()
	}
	b := js.Global().Get("Uint8Array").New(w.body.Len())
	js.CopyBytesToJS(b, w.body.Bytes())
	return b
}
