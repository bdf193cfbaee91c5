#!/bin/sh
# Installs the Debian packages the end-to-end server tests need
# (scripts/test-server.sh): Node 20 and npm (the openai and puppeteer-core
# packages come from the npm registry at test time), curl, jq and Chromium.
# Idempotent: does nothing when everything is present.
set -eu
PKGS="nodejs npm curl jq chromium ca-certificates"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# node or npm may come from elsewhere (nodesource, nvm): a working one is enough
command -v node >/dev/null 2>&1 && missing=$(echo "$missing" | sed 's/ nodejs//')
command -v npm >/dev/null 2>&1 && missing=$(echo "$missing" | sed 's/ npm//')
[ -z "$missing" ] && exit 0
echo "install-test-deps: installing:$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q || true
$SUDO apt-get install -y -q --no-install-recommends $missing
