#!/usr/bin/env bash
# throttle.sh - a WAN-like link in front of an upstream: nginx reverse proxy, unbuffered, with a
# per-connection send limit, so a 1 GiB blob from docker-registry takes about 5 s per transfer.
# usage: throttle.sh start|stop DIR PORT UPSTREAM_URL
#   start: listens on http://127.0.0.1:PORT, forwards everything to UPSTREAM_URL (Host, Range and
#          the rest passed through; no buffering, no caching); config, logs, PID (DIR/pid) in DIR
#   stop:  stops the nginx master whose PID is in DIR/pid
# env: RATE_MBPS=200   per-connection limit in MB/s (10^6 bytes), like factory-upstream.sh
#      NGINX_WORKERS=1
# The upstream's own access log still counts what it sent (upstream-bytes.sh works unchanged).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
. "${HARNESS:-$HERE/../scripts/testbed}/lib.sh"
usage() { echo "usage: $(basename "$0") start|stop DIR PORT UPSTREAM_URL" >&2; exit 2; }
[ $# -ge 2 ] || usage
D=$2
case $1 in
  stop) pid_stop "$D" nginx; exit 0 ;;
  start) [ $# -eq 4 ] || usage ;;
  *) usage ;;
esac
need nginx curl
PORT=$3 UP=${4%/}
loopback_only "$UP"
case $PORT in ''|*[!0-9]*) die "bad PORT: $PORT" ;; esac
RATE=$(awk -v r="${RATE_MBPS:-200}" 'BEGIN { printf "%.0f", r * 1000000 }')
mkdir -p "$D/tmp"; D=$(cd "$D" && pwd)
if [ -f "$D/pid" ] && alive "$(cat "$D/pid")"; then die "already running: $D/pid"; fi
wait_port_free "$PORT" 30 || die "port $PORT is busy"
USER_LINE=; [ "$(id -u)" != 0 ] || USER_LINE="user root root;"
cat >"$D/nginx.conf" <<EOF
$USER_LINE
worker_processes ${NGINX_WORKERS:-1};
pid $D/pid;
error_log $D/error.log warn;
events { worker_connections 4096; }
http {
  access_log $D/access.log combined;
  client_body_temp_path $D/tmp/body; proxy_temp_path $D/tmp/proxy;
  fastcgi_temp_path $D/tmp/fcgi; uwsgi_temp_path $D/tmp/uwsgi; scgi_temp_path $D/tmp/scgi;
  client_max_body_size 0;
  server {
    listen 127.0.0.1:$PORT;
    location / {
      proxy_pass $UP;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host \$http_host;
      proxy_buffering on; proxy_max_temp_file_size 0; proxy_buffers 8 256k;
      proxy_request_buffering off;
      proxy_read_timeout 600s;
      limit_rate $RATE;
    }
  }
}
EOF
nginx -t -q -c "$D/nginx.conf" -p "$D" -e "$D/error.log" || die "bad config $D/nginx.conf"
nginx -c "$D/nginx.conf" -p "$D" -e "$D/error.log"
n=0
until curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$PORT/" 2>/dev/null; do
  n=$((n + 1)); [ "$n" -le 100 ] || die "throttle on port $PORT did not come up (see $D/error.log)"
  sleep 0.1
done
echo "throttle pid $(cat "$D/pid") on http://127.0.0.1:$PORT -> $UP rate=${RATE} B/s per connection"
