// sluice's edge Worker: the entry module. The Go program (app.wasm, built
// from edge/) does the work; this file only starts it, once per isolate, and
// declares the Durable Object class, which Go cannot.
//
// One Go instance serves every request of the isolate. The stock
// syumai/workers entry starts a fresh one per request, which costs ~6 ms of
// wall time and ~9 ms of CPU each time, twice when the Durable Object is Go
// too. `context` is the object syumai/workers reads when its packages
// initialise: `binding` receives Go's serve and takeToken, and `env`
// is refreshed on each request (it holds the same bindings every time).
import "./wasm_exec.js";
import { DurableObject } from "cloudflare:workers";
import wasm from "./app.wasm";

const context = { env: undefined, ctx: undefined, binding: {} };
globalThis.context = context;

let started; // a promise, settled once Go has called workers.Ready()

function startGo(env) {
  context.env = env;
  if (started === undefined) {
    started = new Promise((resolve, reject) => {
      const go = new Go();
      const instance = new WebAssembly.Instance(wasm, {
        ...go.importObject,
        workers: { ready: () => resolve() },
      });
      go.run(instance).then(
        () => {
          // Go exited (a panic): the next request starts a new instance.
          started = undefined;
          reject(new Error("the Go program exited"));
        },
        (err) => {
          started = undefined;
          reject(err);
        },
      );
    });
  }
  return started;
}

// refuse answers an error the way the Go handler does.
function refuse(status, code, message) {
  return new Response(JSON.stringify({ error: { code, message } }), {
    status,
    headers: { "content-type": "application/json" },
  });
}

// readBody reads at most max bytes of the request's body, or returns
// undefined when there are more. Nothing larger is buffered, or copied into
// Go's memory (which never shrinks), before its signature can be checked.
async function readBody(request, max) {
  if (request.body === null) return null;
  if (Number(request.headers.get("content-length")) > max) return undefined;
  const reader = request.body.getReader();
  const chunks = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > max) {
      reader.cancel();
      return undefined;
    }
    chunks.push(value);
  }
  const body = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    body.set(c, at);
    at += c.byteLength;
  }
  return body;
}

export default {
  async fetch(request, env, ctx) {
    try {
      await startGo(env);
    } catch {
      return refuse(500, "internal", "the edge failed");
    }
    context.ctx = ctx;
    const headers = [];
    for (const [name, value] of request.headers) headers.push(name, value);
    const max = context.binding.maxRequestBytes;
    const body = await readBody(request, max);
    if (body === undefined) return refuse(413, "too_large", `the request exceeds ${max} bytes`);
    return new Promise((resolve) => {
      context.binding.serve(request.method, request.url, headers, body, (status, flat, out) => {
        const h = new Headers();
        for (let i = 0; i + 1 < flat.length; i += 2) h.append(flat[i], flat[i + 1]);
        resolve(new Response(out, { status, headers: h }));
      });
    });
  },
};

// SubscriberBucket is one subscriber's token bucket (idFromName(subscriber)).
// The arithmetic is Go's (edge/worker.TakeToken over shared/bucket). take()
// reads, computes and replaces this.bucket without an await in between, so
// concurrent requests to one object are serialized; the new state is in
// storage before the answer leaves.
export class SubscriberBucket extends DurableObject {
  constructor(ctx, env) {
    super(ctx, env);
    this.bucket = null;
    ctx.blockConcurrencyWhile(async () => {
      await startGo(env);
      this.bucket = (await ctx.storage.get("bucket")) ?? null;
    });
  }

  async take(rate) {
    await startGo(this.env);
    const out = context.binding.takeToken(this.bucket, rate.per_second, rate.burst, Date.now());
    if (out.error) throw new Error(out.error);
    this.bucket = { tokens: out.tokens, last_ms: out.last_ms };
    await this.ctx.storage.put("bucket", this.bucket);
    return { ok: out.ok, retry_in_ms: out.retry_in_ms };
  }
}
