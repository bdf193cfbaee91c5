// lib.mjs - what the end-to-end tests of `tern serve` share: options,
// starting and stopping servers (every one is killed when the process exits),
// HTTP and SSE helpers, and a small runner that prints one PASS/FAIL line per
// test and sets the exit status. No dependencies beyond Node 20; the npm
// packages (openai, puppeteer-core) are loaded from the folder scripts/
// test-server.sh installed them into (--deps).
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const HERE = path.dirname(fileURLToPath(import.meta.url));
export const ROOT = path.resolve(HERE, "../..");

// ---- options -------------------------------------------------------------

// --name value pairs and bare --flags; everything has a default so a test
// runs alone: node tests/server/openai.test.mjs --tern build/h-tests/tern
export function options(extra = {}) {
  const o = {
    tern: process.env.TERN_BIN || path.join(ROOT, "build/test-release/tern"),
    out: process.env.TERN_TEST_OUT || path.join(ROOT, "build/server-test"),
    shared: process.env.TERN_SHARED || path.resolve(ROOT, "../shared"),
    deps: process.env.TERN_TEST_DEPS || "",
    ...extra,
  };
  const a = process.argv.slice(2);
  for (let i = 0; i < a.length; i++) {
    if (!a[i].startsWith("--")) throw new Error("unexpected argument " + a[i]);
    const k = a[i].slice(2).replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    if (i + 1 < a.length && !a[i + 1].startsWith("--")) o[k] = a[++i];
    else o[k] = true;
  }
  if (!o.deps) o.deps = o.out;
  if (!o.model) o.model = path.join(o.shared, "models/stories260K.gguf");
  fs.mkdirSync(o.out, { recursive: true });
  return o;
}

// An npm package installed under dir/node_modules (by test-server.sh).
export function npmRequire(dir, name) {
  const req = createRequire(path.join(path.resolve(dir), "package.json"));
  try {
    return req(name);
  } catch (e) {
    throw new Error(`cannot load the npm package ${name} from ${dir}/node_modules (scripts/test-server.sh installs it): ${e.message}`);
  }
}

// ---- servers -------------------------------------------------------------

const live = new Set(); // child processes still running

function killAll() {
  for (const p of live) {
    try { process.kill(p.pid, "SIGKILL"); } catch { /* gone */ }
  }
  live.clear();
}
process.on("exit", killAll);
for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"]) {
  process.on(sig, () => { killAll(); process.exit(128 + (sig === "SIGINT" ? 2 : sig === "SIGTERM" ? 15 : 1)); });
}

export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Starts `tern serve -m model` on a free loopback port and waits (bounded)
// until GET /health answers 200. Returns a handle: url, pid, stderr(),
// stop() (SIGTERM, waits for the exit, returns {code, signal, stderr}),
// kill9(). The server's output goes to out/<name>.log as well.
export async function startServer(o, { model = o.model, args = [], name = "server", env = {}, timeoutMs } = {}) {
  const isAsan = /asan/.test(o.tern) || !!env.ASAN_OPTIONS;
  timeoutMs = timeoutMs || (isAsan ? 90000 : 30000);
  let lastErr = null;
  for (let attempt = 0; attempt < 3; attempt++) {
    const port = await freePort();
    const argv = ["serve", "-m", model, "--host", "127.0.0.1", "--port", String(port), ...args];
    if (process.env.TERN_TEST_THREADS) argv.push("-t", process.env.TERN_TEST_THREADS);
    const logPath = path.join(o.out, `${name}.log`);
    const log = fs.createWriteStream(logPath, { flags: "a" });
    log.write(`\n==== ${new Date().toISOString()} ${o.tern} ${argv.join(" ")}\n`);
    const proc = spawn(o.tern, argv, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
    live.add(proc);
    let errText = "";
    const exited = new Promise((resolve) => {
      proc.on("exit", (code, signal) => { live.delete(proc); resolve({ code, signal }); });
      proc.on("error", (e) => { live.delete(proc); errText += String(e); resolve({ code: -1, signal: null }); });
    });
    proc.stdout.on("data", (d) => log.write(d));
    proc.stderr.on("data", (d) => { errText += d; log.write(d); });
    if (process.env.TERN_TEST_PIDFILE) fs.appendFileSync(process.env.TERN_TEST_PIDFILE, proc.pid + "\n");
    const url = `http://127.0.0.1:${port}`;
    const handle = {
      url, port, pid: proc.pid, proc, logPath,
      stderr: () => errText,
      exited,
      async stop(signal = "SIGTERM", waitMs = isAsan ? 60000 : 20000) {
        if (!live.has(proc)) return { ...(await exited), stderr: errText };
        try { proc.kill(signal); } catch { /* gone */ }
        let timer;
        const r = await Promise.race([exited, new Promise((res) => { timer = setTimeout(() => res(null), waitMs); })]);
        clearTimeout(timer);
        if (!r) {
          proc.kill("SIGKILL");
          await exited;
          throw new Error(`${name}: no exit within ${waitMs} ms of ${signal} (killed)`);
        }
        log.end();
        return { ...r, stderr: errText };
      },
      async kill9() {
        try { proc.kill("SIGKILL"); } catch { /* gone */ }
        const r = await exited;
        log.end();
        return r;
      },
    };
    const t0 = Date.now();
    let done = null;
    exited.then((r) => { done = r; });
    while (Date.now() - t0 < timeoutMs) {
      if (done) break;
      try {
        const r = await fetch(url + "/health", { signal: AbortSignal.timeout(2000) });
        await r.arrayBuffer();
        if (r.status === 200) return handle;
      } catch { /* not listening yet */ }
      await sleep(50);
    }
    if (done) {
      lastErr = new Error(`${name}: tern serve exited (${JSON.stringify(done)}) before /health answered 200; stderr:\n${errText.slice(-2000)}`);
      if (/address already in use|bind/i.test(errText)) continue; // the port was taken meanwhile: another one
      throw lastErr;
    }
    await handle.kill9();
    throw new Error(`${name}: /health did not answer 200 within ${timeoutMs} ms; stderr:\n${errText.slice(-2000)}`);
  }
  throw lastErr;
}

// A clean SIGTERM and a check that the exit was clean: status 0 and, for a
// sanitizer build, no report on stderr.
export async function stopClean(srv) {
  const r = await srv.stop("SIGTERM");
  const bad = /ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|WARNING: ThreadSanitizer/.exec(r.stderr);
  if (bad) {
    const i = r.stderr.indexOf(bad[0]);
    throw new Error(`sanitizer report on the server's stderr:\n${r.stderr.slice(Math.max(0, i - 200), i + 3000)}`);
  }
  if (r.code !== 0) throw new Error(`the server exited with ${JSON.stringify({ code: r.code, signal: r.signal })} after SIGTERM; stderr tail:\n${r.stderr.slice(-1500)}`);
  return r;
}

// ---- HTTP ----------------------------------------------------------------

// POST (or GET with body undefined) JSON; returns {status, headers, text, json}.
export async function http(url, { method, body, headers = {}, timeoutMs = 60000 } = {}) {
  const h = { ...headers };
  let data;
  if (body !== undefined) {
    data = typeof body === "string" || body instanceof Uint8Array ? body : JSON.stringify(body);
    if (!Object.keys(h).some((k) => k.toLowerCase() === "content-type")) h["Content-Type"] = "application/json";
  }
  const r = await fetch(url, {
    method: method || (body === undefined ? "GET" : "POST"), headers: h, body: data,
    signal: AbortSignal.timeout(timeoutMs),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, headers: r.headers, text, json };
}

// A streaming request read event by event. Returns {status, headers, events:
// [{data, t}], raw, ttft} where t is ms since the request was sent and
// events hold the parsed JSON of each data: line (the string "[DONE]" as is).
export async function sse(url, body, { headers = {}, timeoutMs = 120000, onEvent } = {}) {
  const t0 = performance.now();
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), timeoutMs);
  try {
    const r = await fetch(url, {
      method: "POST", headers: { "Content-Type": "application/json", ...headers },
      body: JSON.stringify(body), signal: ctl.signal,
    });
    if (!r.ok) {
      const text = await r.text();
      let json = null;
      try { json = JSON.parse(text); } catch { /* not JSON */ }
      return { status: r.status, headers: r.headers, events: [], raw: text, json };
    }
    const dec = new TextDecoder();
    let raw = "";
    let buf = "";
    const events = [];
    for await (const chunk of r.body) {
      const s = dec.decode(chunk, { stream: true });
      raw += s;
      buf += s;
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        for (const line of block.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const payload = line.slice(6);
          const ev = { t: performance.now() - t0, data: payload === "[DONE]" ? payload : JSON.parse(payload) };
          events.push(ev);
          if (onEvent) onEvent(ev);
        }
      }
    }
    return { status: r.status, headers: r.headers, events, raw, rest: buf };
  } finally {
    clearTimeout(timer);
  }
}

// The text of a chat or completion stream, and the first content time.
export function streamText(events) {
  let text = "";
  let ttft = null;
  for (const e of events) {
    if (e.data === "[DONE]") continue;
    for (const c of e.data.choices || []) {
      const piece = c.delta ? c.delta.content : c.text;
      if (typeof piece === "string" && piece.length) {
        if (ttft === null) ttft = e.t;
        text += piece;
      }
    }
  }
  return { text, ttft };
}

// ---- runner --------------------------------------------------------------

const results = [];

// Runs fn with a time bound and prints "PASS name" or "FAIL name: why".
export async function test(name, fn, { timeoutMs = 120000 } = {}) {
  const t0 = Date.now();
  let timer;
  try {
    await Promise.race([
      fn(),
      new Promise((_, rej) => { timer = setTimeout(() => rej(new Error(`timed out after ${timeoutMs} ms`)), timeoutMs); }),
    ]);
    results.push({ name, ok: true });
    console.log(`PASS ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    results.push({ name, ok: false });
    const msg = e && e.stack ? e.stack : String(e);
    console.log(`FAIL ${name}: ${msg.split("\n").slice(0, 12).join("\n    ")}`);
  } finally {
    clearTimeout(timer);
  }
}

// A failure outside a test (a server that does not start): counted as a FAIL.
export function fail(name, e) {
  results.push({ name, ok: false });
  console.log(`FAIL ${name}: ${e && e.message ? e.message : e}`);
}

export function finish(suite) {
  const bad = results.filter((r) => !r.ok);
  console.log(`${suite}: ${results.length - bad.length} passed, ${bad.length} failed`);
  process.exitCode = bad.length || results.length === 0 ? 1 : 0;
  return process.exitCode;
}

// Reads a tiny PRNG seed from TERN_TEST_SEED (printed so a failure repeats).
export function rng(seed) {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13; s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5; s >>>= 0;
    return s / 4294967296;
  };
}
