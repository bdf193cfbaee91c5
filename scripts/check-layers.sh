#!/bin/sh
# check-layers.sh - holds tern's layering: every #include "..." line in the
# tree must name a header the including file's layer may use. The table
# below is the one place the rules live (docs/ARCHITECTURE.md explains it);
# ctest runs this script in every build (test "check_layers"), so `make test`
# fails on a wrong-way include.
#
# Each row: a path prefix of including files, then the include prefixes that
# files under it may use. The first row whose prefix matches a file decides
# (more specific rows first). A prefix ending in "/" names a folder, any
# other a file or file-name stem ("format/quant" covers format/quant.h).
# Includes are spelled with their folder ("core/pool.h"), resolved against
# src/ (library layers), include/ (the public tern*.h headers), tools/ (the
# CLI's own headers, tools/dev/mkmodel.h as "dev/mkmodel.h") or bench/.
set -eu
cd "$(dirname "$0")/.."

RULES='
src/core/          core/ tern_error.h tern_pool.h
src/format/quant   core/ format/quant tern_error.h
src/format/        core/ format/ tern_error.h
src/kernels/       core/ format/quant kernels/ tern_error.h tern_pool.h
src/model/         core/ format/ kernels/ model/ tern_error.h tern_pool.h
src/text/          core/ format/ text/ tern_error.h tern_sampler.h
src/api/           core/ format/ kernels/ model/ text/ api/ tern.h tern_error.h tern_pool.h tern_sampler.h
tools/server/      server/ srv.h cmds.h model_args.h json_schema.h tern.h tern_error.h tern_sampler.h
tools/dev/         core/ format/ kernels/ model/ text/ dev/ cmds.h json_schema.h bench.h probe.h tern.h tern_error.h tern_pool.h tern_sampler.h
tools/             cmds.h run_args.h model_args.h json_schema.h bench.h probe.h disk_probe.h tern.h tern_error.h tern_pool.h tern_sampler.h
bench/             core/ format/ kernels/ bench.h probe.h disk_probe.h tern_error.h tern_pool.h
include/           tern_error.h tern_pool.h tern_sampler.h
tests/             *
fuzz/              *
dev/               *
'

# file<TAB>line<TAB>header for every quoted include of the tree's C files.
incs=$(git ls-files --cached --others --exclude-standard -- '*.c' '*.h' 2>/dev/null |
       while read -r f; do
           grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" /dev/null 2>/dev/null |
               sed 's/^\([^:]*\):\([0-9]*\):[^"]*"\([^"]*\)".*/\1	\2	\3/'
       done)

bad=$(printf '%s\n' "$incs" | awk -F'\t' -v rules="$RULES" '
BEGIN {
    n = 0
    split(rules, lines, "\n")
    for (i = 1; i in lines; i++) {
        if (lines[i] ~ /^[[:space:]]*$/) continue
        k = split(lines[i], w, /[[:space:]]+/)
        n++; pre[n] = w[1]; allow[n] = ""
        for (j = 2; j <= k; j++) allow[n] = allow[n] " " w[j]
    }
}
NF == 3 {
    file = $1; hdr = $3; row = 0
    for (i = 1; i <= n; i++) if (index(file, pre[i]) == 1) { row = i; break }
    if (row == 0) { printf "%s:%s: no layer row covers this file\n", file, $2; next }
    if (allow[row] == " *") next
    ok = 0
    k = split(allow[row], a, " ")
    for (j = 1; j <= k; j++) if (a[j] != "" && index(hdr, a[j]) == 1) { ok = 1; break }
    if (!ok) printf "%s:%s: includes \"%s\", which layer %s may not use (allowed:%s)\n", file, $2, hdr, pre[row], allow[row]
}')

status=0
if [ -n "$bad" ]; then
    printf '%s\n' "$bad" >&2
    status=1
fi

# The kernels read no environment: the switches of the kernel choice are
# read by the cpu layer (cpu_env) and reach the kernels as kern_options_t.
envbad=$(git ls-files --cached --others --exclude-standard -- 'src/kernels/*' 2>/dev/null |
         while read -r f; do
             [ -f "$f" ] && grep -n 'getenv[[:space:]]*(' "$f" /dev/null 2>/dev/null
         done || true)
if [ -n "$envbad" ]; then
    printf '%s\n' "$envbad" | sed 's/$/   <- getenv in a kernel file/' >&2
    echo "check-layers: files under src/kernels/ must not call getenv; read the variable in src/core (cpu_env) and pass it as kern_options_t" >&2
    status=1
fi
if [ "$status" -ne 0 ]; then
    [ -n "$bad" ] && echo "check-layers: wrong-way includes (rules: scripts/check-layers.sh, docs/ARCHITECTURE.md)" >&2
    exit 1
fi
n=$(printf '%s\n' "$incs" | grep -c .)
echo "check-layers: $n includes follow the layer table; no getenv under src/kernels/"
