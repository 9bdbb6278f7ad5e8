#!/usr/bin/env bash
# fanout.sh - N clients GET one blob of a registry (or cache) at once: fanout-url.sh on
# BASE/v2/REPO/blobs/DIGEST, each body checked against DIGEST (VERIFY=0: size only).
# usage: fanout.sh BASE_URL REPO sha256:HEX N      (env as fanout-url.sh)
set -eu
[ $# -eq 4 ] || { echo "usage: ${0##*/} BASE_URL REPO DIGEST N" >&2; exit 2; }
case $3 in sha256:*) ;; *) echo "${0##*/}: DIGEST must be sha256:HEX" >&2; exit 2 ;; esac
EXPECT_SHA256=${3#sha256:} exec "$(cd "$(dirname "$0")" && pwd)/fanout-url.sh" "${1%/}/v2/$2/blobs/$3" "$4"
