#!/bin/sh
# compare-llamacpp-test.sh TERN - the test of scripts/compare-llamacpp.sh
# (ctest: compare_llamacpp): the script against tests/stub-llama-bench.sh
# (llama-bench's CSV with speeds fixed by a formula) and the real tern on a
# tiny model, two rounds, two thread counts, a file the stub refuses. It
# checks the table's rows, that the llama.cpp column is the stub's figures,
# that the ratio is tern's mean over llama.cpp's (recomputed from the
# printed columns), the notes on the failures, that the two run in turn
# (llama-bench first in odd rounds, tern first in even ones), and that the
# SVG is well-formed with one bar per figure.
set -u
TERN=${1:?usage: compare-llamacpp-test.sh TERN}
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/compare-llamacpp-test.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() {
    echo "FAIL: $*" >&2
    fails=$((fails + 1))
}

"$TERN" mkmodel --shape tiny --type q8_0 --quiet -o "$tmp/tiny.gguf" || { echo "FAIL: tern mkmodel" >&2; exit 1; }
cp "$tmp/tiny.gguf" "$tmp/llamafail-tiny.gguf"
mkdir "$tmp/state"
# tern through a wrapper that logs each bench call, for the order of the runs
cat >"$tmp/tern" <<EOW
#!/bin/sh
[ "\$1" = bench ] && echo "tern \$(basename "\$3") \$5" >>"$tmp/state/calls"
exec "$TERN" "\$@"
EOW
chmod +x "$tmp/tern"

STUB_LLAMA_STATE="$tmp/state" sh "$src/scripts/compare-llamacpp.sh" "$src/tests/stub-llama-bench.sh" \
    "$tmp/tiny.gguf" "$tmp/llamafail-tiny.gguf" --tern "$tmp/tern" --rounds 2 --threads 1,2 --pp 16 --tg 8 \
    --md "$tmp/out.md" --svg "$tmp/out.svg" --tern-args "--probe-mb 16" >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
if [ $rc -ne 0 ]; then
    cat "$tmp/stderr" >&2
    echo "FAIL: compare-llamacpp.sh exit $rc" >&2
    exit 1
fi
cmp -s "$tmp/stdout" "$tmp/out.md" || fail "--md file differs from what was printed"

# header: both binaries and the CPU
grep -q '^- llama.cpp: llama-bench build_commit 5eb1c0de (build 4321) ' "$tmp/stdout" || fail "no llama-bench build line"
ver=$("$TERN" --version | head -n 1)
grep -qF -- "- tern: $ver" "$tmp/stdout" || fail "no tern version line ($ver)"
grep -q '^- CPU: ..*' "$tmp/stdout" || fail "no CPU line"

# the rows: the stub's figures, tern's, the ratio. The stub gives
# 1000 T + 10 k (pp) and 50 T + 2 k (tg) at call k = 0, 1: mean 1000 T + 5,
# sd sqrt(50); mean 50 T + 1, sd sqrt(2).
awk -F'|' '
    function trim(s) { gsub(/^ +| +$/, "", s); return s }
    function bad(m) { print "FAIL: " m; nbad++ }
    $2 ~ /gguf/ {
        file = trim($2); test = trim($3); t = trim($4); l = trim($5); tt = trim($6); x = trim($7)
        key = file " " test " " t
        seen[key]++; n++
        order = order " " key
        if (split(tt, a, " ± ") != 2 || a[1] + 0 <= 0 || a[2] + 0 < 0) bad("tern column of " key ": " tt)
        if (file == "llamafail-tiny.gguf") {
            if (l != "-" || x != "-") bad("refused file has llama.cpp figures: " $0)
            next
        }
        want = test == "pp16" ? sprintf("%.2f ± %.2f", 1000 * t + 5, sqrt(50)) : sprintf("%.2f ± %.2f", 50 * t + 1, sqrt(2))
        if (l != want) bad("llama.cpp column of " key ": " l ", the stub gives " want)
        split(l, b, " ± ")
        if (x !~ /^[0-9.]+x$/) bad("ratio of " key ": " x)
        r = substr(x, 1, length(x) - 1) + 0; exact = a[1] / b[1]
        d = r - exact; if (d < 0) d = -d
        if (d > 0.0051 + 2e-4 * exact) bad(sprintf("ratio of %s: %s, tern / llama.cpp = %.4f", key, x, exact))
    }
    END {
        want = " tiny.gguf pp16 1 tiny.gguf pp16 2 tiny.gguf tg8 1 tiny.gguf tg8 2" \
               " llamafail-tiny.gguf pp16 1 llamafail-tiny.gguf pp16 2 llamafail-tiny.gguf tg8 1 llamafail-tiny.gguf tg8 2"
        if (order != want) bad("rows:" order ", wanted:" want)
        exit nbad > 0
    }' "$tmp/stdout" >"$tmp/rows" || { cat "$tmp/rows" >&2; fail "table rows"; }

# a note per failed llama-bench run, with its error line
n=$(grep -c "^- llama-bench failed on llamafail-tiny.gguf (t=[12], round [12]): main: error: failed to load model" "$tmp/stdout")
[ "$n" -eq 4 ] || fail "$n notes on the refused file, wanted 4"
grep -q "tern bench failed" "$tmp/stdout" && fail "a tern bench run failed"

# in turn: odd rounds llama-bench first, even rounds tern first
want=$(for r in 1 2; do for f in tiny.gguf llamafail-tiny.gguf; do for t in 1 2; do
    if [ $r = 1 ]; then printf 'llama %s %s\ntern %s %s\n' $f $t $f $t; else printf 'tern %s %s\nllama %s %s\n' $f $t $f $t; fi
done; done; done)
[ "$(cat "$tmp/state/calls")" = "$want" ] || fail "order of the runs: $(tr '\n' ';' <"$tmp/state/calls")"

# the SVG: one element, tags closed, a bar per figure (2 per row of tiny.gguf, tern's only for the refused file)
svg="$tmp/out.svg"
head -c 4 "$svg" | grep -q '^<svg' || fail "the SVG does not start with <svg"
[ "$(tail -n 1 "$svg")" = "</svg>" ] || fail "the SVG does not end with </svg>"
for tag in g text rect svg; do
    o=$(grep -o "<${tag}[ >]" "$svg" | wc -l)
    c=$(grep -o "</$tag>" "$svg" | wc -l)
    if [ "$o" -ne "$c" ] || [ "$o" -eq 0 ]; then fail "<$tag>: $o opened, $c closed"; fi
done
bars=$(grep -o '<rect class="bar"' "$svg" | wc -l)
[ "$bars" -eq 12 ] || fail "$bars bars in the SVG, wanted 12"
if ! grep -q '>tern</text>' "$svg" || ! grep -q '>llama.cpp</text>' "$svg"; then fail "no legend"; fi
if command -v xmllint >/dev/null 2>&1; then xmllint --noout "$svg" || fail "xmllint: the SVG is not well-formed"; fi

# bad invocations: exit 2 with a message
sh "$src/scripts/compare-llamacpp.sh" "$tmp/no-such-llama-bench" "$tmp/tiny.gguf" --tern "$TERN" >/dev/null 2>"$tmp/err"
rc=$?
if [ $rc -ne 2 ] || ! grep -q "is not an executable file" "$tmp/err"; then fail "a missing llama-bench: exit $rc"; fi
sh "$src/scripts/compare-llamacpp.sh" "$src/tests/stub-llama-bench.sh" "$tmp/tiny.gguf" --tern "$TERN" --rounds 0 >/dev/null 2>"$tmp/err"
rc=$?
if [ $rc -ne 2 ] || ! grep -q "rounds wants a positive integer" "$tmp/err"; then fail "--rounds 0: exit $rc"; fi

if [ $fails -ne 0 ]; then
    echo "--- output:" >&2
    cat "$tmp/stdout" >&2
    exit 1
fi
echo "compare-llamacpp: table, ratios, notes, order of the runs and SVG as expected"
