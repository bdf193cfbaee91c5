#!/bin/sh
# make demo: what tern is for, in one command.
#   1. writes a synthetic SmolLM2-135M-shape Q8_0 model (random weights, the
#      real tensor names and shapes) with `tern mkmodel` into the build dir;
#   2. `tern bench` on it at 1 and 2 threads: decode (tg) and prompt (pp)
#      tokens/s, the machine's read bandwidth measured in the same run, each
#      decode row as % of that roofline, and a check that the greedy tokens
#      are identical at both thread counts;
#   3. a short story from ../shared/models/stories260K.gguf when present,
#      else how to run your own GGUF.
# Usage: scripts/demo.sh BUILD/tern SHARED_DIR
set -eu
TERN=$1
SHARED=${2:-../shared}
BUILD=$(dirname "$TERN")
MODEL="$BUILD/demo/smollm2-135m-q8_0.gguf"

echo "== tern $("$TERN" --version | cut -d' ' -f2): CPU inference for LLMs in GGUF files"
echo
if [ ! -s "$MODEL" ]; then
    mkdir -p "$BUILD/demo"
    echo "== writing a synthetic SmolLM2-135M-shape Q8_0 model: $MODEL"
    "$TERN" mkmodel --shape smollm2-135m --type q8_0 -o "$MODEL" --quiet
fi
echo "== tern bench at 1 and 2 threads (tg = decode, pp = prompt; roofline = bandwidth / weight bytes per token)"
"$TERN" bench -m "$MODEL" -t 1,2 -p 64 -n 32 -r 3 --check 32 2>&1 |
    grep -v -e '^tern bench: read bandwidth at' -e ' tok/s$' -e 'greedy tokens:'
echo
STORY="$SHARED/models/stories260K.gguf"
if [ -f "$STORY" ]; then
    echo "== a short story from $STORY (tern run, temperature 0.8, seed 42)"
    "$TERN" run -m "$STORY" -p "Once upon a time" -n 200 --temp 0.8 --seed 42 -t 1
else
    echo "== $STORY not found: to run your own GGUF (llama, qwen2, qwen3 families):"
    echo "   $TERN run -m MODEL.gguf -p \"Once upon a time\" -n 128"
    echo "   $TERN chat -m MODEL.gguf"
fi
