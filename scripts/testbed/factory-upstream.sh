#!/usr/bin/env bash
# factory-upstream.sh - the Image Factory stand-in (factory-upstream.py): serves DIR/www on
# 127.0.0.1:PORT, always 200 and the whole file, Range ignored, like the factory.
# usage: factory-upstream.sh start DIR PORT     DIR/www served, DIR/access.log, DIR/server.log, DIR/pid
#        factory-upstream.sh stop DIR
#        factory-upstream.sh stats DIR          one line: requests gets heads get_bytes full_gets
#                                               cut_gets range_hdrs non200 get_secs_max
#        factory-upstream.sh reset DIR          truncate the access log
# env: RATE_MBPS=0 per-connection limit (MB/s), NO_LENGTH=1 close-delimited bodies
set -eu
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
usage() { echo "usage: ${0##*/} start DIR PORT | stop|stats|reset DIR" >&2; exit 2; }
[ $# -ge 2 ] || usage
d=$2
case $1 in
  stop) pid_stop "$d" factory-upstream.py; exit 0 ;;
  reset) [ ! -f "$d/access.log" ] || : >"$d/access.log"; exit 0 ;;
  stats)
    [ -f "$d/access.log" ] || die "no $d/access.log"
    exec python3 - "$d/access.log" <<'PY'
import sys
c = dict.fromkeys(["requests", "gets", "heads", "get_bytes", "full_gets", "cut_gets", "range_hdrs", "non200"], 0)
longest = 0.0
for line in open(sys.argv[1], errors="replace"):
    parts = line.split()
    if len(parts) < 5:
        continue
    method = parts[2]
    kv = dict(p.split("=", 1) for p in parts[4:] if "=" in p)
    c["requests"] += 1
    if kv.get("range") != '"-"':
        c["range_hdrs"] += 1
    if kv.get("status") != "200":
        c["non200"] += 1
    if method == "GET":
        c["gets"] += 1
        c["get_bytes"] += int(kv.get("bytes", 0))
        c["full_gets" if kv.get("end") == "done" else "cut_gets"] += 1
        longest = max(longest, float(kv.get("secs", 0)))
    elif method == "HEAD":
        c["heads"] += 1
print(" ".join("%s=%d" % kv for kv in c.items()) + " get_secs_max=%.3f" % longest)
PY
    ;;
  start) [ $# -eq 3 ] || usage ;;
  *) usage ;;
esac
need python3 curl
port=$3
case $port in ''|*[!0-9]*) die "bad PORT: $port" ;; esac
mkdir -p "$d/www"; d=$(cd "$d" && pwd)
if [ -f "$d/pid" ] && alive "$(cat "$d/pid")"; then die "already running: $d/pid"; fi
wait_port_free "$port" 30 || die "port $port is busy"
args=("$here/factory-upstream.py" "$d/www" "$port" "$d/access.log" --rate "${RATE_MBPS:-0}")
[ "${NO_LENGTH:-0}" = 1 ] && args+=(--no-length)
nohup python3 "${args[@]}" >>"$d/server.log" 2>&1 </dev/null &
echo $! >"$d/pid"
# anything answering (a 404 for /) means it is up
deadline=$(( $(date +%s) + 10 ))
while connect_refused "$port"; do
  if [ "$(date +%s)" -ge "$deadline" ] || ! alive "$(cat "$d/pid")"; then
    tail -n 5 "$d/server.log" >&2; pid_stop "$d" factory-upstream.py; die "did not come up on port $port"
  fi
  sleep 0.1
done
: >"$d/access.log"   # forget the readiness probes
echo "factory stand-in pid $(cat "$d/pid") on http://127.0.0.1:$port serving $d/www rate_mbps=${RATE_MBPS:-0} no_length=${NO_LENGTH:-0}"
