#!/bin/sh
# bench-serve.sh MODEL [TERN] [-- serve_load options]: starts `tern serve`
# on MODEL (loopback, a free port, --parallel 16), runs bench/serve_load.mjs
# against it (1, 4, 8, 16 clients unless told otherwise), stops the server.
#   scripts/bench-serve.sh ../shared/models/stories260K.gguf
#   scripts/bench-serve.sh model.gguf build/tern -- --max-tokens 128 --json
set -u
cd "$(dirname "$0")/.." || exit 2
[ $# -ge 1 ] || { sed -n '2,6p' "$0"; exit 2; }
MODEL=$1; shift
TERN=build/tern
if [ $# -ge 1 ] && [ "$1" != "--" ]; then TERN=$1; shift; fi
[ "${1:-}" = "--" ] && shift
[ -x "$TERN" ] || { echo "bench-serve: $TERN not found (make build)" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "bench-serve: $MODEL not found" >&2; exit 1; }
PORT=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
LOG=$(mktemp /tmp/bench-serve.XXXXXX)
"$TERN" serve -m "$MODEL" --host 127.0.0.1 --port "$PORT" --parallel 16 > "$LOG" 2>&1 &
SPID=$!
trap 'kill -TERM $SPID 2>/dev/null; sleep 1; kill -9 $SPID 2>/dev/null; rm -f "$LOG"' EXIT INT TERM
up=0
for _ in $(seq 1 600); do
  kill -0 $SPID 2>/dev/null || break
  [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$PORT/health")" = 200 ] && { up=1; break; }
  sleep 0.1
done
[ $up = 1 ] || { echo "bench-serve: the server did not come up:" >&2; tail -n 20 "$LOG" >&2; exit 1; }
timeout 900 node bench/serve_load.mjs --url "http://127.0.0.1:$PORT" "$@"
