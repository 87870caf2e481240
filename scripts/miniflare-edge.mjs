// Serves the built edge Worker (build/edge, from `make edge`) in workerd
// through Miniflare, configured from wrangler.toml: the bindings, the Durable
// Object class and the compatibility date come from there, not from here.
//
//   node scripts/miniflare-edge.mjs [--port N] [--persist DIR] [--config FILE]
//
// --port 0 takes any free port on 127.0.0.1. --persist keeps Durable Object
// storage in DIR across restarts (in memory without it). The origin↔edge
// secret comes from SLUICE_EDGE_SECRET in the environment, never an argument.
// When the Worker answers, one JSON line {"url": "http://127.0.0.1:N"} goes
// to stdout; the Worker's own log lines follow. SIGINT or SIGTERM stops it.
import path from "node:path";
import { parseArgs } from "node:util";
import { Log, LogLevel, Miniflare } from "miniflare";
import { unstable_getMiniflareWorkerOptions } from "wrangler";

const { values: args } = parseArgs({
  options: {
    port: { type: "string", default: process.env.EDGE_PORT ?? "8787" },
    persist: { type: "string" },
    config: { type: "string", default: "wrangler.toml" },
  },
});

const secret = process.env.SLUICE_EDGE_SECRET;
if (!secret) {
  console.error("miniflare-edge: SLUICE_EDGE_SECRET is not set");
  process.exit(2);
}

const { workerOptions, main } = unstable_getMiniflareWorkerOptions(args.config);
const persist = args.persist ? path.resolve(args.persist) : false;

const mf = new Miniflare({
  host: "127.0.0.1",
  port: Number(args.port),
  // Miniflare's own messages only at WARN, and no line per request: the
  // Worker logs its own, which go out as they are, one per line.
  log: new Log(LogLevel.WARN),
  logRequests: false,
  handleStructuredLogs: ({ level, message }) => {
    (level === "error" || level === "warn" ? process.stderr : process.stdout).write(message + "\n");
  },
  // Offline: no request for the cf object's data, no telemetry.
  cf: false,
  durableObjectsPersist: persist,
  name: "sluice-edge",
  compatibilityDate: workerOptions.compatibilityDate,
  compatibilityFlags: workerOptions.compatibilityFlags,
  durableObjects: workerOptions.durableObjects,
  bindings: { ...workerOptions.bindings, SLUICE_EDGE_SECRET: secret },
  modules: true,
  scriptPath: main,
  modulesRoot: path.dirname(main),
  modulesRules: [
    ...(workerOptions.modulesRules ?? []),
    // wasm_exec.js sets globalThis.Go; load it as the side-effect module it is.
    { type: "ESModule", include: ["**/*.js", "**/*.mjs"] },
  ],
});

let stopping = false;
async function stop() {
  if (stopping) return;
  stopping = true;
  try {
    await mf.dispose();
  } finally {
    process.exit(0);
  }
}
process.on("SIGINT", stop);
process.on("SIGTERM", stop);

const url = await mf.ready;
process.stdout.write(JSON.stringify({ url: url.origin }) + "\n");
