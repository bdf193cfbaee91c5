// concurrency.mjs - 16 streaming chats with different prompts at temperature
// 0, each asked alone first (one after another), then all 16 at once against
// a server with --parallel 16. Checks: every answer is byte-identical to the
// same request served alone; every request gets its first token, and no
// request waits for others to finish first (all first tokens arrive before
// the first answer ends; the slowest time to first token is within a few
// full answers).
//
// The starvation checks need answers that take longer than 16 HTTP requests
// take to arrive: the tiny Qwen-vocabulary model (a few ms a token) does;
// stories260K answers 48 tokens in a few ms, so on it (--starvation off)
// only the byte identity is checked.
//
// --spec MODE: the server decodes with speculative decoding (--spec MODE)
// and the answers alone come from a second server without it, so the
// concurrent answers with drafts must equal plain decoding's alone; drafts
// must have been evaluated (/metrics).
//
//   node tests/server/concurrency.mjs --tern BIN [--model FILE] [--n 16] [--starvation off] [--spec MODE]
import assert from "node:assert/strict";
import path from "node:path";
import { options, startServer, stopClean, sse, streamText, test, fail, finish } from "./lib.mjs";

const o = options();
const N = Number(o.n || 16);
const starvation = o.starvation !== "off";
const MAXT = 48;
const subjects = ["a red ball", "a small dog", "the moon", "a big tree", "a happy girl", "a boat", "the rain", "a cake",
  "a lost cat", "a garden", "a brave boy", "the sea", "a funny hat", "a bird", "a toy car", "the sun", "a park", "a frog"];
const prompts = Array.from({ length: N }, (_, i) => `Tell me a story about ${subjects[i % subjects.length]}${i >= subjects.length ? " again" : ""}.`);
const body = (p) => ({
  messages: [{ role: "user", content: p }], max_tokens: MAXT, temperature: 0, stream: true,
  ignore_eos: true, stream_options: { include_usage: true },
});

function summary(r) {
  assert.equal(r.status, 200, `status ${r.status}: ${r.raw}`);
  const last = r.events[r.events.length - 1];
  assert.equal(last && last.data, "[DONE]", "the stream does not end with [DONE]");
  const { text, ttft } = streamText(r.events);
  const usageEv = r.events.find((e) => e.data !== "[DONE]" && e.data.usage);
  const finishEv = r.events.find((e) => e.data !== "[DONE]" && e.data.choices && e.data.choices[0] && e.data.choices[0].finish_reason);
  return {
    text, ttft, total: r.events[r.events.length - 1].t,
    finish: finishEv ? finishEv.data.choices[0].finish_reason : null,
    completion: usageEv ? usageEv.data.usage.completion_tokens : null,
  };
}

let srv, plain;
const spec = typeof o.spec === "string" ? o.spec : "";
try {
  srv = await startServer(o, {
    name: `concurrency-${path.basename(o.model, ".gguf")}${spec ? "-" + spec : ""}`,
    args: ["--parallel", String(N), ...(spec ? ["--spec", spec] : [])],
  });
  if (spec) plain = await startServer(o, { name: `concurrency-${path.basename(o.model, ".gguf")}-plain`, args: ["--spec", "off"] });
} catch (e) {
  fail("concurrency: server start", e);
  finish("concurrency");
  process.exit(1);
}
const url = srv.url + "/v1/chat/completions";
const urlAlone = (plain || srv).url + "/v1/chat/completions";

const alone = [];
await test(`concurrency: ${N} requests alone, one after another${spec ? ", without drafts" : ""}`, async () => {
  for (const p of prompts) alone.push(summary(await sse(urlAlone, body(p))));
  for (const [i, a] of alone.entries()) {
    assert.ok(a.text.length > 0, `request ${i}: empty answer`);
    assert.equal(a.completion, MAXT, `request ${i}: ignore_eos with max_tokens ${MAXT} gave ${a.completion} tokens`);
    assert.equal(a.finish, "length");
  }
  assert.ok(new Set(alone.map((a) => a.text)).size > 1, "all prompts gave the same answer: the test would not see a mix-up");
});

await test(`concurrency: ${N} concurrent streams equal the answers alone${starvation ? ", no starvation" : ""}`, async () => {
  assert.equal(alone.length, N, "needs the answers alone");
  const t0 = performance.now();
  const res = await Promise.all(prompts.map(async (p) => {
    const start = performance.now() - t0;
    const r = summary(await sse(url, body(p)));
    return { ...r, start };
  }));
  for (const [i, r] of res.entries()) {
    assert.ok(r.ttft !== null, `request ${i}: no token arrived`);
    assert.equal(r.text, alone[i].text, `request ${i}: the concurrent answer differs from the answer alone`);
    assert.equal(r.completion, MAXT, `request ${i}: completion_tokens`);
  }
  const ttfts = res.map((r) => r.start + r.ttft);
  const ends = res.map((r) => r.start + r.total);
  const maxTtft = Math.max(...ttfts);
  const firstEnd = Math.min(...ends);
  const aloneMax = Math.max(...alone.map((a) => a.total));
  console.log(`  alone: slowest answer ${aloneMax.toFixed(1)} ms; together: TTFT max ${maxTtft.toFixed(1)} ms, ` +
    `first answer done at ${firstEnd.toFixed(1)} ms, all done at ${Math.max(...ends).toFixed(1)} ms`);
  if (!starvation) return;
  // Continuous batching with --parallel N: all N are admitted together, so
  // each has its first token before any of them has its 48th. Served one
  // after another, the last first token would come after 15 full answers.
  assert.ok(maxTtft < firstEnd, `a request got its first token (${maxTtft.toFixed(1)} ms) after another had finished (${firstEnd.toFixed(1)} ms)`);
  const bound = 4 * aloneMax + 500;
  assert.ok(maxTtft <= bound, `slowest TTFT ${maxTtft.toFixed(1)} ms > ${bound.toFixed(1)} ms (4 answers alone + 0.5 s)`);
}, { timeoutMs: 180000 });

if (spec) {
  await test(`concurrency: drafts were evaluated (--spec ${spec})`, async () => {
    const m = await (await fetch(srv.url + "/metrics")).text();
    const d = Number((m.match(/^tern_spec_draft_tokens_total (\d+)/m) || [])[1]);
    assert.ok(d > 0, `tern_spec_draft_tokens_total is ${d}`);
  });
  await test("concurrency: the plain server shuts down cleanly", () => stopClean(plain));
}
await test("concurrency: clean shutdown on SIGTERM", () => stopClean(srv));
process.exit(finish("concurrency"));
