#!/usr/bin/env bash
# tender-cache.sh - run tender as the cache under test (start|stop DIR PORT UPSTREAM_URL, like the
# test bed's peer scripts).
# usage: tender-cache.sh start|stop DIR PORT UPSTREAM_URL
#   start: tender serve on http://127.0.0.1:PORT, data in DIR/data, log (stderr, text format)
#          in DIR/tender.log (also reachable as DIR/registry.log and DIR/access.log, the names the
#          bed's peers use), PID in DIR/pid. UPSTREAM_URL is both the registry upstream
#          "ghcr.io" (the default upstream, so /v2/<repo>/... reaches it) and the Image Factory
#          (--image-factory), so one script serves the registry and the factory runs alike.
#   stop:  SIGTERM to the PID in DIR/pid (SIGKILL after 10 s); rm -rf DIR for a cold cache
# env: TENDER_BIN=   the binary (default: <repo>/target/release/tender, the release build)
#      TENDER_ARGS=  extra arguments for "tender serve" (word-split)
#      HARNESS=<repo>/scripts/testbed   the test bed whose lib.sh it sources
set -eu
SELF=$(readlink -f "$0")
HERE=$(cd "$(dirname "$0")" && pwd)
. "${HARNESS:-$HERE/../scripts/testbed}/lib.sh"
usage() { echo "usage: $(basename "$0") start|stop DIR PORT UPSTREAM_URL" >&2; exit 2; }
[ $# -ge 2 ] || usage
D=$2
case $1 in
  # match on the data dir: the binary may be a copy under another name (run.sh), and the PID
  # may have been reused
  stop) [ ! -d "$D" ] || D=$(cd "$D" && pwd); pid_stop "$D" "serve .*--data $D/data"; exit 0 ;;
  start) [ $# -eq 4 ] || usage ;;
  *) usage ;;
esac
PORT=$3 UP=${4%/}
loopback_only "$UP"
case $PORT in ''|*[!0-9]*) die "bad PORT: $PORT" ;; esac
BIN=${TENDER_BIN:-$(dirname "$(dirname "$SELF")")/target/release/tender}
[ -x "$BIN" ] || die "no tender binary at $BIN (cargo build --release --bin tender, or set TENDER_BIN)"
need curl
mkdir -p "$D/data"; D=$(cd "$D" && pwd)
if [ -f "$D/pid" ] && alive "$(cat "$D/pid")"; then die "already running: $D/pid"; fi
wait_port_free "$PORT" 30 || die "port $PORT is busy"
: >>"$D/tender.log"
ln -sf tender.log "$D/registry.log"; ln -sf tender.log "$D/access.log"
# shellcheck disable=SC2086  # TENDER_ARGS is split on purpose
nohup "$BIN" serve --listen "127.0.0.1:$PORT" --data "$D/data" \
  --upstream "ghcr.io=$UP" --default-upstream ghcr.io --image-factory "$UP" \
  ${TENDER_ARGS:-} >>"$D/tender.log" 2>&1 </dev/null &
echo $! >"$D/pid"
if ! wait_http "http://127.0.0.1:$PORT/v2/" 20 || ! alive "$(cat "$D/pid")"; then
  tail -5 "$D/tender.log" >&2
  pid_stop "$D" "serve .*--data $D/data"
  die "tender on port $PORT did not come up"
fi
echo "tender pid $(cat "$D/pid") on http://127.0.0.1:$PORT (upstream and image factory $UP) dir $D"
