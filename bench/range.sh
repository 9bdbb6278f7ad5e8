#!/usr/bin/env bash
# range.sh - issue 32 item 11: what `rangeBeforeVerify` costs a client that asks a short Range
# while a blob's first fetch is still running. docker-registry behind throttle.sh (RATE_MBPS
# per connection) holds one SIZE_MB blob; a cold tender starts one whole GET of it, and DELAY_S
# later a second client asks `Range: bytes=0-1023`. With `rangeBeforeVerify: false` (the
# default) the range waits until the whole blob is verified; with `true` it is served from the
# bytes already received. Each repetition starts from an empty data directory.
# usage: bench/range.sh [WORKDIR]
# env: SIZE_MB=256 RATE_MBPS=50 REPS=3 DELAY_S=0.5 PORT_BASE=17300 (uses .. +2)
#      TENDER_BIN=<repo>/target/release/tender HARNESS=<repo>/scripts/testbed KEEP=1
# Writes WORKDIR/results.txt: one `range mode=… rep=…` line per repetition.
set -eu
BENCH=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$BENCH")
H=${HARNESS:-$REPO/scripts/testbed}
. "$H/lib.sh"
need curl nginx docker-registry python3 awk
SIZE_MB=${SIZE_MB:-256} RATE_MBPS=${RATE_MBPS:-50} REPS=${REPS:-3} DELAY_S=${DELAY_S:-0.5}
PB=${PORT_BASE:-17300}
UP_PORT=$PB THR_PORT=$((PB + 1)) T_PORT=$((PB + 2))
export TENDER_BIN=${TENDER_BIN:-$REPO/target/release/tender}
[ -x "$TENDER_BIN" ] || die "no $TENDER_BIN: cargo build --release --bin tender"
W=${1:-$(mktemp -d /tmp/tenderrange.XXXXXX)}
mkdir -p "$W"; W=$(cd "$W" && pwd)
RES=$W/results.txt; : >"$RES"
UP=$W/upstream THR=$W/throttle TEN=$W/tender DATA=$W/data
cleanup() {
  "$BENCH/tender-cache.sh" stop "$TEN" >/dev/null 2>&1 || true
  "$BENCH/throttle.sh" stop "$THR" >/dev/null 2>&1 || true
  "$H/upstream.sh" stop "$UP" >/dev/null 2>&1 || true
  [ -n "${KEEP:-}" ] || rm -rf "$UP/data" "$DATA" "$TEN"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
rec() { echo "$*" | tee -a "$RES"; }

rec "env date=$(date -u +%FT%TZ) size_mb=$SIZE_MB rate_mbps=$RATE_MBPS reps=$REPS delay_s=$DELAY_S" \
  "tender_rev=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo ?) load1=$(cut -d' ' -f1 /proc/loadavg)"
"$H/upstream.sh" start "$UP" "$UP_PORT" >/dev/null
python3 "$BENCH/small_setup.py" gen "$DATA" "http://127.0.0.1:$UP_PORT" 1 1024 1024 "$SIZE_MB" >/dev/null
# shellcheck source=/dev/null  # written by small_setup.py
. "$DATA/small.env"
RATE_MBPS=$RATE_MBPS "$BENCH/throttle.sh" start "$THR" "$THR_PORT" "http://127.0.0.1:$UP_PORT" >/dev/null
URL=http://127.0.0.1:$T_PORT$BIG_PATH

for mode in false true; do
  for r in $(seq "$REPS"); do
    rm -rf "$TEN"; mkdir -p "$TEN"
    printf 'upstreams:\n  - name: ghcr.io\n    url: http://127.0.0.1:%s\n    rangeBeforeVerify: %s\n' \
      "$THR_PORT" "$mode" >"$W/tender.yaml"
    TENDER_ARGS="--config $W/tender.yaml" "$BENCH/tender-cache.sh" start "$TEN" "$T_PORT" \
      "http://127.0.0.1:$THR_PORT" >/dev/null
    t0=$(now)
    curl -s -o /dev/null -w '%{http_code} %{size_download}\n' "$URL" >"$W/whole.txt" &
    whole=$!
    sleep "$DELAY_S"   # the second client's offset into the first fetch: a parameter, not a wait for state
    ranged=$(curl -s -r 0-1023 -o /dev/null -w '%{http_code} %{size_download} %{time_starttransfer} %{time_total}' "$URL")
    wait "$whole"
    t1=$(now)
    set -- $ranged
    rec "range mode=$mode rep=$r range_code=$1 range_bytes=$2 range_first_byte_s=$3 range_total_s=$4" \
      "whole=$(tr ' ' ':' <"$W/whole.txt") whole_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b - a}')"
    "$BENCH/tender-cache.sh" stop "$TEN" >/dev/null
  done
done
