// openai.test.mjs - `tern serve` driven by the official openai npm package
// (v4), the way a user's program talks to it, plus raw fetches where the
// client hides the wire (usage: null on every chunk, /tokenize).
//
//   node tests/server/openai.test.mjs --tern BIN --model FILE [--label NAME]
//        [--deps DIR] [--out DIR]
import assert from "node:assert/strict";
import path from "node:path";
import { options, npmRequire, startServer, stopClean, http, test, fail, finish } from "./lib.mjs";

const o = options();
const label = o.label || path.basename(o.model, ".gguf");
const openaiPkg = npmRequire(o.deps, "openai");
const OpenAI = openaiPkg.OpenAI || openaiPkg.default || openaiPkg;

const MAXT = 32;
const USER1 = "Tell me a short story about a cat and a dog.";
const USER2 = "What happened next?";

function checkUsage(u, maxTokens) {
  assert.ok(u, "usage is missing");
  for (const k of ["prompt_tokens", "completion_tokens", "total_tokens"]) {
    assert.ok(Number.isInteger(u[k]) && u[k] >= 0, `usage.${k} = ${u[k]}`);
  }
  assert.ok(u.prompt_tokens > 0, "usage.prompt_tokens is 0");
  assert.ok(u.completion_tokens > 0, "usage.completion_tokens is 0");
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens, "total_tokens != prompt + completion");
  if (maxTokens !== undefined) assert.ok(u.completion_tokens <= maxTokens, `completion_tokens ${u.completion_tokens} > max_tokens ${maxTokens}`);
}

function checkFinish(finishReason, u, maxTokens) {
  assert.ok(["stop", "length"].includes(finishReason), `finish_reason ${JSON.stringify(finishReason)}`);
  if (finishReason === "length") assert.equal(u.completion_tokens, maxTokens, "finish_reason length before max_tokens");
  else assert.ok(u.completion_tokens <= maxTokens);
}

async function collect(stream) {
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

function chunkText(chunks) {
  let s = "";
  for (const c of chunks) for (const ch of c.choices) if (ch.delta && typeof ch.delta.content === "string") s += ch.delta.content;
  return s;
}

async function expectApiError(promise, status, substr) {
  let err = null;
  try {
    await promise;
  } catch (e) {
    err = e;
  }
  assert.ok(err, `expected an APIError ${status}, the call succeeded`);
  assert.ok(err instanceof OpenAI.APIError, `expected an APIError, got ${err && err.constructor && err.constructor.name}: ${err && err.message}`);
  assert.equal(err.status, status, `status: ${err.message}`);
  if (substr) assert.ok(err.message.toLowerCase().includes(substr.toLowerCase()), `message ${JSON.stringify(err.message)} lacks ${JSON.stringify(substr)}`);
  return err;
}

let srv;
try {
  srv = await startServer(o, { name: `openai-${label}`, args: ["--parallel", "4"] });
} catch (e) {
  fail(`openai[${label}] server start`, e);
  finish(`openai[${label}]`);
  process.exit(1);
}
const client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "unused", maxRetries: 0, timeout: 60000 });
const T = (name, fn, opts) => test(`openai[${label}] ${name}`, fn, opts);

let modelId = "";
let greedy = null; // the non-streaming answer at temperature 0
const base = () => ({ model: modelId, messages: [{ role: "user", content: USER1 }], max_tokens: MAXT, temperature: 0 });

await T("models list", async () => {
  const page = await client.models.list();
  assert.ok(Array.isArray(page.data) && page.data.length >= 1, "no models");
  const m = page.data[0];
  assert.equal(m.object, "model");
  assert.equal(typeof m.id, "string");
  assert.ok(m.id.length > 0, "empty model id");
  modelId = m.id;
});

await T("chat non-streaming", async () => {
  const r = await client.chat.completions.create(base());
  assert.equal(r.object, "chat.completion");
  assert.ok(typeof r.id === "string" && r.id.length > 0, "id");
  assert.ok(Number.isInteger(r.created) && r.created > 1.6e9, `created ${r.created}`);
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.index, 0);
  assert.equal(c.message.role, "assistant");
  assert.equal(typeof c.message.content, "string");
  assert.ok(c.message.content.length > 0, "empty content");
  checkUsage(r.usage, MAXT);
  checkFinish(c.finish_reason, r.usage, MAXT);
  greedy = { text: c.message.content, finish: c.finish_reason, usage: r.usage };
  const again = await client.chat.completions.create(base());
  assert.equal(again.choices[0].message.content, greedy.text, "temperature 0 twice gave different answers");
  assert.notEqual(again.id, r.id, "two completions share an id");
});

await T("chat streaming", async () => {
  assert.ok(greedy, "needs the non-streaming answer");
  const chunks = await collect(await client.chat.completions.create({ ...base(), stream: true }));
  assert.ok(chunks.length >= 2, `${chunks.length} chunks`);
  const { id, created } = chunks[0];
  assert.ok(typeof id === "string" && id.length > 0);
  for (const c of chunks) {
    assert.equal(c.object, "chat.completion.chunk");
    assert.equal(c.id, id, "id changes within the stream");
    assert.equal(c.created, created, "created changes within the stream");
    assert.equal(c.choices.length, 1, "a chunk without include_usage has one choice");
  }
  assert.equal(chunks[0].choices[0].delta.role, "assistant", "the first delta has no role");
  const last = chunks[chunks.length - 1].choices[0];
  assert.equal(last.finish_reason, greedy.finish, "finish_reason of the last chunk");
  for (const c of chunks.slice(0, -1)) assert.equal(c.choices[0].finish_reason, null, "finish_reason before the last chunk");
  assert.equal(chunkText(chunks), greedy.text, "the stream differs from the non-streaming answer");
});

await T("chat streaming include_usage", async () => {
  assert.ok(greedy);
  const chunks = await collect(await client.chat.completions.create({ ...base(), stream: true, stream_options: { include_usage: true } }));
  const last = chunks[chunks.length - 1];
  assert.deepEqual(last.choices, [], "the usage chunk has choices []");
  checkUsage(last.usage, MAXT);
  assert.equal(last.usage.prompt_tokens, greedy.usage.prompt_tokens);
  assert.equal(last.usage.completion_tokens, greedy.usage.completion_tokens);
  for (const c of chunks.slice(0, -1)) {
    assert.equal(c.usage, null, "usage is null on the other chunks");
    assert.equal(c.choices.length, 1);
  }
  assert.equal(chunkText(chunks), greedy.text);
});

await T("stop sequence", async () => {
  assert.ok(greedy);
  const g = greedy.text;
  // A 3-character piece from the middle that first occurs there and is not blank.
  let stop = null;
  for (let p = Math.floor(g.length / 2); p >= 1 && !stop; p--) {
    const s = g.slice(p, p + 3);
    if (s.length === 3 && s.trim().length > 0 && g.indexOf(s) === p) stop = s;
  }
  assert.ok(stop, `no stop string can be taken from the greedy answer ${JSON.stringify(g)}`);
  const want = g.slice(0, g.indexOf(stop));
  const r = await client.chat.completions.create({ ...base(), stop: [stop, "\u0001never\u0001"] });
  const c = r.choices[0];
  assert.ok(!c.message.content.includes(stop), `the stop string ${JSON.stringify(stop)} is in the answer`);
  assert.equal(c.message.content, want, `stop ${JSON.stringify(stop)}`);
  assert.equal(c.finish_reason, "stop");
  assert.ok(r.usage.completion_tokens <= greedy.usage.completion_tokens);
  const chunks = await collect(await client.chat.completions.create({ ...base(), stop, stream: true }));
  assert.equal(chunkText(chunks), want, "streaming with a stop string");
  assert.equal(chunks[chunks.length - 1].choices[0].finish_reason, "stop");
});

await T("seed reproducibility", async () => {
  const ask = async (seed) => (await client.chat.completions.create({ ...base(), temperature: 0.8, seed })).choices[0].message.content;
  const a = await ask(42);
  const b = await ask(42);
  assert.ok(a.length > 0);
  assert.equal(b, a, "the same seed gave different answers");
  const others = [];
  for (const s of [1, 2, 3, 4, 5]) others.push(await ask(s));
  assert.ok(others.some((t) => t !== a), "five other seeds all gave the seed-42 answer");
});

await T("completions: string and token-array prompts", async () => {
  const prompt = "Once upon a time";
  const r = await client.completions.create({ model: modelId, prompt, max_tokens: 16, temperature: 0 });
  assert.equal(r.object, "text_completion");
  assert.equal(r.choices.length, 1);
  const text = r.choices[0].text;
  assert.equal(typeof text, "string");
  assert.ok(text.length > 0, "empty completion");
  checkUsage(r.usage, 16);
  checkFinish(r.choices[0].finish_reason, r.usage, 16);
  // streaming gives the same text
  const chunks = await collect(await client.completions.create({ model: modelId, prompt, max_tokens: 16, temperature: 0, stream: true }));
  assert.equal(chunks.map((c) => c.choices.map((x) => x.text).join("")).join(""), text, "streamed completion differs");
  // the prompt as token ids (with the special tokens the string prompt gets)
  const tk = await http(srv.url + "/tokenize", { body: { content: prompt, add_special: true } });
  assert.equal(tk.status, 200, `/tokenize: ${tk.text}`);
  const ids = tk.json.tokens;
  assert.ok(Array.isArray(ids) && ids.length > 0 && ids.every(Number.isInteger), `/tokenize gave ${tk.text}`);
  assert.equal(ids.length, r.usage.prompt_tokens, "/tokenize with add_special and the string prompt disagree on the length");
  const dt = await http(srv.url + "/detokenize", { body: { tokens: ids } });
  assert.equal(dt.status, 200, `/detokenize: ${dt.text}`);
  assert.ok(dt.json.content.includes(prompt), `/detokenize gave ${dt.text}`);
  const r2 = await client.completions.create({ model: modelId, prompt: ids, max_tokens: 16, temperature: 0 });
  assert.equal(r2.usage.prompt_tokens, ids.length);
  assert.equal(r2.choices[0].text, text, "token-array prompt differs from the string prompt");
});

await T("errors are APIErrors with the right status", async () => {
  const e1 = await expectApiError(client.chat.completions.create({ ...base(), temperature: "hot" }), 400, "temperature");
  assert.ok(e1 instanceof OpenAI.BadRequestError);
  await expectApiError(client.chat.completions.create({ ...base(), messages: [] }), 400, "messages");
  await expectApiError(client.chat.completions.create({ ...base(), max_tokens: -5 }), 400, "max_tokens");
  await expectApiError(client.chat.completions.create({ ...base(), n: 2 }), 400, "n: only 1");
  const e404 = await expectApiError(client.get("/no/such/path"), 404);
  assert.ok(e404 instanceof OpenAI.NotFoundError);
  // the server still answers
  const r = await client.chat.completions.create(base());
  assert.equal(r.choices[0].message.content, greedy.text);
});

await T("api key: 401 for a wrong or missing key", async () => {
  const key = "sk-tern-test-" + Math.random().toString(36).slice(2);
  const s2 = await startServer(o, { name: `openai-${label}-key`, args: ["--api-key", key, "--parallel", "2"] });
  try {
    const wrong = new OpenAI({ baseURL: s2.url + "/v1", apiKey: key + "x", maxRetries: 0, timeout: 30000 });
    const e = await expectApiError(wrong.chat.completions.create(base()), 401);
    assert.ok(e instanceof OpenAI.AuthenticationError);
    await expectApiError(wrong.models.list(), 401);
    const none = await http(s2.url + "/v1/chat/completions", { body: base() });
    assert.equal(none.status, 401, `no Authorization header: ${none.status} ${none.text}`);
    const right = new OpenAI({ baseURL: s2.url + "/v1", apiKey: key, maxRetries: 0, timeout: 30000 });
    const r = await right.chat.completions.create(base());
    assert.equal(r.choices[0].message.content, greedy.text, "the right key: same greedy answer");
    const health = await http(s2.url + "/health");
    assert.equal(health.status, 200, "/health needs no key");
  } finally {
    await stopClean(s2);
  }
});

await T("cached_tokens on a conversation that goes on", async () => {
  assert.ok(greedy);
  const msgs = [
    { role: "user", content: USER1 },
    { role: "assistant", content: greedy.text },
    { role: "user", content: USER2 },
  ];
  const r = await client.chat.completions.create({ ...base(), messages: msgs });
  const u = r.usage;
  checkUsage(u, MAXT);
  assert.ok(u.prompt_tokens > greedy.usage.prompt_tokens, "the longer conversation has more prompt tokens");
  const cached = u.prompt_tokens_details && u.prompt_tokens_details.cached_tokens;
  assert.ok(Number.isInteger(cached), `usage.prompt_tokens_details.cached_tokens = ${JSON.stringify(u.prompt_tokens_details)}`);
  assert.ok(cached > 0, "cached_tokens is 0 on a conversation that extends the previous one");
  assert.ok(cached < u.prompt_tokens, `cached_tokens ${cached} >= prompt_tokens ${u.prompt_tokens}`);
  if (r.timings) assert.equal(r.timings.prompt_n, u.prompt_tokens - cached, "timings.prompt_n != prompt_tokens - cached_tokens");
  // the first request asked again: its whole prompt but the last position is cached
  const r1 = await client.chat.completions.create(base());
  assert.equal(r1.choices[0].message.content, greedy.text, "a cached prefix changes the answer");
  assert.ok(r1.usage.prompt_tokens_details.cached_tokens > 0, "the same request again has no cached tokens");
});

// Structured output: response_format json_schema / json_object and llama-server's
// "grammar" field. The tiny model rarely ends on its own, so the answers stop at
// the grammar's end only when the schema leaves nothing else; the schema here is
// closed (enum, bounded integer, bounded string) and max_tokens generous.
const PERSON = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 10 },
    age: { type: "integer", minimum: 1, maximum: 99 },
    mood: { enum: ["happy", "sad"] },
  },
  required: ["name", "age", "mood"],
  additionalProperties: false,
};
await T("response_format json_schema: the answer parses and follows the schema", async () => {
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.create({
      ...base(), temperature: 0.8, seed, max_tokens: 120,
      response_format: { type: "json_schema", json_schema: { name: "person", schema: PERSON, strict: true } },
    });
    const c = r.choices[0];
    assert.equal(c.finish_reason, "stop", `the grammar did not complete in 120 tokens: ${c.message.content}`);
    const v = JSON.parse(c.message.content);
    assert.deepEqual(Object.keys(v), ["name", "age", "mood"]);
    assert.ok(typeof v.name === "string" && [...v.name].length <= 10, `name ${JSON.stringify(v.name)}`);
    assert.ok(Number.isInteger(v.age) && v.age >= 1 && v.age <= 99, `age ${v.age}`);
    assert.ok(["happy", "sad"].includes(v.mood), `mood ${v.mood}`);
  }
});
await T("response_format json_schema streamed equals the non-streamed answer", async () => {
  const req = { ...base(), max_tokens: 120, response_format: { type: "json_schema", json_schema: { name: "p", schema: PERSON } } };
  const whole = await client.chat.completions.create(req);
  const chunks = await collect(await client.chat.completions.create({ ...req, stream: true }));
  const text = chunks.map((c) => (c.choices[0] && c.choices[0].delta.content) || "").join("");
  assert.equal(text, whole.choices[0].message.content);
  JSON.parse(text);
});
await T("response_format json_object and the grammar field", async () => {
  const r = await client.chat.completions.create({ ...base(), max_tokens: 24, response_format: { type: "json_object" } });
  assert.ok(r.choices[0].message.content.startsWith("{"), `json_object answer ${r.choices[0].message.content}`);
  const g = await client.chat.completions.create({ ...base(), max_tokens: 40, grammar: 'root ::= ("yes" | "no") "."' });
  assert.ok(["yes.", "no."].includes(g.choices[0].message.content), `grammar answer ${g.choices[0].message.content}`);
  assert.equal(g.choices[0].finish_reason, "stop");
});
await T("an unsupported schema keyword and a broken grammar are 400s naming the problem", async () => {
  const e1 = await client.chat.completions
    .create({ ...base(), response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "string", pattern: "^a" } } } })
    .then(() => null, (e) => e);
  assert.ok(e1 && e1.status === 400 && /pattern/.test(e1.message), `got ${e1 && e1.message}`);
  const e2 = await client.chat.completions.create({ ...base(), grammar: "root ::= undefined-rule" }).then(() => null, (e) => e);
  assert.ok(e2 && e2.status === 400 && /undefined rule/.test(e2.message), `got ${e2 && e2.message}`);
});

await T("clean shutdown on SIGTERM", () => stopClean(srv));
process.exit(finish(`openai[${label}]`));
