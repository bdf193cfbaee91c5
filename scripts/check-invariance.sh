#!/bin/sh
# Thread and batch invariance on real-size models (the tests cover the tiny
# shapes in every type; this covers the mkmodel shapes of the benchmark).
# For each model: a prompt, then 32 greedy tokens, hashing the bytes of every
# logit vector sampled from (tern run --logits-digest), at -t 1,2,3,4 with
# the default batch, and at -b 1, 7, 512 with 2 threads. Every digest of a
# model must be equal. The pool's serial gate is set to 0 so that small
# matrices are really split between the threads.
# Usage: scripts/check-invariance.sh BUILD/tern MODEL.gguf [MODEL.gguf ...]
set -eu
TERN=$1
shift
PROMPT="One day, a little fox found a shiny red ball in the tall green grass near the river."
status=0
for m in "$@"; do
    ref=""
    line="$(basename "$m"):"
    for cfg in "-t 1" "-t 2" "-t 3" "-t 4" "-t 2 -b 1" "-t 2 -b 7" "-t 2 -b 512"; do
        # shellcheck disable=SC2086
        d=$(TERN_POOL_GATE=0 "$TERN" run -m "$m" -p "$PROMPT" -n 32 --temp 0 --logits-digest $cfg 2>&1 >/dev/null |
            sed -n 's/^tern: logits digest \([0-9a-f]*\) over \([0-9]*\) vectors$/\1x\2/p')
        [ -n "$d" ] || { echo "$line no digest for $cfg"; status=1; continue; }
        [ -z "$ref" ] && ref=$d
        if [ "$d" = "$ref" ]; then line="$line [$cfg] ok"; else line="$line [$cfg] DIFFERS ($d vs $ref)"; status=1; fi
    done
    echo "$line   digest ${ref%x*} over ${ref#*x} vectors"
done
[ $status -eq 0 ] && echo "check-invariance: all digests equal" || echo "check-invariance: FAILED"
exit $status
