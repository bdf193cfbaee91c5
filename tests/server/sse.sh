#!/bin/sh
# sse.sh URL OUTDIR - the raw bytes of `tern serve`'s streams, as curl gets
# them: Content-Type text/event-stream, every event exactly "data: JSON"
# and a blank line (LF only), "data: [DONE]" last; with include_usage, every
# chunk but the last has "usage": null and the last has choices [] and the
# usage. One PASS/FAIL line per check; exit status 1 when any failed.
set -u
URL=$1
OUT=$2
mkdir -p "$OUT"
fails=0
pass() { echo "PASS sse: $1"; }
failed() { echo "FAIL sse: $1"; fails=$((fails + 1)); }

# post NAME BODY: headers in OUT/NAME.h, body bytes in OUT/NAME.b
post() {
  curl -sS -N --max-time 60 -D "$OUT/$1.h" -o "$OUT/$1.b" -H 'Content-Type: application/json' \
    --data-binary "$3" "$URL$2"
}

# frame NAME: the framing of a whole stream
frame() {
  f="$OUT/$1.b"
  why=""
  grep -qi '^content-type: text/event-stream' "$OUT/$1.h" || why="Content-Type is $(grep -i '^content-type' "$OUT/$1.h" | tr -d '\r')"
  grep -q '^HTTP/1.1 200' "$OUT/$1.h" || why="$why; status $(head -n 1 "$OUT/$1.h" | tr -d '\r')"
  [ -s "$f" ] || why="$why; empty body"
  if tr -d '\n' < "$f" | grep -q "$(printf '\r')"; then why="$why; a CR in the body (events end with LF LF)"; fi
  # odd lines "data: ..." (or an SSE comment ": ..." the server may send as a
  # keep-alive), even lines empty, nothing else
  bad=$(awk 'NR % 2 == 1 && !/^data: ./ && !/^: / { print NR": "$0; exit } NR % 2 == 0 && $0 != "" { print NR": "$0; exit }' "$f")
  [ -z "$bad" ] || why="$why; line $bad"
  # the last 14 bytes are exactly "data: [DONE]\n\n" (compared as hex)
  tailhex=$(tail -c 14 "$f" | od -An -tx1 | tr -d ' \n')
  [ "$tailhex" = "$(printf 'data: [DONE]\n\n' | od -An -tx1 | tr -d ' \n')" ] || why="$why; does not end with \"data: [DONE]\\n\\n\" (ends with $tailhex)"
  [ "$(grep -c '^data: \[DONE\]$' "$f")" = 1 ] || why="$why; [DONE] is not there exactly once"
  # every other event is one JSON object
  n=0
  while IFS= read -r line; do
    case $line in
      "data: [DONE]" | "") ;;
      "data: "*) n=$((n + 1))
        printf '%s' "${line#data: }" | jq -e 'type == "object"' >/dev/null 2>&1 || { why="$why; not a JSON object: ${line#data: }"; break; } ;;
    esac
  done < "$f"
  [ "$n" -ge 2 ] || why="$why; only $n JSON events"
  if [ -z "$why" ]; then pass "$1: framing ($n events + [DONE])"; else failed "$1: framing:$why"; fi
}

# the JSON events of a stream, one a line
events() { sed -n 's/^data: //p' "$OUT/$1.b" | grep -v '^\[DONE\]$'; }

post chat /v1/chat/completions '{"messages":[{"role":"user","content":"Tell me a story."}],"max_tokens":16,"temperature":0,"stream":true}' \
  || failed "chat: curl exit $?"
frame chat
post chatu /v1/chat/completions '{"messages":[{"role":"user","content":"Tell me a story."}],"max_tokens":16,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' \
  || failed "chat include_usage: curl exit $?"
frame chatu
post comp /v1/completions '{"prompt":"Once upon a time","max_tokens":16,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' \
  || failed "completions: curl exit $?"
frame comp

for s in chatu comp; do
  nev=$(events $s | wc -l)
  # every event but the last carries "usage":null (the key, with null)
  nnull=$(events $s | head -n $((nev - 1)) | jq -c 'select(has("usage") and .usage == null)' | wc -l)
  lastok=$(events $s | tail -n 1 | jq -e '(.choices == []) and (.usage.total_tokens == .usage.prompt_tokens + .usage.completion_tokens) and (.usage.completion_tokens > 0)' 2>/dev/null)
  if [ "$nev" -ge 3 ] && [ "$nnull" = $((nev - 1)) ] && [ "$lastok" = true ]; then
    pass "$s: include_usage: usage null on $nnull chunks, the last has choices [] and the usage"
  else
    failed "$s: include_usage: $nev events, $nnull with \"usage\":null; last: $(events $s | tail -n 1)"
  fi
done
# without include_usage there is no usage chunk: every event has one choice
if [ "$(events chat | jq -c 'select((.choices | length) != 1)' | wc -l)" = 0 ]; then
  pass "chat: without include_usage every chunk has one choice"
else
  failed "chat: a chunk without exactly one choice: $(events chat | jq -c 'select((.choices | length) != 1)' | head -n 1)"
fi
# the streamed text equals the non-streamed answer
curl -sS --max-time 60 -D "$OUT/plain.h" -o "$OUT/plain.b" -H 'Content-Type: application/json' \
  --data-binary '{"messages":[{"role":"user","content":"Tell me a story."}],"max_tokens":16,"temperature":0}' "$URL/v1/chat/completions"
want=$(jq -r '.choices[0].message.content' "$OUT/plain.b")
got=$(events chat | jq -j '.choices[0].delta.content // ""')
if grep -qi '^content-type: application/json' "$OUT/plain.h" && [ -n "$want" ] && [ "$want" = "$got" ]; then
  pass "chat: non-streaming is application/json and its content equals the stream's"
else
  failed "chat: stream $(printf %s "$got" | jq -Rs .) vs plain $(printf %s "$want" | jq -Rs .) ($(grep -i '^content-type' "$OUT/plain.h" | tr -d '\r'))"
fi
exit $((fails > 0))
