#!/bin/sh
# test-server.sh - end-to-end tests of `tern serve` against the real binary,
# with what a user would use: the openai npm package, curl, headless
# Chromium (puppeteer-core). Tiny models only; a few minutes on 2 cores.
#
#   scripts/test-server.sh [--tern BIN] [--asan-tern BIN] [--shared DIR]
#                          [--out DIR] [--only LIST]
#
#   --tern       the tern binary (default build/test-release/tern)
#   --asan-tern  the ASan build for the bad-input test (default
#                build/test-asan/tern when it exists, else --tern)
#   --shared     ../shared (models, vocabularies)
#   --out        scratch folder: npm packages, models, logs (build/server-test)
#   --only       comma-separated subset of: openai,sse,concurrency,crash,bad_input,browser
#
# Every server is started on a free loopback port and killed on exit; every
# wait is bounded. One PASS/FAIL line per test; the exit status is 1 when any
# failed. A missing tool (node, npm, curl, jq, chromium) or model skips the
# tests that need it, except under CI=true, where it is a failure.
set -u
cd "$(dirname "$0")/.." || exit 2
TERN=build/test-release/tern
ASAN_TERN=""
SHARED=$(cd .. && pwd)/shared
OUT=build/server-test
ONLY=openai,sse,concurrency,crash,bad_input,browser
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
while [ $# -gt 0 ]; do
  case $1 in
    --tern) TERN=$2; shift 2 ;;
    --asan-tern) ASAN_TERN=$2; shift 2 ;;
    --shared) SHARED=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "test-server: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -n "$ASAN_TERN" ] || { [ -x build/test-asan/tern ] && ASAN_TERN=build/test-asan/tern || ASAN_TERN=$TERN; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CI=${CI:-}
STORIES=$SHARED/models/stories260K.gguf
QWEN_VOCAB=$SHARED/reference/vocab/ggml-vocab-qwen2.gguf
QWEN=$OUT/tiny-qwen2.gguf

n_pass=0
n_fail=0
n_skip=0
failed_names=""
pass() { echo "PASS $1"; n_pass=$((n_pass + 1)); }
fail() { echo "FAIL $1"; n_fail=$((n_fail + 1)); failed_names="$failed_names ${1%%:*}"; }
# A missing prerequisite: a failure under CI, a skip elsewhere.
missing() {
  if [ "$CI" = true ]; then fail "$1: $2 (CI=true: nothing may be skipped; scripts/install-test-deps.sh installs the tools)"
  else echo "SKIP $1: $2"; n_skip=$((n_skip + 1)); fi
}
want() { case ",$ONLY," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# Servers started here and by the node tests (they append their pids).
PIDFILE=$OUT/pids
: > "$PIDFILE"
export TERN_TEST_PIDFILE=$PIDFILE
cleanup() {
  [ -f "$PIDFILE" ] && while read -r p; do
    [ -n "$p" ] && kill -9 "$p" 2>/dev/null
  done < "$PIDFILE"
  rm -f "$PIDFILE"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- prerequisites ---------------------------------------------------------
have_node=0; have_npm_pkgs=0; have_curl=0; have_jq=0; have_chromium=0; have_stories=0; have_qwen=0
[ -x "$TERN" ] || { fail "tern binary: $TERN is missing (make test-server builds it)"; exit 1; }
echo "test-server: $TERN; bad input against $ASAN_TERN; models from $SHARED; scratch $OUT"
if command -v node >/dev/null 2>&1 && node -e 'process.exit(+process.versions.node.split(".")[0] >= 18 ? 0 : 1)'; then
  have_node=1
else
  missing "prerequisites" "node >= 18 not found"
fi
command -v curl >/dev/null 2>&1 && have_curl=1 || missing "prerequisites" "curl not found"
command -v jq >/dev/null 2>&1 && have_jq=1 || missing "prerequisites" "jq not found"
[ -x "$CHROMIUM" ] && have_chromium=1 || missing "prerequisites" "chromium not found at $CHROMIUM"
[ -f "$STORIES" ] && have_stories=1 || missing "prerequisites" "$STORIES not found"

# The npm packages, fetched from the registry into the scratch folder (never
# vendored, no lockfile in the repository).
if [ $have_node = 1 ]; then
  if [ -f "$OUT/node_modules/openai/package.json" ] && [ -f "$OUT/node_modules/puppeteer-core/package.json" ]; then
    have_npm_pkgs=1
  elif command -v npm >/dev/null 2>&1; then
    echo "test-server: npm install openai@4 puppeteer-core@24 into $OUT"
    if timeout 300 npm install --prefix "$OUT" --no-audit --no-fund --no-save --no-package-lock --loglevel=error \
        openai@4 puppeteer-core@24 >"$OUT/npm.log" 2>&1; then
      have_npm_pkgs=1
    else
      tail -n 20 "$OUT/npm.log"
      missing "prerequisites" "npm install of openai@4 and puppeteer-core@24 failed (log: $OUT/npm.log)"
    fi
  else
    missing "prerequisites" "npm not found"
  fi
fi

# The tiny Qwen-vocabulary model (random weights, 151936 tokens), made here.
if [ -f "$QWEN_VOCAB" ]; then
  if [ -f "$QWEN" ] || "$TERN" mkmodel --shape tiny-qwen2 --type q8_0 --vocab-from "$QWEN_VOCAB" -o "$QWEN" --quiet \
      >"$OUT/mkmodel.log" 2>&1; then
    have_qwen=1
  else
    cat "$OUT/mkmodel.log"
    fail "prerequisites: tern mkmodel --shape tiny-qwen2 failed"
  fi
else
  missing "prerequisites" "$QWEN_VOCAB not found"
fi

# run NAME TIMEOUT_S COMMAND...: its PASS/FAIL lines go through; the exit
# status (or a timeout) makes a FAIL line of its own when no FAIL was printed.
run() {
  name=$1; limit=$2; shift 2
  echo "---- $name"
  log=$OUT/$name.out
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" > "$log" 2>&1
  rc=$?
  cat "$log"
  echo "     ($name: $(( $(date +%s) - t0 )) s)"
  p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log")
  n_pass=$((n_pass + p)); n_fail=$((n_fail + f))
  [ "$f" -gt 0 ] && failed_names="$failed_names $name"
  if [ $rc -ne 0 ] && [ "$f" = 0 ]; then
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then fail "$name: did not finish within $limit s"
    else fail "$name: exit status $rc without a FAIL line"; fi
  elif [ $rc -eq 0 ] && [ "$p" = 0 ]; then
    fail "$name: no test ran"
  fi
}

NODE_OPTS="--deps $OUT --out $OUT --tern $TERN --shared $SHARED"
T=tests/server

if want openai; then
  if [ $have_node = 1 ] && [ $have_npm_pkgs = 1 ] && [ $have_stories = 1 ]; then
    run openai-stories 180 node $T/openai.test.mjs $NODE_OPTS --model "$STORIES" --label stories260K
  else missing "openai[stories260K]" "needs node, the npm packages and $STORIES"; fi
  if [ $have_node = 1 ] && [ $have_npm_pkgs = 1 ] && [ $have_qwen = 1 ]; then
    run openai-qwen 180 node $T/openai.test.mjs $NODE_OPTS --model "$QWEN" --label tiny-qwen2
  else missing "openai[tiny-qwen2]" "needs node, the npm packages and the tiny-qwen2 model"; fi
fi

if want sse; then
  if [ $have_curl = 1 ] && [ $have_jq = 1 ] && [ $have_stories = 1 ]; then
    # a server of its own, started and stopped here
    echo "---- sse"
    port=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})' 2>/dev/null \
      || python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
    "$TERN" serve -m "$STORIES" --host 127.0.0.1 --port "$port" --parallel 2 > "$OUT/sse-server.log" 2>&1 &
    spid=$!
    echo "$spid" >> "$PIDFILE"
    up=0
    for _ in $(seq 1 300); do
      kill -0 "$spid" 2>/dev/null || break
      if [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$port/health")" = 200 ]; then up=1; break; fi
      sleep 0.1
    done
    if [ $up = 1 ]; then
      run sse 120 sh $T/sse.sh "http://127.0.0.1:$port" "$OUT/sse"
      kill -TERM "$spid" 2>/dev/null
      rc=0
      for _ in $(seq 1 200); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
      if kill -0 "$spid" 2>/dev/null; then kill -9 "$spid"; fail "sse: the server did not exit within 20 s of SIGTERM"
      else wait "$spid"; rc=$?; [ $rc = 0 ] && pass "sse: clean shutdown on SIGTERM" || fail "sse: the server exited with $rc after SIGTERM"; fi
    else
      tail -n 20 "$OUT/sse-server.log"
      fail "sse: the server did not answer /health within 30 s"
      kill -9 "$spid" 2>/dev/null
    fi
  else missing "sse" "needs curl, jq and $STORIES"; fi
fi

if want concurrency; then
  # the starvation checks on the slower model; byte identity on both
  if [ $have_node = 1 ] && [ $have_qwen = 1 ]; then
    run concurrency-qwen 240 node $T/concurrency.mjs $NODE_OPTS --model "$QWEN"
  else missing "concurrency[tiny-qwen2]" "needs node and the tiny-qwen2 model"; fi
  if [ $have_node = 1 ] && [ $have_stories = 1 ]; then
    run concurrency-stories 120 node $T/concurrency.mjs $NODE_OPTS --model "$STORIES" --starvation off
    # with drafts in every step: the answers of plain decoding alone
    run concurrency-stories-spec 120 node $T/concurrency.mjs $NODE_OPTS --model "$STORIES" --starvation off --spec ngram-fixed
  else missing "concurrency[stories260K]" "needs node and $STORIES"; fi
fi

if want crash; then
  if [ $have_node = 1 ] && [ $have_qwen = 1 ]; then
    run crash 300 node $T/crash.mjs $NODE_OPTS --model "$QWEN"
  else missing "crash" "needs node and the tiny-qwen2 model"; fi
fi

if want bad_input; then
  if [ $have_node = 1 ] && [ $have_stories = 1 ]; then
    run bad_input 300 node $T/bad_input.mjs --deps "$OUT" --out "$OUT" --shared "$SHARED" --tern "$ASAN_TERN" --model "$STORIES"
  else missing "bad_input" "needs node and $STORIES"; fi
fi

if want browser; then
  if [ $have_node = 1 ] && [ $have_npm_pkgs = 1 ] && [ $have_chromium = 1 ] && [ $have_stories = 1 ] && [ $have_qwen = 1 ]; then
    run browser 180 node $T/browser.mjs $NODE_OPTS --model "$STORIES" --qwen "$QWEN" --chromium "$CHROMIUM"
  else missing "browser" "needs node, puppeteer-core, $CHROMIUM, $STORIES and the tiny-qwen2 model"; fi
fi

echo "test-server: $n_pass passed, $n_fail failed, $n_skip skipped${failed_names:+ (failed:$failed_names)}"
[ $n_fail -eq 0 ]
