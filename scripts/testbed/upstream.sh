#!/usr/bin/env bash
# upstream.sh - the upstream registry of the tests and benchmarks: Debian's docker-registry
# (distribution 2.8) on 127.0.0.1, plain HTTP, no proxy.
# usage: upstream.sh start DIR PORT | upstream.sh stop DIR
#   DIR/data storage, DIR/access.log access log, DIR/registry.log app log, DIR/pid
set -eu
. "$(cd "$(dirname "$0")" && pwd)/lib.sh"
case ${1:-}:$# in
  start:3) registry_start "$2" "$3" ;;
  stop:2|stop:3) pid_stop "$2" docker-registry ;;
  *) echo "usage: ${0##*/} start DIR PORT | stop DIR" >&2; exit 2 ;;
esac
