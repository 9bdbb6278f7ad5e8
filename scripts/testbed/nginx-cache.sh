#!/usr/bin/env bash
# nginx-cache.sh - the cache an operator would otherwise put in front of the Image Factory: nginx
# proxy_cache (optionally with proxy_cache_lock and the slice module).
# usage: nginx-cache.sh start DIR PORT UPSTREAM_URL | nginx-cache.sh stop DIR
#   cache in DIR/cache, DIR/nginx.conf, DIR/access.log, DIR/error.log (level info: lock timeouts
#   and cut upstreams show there), DIR/pid; GET /.nginx-cache/health answers 200 without the cache
# env: LOCK=off|on        proxy_cache_lock: one request fills, the others wait
#      LOCK_TIMEOUT=5s    a waiter then goes upstream itself, uncached (nginx's default)
#      LOCK_AGE=5s        a fill older than this lets one more request go upstream
#      SLICE=0|8m         the slice module: cache key and upstream Range per slice, 206 cached
#      FORCE_RANGES=off   on: ranges from cached responses that had no Accept-Ranges
#      VALID=7d MAX_SIZE=20g NGINX_WORKERS=auto
#      NGINX_EXTRA=       more directives for the proxied location
# access log: TIME "REQUEST" range=".." status= bytes= cache= up_status= up_bytes= rt= up_rt= up_ht= slice=
set -eu
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
. "$here/nginx.sh"
case ${1:-}:$# in
  stop:*) [ $# -ge 2 ] || exit 2; pid_stop "$2" nginx; exit 0 ;;
  start:4) ;;
  *) echo "usage: ${0##*/} start DIR PORT UPSTREAM_URL | stop DIR" >&2; exit 2 ;;
esac
port=$3 up=${4%/}
loopback_only "$up"
case $port in ''|*[!0-9]*) die "bad PORT: $port" ;; esac
lock=${LOCK:-off} force=${FORCE_RANGES:-off} slice=${SLICE:-0}
case $lock:$force in on:on|on:off|off:on|off:off) ;; *) die "LOCK and FORCE_RANGES are on or off" ;; esac
if [ "$slice" != 0 ] && ! nginx -V 2>&1 | grep -q -- --with-http_slice_module; then
  die "this nginx has no slice module (nginx -V)"
fi
mkdir -p "$2/cache"
dir=$(cd "$2" && pwd)
if [ -f "$dir/pid" ] && alive "$(cat "$dir/pid")"; then die "already running: $dir/pid"; fi
wait_port_free "$port" 30 || die "port $port is busy"
key='$scheme$proxy_host$request_uri' codes=200 slicing=
if [ "$slice" != 0 ]; then
  key='$scheme$proxy_host$request_uri$slice_range' codes="200 206"
  slicing="slice $slice; proxy_set_header Range \$slice_range;"
fi
NGINX_ERROR_LEVEL=info nginx_run "$dir" "http://127.0.0.1:$port/.nginx-cache/health" "
  log_format cache '\$time_iso8601 \"\$request\" range=\"\$http_range\" status=\$status bytes=\$body_bytes_sent '
                   'cache=\$upstream_cache_status up_status=\$upstream_status up_bytes=\$upstream_bytes_received '
                   'rt=\$request_time up_rt=\$upstream_response_time up_ht=\$upstream_header_time slice=\$slice_range';
  access_log $dir/access.log cache;
  proxy_cache_path $dir/cache levels=1:2 keys_zone=factory:10m max_size=${MAX_SIZE:-20g} inactive=30d use_temp_path=off;
  server {
    listen 127.0.0.1:$port;
    location = /.nginx-cache/health { access_log off; return 200 \"ok\n\"; }
    location / {
      proxy_pass $up;
      proxy_cache factory;
      proxy_cache_key $key;
      proxy_cache_valid $codes ${VALID:-7d};
      proxy_cache_lock $lock;
      proxy_cache_lock_timeout ${LOCK_TIMEOUT:-5s};
      proxy_cache_lock_age ${LOCK_AGE:-5s};
      proxy_force_ranges $force;
      $slicing
      add_header X-Cache-Status \$upstream_cache_status always;
      ${NGINX_EXTRA:-}
    }
  }"
echo "nginx cache pid $(cat "$dir/pid") on http://127.0.0.1:$port -> $up lock=$lock slice=$slice force_ranges=$force"
