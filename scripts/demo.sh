#!/bin/sh
# make demo: the main job. For now: the pool benchmark.
set -eu
TERN=$1
SHARED=$2
"$TERN" bench pool
