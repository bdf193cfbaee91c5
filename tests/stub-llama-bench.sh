#!/bin/sh
# stub-llama-bench.sh - stands in for llama.cpp's llama-bench in the test of
# scripts/compare-llamacpp.sh (tests/compare-llamacpp-test.sh). It takes
# the options the script passes (-m FILE -p N -n N -t T -r 1 -o csv) and
# prints what llama-bench -o csv prints: a header of its field names, then
# one row per test (ppN, then tgN; a length of 0 is no test), every value
# in double quotes. The speeds are fixed so the test can check them:
#   ppN at T threads: 1000 * T + 10 * k tokens/s
#   tgN at T threads:   50 * T +  2 * k tokens/s
# where k counts the earlier calls on the same file and T (kept in
# $STUB_LLAMA_STATE, a folder, whose file "calls" gets a line "llama FILE T"
# per call; without it k = 0). A file whose name contains
# "llamafail" fails the way llama-bench does when it cannot load a model.
set -eu
model="" p=512 n=128 t=4 o=md
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { echo "error: missing value for $1" >&2; exit 1; }
    case $1 in
    -m | --model) model=$2 ;;
    -p | --n-prompt) p=$2 ;;
    -n | --n-gen) n=$2 ;;
    -t | --threads) t=$2 ;;
    -r | --repetitions) ;;
    -o | --output) o=$2 ;;
    *) echo "error: invalid parameter for argument: $1" >&2; exit 1 ;;
    esac
    shift 2
done
[ "$o" = csv ] || { echo "stub-llama-bench: only -o csv" >&2; exit 1; }
k=0
if [ -n "${STUB_LLAMA_STATE:-}" ]; then
    f="$STUB_LLAMA_STATE/$(basename "$model").t$t"
    [ -f "$f" ] && k=$(cat "$f")
    echo $((k + 1)) >"$f"
    echo "llama $(basename "$model") $t" >>"$STUB_LLAMA_STATE/calls"
fi
case $(basename "$model") in
*llamafail*)
    echo "llama_model_load: error loading model: stub refuses this file" >&2
    echo "main: error: failed to load model '$model'" >&2
    exit 1
    ;;
esac
[ -f "$model" ] || { echo "main: error: failed to load model '$model'" >&2; exit 1; }
echo "build_commit,build_number,cpu_info,gpu_info,backends,model_filename,model_type,model_size,model_n_params,n_batch,n_ubatch,n_threads,cpu_mask,cpu_strict,poll,type_k,type_v,n_gpu_layers,split_mode,main_gpu,no_kv_offload,flash_attn,tensor_split,use_mmap,embeddings,n_prompt,n_gen,n_depth,test_time,avg_ns,stddev_ns,avg_ts,stddev_ts"
row() { # n_prompt n_gen tokens/s
    ns=$(awk -v n="$(($1 + $2))" -v ts="$3" 'BEGIN { printf "%.0f", n / ts * 1e9 }')
    printf '"5eb1c0de","4321","Stub CPU, 2 cores","","CPU","%s","llama ?B Q8_0","1411008","1312000","2048","512","%s","0x0","0","50","f16","f16","0","layer","0","0","0","0.00","1","0","%s","%s","0","2026-12-02T00:00:00Z","%s","0","%s.000000","0.000000"\n' \
        "$model" "$t" "$1" "$2" "$ns" "$3"
}
[ "$p" -gt 0 ] && row "$p" 0 $((1000 * t + 10 * k))
[ "$n" -gt 0 ] && row 0 "$n" $((50 * t + 2 * k))
exit 0
