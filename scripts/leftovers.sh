#!/usr/bin/env bash
# scripts/leftovers.sh MARK - the processes a test run left behind: every process whose environment
# holds TENDER_TEST_RUN=MARK (scripts/test.sh exports it, so everything the tests start inherits it:
# tender, docker-registry, containerd and its shims, weed, nginx, nbdkit, qemu, chromium, …), other
# than this script and its own children. Each is listed (pid, command line) and then ended by its
# pid (SIGTERM, SIGKILL after 5 s), so the next run finds the machine clean; exit 1 if there was any.
set -uo pipefail
MARK=${1:?usage: leftovers.sh MARK}
me=$$

# ppid PID: the parent of PID (field 4 of /proc/PID/stat, after the parenthesised command name)
ppid() {
  local s
  { read -r s <"/proc/$1/stat"; } 2>/dev/null || return 1
  s=${s##*) }
  # shellcheck disable=SC2086 # split into fields on purpose
  set -- $s
  echo "$2"
}

found=()
for d in /proc/[0-9]*; do
  pid=${d#/proc/}
  [ "$pid" = "$me" ] && continue
  [ "$(ppid "$pid")" = "$me" ] && continue   # this script's own tr, grep, cat
  { tr '\0' '\n' <"$d/environ"; } 2>/dev/null | grep -qxF "TENDER_TEST_RUN=$MARK" || continue
  found+=("$pid")
done
[ "${#found[@]}" -eq 0 ] && exit 0

echo "leftovers.sh: ${#found[@]} process(es) the tests started still run:" >&2
for pid in "${found[@]}"; do
  echo "  $pid $({ tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | cut -c1-300)" >&2
done
kill -TERM "${found[@]}" 2>/dev/null
for _ in $(seq 50); do
  alive=()
  for pid in "${found[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
  [ "${#alive[@]}" -eq 0 ] && break
  sleep 0.1
done
[ "${#alive[@]}" -eq 0 ] || kill -KILL "${alive[@]}" 2>/dev/null
exit 1
