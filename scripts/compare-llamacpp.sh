#!/bin/sh
# compare-llamacpp.sh - tern against llama.cpp on the same files, in the
# same run: llama-bench (a binary you built elsewhere; this repository
# contains and builds nothing of llama.cpp) and `tern bench` take turns.
#
# usage: scripts/compare-llamacpp.sh LLAMA_BENCH FILE... [--tern PATH]
#          [--rounds R] [--threads 1,2] [--pp 512] [--tg 64]
#          [--md OUT.md] [--svg OUT.svg] [--tern-args "ARGS"]
#
# For each round, for each file, for each thread count: llama-bench once
# (-r 1: the rounds are ours) and tern bench once (-r 1), both running the
# prompt test (ppN: N prompt tokens in one evaluation) and the decode test
# (tgN: N tokens one at a time); every other round tern goes first, so
# neither always runs on a machine the other has just warmed or heated. The
# speeds come from the tools' CSV output (llama-bench -o csv: n_prompt,
# n_gen, n_threads, avg_ts; tern bench -o csv: threads, test, tok_s). Prints
# a markdown table (date, both binaries, the CPU; per file, test and thread
# count: mean +- sd tokens/s of each over the rounds and tern / llama.cpp),
# also to --md OUT, and with --svg OUT the same figures as a bar chart (SVG
# written by awk here, no plotting dependency). A run that fails (a file
# llama-bench cannot load, say) gets a note with its error line and the
# others go on; the table says "-" where a side has no figure.
#
# --tern PATH     the tern binary (default: build/tern of this checkout, else
#                 tern on PATH)
# --rounds R      rounds (default 3)
# --threads LIST  thread counts, comma-separated (default 1,2)
# --pp N, --tg N  prompt and decode lengths (default 512 and 64; 0 = skip)
# --tern-args S   more options for tern bench (word-split), e.g. "--probe-mb 64"
# KEEP_TMP=1 (environment) keeps the temporary folder with every run's raw
# output; its path is printed on stderr.
#
# POSIX sh and awk only (Debian 12's dash and mawk).
set -u

die() {
    echo "compare-llamacpp: $*" >&2
    exit 2
}

# The comment above from "usage:" on; exit status $1.
usage() {
    sed -n '/^# usage:/,/^# POSIX/p' "$0" | sed 's/^# \{0,1\}//'
    exit "$1"
}

[ $# -ge 1 ] || usage 2
case $1 in -h | --help) usage 0 ;; esac
LB=$1
shift
here=$(cd "$(dirname "$0")/.." && pwd)
TERN=""
ROUNDS=3
THREADS=1,2
PP=512
TG=64
MD=""
SVG=""
TERN_ARGS=""
tmp=$(mktemp -d "${TMPDIR:-/tmp}/compare-llamacpp.XXXXXX") || die "no temporary folder"
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
[ -z "${KEEP_TMP:-}" ] || echo "compare-llamacpp: raw outputs kept in $tmp" >&2
trap 'exit 130' INT TERM
: >"$tmp/files"
while [ $# -gt 0 ]; do
    case $1 in
    --tern | --rounds | --threads | --pp | --tg | --md | --svg | --tern-args)
        [ $# -ge 2 ] || die "$1 needs a value"
        case $1 in
        --tern) TERN=$2 ;;
        --rounds) ROUNDS=$2 ;;
        --threads) THREADS=$2 ;;
        --pp) PP=$2 ;;
        --tg) TG=$2 ;;
        --md) MD=$2 ;;
        --svg) SVG=$2 ;;
        --tern-args) TERN_ARGS=$2 ;;
        esac
        shift 2
        ;;
    -h | --help) usage 0 ;;
    -*) die "unknown option '$1'" ;;
    *)
        case $1 in *"
"*) die "a file name with a newline: '$1'" ;; esac
        printf '%s\n' "$1" >>"$tmp/files"
        shift
        ;;
    esac
done
[ -s "$tmp/files" ] || die "no model files given"
isnum() { case $1 in '' | *[!0-9]*) return 1 ;; esac; }
{ isnum "$ROUNDS" && [ "$ROUNDS" -ge 1 ]; } || die "--rounds wants a positive integer, got '$ROUNDS'"
isnum "$PP" || die "--pp wants an integer >= 0, got '$PP'"
isnum "$TG" || die "--tg wants an integer >= 0, got '$TG'"
[ -x "$LB" ] || die "llama-bench '$LB' is not an executable file"
if [ -z "$TERN" ]; then
    if [ -x "$here/build/tern" ]; then TERN=$here/build/tern; else TERN=$(command -v tern) || die "no tern binary: pass --tern PATH"; fi
fi
[ -x "$TERN" ] || die "tern '$TERN' is not an executable file"
[ "$PP" -gt 0 ] || [ "$TG" -gt 0 ] || die "--pp 0 and --tg 0: nothing to run"
tlist=$(printf '%s' "$THREADS" | tr ',' ' ')
for t in $tlist; do { isnum "$t" && [ "$t" -ge 1 ]; } || die "--threads wants positive integers, got '$THREADS'"; done
[ -n "$tlist" ] || die "--threads: empty list"

# The rows of the table, in order: file index, test, threads.
: >"$tmp/order"
fi=0
while IFS= read -r f <&3; do
    fi=$((fi + 1))
    for test in pp tg; do
        if [ $test = pp ]; then n=$PP; else n=$TG; fi
        [ "$n" -gt 0 ] || continue
        for t in $tlist; do printf '%s\t%s\t%s%s\t%s\n' "$fi" "$(basename "$f")" "$test" "$n" "$t" >>"$tmp/order"; done
    done
done 3<"$tmp/files"

# CSV with quoted fields (llama-bench quotes every value; commas and ""
# inside quotes) to tab-separated fields; the header row names them.
# shellcheck disable=SC2016 # an awk program
CSV2TSV='
function field(s,    out, c, i, q) {
    out = ""; q = 0
    for (i = 1; i <= length(s); i++) {
        c = substr(s, i, 1)
        if (q) {
            if (c == "\"") {
                if (substr(s, i + 1, 1) == "\"") { out = out "\""; i++ } else q = 0
            } else out = out c
        } else if (c == "\"") q = 1
        else if (c == ",") out = out "\t"
        else if (c != "\r") out = out c
    }
    return out
}
{ print field($0) }'

note() {
    printf '%s\n' "$*" >>"$tmp/notes"
    printf 'compare-llamacpp: %s\n' "$*" >&2
}

# The last non-empty line of a file, for the notes.
last_line() { awk 'NF { l = $0 } END { print l }' "$1"; }

# llama-bench on file $1 (index $2) at $3 threads: rows to $tmp/data.
run_llama() {
    "$LB" -m "$1" -p "$PP" -n "$TG" -t "$3" -r 1 -o csv </dev/null >"$tmp/lb.csv" 2>"$tmp/lb.err"
    rc=$?
    awk "$CSV2TSV" "$tmp/lb.csv" >"$tmp/lb.tsv"
    got=$(awk -F'\t' -v fi="$2" -v id="$tmp/lb.id" '
        NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        ("avg_ts" in col) && ("n_prompt" in col) && ("n_gen" in col) && ("n_threads" in col) {
            p = $col["n_prompt"] + 0; g = $col["n_gen"] + 0
            test = p > 0 && g == 0 ? "pp" p : g > 0 && p == 0 ? "tg" g : "pp" p "+tg" g
            printf "%s\t%s\t%s\tllama\t%s\n", fi, test, $col["n_threads"] + 0, $col["avg_ts"]
            if ("build_commit" in col) {
                b = $col["build_commit"]
                if ("build_number" in col) b = b " (build " $col["build_number"] ")"
                print b > id
            }
            n++
        }
        END { if (!n) exit 1 }' "$tmp/lb.tsv" >>"$tmp/data" && echo ok)
    if [ "$rc" -ne 0 ] || [ "$got" != ok ]; then
        why=$(last_line "$tmp/lb.err")
        [ -n "$why" ] || why="exit status $rc, no rows"
        note "llama-bench failed on $(basename "$1") (t=$3, round $r): $why"
    fi
}

# tern bench on file $1 (index $2) at $3 threads.
run_tern() {
    # shellcheck disable=SC2086 # --tern-args is word-split on purpose
    "$TERN" bench -m "$1" -t "$3" -p "$PP" -n "$TG" -r 1 -o csv $TERN_ARGS </dev/null >"$tmp/tb.csv" 2>"$tmp/tb.err"
    rc=$?
    got=$(awk -F, -v fi="$2" '
        NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        ("tok_s" in col) && ("test" in col) && ("threads" in col) {
            printf "%s\t%s\t%s\ttern\t%s\n", fi, $col["test"], $col["threads"] + 0, $col["tok_s"]; n++
        }
        END { if (!n) exit 1 }' "$tmp/tb.csv" >>"$tmp/data" && echo ok)
    if [ "$rc" -ne 0 ] || [ "$got" != ok ]; then
        why=$(last_line "$tmp/tb.err")
        [ -n "$why" ] || why="exit status $rc, no rows"
        note "tern bench failed on $(basename "$1") (t=$3, round $r): $why"
    fi
}

: >"$tmp/data"
: >"$tmp/notes"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    fi=0
    while IFS= read -r f <&3; do
        fi=$((fi + 1))
        for t in $tlist; do
            printf 'compare-llamacpp: round %d/%d, %s, %d thread(s)\n' "$r" "$ROUNDS" "$(basename "$f")" "$t" >&2
            if [ $((r % 2)) -eq 1 ]; then
                run_llama "$f" "$fi" "$t"
                run_tern "$f" "$fi" "$t"
            else
                run_tern "$f" "$fi" "$t"
                run_llama "$f" "$fi" "$t"
            fi
        done
    done 3<"$tmp/files"
    r=$((r + 1))
done

# Mean and sd (n - 1) per row and side: index, name, test, threads, then
# llama mean, sd, n, tern mean, sd, n (n = 0: no figure).
awk -F'\t' '
    FILENAME == ARGV[1] { k = $1 SUBSEP $2 SUBSEP $3; s[k, $4] += $5; q[k, $4] += $5 * $5; c[k, $4]++; next }
    {
        k = $1 SUBSEP $3 SUBSEP $4
        printf "%s\t%s\t%s\t%s", $1, $2, $3, $4
        split("llama tern", side, " ")
        for (j = 1; j <= 2; j++) {
            n = c[k, side[j]] + 0
            m = n ? s[k, side[j]] / n : 0
            v = n > 1 ? (q[k, side[j]] - n * m * m) / (n - 1) : 0
            printf "\t%.6f\t%.6f\t%d", m, (v > 0 ? sqrt(v) : 0), n
        }
        printf "\n"
    }' "$tmp/data" "$tmp/order" >"$tmp/stats" || die "cannot summarize the runs"

# The report.
cpu=$(LC_ALL=C lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)
[ -n "$cpu" ] || cpu=$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo 2>/dev/null | head -n 1)
[ -n "$cpu" ] || cpu="unknown"
lbid=$(head -n 1 "$tmp/lb.id" 2>/dev/null)
[ -n "$lbid" ] || lbid="build unknown (no successful run)"
ternid=$("$TERN" --version 2>/dev/null | head -n 1)
case $TERN in "$here"/*) # a build of this checkout: its commit too
    gitid=$(git -C "$here" describe --always --dirty 2>/dev/null) && ternid="$ternid, git $gitid" ;;
esac
date=$(date -u '+%Y-%m-%d %H:%M UTC')
{
    echo "## tern vs llama.cpp"
    echo
    echo "- date: $date"
    echo "- CPU: $cpu ($(nproc 2>/dev/null || echo ?) CPUs available)"
    echo "- llama.cpp: llama-bench build_commit $lbid ($LB)"
    echo "- tern: $ternid ($TERN)"
    echo "- method: $ROUNDS round(s); in each, per file and thread count, llama-bench -r 1 and tern bench -r 1 in turn" \
        "(tern first in even rounds); tokens/s as mean ± sd over the rounds; ppN: an N-token prompt, tgN: N tokens decoded"
    echo
    echo "| file | test | threads | llama.cpp t/s | tern t/s | tern / llama.cpp |"
    echo "|---|---|---:|---:|---:|---:|"
    awk -F'\t' '{
        l = $7 ? sprintf("%.2f ± %.2f", $5, $6) : "-"
        t = $10 ? sprintf("%.2f ± %.2f", $8, $9) : "-"
        x = $7 && $10 && $5 > 0 ? sprintf("%.2fx", $8 / $5) : "-"
        printf "| %s | %s | %s | %s | %s | %s |\n", $2, $3, $4, l, t, x
    }' "$tmp/stats"
    if [ -s "$tmp/notes" ]; then
        echo
        echo "Notes:"
        echo
        sed 's/^/- /' "$tmp/notes"
    fi
} >"$tmp/report.md"
cat "$tmp/report.md"
if [ -n "$MD" ]; then cp "$tmp/report.md" "$MD" || die "cannot write $MD"; fi

# The chart: a section per test (its own scale: prompt speeds dwarf decode
# speeds), in it a group per file and thread count: a bar for tern and one
# for llama.cpp, each with its value, the ratio to the right.
if [ -n "$SVG" ]; then
    awk -F'\t' -v title="tern vs llama.cpp, tokens/s (mean of $ROUNDS round(s))" -v subtitle="$cpu; $date" '
    function esc(s) {
        gsub(/&/, "\\&amp;", s); gsub(/</, "\\&lt;", s); gsub(/>/, "\\&gt;", s); gsub(/"/, "\\&quot;", s)
        return s
    }
    function bar(y, v, n, sd, color, who,    w) {
        if (!n) {
            printf "    <text x=\"%d\" y=\"%d\" fill=\"#777\">%s: no figure</text>\n", X0 + 4, y + 11, who
            return
        }
        w = max[sec] > 0 ? v / max[sec] * BW : 0
        if (w < 1) w = 1
        printf "    <rect class=\"bar\" x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\">", X0, y, w, BH, color
        printf "<title>%s %.2f ± %.2f t/s</title></rect>\n", who, v, sd
        printf "    <text x=\"%.1f\" y=\"%d\">%.2f</text>\n", X0 + w + 4, y + 11, v
    }
    {
        n++; sect[n] = $3; name[n] = $2; thr[n] = $4
        lm[n] = $5; ls[n] = $6; ln[n] = $7; tm[n] = $8; ts[n] = $9; tn[n] = $10
        if (!($3 in max)) { ns++; secname[ns] = $3; max[$3] = 0 }
        if ($7 && $5 > max[$3]) max[$3] = $5
        if ($10 && $8 > max[$3]) max[$3] = $8
    }
    END {
        X0 = 250; BW = 460; BH = 14; GH = 2 * BH + 14; W = X0 + BW + 160
        H = 90 + ns * 34 + n * GH + 10
        printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" ", W, H, W, H
        printf "font-family=\"sans-serif\" font-size=\"12\">\n"
        printf "  <rect class=\"background\" x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#fff\"></rect>\n", W, H
        printf "  <text x=\"10\" y=\"22\" font-size=\"16\" font-weight=\"bold\">%s</text>\n", esc(title)
        printf "  <text x=\"10\" y=\"40\" fill=\"#555\">%s</text>\n", esc(subtitle)
        printf "  <g class=\"legend\">\n"
        printf "    <rect class=\"key\" x=\"10\" y=\"52\" width=\"12\" height=\"12\" fill=\"#2f6db5\"></rect>\n"
        printf "    <text x=\"28\" y=\"62\">tern</text>\n"
        printf "    <rect class=\"key\" x=\"80\" y=\"52\" width=\"12\" height=\"12\" fill=\"#d9822b\"></rect>\n"
        printf "    <text x=\"98\" y=\"62\">llama.cpp</text>\n"
        printf "    <text x=\"190\" y=\"62\" fill=\"#555\">bold on the right: tern / llama.cpp</text>\n"
        printf "  </g>\n"
        y = 90
        for (s = 1; s <= ns; s++) {
            sec = secname[s]
            printf "  <g class=\"section\">\n"
            printf "    <text x=\"10\" y=\"%d\" font-weight=\"bold\">%s (%s)</text>\n", y + 14, esc(sec),
                substr(sec, 1, 2) == "pp" ? "prompt processing" : "decode"
            y += 34
            for (i = 1; i <= n; i++) {
                if (sect[i] != sec) continue
                printf "  <g class=\"group\">\n"
                printf "    <text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s, t=%s</text>\n", X0 - 8, y + BH + 4,
                    esc(name[i]), thr[i]
                bar(y, tm[i], tn[i], ts[i], "#2f6db5", "tern")
                bar(y + BH + 2, lm[i], ln[i], ls[i], "#d9822b", "llama.cpp")
                if (tn[i] && ln[i] && lm[i] > 0)
                    printf "    <text x=\"%d\" y=\"%d\" font-weight=\"bold\">%.2fx</text>\n", X0 + BW + 80,
                        y + BH + 4, tm[i] / lm[i]
                printf "  </g>\n"
                y += GH
            }
            printf "  </g>\n"
        }
        printf "</svg>\n"
    }' "$tmp/stats" >"$tmp/chart.svg" || die "cannot make the chart"
    cp "$tmp/chart.svg" "$SVG" || die "cannot write $SVG"
fi
exit 0
