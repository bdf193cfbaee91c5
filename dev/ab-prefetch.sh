#!/bin/sh
# ab-prefetch.sh - in-process A/B of the kernels' weight-prefetch distance
# (PF_DIST in src/kernels/prefetch.h); see dev/ab/ab_prefetch.c.
#
# Builds libtern once more under build/ab-prefetch with PF_DIST read from a
# global variable (the one thing that differs from a normal build: an add
# from memory instead of an immediate in each prefetch address), links
# dev/ab/ab_prefetch.c against it and runs it with the arguments given:
#
#   dev/ab-prefetch.sh THREADS DIST_A DIST_B FORMATS [ROUNDS] [ROWSxCOLS]
#   e.g. dev/ab-prefetch.sh 2 4096 2048 q4_0,q5_0,f16,q4_k 24
#        dev/ab-prefetch.sh 2 2048 2048 q4_0 12        (A/A: the noise)
#
# TERN_ISA=avx2 (etc.) applies as usual. Environment: BUILD (default
# build/ab-prefetch), CC (default cc).
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/ab-prefetch}
CC=${CC:-cc}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTERN_TESTS=OFF \
    "-DCMAKE_C_FLAGS=-DPF_DIST=tern_ab_pf_dist -include $(pwd)/dev/ab/ab_prefetch.h" >/dev/null
cmake --build "$BUILD" -j "$(nproc 2>/dev/null || echo 2)" --target ternlib >/dev/null
# shellcheck disable=SC2046
$CC -O2 -Wall -Wextra -Werror -std=c11 -Iinclude -Isrc -Ibench dev/ab/ab_prefetch.c bench/probe.c "$BUILD/libtern.a" -o "$BUILD/ab_prefetch" \
    $(pkg-config --libs libpcre2-8 libutf8proc hwloc) -lpthread -lm
exec "$BUILD/ab_prefetch" "$@"
