//go:build js && wasm

package main

import (
	"context"
	"errors"
	"fmt"
	"syscall/js"
	"time"

	"github.com/syumai/workers/cloudflare"

	"github.com/sluice-dev/sluice/edge/worker"
	"github.com/sluice-dev/sluice/shared/bucket"
)

// durableBuckets asks each subscriber's Durable Object for a token over RPC
// (its take method in worker.mjs), addressing it by idFromName(subscriber).
type durableBuckets struct{ binding string }

func (b durableBuckets) Take(ctx context.Context, subscriberID string, r bucket.Rate) (g worker.Grant, err error) {
	defer recoverJS(&err)
	ns := cloudflare.GetBinding(b.binding)
	if ns.IsUndefined() {
		return g, fmt.Errorf("durable object binding %s is missing", b.binding)
	}
	stub := ns.Call("get", ns.Call("idFromName", subscriberID))
	rate := js.Global().Get("Object").New()
	rate.Set("per_second", r.PerSecond)
	rate.Set("burst", r.Burst)
	v, err := await(stub.Call("take", rate))
	if err != nil {
		return g, fmt.Errorf("bucket take: %w", err)
	}
	if v.Get("ok").Bool() {
		return worker.Grant{OK: true}, nil
	}
	return worker.Grant{RetryIn: time.Duration(v.Get("retry_in_ms").Float() * float64(time.Millisecond))}, nil
}

// takeToken is the Durable Object's call into Go:
// takeToken(stored|null, perSecond, burst, nowMs) → {tokens, last_ms, ok, retry_in_ms}
// or {error}. It never blocks, so the object's JavaScript runs it to the
// end before any other request to that object gets in.
func takeToken(_ js.Value, args []js.Value) (out any) {
	// A panic here would end the Go instance the whole isolate shares.
	defer func() {
		if p := recover(); p != nil {
			out = map[string]any{"error": fmt.Sprint("takeToken: ", p)}
		}
	}()
	if len(args) != 4 {
		return map[string]any{"error": "takeToken wants 4 arguments"}
	}
	r := bucket.Rate{PerSecond: args[1].Float(), Burst: args[2].Float()}
	if !r.Valid() {
		return map[string]any{"error": "invalid rate"}
	}
	var prev *worker.Stored
	if s := args[0]; s.Type() == js.TypeObject {
		prev = &worker.Stored{Tokens: s.Get("tokens").Float(), LastMS: int64(s.Get("last_ms").Float())}
	}
	next, g := worker.TakeToken(prev, r, time.UnixMilli(int64(args[3].Float())))
	return map[string]any{
		"tokens":      next.Tokens,
		"last_ms":     next.LastMS,
		"ok":          g.OK,
		"retry_in_ms": float64(g.RetryIn) / float64(time.Millisecond), // unrounded: the handler rounds up
	}
}

// errJS is wrapped by errors raised on the JavaScript side.
var errJS = errors.New("javascript")

// recoverJS turns a JavaScript exception thrown through syscall/js (a
// js.Error panic) into an error, so one bad call fails one request.
func recoverJS(err *error) {
	if p := recover(); p != nil {
		if je, ok := p.(js.Error); ok {
			*err = fmt.Errorf("%w: %s", errJS, je.Error())
			return
		}
		panic(p)
	}
}

// await blocks the calling goroutine until promise settles. Only the
// promise's own callbacks wake it, so the goroutine goes on running in the
// request context that made the promise.
func await(promise js.Value) (js.Value, error) {
	type settled struct {
		v   js.Value
		err error
	}
	ch := make(chan settled, 1)
	var onOK, onErr js.Func
	onOK = js.FuncOf(func(_ js.Value, args []js.Value) any {
		ch <- settled{v: arg0(args)}
		return nil
	})
	onErr = js.FuncOf(func(_ js.Value, args []js.Value) any {
		e := arg0(args)
		ch <- settled{err: jsError(e)}
		return nil
	})
	promise.Call("then", onOK, onErr)
	s := <-ch
	onOK.Release()
	onErr.Release()
	return s.v, s.err
}

func arg0(args []js.Value) js.Value {
	if len(args) == 0 {
		return js.Undefined()
	}
	return args[0]
}

// jsError describes a rejection; a TimeoutError (AbortSignal.timeout) wraps
// context.DeadlineExceeded, as net/http's would.
func jsError(e js.Value) error {
	if e.Type() == js.TypeObject {
		name, msg := e.Get("name"), e.Get("message")
		if name.Type() == js.TypeString && name.String() == "TimeoutError" {
			return fmt.Errorf("%w: %w", errJS, context.DeadlineExceeded)
		}
		if msg.Type() == js.TypeString {
			return fmt.Errorf("%w: %s", errJS, msg.String())
		}
	}
	return fmt.Errorf("%w: %s", errJS, js.Global().Call("String", e).String())
}
