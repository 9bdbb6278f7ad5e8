#!/usr/bin/env bash
# nginx-files.sh - the ceiling for OS images: nginx + sendfile serving a directory as is, so
# /image/<schematic>/<version>/<asset> comes straight from the file factory-upstream.sh serves.
# (the test bed's nginx-static.sh does the same for a registry's blob layout.)
# usage: nginx-files.sh start|stop DIR PORT ROOT
#   start: config, logs and PID (DIR/pid) in DIR; ROOT e.g. FACTORYDIR/www
#   stop:  stops the nginx master whose PID is in DIR/pid
# env: NGINX_WORKERS=auto
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
. "${HARNESS:-$HERE/../scripts/testbed}/lib.sh"
usage() { echo "usage: $(basename "$0") start|stop DIR PORT ROOT" >&2; exit 2; }
[ $# -ge 2 ] || usage
D=$2
case $1 in
  stop) pid_stop "$D" nginx; exit 0 ;;
  start) [ $# -eq 4 ] || usage ;;
  *) usage ;;
esac
need nginx curl
PORT=$3
case $PORT in ''|*[!0-9]*) die "bad PORT: $PORT" ;; esac
mkdir -p "$D/tmp"; D=$(cd "$D" && pwd); ROOT=$(cd "$4" && pwd)
if [ -f "$D/pid" ] && alive "$(cat "$D/pid")"; then die "already running: $D/pid"; fi
wait_port_free "$PORT" 30 || die "port $PORT is busy"
USER_LINE=; [ "$(id -u)" != 0 ] || USER_LINE="user root root;"
cat >"$D/nginx.conf" <<EOF
$USER_LINE
worker_processes ${NGINX_WORKERS:-auto};
pid $D/pid;
error_log $D/error.log warn;
events { worker_connections 4096; }
http {
  access_log $D/access.log combined;
  sendfile on; tcp_nopush on;
  client_body_temp_path $D/tmp/body; proxy_temp_path $D/tmp/proxy;
  fastcgi_temp_path $D/tmp/fcgi; uwsgi_temp_path $D/tmp/uwsgi; scgi_temp_path $D/tmp/scgi;
  server {
    listen 127.0.0.1:$PORT;
    default_type application/octet-stream;
    location = /.health { access_log off; return 200 "ok\n"; }
    location / { root $ROOT; }
  }
}
EOF
nginx -c "$D/nginx.conf" -p "$D" -e "$D/error.log"
wait_http "http://127.0.0.1:$PORT/.health" 10 || die "nginx on port $PORT did not come up (see $D/error.log)"
echo "nginx pid $(cat "$D/pid") on http://127.0.0.1:$PORT serving $ROOT"
