#!/bin/sh
# The model benchmark of docs/perf/model.md: writes the synthetic models of
# the three shapes llama.cpp was measured on (../shared/reference/
# llamacpp-bench.md) in Q8_0, Q4_0 and Q4_K_M into BUILD/models (reused when
# present; ~3.5 GB in all), then runs `tern bench` on all of them at 1 and 2
# threads, tg128 and pp512, with the bandwidth probe in the same run.
# Usage: scripts/bench-models.sh BUILD/tern [extra tern bench options, e.g. -o json]
set -eu
TERN=$1
shift
DIR="$(dirname "$TERN")/models"
mkdir -p "$DIR"
FILES=""
for shape in smollm2-135m qwen2.5-0.5b llama3.2-1b; do
    for type in q8_0 q4_0 q4_k_m; do
        f="$DIR/$shape-$type.gguf"
        [ -s "$f" ] || "$TERN" mkmodel --shape "$shape" --type "$type" -o "$f" --quiet
        FILES="$FILES${FILES:+,}$f"
    done
done
"$TERN" bench -m "$FILES" -t 1,2 -p 512 -n 128 -r 5 "$@"
