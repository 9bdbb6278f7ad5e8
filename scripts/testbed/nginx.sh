# shellcheck shell=bash
# nginx.sh - run an nginx of the test bed (sourced by nginx-static.sh and nginx-cache.sh):
#   nginx_run DIR HEALTH_URL HTTP_BLOCK   writes DIR/nginx.conf around HTTP_BLOCK (the directives
#   inside http { }), checks it, starts nginx (master PID in DIR/pid, errors in DIR/error.log)
#   and waits until HEALTH_URL answers.
nginx_run() {
  local dir=$1 health=$2 body=$3 user=
  need nginx curl
  # as root the workers run as root too, so they read the 0700 temporary directories of the tests
  [ "$(id -u)" != 0 ] || user="user root root;"
  mkdir -p "$dir/tmp"
  cat >"$dir/nginx.conf" <<CONF
$user
worker_processes ${NGINX_WORKERS:-auto};
pid $dir/pid;
error_log $dir/error.log ${NGINX_ERROR_LEVEL:-warn};
events { worker_connections 4096; }
http {
  sendfile on;
  tcp_nopush on;
  client_body_temp_path $dir/tmp/body;
  proxy_temp_path $dir/tmp/proxy;
  fastcgi_temp_path $dir/tmp/fastcgi;
  uwsgi_temp_path $dir/tmp/uwsgi;
  scgi_temp_path $dir/tmp/scgi;
$body
}
CONF
  nginx -t -q -c "$dir/nginx.conf" -p "$dir" -e "$dir/error.log" || die "bad config $dir/nginx.conf (see $dir/error.log)"
  nginx -c "$dir/nginx.conf" -p "$dir" -e "$dir/error.log"
  wait_http "$health" 10 || die "nginx did not come up at $health (see $dir/error.log)"
}
