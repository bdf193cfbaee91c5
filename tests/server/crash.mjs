// crash.mjs - a multi-turn chat with a session file (--sessions DIR,
// X-Session-Id) whose server is killed with SIGKILL in the middle of each
// turn, at a random point, then restarted; the turn is asked again. Checks:
// the answer is byte-identical to a run without kills, the prompt the
// session file holds is not evaluated again (cached_tokens; timings.prompt_n
// counts the positions evaluated).
//
// The kill point is the k-th content event (k random, 0: a few ms after the
// request is sent). A model that sends one token per event and takes a few
// ms a token (the tiny Qwen-vocabulary model) gives kills mid-generation;
// at least 2 of the rounds must be.
//
//   node tests/server/crash.mjs --tern BIN [--model FILE] [--rounds 5] [--seed N]
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { options, startServer, stopClean, http, sse, test, fail, finish, rng } from "./lib.mjs";

const o = options();
const ROUNDS = Number(o.rounds || 5);
const seed = Number(o.seed || process.env.TERN_TEST_SEED || Date.now() % 100000);
console.log(`crash: seed ${seed} (--seed ${seed} repeats the kill points), ${ROUNDS} rounds`);
const rand = rng(seed);
const MAXT = 40;
const TURNS = [
  "Tell me a story about a little bird.",
  "What did the bird find?",
  "Who did the bird meet next?",
  "Where did they go together?",
  "How did the day end?",
  "What did they learn?",
  "Tell me one more thing.",
  "Say goodbye.",
];
assert.ok(ROUNDS <= TURNS.length, `at most ${TURNS.length} rounds`);

const sessArgs = (dir) => ["--sessions", dir, "--parallel", "2"];
const body = (messages, stream) => ({ messages, max_tokens: MAXT, temperature: 0, stream });

function freshDir(name) {
  const d = path.join(o.out, name);
  fs.rmSync(d, { recursive: true, force: true });
  fs.mkdirSync(d, { recursive: true });
  return d;
}

async function turn(url, sid, messages) {
  const r = await http(url + "/v1/chat/completions", { body: body(messages, false), headers: { "X-Session-Id": sid } });
  assert.equal(r.status, 200, `turn: ${r.status} ${r.text}`);
  const u = r.json.usage;
  return {
    text: r.json.choices[0].message.content,
    finish: r.json.choices[0].finish_reason,
    prompt: u.prompt_tokens,
    cached: u.prompt_tokens_details ? u.prompt_tokens_details.cached_tokens : undefined,
    promptN: r.json.timings ? r.json.timings.prompt_n : undefined,
  };
}

// The run without kills.
const ref = [];
await test("crash: reference conversation (no kills)", async () => {
  const dir = freshDir("crash-ref");
  const srv = await startServer(o, { name: "crash-ref", args: sessArgs(dir) });
  try {
    const hist = [];
    for (let i = 0; i < ROUNDS; i++) {
      const msgs = [...hist, { role: "user", content: TURNS[i] }];
      const t = await turn(srv.url, "ref", msgs);
      assert.ok(t.text.length > 0, `turn ${i}: empty answer`);
      if (i > 0) assert.ok(t.cached >= ref[i - 1].prompt, `turn ${i}: cached_tokens ${t.cached} < the previous prompt ${ref[i - 1].prompt}`);
      ref.push(t);
      hist.push({ role: "user", content: TURNS[i] }, { role: "assistant", content: t.text });
    }
    assert.ok(fs.existsSync(path.join(dir, "ref.tsess")), "no session file ref.tsess in the sessions folder");
  } finally {
    await stopClean(srv);
  }
}, { timeoutMs: 120000 });

await test(`crash: kill -9 mid-generation, ${ROUNDS} rounds, restart, same answers`, async () => {
  assert.equal(ref.length, ROUNDS, "the reference run failed");
  const dir = freshDir("crash-kill");
  const sid = "crash-" + seed;
  let srv = await startServer(o, { name: "crash-kill", args: sessArgs(dir) });
  try {
    const hist = [];
    let midGen = 0;
    for (let i = 0; i < ROUNDS; i++) {
      const msgs = [...hist, { role: "user", content: TURNS[i] }];
      // kill after k content events, 0 .. the answer's length: anywhere from
      // before the prompt is read to after the last token
      const k = Math.floor(rand() * (MAXT - 4));
      let seen = 0;
      let killed = null;
      const kill = () => { if (!killed) killed = srv.kill9(); };
      if (k === 0) setTimeout(kill, Math.floor(rand() * 20));
      const req = sse(srv.url + "/v1/chat/completions", body(msgs, true), {
        headers: { "X-Session-Id": sid }, timeoutMs: 60000,
        onEvent: (ev) => {
          if (ev.data !== "[DONE]" && ev.data.choices && ev.data.choices[0] && ev.data.choices[0].delta.content) seen++;
          if (seen >= k && k > 0) kill();
        },
      }).catch((e) => ({ error: e }));
      const res = await req;
      kill(); // the answer ended before the k-th event: kill anyway
      const ex = await killed;
      assert.equal(ex.signal, "SIGKILL", `round ${i}: the server was not killed by SIGKILL: ${JSON.stringify(ex)}`);
      const ended = !res.error && res.events && res.events.length && res.events[res.events.length - 1].data === "[DONE]";
      if (seen > 0 && !ended) midGen++;
      console.log(`  round ${i}: killed after ${seen} content events (k=${k})${ended ? ", the answer had ended" : seen ? ", mid-generation" : ", before the first token"}`);
      srv = await startServer(o, { name: "crash-kill", args: sessArgs(dir) });
      const t = await turn(srv.url, sid, msgs);
      assert.equal(t.prompt, ref[i].prompt, `round ${i}: prompt_tokens`);
      assert.equal(t.text, ref[i].text, `round ${i}: the answer after the restart differs from the run without kills`);
      assert.equal(t.finish, ref[i].finish, `round ${i}: finish_reason`);
      assert.ok(Number.isInteger(t.cached), `round ${i}: no usage.prompt_tokens_details.cached_tokens`);
      // what the session file must hold: the conversation up to the previous
      // turn, and this turn's prompt once its first token was seen
      const committed = seen > 0 ? ref[i].prompt - 1 : i > 0 ? ref[i - 1].prompt : 0;
      assert.ok(t.cached >= committed, `round ${i}: cached_tokens ${t.cached} < ${committed} committed before the kill`);
      assert.ok(t.cached < t.prompt, `round ${i}: cached_tokens ${t.cached} >= prompt_tokens ${t.prompt}`);
      assert.equal(t.promptN, t.prompt - t.cached, `round ${i}: timings.prompt_n (positions evaluated) != prompt_tokens - cached_tokens`);
      hist.push({ role: "user", content: TURNS[i] }, { role: "assistant", content: t.text });
    }
    // the point of the test: kills while tokens are being generated
    assert.ok(midGen >= Math.min(2, ROUNDS), `only ${midGen} of ${ROUNDS} kills landed mid-generation (seed ${seed})`);
  } finally {
    await stopClean(srv);
  }
}, { timeoutMs: 240000 });

process.exit(finish("crash"));
