#!/bin/sh
# Runs every libFuzzer target in a build folder for SECONDS each.
# Seeds: fuzz/seeds/<target>/ (in the tree) plus the files of ../shared named,
# one glob per line relative to the shared folder, in fuzz/<target>.seeds.
# The working corpus lives in BUILD/corpus/<target> (not in git).
# usage: scripts/fuzz.sh BUILD SECONDS SHARED
set -eu
BUILD=$1
SECONDS_EACH=$2
SHARED=$3
ROOT=$(cd "$(dirname "$0")/.." && pwd)
status=0
# Every fuzz/fuzz_*.c must have been built: a target left out is a failure.
for src in "$ROOT"/fuzz/fuzz_*.c; do
  name=$(basename "$src" .c)
  [ -f "$BUILD/$name" ] && [ -x "$BUILD/$name" ] || { echo "$name: not built in $BUILD"; status=1; }
done
for bin in "$BUILD"/fuzz_*; do
  [ -f "$bin" ] && [ -x "$bin" ] || continue
  name=$(basename "$bin")
  corpus="$BUILD/corpus/$name"
  mkdir -p "$corpus"
  [ -d "$ROOT/fuzz/seeds/$name" ] && cp -n "$ROOT/fuzz/seeds/$name"/* "$corpus"/ 2>/dev/null || true
  if [ -f "$ROOT/fuzz/$name.seeds" ] && [ -d "$SHARED" ]; then
    while IFS= read -r pat; do
      [ -n "$pat" ] || continue
      for f in "$SHARED"/$pat; do [ -f "$f" ] && cp -n "$f" "$corpus/" 2>/dev/null || true; done
    done < "$ROOT/fuzz/$name.seeds"
  fi
  echo "== $name: ${SECONDS_EACH}s"
  dict=""
  [ -f "$ROOT/fuzz/$name.dict" ] && dict="-dict=$ROOT/fuzz/$name.dict"
  if ! "$bin" $dict -max_total_time="$SECONDS_EACH" -print_final_stats=1 -artifact_prefix="$BUILD/" \
        -rss_limit_mb=4096 -max_len=1048576 "$corpus" 2>"$BUILD/$name.log"; then
    echo "$name: FAILED (see $BUILD/$name.log)"; tail -40 "$BUILD/$name.log"; status=1
  else
    grep -E 'stat::number_of_executed_units|Done [0-9]+ runs' "$BUILD/$name.log" | tail -2
  fi
done
exit $status
