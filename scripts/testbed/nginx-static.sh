#!/usr/bin/env bash
# nginx-static.sh - the ceiling: nginx with sendfile serving a docker-registry's blob files at the
# URLs a cache answers (/v2/REPO/blobs/sha256:HEX), straight from the registry's storage.
# usage: nginx-static.sh start DIR PORT REGISTRY_DATA_DIR | nginx-static.sh stop DIR
#   REGISTRY_DATA_DIR: the registry's rootdirectory (upstream.sh's DIR/data)
#   DIR/nginx.conf, DIR/access.log (combined format), DIR/error.log, DIR/pid
# env: NGINX_WORKERS=auto
set -eu
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
. "$here/nginx.sh"
case ${1:-}:$# in
  stop:*) [ $# -ge 2 ] || exit 2; pid_stop "$2" nginx; exit 0 ;;
  start:4) ;;
  *) echo "usage: ${0##*/} start DIR PORT REGISTRY_DATA_DIR | stop DIR" >&2; exit 2 ;;
esac
mkdir -p "$2"
dir=$(cd "$2" && pwd) port=$3
blobs=$(cd "$4" && pwd)/docker/registry/v2/blobs/sha256
if [ -f "$dir/pid" ] && alive "$(cat "$dir/pid")"; then die "already running: $dir/pid"; fi
wait_port_free "$port" 30 || die "port $port is busy"
# distribution's layout: blobs/sha256/<first two hex digits>/<hex>/data
nginx_run "$dir" "http://127.0.0.1:$port/v2/" "
  access_log $dir/access.log combined;
  server {
    listen 127.0.0.1:$port;
    default_type application/octet-stream;
    location = /v2/ { return 200 '{}'; }
    location ~ \"^/v2/.+/blobs/sha256:(?<hex>(?<pre>[0-9a-f]{2})[0-9a-f]{62})\$\" {
      alias $blobs/\$pre/\$hex/data;
    }
  }"
echo "nginx pid $(cat "$dir/pid") on http://127.0.0.1:$port serving $blobs"
