// bad_input.mjs - malformed and hostile requests against `tern serve`, each
// with the status it must get and a piece of the error message; then a
// client that disconnects mid-body, one that goes away mid-stream, and a
// slowloris client (headers one byte a second) that must not hold up the
// others and must be dropped. Afterwards the server still answers /health
// and a normal chat, and exits cleanly on SIGTERM: with the ASan build
// (--tern build/test-asan/tern) a crash, a leak or UB fails the test.
//
//   node tests/server/bad_input.mjs --tern BIN [--model FILE]
import assert from "node:assert/strict";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { options, startServer, stopClean, http, sse, sleep, test, fail, finish } from "./lib.mjs";

const o = options();
const KEY = "sk-bad-input-" + process.pid;
const CONN_TIMEOUT_S = 3;
const sessDir = path.join(o.out, "bad-input-sessions");
fs.rmSync(sessDir, { recursive: true, force: true });
fs.mkdirSync(sessDir, { recursive: true });

// One request over a fresh TCP connection, bytes as given; reads until the
// server closes (Connection: close). Returns {status, headers, body} or
// {status: 0, error} when no response came. A big body goes after the head
// has had a moment to be answered (the server may refuse it on its
// Content-Length alone), in pieces, and stops once a response arrives: a
// server that closes with unread bytes resets the connection, and the reset
// would take the unread response with it.
function raw(port, bytes, { timeoutMs = 30000 } = {}) {
  return new Promise((resolve) => {
    const chunks = [];
    let settled = false;
    let writeError = null;
    const sock = net.connect(port, "127.0.0.1");
    const done = (error) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      sock.destroy();
      const buf = Buffer.concat(chunks);
      const r = parseResponse(buf);
      if (!r) return resolve({ status: 0, error: String(error || writeError || "no response"), bytes: buf.length });
      resolve(r);
    };
    const timer = setTimeout(() => done("timed out"), timeoutMs);
    sock.on("data", (d) => chunks.push(d));
    sock.on("end", () => done());
    sock.on("close", () => done());
    sock.on("error", (e) => { writeError = e; setTimeout(() => done(e), 200); });
    sock.on("connect", async () => {
      const split = bytes.indexOf("\r\n\r\n") + 4;
      const head = bytes.subarray(0, split);
      const body = bytes.subarray(split);
      sock.write(head);
      if (body.length < 1 << 20) return void sock.write(body);
      await sleep(300);
      const step = 1 << 16;
      let off = 0;
      const pump = () => {
        while (off < body.length && !chunks.length && !writeError && !settled) {
          const ok = sock.write(body.subarray(off, off + step));
          off += step;
          if (!ok) return void sock.once("drain", pump);
        }
      };
      pump();
    });
  });
}

function parseResponse(buf) {
  const end = buf.indexOf("\r\n\r\n");
  if (end < 0) return null;
  const head = buf.subarray(0, end).toString("latin1").split("\r\n");
  const m = /^HTTP\/1\.[01] (\d{3})/.exec(head[0]);
  if (!m) return null;
  const headers = {};
  for (const l of head.slice(1)) {
    const i = l.indexOf(":");
    if (i > 0) headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
  }
  let body = buf.subarray(end + 4);
  if (/chunked/i.test(headers["transfer-encoding"] || "")) {
    const parts = [];
    let p = 0;
    for (;;) {
      const nl = body.indexOf("\r\n", p);
      if (nl < 0) break;
      const n = parseInt(body.subarray(p, nl).toString("latin1"), 16);
      if (!(n > 0)) break;
      parts.push(body.subarray(nl + 2, nl + 2 + n));
      p = nl + 2 + n + 2;
    }
    body = Buffer.concat(parts);
  }
  const text = body.toString("utf8");
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: Number(m[1]), headers, text, json };
}

function request(method, p, body, headers = {}) {
  const b = body === undefined ? Buffer.alloc(0) : Buffer.isBuffer(body) ? body : Buffer.from(typeof body === "string" ? body : JSON.stringify(body));
  const h = { Host: "127.0.0.1", Connection: "close", ...headers };
  let payload = b;
  if (body !== undefined) {
    if (!("Content-Type" in h)) h["Content-Type"] = "application/json";
    if (h["Transfer-Encoding"] === "chunked") {
      const parts = [];
      for (let off = 0; off < b.length; off += 1 << 16) {
        const c = b.subarray(off, off + (1 << 16));
        parts.push(Buffer.from(c.length.toString(16) + "\r\n"), c, Buffer.from("\r\n"));
      }
      parts.push(Buffer.from("0\r\n\r\n"));
      payload = Buffer.concat(parts);
    } else {
      h["Content-Length"] = String(b.length);
    }
  }
  const lines = [`${method} ${p} HTTP/1.1`, ...Object.entries(h).filter(([, v]) => v !== null).map(([k, v]) => `${k}: ${v}`)];
  return Buffer.concat([Buffer.from(lines.join("\r\n") + "\r\n\r\n", "latin1"), payload]);
}

const auth = { Authorization: `Bearer ${KEY}` };
const chat = (extra) => ({ messages: [{ role: "user", content: "Hi" }], max_tokens: 4, ...extra });
const CHAT = "/v1/chat/completions";
const COMP = "/v1/completions";

// [name, method, path, body, extra headers, status, message piece]
const T = [
  ["broken JSON", "POST", CHAT, '{"messages": [', {}, 400, "Invalid JSON"],
  ["not JSON at all", "POST", CHAT, "hello there", {}, 400, "Invalid JSON"],
  ["empty body", "POST", CHAT, "", {}, 400, "empty"],
  ["JSON null", "POST", CHAT, "null", {}, 400, "JSON object"],
  ["top-level array", "POST", CHAT, "[]", {}, 400, "JSON object"],
  ["top-level string", "POST", CHAT, '"hi"', {}, 400, "JSON object"],
  ["trailing garbage", "POST", CHAT, JSON.stringify(chat()) + "}}", {}, 400, "JSON"],
  ["100000 nested [", "POST", CHAT, "[".repeat(100000), {}, 400, "nested deeper"],
  ["100000 nested objects", "POST", CHAT, '{"a":'.repeat(100000) + "1" + "}".repeat(100000), {}, 400, "nested deeper"],
  ["raw control byte in a string", "POST", CHAT, '{"messages":[{"role":"user","content":"a\u0001b"}]}', {}, 400, "control character"],
  ["\\u0000 escape", "POST", CHAT, '{"messages":[{"role":"user","content":"a\\u0000b"}]}', {}, 400, "\\u0000"],
  ["bad UTF-8 bytes in content", "POST", CHAT, Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"ab'), Buffer.from([0xff, 0xfe, 0xc3]), Buffer.from('"}]}')]), {}, 400, "UTF-8"],
  ["overlong UTF-8 in a stop string", "POST", CHAT, Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"x"}],"stop":"'), Buffer.from([0xc0, 0xaf]), Buffer.from('"}')]), {}, 400, "UTF-8"],
  ["messages missing", "POST", CHAT, { max_tokens: 3 }, {}, 400, "messages"],
  ["messages is a string", "POST", CHAT, { messages: "hi" }, {}, 400, "messages"],
  ["messages empty", "POST", CHAT, { messages: [] }, {}, 400, "messages"],
  ["message not an object", "POST", CHAT, { messages: [42] }, {}, 400, "messages[0]"],
  ["message without role", "POST", CHAT, { messages: [{ content: "hi" }] }, {}, 400, "role"],
  ["unknown role", "POST", CHAT, { messages: [{ role: "wizard", content: "hi" }] }, {}, 400, "role"],
  ["content is a number", "POST", CHAT, { messages: [{ role: "user", content: 42 }] }, {}, 400, "content"],
  ["content part of type image", "POST", CHAT, { messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }] }, {}, 400, "content[0]"],
  ["1000 messages", "POST", CHAT, { messages: Array.from({ length: 1000 }, () => ({ role: "user", content: "a" })) }, {}, 400, "messages"],
  ["temperature is a string", "POST", CHAT, chat({ temperature: "hot" }), {}, 400, "temperature"],
  ["temperature negative", "POST", CHAT, chat({ temperature: -1 }), {}, 400, "temperature"],
  ["top_p 2", "POST", CHAT, chat({ top_p: 2 }), {}, 400, "top_p"],
  ["max_tokens negative", "POST", CHAT, chat({ max_tokens: -5 }), {}, 400, "max_tokens"],
  ["max_tokens 1.5", "POST", CHAT, chat({ max_tokens: 1.5 }), {}, 400, "max_tokens"],
  ["max_tokens a string", "POST", CHAT, chat({ max_tokens: "ten" }), {}, 400, "max_tokens"],
  ["top_logprobs 99", "POST", CHAT, chat({ logprobs: true, top_logprobs: 99 }), {}, 400, "top_logprobs"],
  ["n 2", "POST", CHAT, chat({ n: 2 }), {}, 400, "n:"],
  ["five stop strings", "POST", CHAT, chat({ stop: ["a", "b", "c", "d", "e"] }), {}, 400, "stop"],
  ["stop string of 300 bytes", "POST", CHAT, chat({ stop: "x".repeat(300) }), {}, 400, "stop[0]"],
  ["stop is a number", "POST", CHAT, chat({ stop: 5 }), {}, 400, "stop"],
  ["stream is a string", "POST", CHAT, chat({ stream: "yes" }), {}, 400, "stream"],
  ["stream_options without stream", "POST", CHAT, chat({ stream_options: { include_usage: true } }), {}, 400, "stream_options"],
  ["seed is a string", "POST", CHAT, chat({ seed: "abc" }), {}, 400, "seed"],
  ["logit_bias key not a number", "POST", CHAT, chat({ logit_bias: { abc: 1 } }), {}, 400, "logit_bias"],
  ["logit_bias token outside the vocabulary", "POST", CHAT, chat({ logit_bias: { 999999999: 1 } }), {}, 400, "logit_bias"],
  ["tools", "POST", CHAT, chat({ tools: [{ type: "function", function: { name: "f" } }] }), {}, 400, "tools"],
  ["model is a number", "POST", CHAT, chat({ model: 5 }), {}, 400, "model"],
  ["prompt missing", "POST", COMP, { max_tokens: 3 }, {}, 400, "prompt"],
  ["prompt token id outside the vocabulary", "POST", COMP, { prompt: [1, 999999999], max_tokens: 3 }, {}, 400, "prompt[1]"],
  ["prompt token id negative", "POST", COMP, { prompt: [1, -1], max_tokens: 3 }, {}, 400, "prompt[1]"],
  ["prompt token id 2.5", "POST", COMP, { prompt: [2.5], max_tokens: 3 }, {}, 400, "prompt[0]"],
  ["two string prompts", "POST", COMP, { prompt: ["a", "b"], max_tokens: 3 }, {}, 400, "prompt"],
  ["nested token arrays", "POST", COMP, { prompt: [[1, 2], [3]], max_tokens: 3 }, {}, 400, "prompt"],
  ["/detokenize id outside the vocabulary", "POST", "/detokenize", { tokens: [1, 999999999] }, {}, 400, "tokens"],
  ["/detokenize id negative", "POST", "/detokenize", { tokens: [-7] }, {}, 400, "tokens"],
  ["/detokenize tokens a string", "POST", "/detokenize", { tokens: "abc" }, {}, 400, "tokens"],
  ["/tokenize content a number", "POST", "/tokenize", { content: 5 }, {}, 400, "content"],
  ["session id ../x (header)", "POST", CHAT, chat(), { "X-Session-Id": "../x" }, 400, "session"],
  ["session id /etc/passwd (header)", "POST", CHAT, chat(), { "X-Session-Id": "/etc/passwd" }, 400, "session"],
  ["session id a/b (header)", "POST", CHAT, chat(), { "X-Session-Id": "a/b" }, 400, "session"],
  ["session id of 200 characters", "POST", CHAT, chat(), { "X-Session-Id": "a".repeat(200) }, 400, "session"],
  ["session id ../x (body field)", "POST", CHAT, chat({ session_id: "../x" }), {}, 400, "session_id"],
  ["session id with a NUL escape", "POST", CHAT, chat({ session_id: "ab\u0000cd" }), {}, 400, ""],
  ["no API key", "POST", CHAT, chat(), { Authorization: null }, 401, ""],
  ["wrong API key", "POST", CHAT, chat(), { Authorization: `Bearer ${KEY}x` }, 401, ""],
  ["API key prefix only", "POST", CHAT, chat(), { Authorization: `Bearer ${KEY.slice(0, -1)}` }, 401, ""],
  ["Basic auth instead of Bearer", "POST", CHAT, chat(), { Authorization: "Basic " + Buffer.from("u:" + KEY).toString("base64") }, 401, ""],
  ["no API key on /v1/models", "GET", "/v1/models", undefined, { Authorization: null }, 401, ""],
  ["GET on a POST route", "GET", CHAT, undefined, {}, 405, ""],
  ["DELETE /v1/models", "DELETE", "/v1/models", undefined, {}, 405, ""],
  ["unknown path", "GET", "/v1/nothing-here", undefined, {}, 404, ""],
  ["path traversal in the URL", "GET", "/../../etc/passwd", undefined, {}, 404, ""],
  ["10 MB body", "POST", CHAT, Buffer.alloc(10 << 20, 0x20), {}, 413, ""],
  // raw bytes: libmicrohttpd's own answers (not JSON), or a closed connection (0)
  ["a request line of garbage", "RAW", "", "GARBAGE\r\n\r\n", {}, 0, null],
  ["a header line without a colon", "RAW", "", "GET /health HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n", {}, 400, null],
  ["HTTP/9.9", "RAW", "", "GET /health HTTP/9.9\r\nHost: x\r\n\r\n", {}, 505, null],
  ["Content-Length -5", "RAW", "", `POST ${CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Length: -5\r\n\r\n`, {}, 400, null],
  ["Content-Length of 20 digits", "RAW", "", `POST ${CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Length: 99999999999999999999\r\n\r\n`, {}, 413, null],
  ["a bad chunk size", "RAW", "", `POST ${CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n`, {}, 400, null],
  ["10 MB chunked body (no Content-Length)", "POST", CHAT, Buffer.alloc(10 << 20, 0x20), { "Transfer-Encoding": "chunked" }, 413, ""],
];

let srv;
try {
  srv = await startServer(o, {
    name: "bad-input",
    args: ["--api-key", KEY, "--sessions", sessDir, "--parallel", "4", "--conn-timeout", String(CONN_TIMEOUT_S)],
    env: { ASAN_OPTIONS: "detect_leaks=1:abort_on_error=0:exitcode=23", UBSAN_OPTIONS: "print_stacktrace=1:halt_on_error=1" },
  });
} catch (e) {
  fail("bad input: server start", e);
  finish("bad input");
  process.exit(1);
}
console.log(`bad input: ${T.length} requests against ${o.tern}`);
assert.ok(T.length >= 40);

for (const [name, method, p, body, hdrs, status, piece] of T) {
  await test(`bad input: ${name} -> ${status}`, async () => {
    const h = { ...auth, ...hdrs };
    const r = await raw(srv.port, method === "RAW" ? Buffer.from(body, "latin1") : request(method, p, body, h));
    if (status === 0) {
      assert.equal(r.status, 0, `expected the connection closed without an answer, got ${r.status} ${r.text && r.text.slice(0, 200)}`);
      return;
    }
    assert.ok(r.status, `no response: ${r.error}`);
    assert.equal(r.status, status, `got ${r.status} ${r.text.slice(0, 300)}`);
    if (status >= 400 && piece !== null) {
      assert.ok(r.json && r.json.error && typeof r.json.error.message === "string", `no {"error": {"message"}} body: ${r.text.slice(0, 300)}`);
      if (piece) assert.ok(r.json.error.message.includes(piece), `message ${JSON.stringify(r.json.error.message)} lacks ${JSON.stringify(piece)}`);
    }
  }, { timeoutMs: 60000 });
}

await test("bad input: no file was made outside the sessions folder", async () => {
  for (const f of ["x.tsess", "../x.tsess", "b.tsess", "passwd.tsess"]) {
    assert.ok(!fs.existsSync(path.join(o.out, f)), `${f} exists next to the sessions folder`);
  }
  assert.ok(!fs.existsSync("/etc/passwd.tsess"), "/etc/passwd.tsess exists");
  const inside = fs.readdirSync(sessDir);
  assert.deepEqual(inside.filter((f) => !/^[A-Za-z0-9_-]+\.tsess/.test(f)), [], `odd files in the sessions folder: ${inside}`);
});

await test("bad input: a client that disconnects mid-body", async () => {
  for (let i = 0; i < 5; i++) {
    const sock = net.connect(srv.port, "127.0.0.1");
    await new Promise((res, rej) => { sock.on("connect", res); sock.on("error", rej); });
    const body = JSON.stringify(chat());
    sock.write(`POST ${CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\nContent-Length: ${body.length + 1000}\r\n\r\n` + body.slice(0, 20));
    await sleep(50);
    sock.destroy();
  }
  const h = await http(srv.url + "/health", { timeoutMs: 5000 });
  assert.equal(h.status, 200);
});

await test("bad input: a client that goes away mid-stream", async () => {
  for (let i = 0; i < 3; i++) {
    const ctl = new AbortController();
    let n = 0;
    const r = await fetch(srv.url + CHAT, {
      method: "POST", headers: { ...auth, "Content-Type": "application/json" }, signal: ctl.signal,
      body: JSON.stringify({ ...chat(), max_tokens: 200, ignore_eos: true, stream: true }),
    });
    assert.equal(r.status, 200);
    try {
      for await (const c of r.body) { n += c.length; if (n > 200) ctl.abort(); }
    } catch (e) {
      assert.equal(e.name, "AbortError");
    }
  }
  const r = await http(srv.url + CHAT, { body: chat(), headers: auth });
  assert.equal(r.status, 200, r.text);
});

await test("bad input: slowloris (headers a byte a second) is dropped, others are served meanwhile", async () => {
  const sock = net.connect(srv.port, "127.0.0.1");
  let closedAt = 0;
  const t0 = Date.now();
  sock.on("close", () => { closedAt = Date.now(); });
  sock.on("error", () => {});
  await new Promise((res, rej) => { sock.on("connect", res); setTimeout(() => rej(new Error("no connect")), 5000).unref(); });
  const head = `POST ${CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${KEY}\r\nX-Padding: ${"a".repeat(200)}\r\n`;
  let i = 0;
  const drip = setInterval(() => { if (!closedAt && i < head.length) sock.write(head[i++]); }, 1000);
  try {
    // others are served while the slow client drips
    const served = [];
    while (!closedAt && Date.now() - t0 < 30000) {
      const s = Date.now();
      const r = await http(srv.url + "/health", { timeoutMs: 3000 });
      assert.equal(r.status, 200, "/health during slowloris");
      served.push(Date.now() - s);
      if (served.length === 2) {
        const c = await http(srv.url + CHAT, { body: chat(), headers: auth, timeoutMs: 10000 });
        assert.equal(c.status, 200, `a chat during slowloris: ${c.text}`);
      }
      await sleep(500);
    }
    assert.ok(served.length >= 2, "too few requests served meanwhile");
    assert.ok(closedAt, `the slow client was not dropped after ${Date.now() - t0} ms (${i} bytes sent, --conn-timeout ${CONN_TIMEOUT_S})`);
    console.log(`  slow client dropped after ${closedAt - t0} ms, ${i} bytes; ${served.length} /health answered meanwhile, slowest ${Math.max(...served)} ms`);
  } finally {
    clearInterval(drip);
    sock.destroy();
  }
}, { timeoutMs: 60000 });

await test("bad input: the server still answers /health and a chat", async () => {
  const h = await http(srv.url + "/health");
  assert.equal(h.status, 200);
  const r = await http(srv.url + CHAT, { body: chat({ max_tokens: 8 }), headers: auth });
  assert.equal(r.status, 200, r.text);
  assert.ok(r.json.choices[0].message.content.length > 0, "empty answer");
  const s = await sse(srv.url + CHAT, chat({ max_tokens: 8, stream: true }), { headers: auth });
  assert.equal(s.status, 200);
  assert.equal(s.events[s.events.length - 1].data, "[DONE]");
});

await test("bad input: clean exit on SIGTERM (no sanitizer report)", () => stopClean(srv), { timeoutMs: 90000 });
process.exit(finish("bad input"));
