// browser.mjs - the chat page (GET /) in headless Chromium, driven by
// puppeteer-core: type, send, the answer streams into the page and equals
// the non-streaming answer at temperature 0; a second turn carries the
// conversation; an error from the server is shown; "New chat" clears it.
// Saves a screenshot to OUT/webui.png.
//
//   node tests/server/browser.mjs --tern BIN [--model FILE] --qwen FILE [--chromium /usr/bin/chromium]
import assert from "node:assert/strict";
import path from "node:path";
import { options, npmRequire, startServer, stopClean, http, test, fail, finish } from "./lib.mjs";

const o = options();
const chromium = o.chromium || process.env.CHROMIUM || "/usr/bin/chromium";
const puppeteer = npmRequire(o.deps, "puppeteer-core");
const MAXT = 24;
const Q1 = "Tell me a story about a fox.";
const Q2 = "What did the fox do then?";

let srv, browser;
try {
  srv = await startServer(o, { name: "browser", args: ["--parallel", "2"] });
  browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    args: ["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"],
    timeout: 60000,
  });
} catch (e) {
  fail("browser: start (server, chromium)", e);
  if (srv) await srv.kill9();
  finish("browser");
  process.exit(1);
}

const ask = async (messages) => {
  const r = await http(srv.url + "/v1/chat/completions", { body: { messages, max_tokens: MAXT, temperature: 0 } });
  assert.equal(r.status, 200, r.text);
  return r.json.choices[0].message.content;
};

const page = await browser.newPage();
const consoleErrors = [];
page.on("pageerror", (e) => consoleErrors.push(String(e)));
page.on("console", (m) => { if (m.type() === "error") consoleErrors.push(m.text()); });

async function waitIdle() {
  await page.waitForFunction(() => document.body.dataset.state === "idle", { timeout: 30000 });
}
async function sendMessage(text) {
  await page.click("#input");
  await page.type("#input", text);
  await page.click("#send");
  // busy while the answer streams, idle when it is done
  await waitIdle();
}
const texts = (sel) => page.$$eval(sel, (els) => els.map((e) => e.textContent));

await test("browser: GET / is the chat page", async () => {
  const r = await http(srv.url + "/");
  assert.equal(r.status, 200);
  assert.match(r.headers.get("content-type") || "", /^text\/html/);
  assert.ok(r.text.includes('id="messages"'), "the page lacks #messages");
  const resp = await page.goto(srv.url + "/", { waitUntil: "load", timeout: 30000 });
  assert.equal(resp.status(), 200);
  for (const id of ["input", "send", "new-chat", "messages", "temperature", "max-tokens", "api-key", "stop"]) {
    assert.ok(await page.$("#" + id), `#${id} missing`);
  }
  await page.waitForFunction(() => document.getElementById("model").textContent.length > 0, { timeout: 10000 });
});

await test("browser: a message streams in and equals the answer at temperature 0", async () => {
  await page.click("#settings summary");
  await page.type("#temperature", "0");
  await page.type("#max-tokens", String(MAXT));
  await sendMessage(Q1);
  const want = await ask([{ role: "user", content: Q1 }]);
  assert.ok(want.length > 0);
  assert.deepEqual(await texts(".msg.user"), [Q1]);
  const got = await texts(".msg.assistant");
  assert.equal(got.length, 1, "one assistant message");
  assert.ok(got[0].length > 0, "the assistant message is empty");
  assert.equal(got[0], want, "the page's answer differs from the API's");
  assert.equal(await page.$$eval(".msg.error", (e) => e.length), 0, "an error is shown");
});

await test("browser: the second turn carries the conversation", async () => {
  const first = (await texts(".msg.assistant"))[0];
  await sendMessage(Q2);
  const want = await ask([
    { role: "user", content: Q1 }, { role: "assistant", content: first }, { role: "user", content: Q2 },
  ]);
  const got = await texts(".msg.assistant");
  assert.equal(got.length, 2);
  assert.equal(got[1], want, "the second answer is not the answer to the whole conversation");
  await page.screenshot({ path: path.join(o.out, "webui.png"), fullPage: true });
});

await test("browser: model output is text, never markup", async () => {
  // what the page does with text: a user message that looks like HTML
  await sendMessage("<img src=x onerror=window.__pwned=1><b>bold</b>");
  assert.equal(await page.evaluate(() => window.__pwned), undefined);
  assert.equal(await page.$$eval("#messages img, #messages b", (e) => e.length), 0, "markup was rendered");
});

await test("browser: a server error is shown", async () => {
  await page.$eval("#max-tokens", (e) => { e.value = ""; });
  await page.type("#max-tokens", "-3");
  await sendMessage("this one fails");
  const errs = await texts(".msg.error");
  assert.equal(errs.length, 1, "no error shown");
  assert.match(errs[0], /400/);
  assert.match(errs[0], /max_tokens/);
  await page.$eval("#max-tokens", (e) => { e.value = ""; });
  await page.type("#max-tokens", String(MAXT));
});

await test("browser: New chat clears the conversation", async () => {
  assert.ok((await page.$$(".msg")).length > 0);
  await page.click("#new-chat");
  assert.equal((await page.$$("#messages .msg")).length, 0, "messages left after New chat");
  // and the next answer is a first turn again
  await sendMessage(Q1);
  const got = await texts(".msg.assistant");
  assert.equal(got.length, 1);
  assert.equal(got[0], await ask([{ role: "user", content: Q1 }]), "New chat did not forget the conversation");
});

await test("browser: no errors in the page's console", async () => {
  // the failed request above logs a 400 resource error; nothing else may
  const other = consoleErrors.filter((e) => !/status of 400/.test(e));
  assert.deepEqual(other, []);
});

// A second server, with --api-key, on the slower tiny Qwen-vocabulary model
// (a few ms a token: long enough to press Stop mid-answer).
await test("browser: API key field and Stop button", async () => {
  assert.ok(o.qwen, "--qwen FILE (the tiny-qwen2 model) is needed");
  const key = "sk-browser-" + process.pid;
  const s2 = await startServer(o, { name: "browser-key", model: o.qwen, args: ["--api-key", key, "--parallel", "2"] });
  try {
    const p2 = await browser.newPage();
    const errs2 = [];
    p2.on("pageerror", (e) => errs2.push(String(e)));
    await p2.goto(s2.url + "/", { waitUntil: "load", timeout: 30000 });
    const idle = () => p2.waitForFunction(() => document.body.dataset.state === "idle", { timeout: 30000 });
    const say = async (t) => { await p2.type("#input", t); await p2.click("#send"); };
    await p2.click("#settings summary");
    await p2.type("#max-tokens", "8");
    // no key: the server's 401 is shown
    await say("hello");
    await idle();
    const e1 = await p2.$$eval(".msg.error", (e) => e.map((x) => x.textContent));
    assert.equal(e1.length, 1, "no error shown without the API key");
    assert.match(e1[0], /401/);
    // with the key: an answer
    await p2.type("#api-key", key);
    await say("hello");
    await idle();
    const a1 = await p2.$$eval(".msg.assistant", (e) => e.map((x) => x.textContent));
    assert.equal(a1.length, 1);
    assert.ok(a1[0].length > 0, "no answer with the right key");
    // Stop: a long answer, stopped once some of it has arrived
    await p2.$eval("#max-tokens", (e) => { e.value = ""; });
    await p2.type("#max-tokens", "2000");
    await say("tell me everything");
    await p2.waitForFunction(() => {
      const m = document.querySelectorAll(".msg.assistant");
      return m.length === 2 && m[1].textContent.length > 0;
    }, { timeout: 30000 });
    assert.equal(await p2.evaluate(() => document.body.dataset.state), "busy");
    await p2.click("#stop");
    await p2.waitForFunction(() => document.body.dataset.state === "idle", { timeout: 5000 });
    const stopped = await p2.$$eval(".msg.assistant", (e) => ({ finish: e[1].dataset.finish, n: e[1].textContent.length }));
    assert.equal(stopped.finish, "stopped", `finish ${JSON.stringify(stopped)}`);
    await new Promise((r) => setTimeout(r, 300));
    const later = await p2.$$eval(".msg.assistant", (e) => e[1].textContent.length);
    assert.equal(later, stopped.n, "text kept arriving after Stop");
    // the server dropped the stopped request: nothing is running
    const deadline = Date.now() + 5000;
    let running = null;
    while (Date.now() < deadline) {
      const m = await http(s2.url + "/metrics", { headers: { Authorization: "Bearer " + key } });
      const mm = /^tern_requests_running\s+(\d+)/m.exec(m.text);
      running = mm ? Number(mm[1]) : null;
      if (running === 0) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(running, 0, "the stopped request is still running on the server (tern_requests_running)");
    assert.deepEqual(errs2, []);
    await p2.close();
  } finally {
    await stopClean(s2);
  }
}, { timeoutMs: 90000 });

await browser.close().catch(() => {});
await test("browser: clean shutdown on SIGTERM", () => stopClean(srv));
process.exit(finish("browser"));
