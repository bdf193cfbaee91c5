#!/bin/sh
# Installs the Debian packages tern needs to build, test and fuzz. Idempotent:
# does nothing when everything is present. Run as root or with sudo available.
set -eu
PKGS="build-essential cmake pkg-config clang libclang-rt-dev libcmocka-dev libpcre2-dev libutf8proc-dev libhwloc-dev libgomp1 libmicrohttpd-dev libcjson-dev"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "install-deps: installing:$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q || true
$SUDO apt-get install -y -q --no-install-recommends $missing
