#!/usr/bin/env bash
# proxy-registry2.sh - the peer cache: docker-registry in pull-through mode (proxy.remoteurl),
# what registry:2 as a mirror does (Cozystack's default). Same layout as upstream.sh.
# usage: proxy-registry2.sh start DIR PORT UPSTREAM_URL | proxy-registry2.sh stop DIR
set -eu
. "$(cd "$(dirname "$0")" && pwd)/lib.sh"
case ${1:-}:$# in
  start:4) registry_start "$2" "$3" "$4" ;;
  stop:2|stop:3|stop:4) pid_stop "$2" docker-registry ;;
  *) echo "usage: ${0##*/} start DIR PORT UPSTREAM_URL | stop DIR" >&2; exit 2 ;;
esac
