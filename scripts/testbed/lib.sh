# shellcheck shell=bash
# lib.sh - helpers for the test bed scripts and bench/ (sourced, not run).
#   . "$(dirname "$0")/lib.sh"
# Every server the bed starts listens on 127.0.0.1 and keeps its state, logs and PID in one
# directory; stop_pidfile stops it again. Functions: die need loopback_only alive wait_port_free
# wait_http pid_stop now.

die() { printf '%s: %s\n' "${0##*/}" "$*" >&2; exit 1; }

# need CMD... : every command must exist; the hint names the Debian packages (scripts/test.sh)
need() {
  local c
  for c in "$@"; do
    command -v "$c" >/dev/null 2>&1 || die "$c is not installed (scripts/test.sh lists and installs the packages)"
  done
}

# loopback_only URL|HOST[:PORT] : nothing the bed starts or measures may leave the machine
loopback_only() {
  local host=${1#*://}
  host=${host%%/*}
  host=${host%:*}
  case $host in
    127.*|localhost) ;;
    *) die "not a loopback address: $1" ;;
  esac
}

# alive PID : the process exists and is not a zombie whose threads are all gone (a process
# whose main thread exited keeps its sockets while another thread still runs, e.g. in fsync)
alive() {
  local st
  [ -n "${1:-}" ] || return 1
  st=$(awk '/^State:/ {print $2}' "/proc/$1/status" 2>/dev/null) || return 1
  [ -n "$st" ] || return 1
  [ "$st" != Z ] && return 0
  [ "$(find "/proc/$1/task" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)" -gt 1 ]
}

# connect_refused PORT : true when nothing accepts on 127.0.0.1:PORT (curl exit 7)
connect_refused() {
  local rc=0
  curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$1/" 2>/dev/null || rc=$?
  [ "$rc" -eq 7 ]
}

# wait_port_free PORT [SECONDS=30]
wait_port_free() {
  local deadline=$(( $(date +%s) + ${2:-30} ))
  until connect_refused "$1"; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}

# wait_http URL [SECONDS=20] : until URL answers 2xx
wait_http() {
  local deadline=$(( $(date +%s) + ${2:-20} ))
  until curl -fsS -o /dev/null --max-time 2 "$1" 2>/dev/null; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}

# pid_stop DIR PATTERN : stop the process in DIR/pid if its command line still matches PATTERN
# (a grep regex; a PID reused by something else is left alone): TERM, KILL after 10 s, then
# wait until it is gone
pid_stop() {
  local pid i=0
  [ -f "$1/pid" ] || return 0
  pid=$(cat "$1/pid")
  if alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$2"; then
    kill -TERM "$pid" 2>/dev/null || true
    while alive "$pid" && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    alive "$pid" && kill -KILL "$pid" 2>/dev/null
    while alive "$pid" && [ $i -lt 700 ]; do sleep 0.1; i=$((i + 1)); done
  fi
  rm -f "$1/pid"
}

# now : wall-clock seconds with nanoseconds
now() { date +%s.%N; }

# registry_start DIR PORT [REMOTE_URL] : docker-registry (distribution 2.8) on 127.0.0.1:PORT,
# storage DIR/data; with REMOTE_URL a pull-through cache (proxy.remoteurl, = registry:2 as a
# mirror). Access log (stdout, Apache combined format) DIR/access.log, app log DIR/registry.log.
registry_start() {
  local dir=$1 port=$2 remote=${3:-} pid
  need docker-registry curl
  if [ -f "$dir/pid" ] && alive "$(cat "$dir/pid")"; then die "already running: $dir/pid"; fi
  wait_port_free "$port" 30 || die "port $port is busy"
  mkdir -p "$dir/data"
  dir=$(cd "$dir" && pwd)
  {
    printf 'version: 0.1\n'
    printf 'log: {level: %s, formatter: text, accesslog: {disabled: false}}\n' "${REG_LOG_LEVEL:-info}"
    printf 'storage:\n  filesystem: {rootdirectory: %s}\n' "$dir/data"
    printf '  cache: {blobdescriptor: inmemory}\n  delete: {enabled: true}\n'
    printf 'http: {addr: "127.0.0.1:%s", secret: "testbed-%s"}\n' "$port" "$port"
    printf 'health: {storagedriver: {enabled: false}}\n'
    if [ -n "$remote" ]; then
      loopback_only "$remote"
      printf 'proxy: {remoteurl: "%s"}\n' "$remote"
    fi
  } >"$dir/config.yml"
  # appending (O_APPEND) lets upstream-bytes.sh truncate the log while the registry runs
  nohup docker-registry serve "$dir/config.yml" >>"$dir/access.log" 2>>"$dir/registry.log" </dev/null &
  pid=$!
  echo "$pid" >"$dir/pid"
  if ! wait_http "http://127.0.0.1:$port/v2/" 20 || ! alive "$pid"; then
    tail -n 5 "$dir/registry.log" >&2
    pid_stop "$dir" docker-registry
    die "docker-registry did not come up on port $port"
  fi
  echo "docker-registry pid $pid on http://127.0.0.1:$port${remote:+ mirroring $remote}, state in $dir"
}
