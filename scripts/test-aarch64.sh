#!/bin/sh
# test-aarch64.sh - cross-build tern for aarch64 (cmake/aarch64-linux-gnu.cmake)
# and run its kernel tests under qemu-user, twice: on an emulated CPU with
# the ARMv8.2 dot-product extension (-cpu max: the SDOT kernels) and on one
# without it (-cpu cortex-a57: the plain NEON kernels). Before the tests, a
# small probe checks that each CPU model really selects the NEON kernels
# with the expected dot-product flag, so a pass means the NEON code ran.
# Which tests cover NEON: test_kernels (every ISA the CPU has against the
# scalar kernels, thread and column bit-identity), test_model and
# test_model_invariance (whole models through the active ISA, NEON here),
# test_batch (many sequences in one batch byte-identical to each alone, on NEON).
# test_quant_legacy / test_quant_k add the NEON entries to their own tables
# on aarch64, so they also check NEON against the scalar oracle (exact
# integer sums, byte-identical activation rows, multi-column bit-identity).
#
# Usage: scripts/test-aarch64.sh [--install] [TEST ...]
#   TEST      test executables to run (default: test_quant_legacy test_quant_k
#             test_kernels test_model test_model_invariance test_batch)
#   --install install the missing Debian packages first (apt-get; root)
# Environment:
#   BUILD  build directory (default build/aarch64)
#   JOBS   parallel build jobs (default 2)
#   CPUS   qemu CPU models to test (default "max cortex-a57")
#   NICE   nice level for the build and the runs (default 15)
#   TERN_TEST_QUICK=1 is passed on to the tests (shorter sweeps)
# Exit status: 0 all passed, 1 a build or test failed, 2 missing packages.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build/aarch64}
JOBS=${JOBS:-2}
CPUS=${CPUS:-"max cortex-a57"}
NICE=${NICE:-15}
TRIPLE=aarch64-linux-gnu
PCDIR=/usr/lib/$TRIPLE/pkgconfig

INSTALL=0
TESTS=""
for a in "$@"; do
  case "$a" in
    --install) INSTALL=1 ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    -*) echo "test-aarch64: unknown option $a" >&2; exit 2 ;;
    *) TESTS="$TESTS $a" ;;
  esac
done
[ -n "$TESTS" ] || TESTS="test_quant_legacy test_quant_k test_kernels test_model test_model_invariance test_batch"

# ---- prerequisites ------------------------------------------------------------
PKGS="gcc-$TRIPLE qemu-user libcmocka-dev:arm64 libpcre2-dev:arm64 libutf8proc-dev:arm64 libhwloc-dev:arm64"
qemu_bin() { command -v qemu-aarch64 || command -v qemu-aarch64-static || true; }
missing() {
  m=""
  command -v cmake >/dev/null 2>&1 || m="$m cmake"
  command -v pkg-config >/dev/null 2>&1 || m="$m pkg-config"
  command -v $TRIPLE-gcc >/dev/null 2>&1 || m="$m gcc-$TRIPLE"
  [ -n "$(qemu_bin)" ] || m="$m qemu-user"
  for pc in cmocka:libcmocka-dev libpcre2-8:libpcre2-dev libutf8proc:libutf8proc-dev hwloc:libhwloc-dev; do
    [ -f "$PCDIR/${pc%%:*}.pc" ] || m="$m ${pc#*:}:arm64"
  done
  [ -e /lib/ld-linux-aarch64.so.1 ] || [ -e /usr/$TRIPLE/lib/ld-linux-aarch64.so.1 ] || m="$m libc6:arm64"
  echo "$m"
}
need=$(missing)
if [ -n "$need" ] && [ "$INSTALL" = 1 ]; then
  echo "test-aarch64: installing:$need"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -q
  # shellcheck disable=SC2086
  $SUDO apt-get install -y -q --no-install-recommends $PKGS cmake pkg-config
  need=$(missing)
fi
if [ -n "$need" ]; then
  cat >&2 <<EOF
test-aarch64: missing:$need
Install them (Debian 12, as root), then run this script again:
  dpkg --add-architecture arm64 && apt-get update
  apt-get install -y --no-install-recommends $PKGS
(or run: $0 --install)
EOF
  exit 2
fi
QEMU=$(qemu_bin)
# The arm64 loader and libc: multiarch libc6:arm64 puts them where the
# binaries look (/lib); otherwise the cross toolchain's copy is used.
if [ -e /lib/ld-linux-aarch64.so.1 ]; then QEMU_L=""; else QEMU_L="-L /usr/$TRIPLE"; fi

# ---- build --------------------------------------------------------------------
echo "test-aarch64: configure + build in $BUILD"
mkdir -p "$BUILD"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_TOOLCHAIN_FILE="$ROOT/cmake/$TRIPLE.cmake" \
  -DCMAKE_BUILD_TYPE=Release -DTERN_SERVER=OFF >"$BUILD/configure.log" 2>&1 || { cat "$BUILD/configure.log"; exit 1; }
# shellcheck disable=SC2086
nice -n "$NICE" cmake --build "$BUILD" -j "$JOBS" --target ternlib $TESTS

# The probe: what the kernel table picks on the running (emulated) CPU.
cat >"$BUILD/neon_probe.c" <<'EOF'
#include <stdio.h>
#include "core/cpu.h"
#include "kernels/kernels.h"
int main(void) {
    const cpu_features_t *f = cpu_features();
    int missing = 0;
    for (int t = 0; t < TYPE_COUNT; t++) {
        const quant_traits_t *tr = quant_traits(t);
        const kern_ops_t *n = kern_ops(t, ISA_NEON), *s = kern_ops(t, ISA_SCALAR);
        if (tr && tr->weight && (!n || !s || n->dot == s->dot)) {
            printf("no NEON kernel for %s\n", quant_name(t));
            missing++;
        }
    }
    const kern_options_t o = kern_options();
    /* sdot: the kernel options chose the SDOT builds (they must where the CPU has it) */
    printf("neon=%d dotprod=%d isa=%s missing=%d sdot=%d\n", f->neon, f->dotprod, kern_isa_name(o.isa), missing,
           o.dotprod);
    return 0;
}
EOF
LIBS=$(PKG_CONFIG_LIBDIR=$PCDIR:/usr/share/pkgconfig pkg-config --libs libpcre2-8 libutf8proc hwloc)
# shellcheck disable=SC2086
nice -n "$NICE" $TRIPLE-gcc -O2 -I"$ROOT/src" -I"$ROOT/include" "$BUILD/neon_probe.c" "$BUILD/libtern.a" \
  $LIBS -lpthread -lm -o "$BUILD/neon_probe"

# ---- run ----------------------------------------------------------------------
# Which CPU models have the dot-product extension (qemu 7.x).
expect_dotprod() {
  case "$1" in
    max|cortex-a76|neoverse-n1|a64fx) echo 1 ;;
    cortex-a35|cortex-a53|cortex-a57|cortex-a72) echo 0 ;;
    *) echo "?" ;;
  esac
}

fail=0
SUMMARY=""
for cpu in $CPUS; do
  # shellcheck disable=SC2086
  probe=$(unset TERN_ISA; "$QEMU" $QEMU_L -cpu "$cpu" "$BUILD/neon_probe") || { echo "probe failed on $cpu"; exit 1; }
  echo "test-aarch64: -cpu $cpu: $probe"
  case "$probe" in
    *"neon=1 "*"isa=neon missing=0"*) ;;
    *) echo "test-aarch64: -cpu $cpu does not run the NEON kernels"; exit 1 ;;
  esac
  want=$(expect_dotprod "$cpu")
  got=$(echo "$probe" | sed -n 's/.*dotprod=\([01]\).*/\1/p')
  if [ "$want" != "?" ] && [ "$got" != "$want" ]; then
    echo "test-aarch64: -cpu $cpu: dotprod=$got, expected $want"
    exit 1
  fi
  sdot=$(echo "$probe" | sed -n 's/.*sdot=\([01]\).*/\1/p')
  if [ "$sdot" != "$got" ]; then
    echo "test-aarch64: -cpu $cpu: the kernel options say sdot=$sdot where the CPU says dotprod=$got"
    exit 1
  fi
  case "$probe" in *dotprod=1*) path="SDOT kernels" ;; *) path="plain NEON kernels" ;; esac
  for t in $TESTS; do
    log="$BUILD/$t.$cpu.log"
    start=$(date +%s)
    # shellcheck disable=SC2086
    if (cd "$BUILD" && env -u TERN_ISA nice -n "$NICE" "$QEMU" $QEMU_L -cpu "$cpu" "./$t") >"$log" 2>&1; then
      res=PASS
    else
      res=FAIL
      fail=1
      tail -30 "$log"
    fi
    secs=$(($(date +%s) - start))
    line=$(printf '%-5s %-22s -cpu %-12s %5ss  (%s)' "$res" "$t" "$cpu" "$secs" "$path")
    echo "$line"
    SUMMARY="$SUMMARY
$line"
  done
done
echo
echo "test-aarch64 summary (logs: $BUILD/TEST.CPU.log):$SUMMARY"
exit $fail
