// serve_load.mjs - load generator for a running `tern serve` (loopback only).
// For each client count (default 1, 4, 8, 16) it runs that many clients at
// once, each sending streaming /v1/completions requests one after another
// (fixed prompts, fixed max_tokens, ignore_eos: every answer has the same
// length; the same prompts every run), and prints a table: clients,
// requests, aggregate generated tok/s, time to first token p50/p99,
// inter-token latency p50/p99, and tok/s relative to 1 client. One untimed
// request warms the server up first.
//
//   node bench/serve_load.mjs --url http://127.0.0.1:8080 [--clients 1,4,8,16]
//        [--requests 2] (per client) [--max-tokens 64] [--api-key K]
//        [--time-limit 300] (seconds, all levels together) [--json]
//        [--workload prose|copy] [--temperature T] (default 0, then seed 1)
//
// --workload copy: prompts that repeat a passage and start it once more,
// so the answer tends to copy it (speculative decoding's drafts find it).
// The drafted and accepted columns are the differences of the server's
// tern_spec_* counters (/metrics) over the level.
//
// Inter-token latency: the gaps between the stream's content events divided
// by the tokens each event carries (a held-back stop-string prefix can put
// several tokens in one event; without stop strings it is one token per event).
// Events that arrive in one socket read get one timestamp: on a model faster
// than the loopback round trip (stories260K) many gaps read 0 ms.
const args = process.argv.slice(2);
const opt = { url: "http://127.0.0.1:8080", clients: "1,4,8,16", requests: "2", maxTokens: "64", timeLimit: "300", apiKey: "", json: false, workload: "prose", temperature: "0" };
for (let i = 0; i < args.length; i++) {
  const a = args[i];
  if (a === "--json") { opt.json = true; continue; }
  if (a === "-h" || a === "--help") {
    console.log("usage: node bench/serve_load.mjs --url URL [--clients 1,4,8,16] [--requests N] [--max-tokens N] [--api-key K] [--time-limit S] [--json] [--workload prose|copy] [--temperature T]");
    process.exit(0);
  }
  if (!a.startsWith("--") || i + 1 >= args.length) { console.error(`serve_load: bad argument ${a}`); process.exit(2); }
  opt[a.slice(2).replace(/-([a-z])/g, (_, c) => c.toUpperCase())] = args[++i];
}
const url = new URL(opt.url);
if (!["127.0.0.1", "localhost", "[::1]"].includes(url.hostname)) {
  console.error(`serve_load: loopback only (got ${url.hostname})`);
  process.exit(2);
}
const levels = opt.clients.split(",").map(Number);
const perClient = Number(opt.requests);
const maxTokens = Number(opt.maxTokens);
const deadline = Date.now() + Number(opt.timeLimit) * 1000;
const temperature = Number(opt.temperature);
if (levels.some((n) => !(n >= 1 && n <= 256)) || !(perClient >= 1 && perClient <= 1000) || !(maxTokens >= 1 && maxTokens <= 4096) ||
    !["prose", "copy"].includes(opt.workload) || !(temperature >= 0 && temperature <= 2)) {
  console.error("serve_load: --clients 1..256, --requests 1..1000, --max-tokens 1..4096, --workload prose|copy, --temperature 0..2");
  process.exit(2);
}

const PROMPTS = [
  "Once upon a time, there was a little girl who",
  "The dog ran to the park because",
  "Tom and his sister found a box in the garden. Inside the box",
  "One day the sun did not come up, so the animals",
  "A small bird wanted to fly over the big mountain.",
  "In a little town there lived an old man who loved",
  "The cat looked at the moon and said",
  "Lily had a red ball. She",
];

// The same stories, each told twice and begun a third time.
const COPY = PROMPTS.map((p) => `${p} it was a sunny day and everyone was happy. ${p} it was a sunny day and everyone was happy. ${p}`);
const WORK = opt.workload === "copy" ? COPY : PROMPTS;

const headers = { "Content-Type": "application/json" };
if (opt.apiKey) headers.Authorization = `Bearer ${opt.apiKey}`;

// One streaming completion: returns {ttft, gaps[], tokens} (ms).
async function one(prompt) {
  const t0 = performance.now();
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), Math.max(1000, deadline - Date.now() + 30000));
  try {
    const r = await fetch(new URL("/v1/completions", url), {
      method: "POST", headers, signal: ctl.signal,
      body: JSON.stringify({
        prompt, max_tokens: maxTokens, temperature, seed: 1, ignore_eos: true, stream: true,
        stream_options: { include_usage: true },
      }),
    });
    if (!r.ok) throw new Error(`HTTP ${r.status}: ${(await r.text()).slice(0, 200)}`);
    const dec = new TextDecoder();
    let buf = "";
    let ttft = null;
    let last = 0;
    const gaps = [];
    let pieces = 0;
    let tokens = 0;
    for await (const chunk of r.body) {
      buf += dec.decode(chunk, { stream: true });
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const ev = buf.slice(0, i);
        buf = buf.slice(i + 2);
        if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
        const j = JSON.parse(ev.slice(6));
        if (j.usage) tokens = j.usage.completion_tokens;
        const c = j.choices && j.choices[0];
        if (c && typeof c.text === "string" && c.text.length) {
          const t = performance.now() - t0;
          if (ttft === null) ttft = t;
          else gaps.push(t - last);
          last = t;
          pieces++;
        }
      }
    }
    if (tokens && pieces > 1 && tokens > pieces) {
      // events that carried several tokens: spread the time over them
      const f = (pieces - 1) / (tokens - 1);
      for (let k = 0; k < gaps.length; k++) gaps[k] *= f;
    }
    return { ttft, gaps, tokens };
  } finally {
    clearTimeout(timer);
  }
}

function pct(xs, p) {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}

// The server's speculative counters (0 when it has none).
async function specCounters() {
  try {
    const r = await fetch(new URL("/metrics", url), { headers, signal: AbortSignal.timeout(5000) });
    const t = await r.text();
    const get = (name) => { const m = t.match(new RegExp(`^${name} (\\d+)`, "m")); return m ? Number(m[1]) : 0; };
    return { drafted: get("tern_spec_draft_tokens_total"), accepted: get("tern_spec_accepted_tokens_total") };
  } catch {
    return { drafted: 0, accepted: 0 };
  }
}

async function level(clients) {
  const c0 = await specCounters();
  const ttfts = [];
  const gaps = [];
  let tokens = 0;
  let requests = 0;
  let errors = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: clients }, async (_, c) => {
    for (let k = 0; k < perClient && Date.now() < deadline; k++) {
      try {
        const r = await one(WORK[(c * perClient + k) % WORK.length]);
        requests++;
        tokens += r.tokens;
        if (r.ttft !== null) ttfts.push(r.ttft);
        gaps.push(...r.gaps);
      } catch (e) {
        errors++;
        if (errors === 1) console.error(`serve_load: ${clients} clients: ${e.message}`);
      }
    }
  }));
  const secs = (performance.now() - t0) / 1000;
  const c1 = await specCounters();
  return {
    clients, requests, errors, tokens, seconds: +secs.toFixed(3),
    drafted: c1.drafted - c0.drafted, accepted: c1.accepted - c0.accepted,
    tok_s: +(tokens / secs).toFixed(1),
    ttft_p50_ms: +pct(ttfts, 50).toFixed(1), ttft_p99_ms: +pct(ttfts, 99).toFixed(1),
    itl_p50_ms: +pct(gaps, 50).toFixed(2), itl_p99_ms: +pct(gaps, 99).toFixed(2),
  };
}

// the server answers, then one untimed request warms it up (the weights
// paged in, the first allocations), so that the first level's figures,
// which every ratio divides by, are not a cold start's
try {
  const r = await fetch(new URL("/health", url), { signal: AbortSignal.timeout(5000) });
  if (r.status !== 200) throw new Error(`/health: ${r.status}`);
  await one(WORK[0]);
} catch (e) {
  console.error(`serve_load: the server at ${opt.url} does not answer: ${e.message}`);
  process.exit(1);
}
const rows = [];
for (const n of levels) {
  if (Date.now() >= deadline) { console.error(`serve_load: time limit reached before ${n} clients`); break; }
  const row = await level(n);
  row.ratio = rows.length && rows[0].clients === 1 ? +(row.tok_s / rows[0].tok_s).toFixed(2) : n === 1 ? 1 : null;
  row.max_tokens = maxTokens;
  rows.push(row);
  if (opt.json) console.log(JSON.stringify({ bench: "serve_load", ...row }));
}
if (!opt.json) {
  const cols = [["clients", 7], ["requests", 8], ["errors", 6], ["tok/s", 9], ["TTFT p50", 9], ["TTFT p99", 9], ["ITL p50", 8], ["ITL p99", 8], ["x 1 client", 10], ["drafted", 8], ["accepted", 8]];
  console.log(`serve_load: ${opt.url}, ${opt.workload} prompts, temperature ${temperature}, max_tokens ${maxTokens}, ignore_eos, ${perClient} request(s) per client; times in ms`);
  console.log(cols.map(([h, w]) => h.padStart(w)).join("  "));
  for (const r of rows) {
    const v = [r.clients, r.requests, r.errors, r.tok_s.toFixed(1), r.ttft_p50_ms.toFixed(1), r.ttft_p99_ms.toFixed(1),
      r.itl_p50_ms.toFixed(2), r.itl_p99_ms.toFixed(2), r.ratio === null ? "-" : r.ratio.toFixed(2) + "x", r.drafted, r.accepted];
    console.log(v.map((x, i) => String(x).padStart(cols[i][1])).join("  "));
  }
}
process.exitCode = rows.some((r) => r.errors) ? 1 : 0;
