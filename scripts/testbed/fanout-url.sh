#!/usr/bin/env bash
# fanout-url.sh - N clients GET one URL at the same time (curl), each body hashed (openssl) or
# discarded; the per-client results and one summary line.
# usage: fanout-url.sh URL N
# env: EXPECT_SHA256=  hex digest every body must have (required unless VERIFY=0)
#      EXPECT_BYTES=   size every body must have (optional)
#      VERIFY=1        0 = discard bodies unhashed and check only the size (throughput runs)
#      RATE=           per-client curl --limit-rate, e.g. 50M
#      MAXTIME=900     per-client limit in seconds
#      WATCH_PID=      add vmhwm_kb (that process's peak RSS) to the summary
#      FANOUT_KEEP=DIR keep the per-client files there (not KEEP: the benchmarks pass KEEP=1 for their data)
# output: "client I: ok|fail rc= http= bytes= time_s= ttfb_s= sha256=ok|BAD|-" per client, then
#   "fanout N= wall_s= ok= fail= bytes= agg_GiBps= ttfb_min_s= ttfb_med_s= ttfb_max_s= [vmhwm_kb=]"
# exit 1 when any client failed (curl error, not 200, wrong size or digest).
set -eu
. "$(cd "$(dirname "$0")" && pwd)/lib.sh"
[ $# -eq 2 ] || { echo "usage: ${0##*/} URL N" >&2; exit 2; }
url=$1 n=$2
loopback_only "$url"
case $n in ''|*[!0-9]*|0) die "N must be a positive number, not '$n'" ;; esac
need curl openssl python3
VERIFY=${VERIFY:-1} MAXTIME=${MAXTIME:-900}
[ "$VERIFY" = 0 ] || [ -n "${EXPECT_SHA256:-}" ] || die "VERIFY=1 needs EXPECT_SHA256"
if [ -n "${FANOUT_KEEP:-}" ]; then
  # A kept directory may hold an earlier run's files: never read those as this run's results.
  out=$FANOUT_KEEP; mkdir -p "$out"; rm -f "$out"/[0-9]*.stats "$out"/[0-9]*.err "$out"/[0-9]*.rc "$out"/[0-9]*.sha "$out"/[0-9]*.body
else
  out=$(mktemp -d /tmp/fanout.XXXXXX)
fi
trap '[ -n "${FANOUT_KEEP:-}" ] || rm -rf "$out"' EXIT

# client I: curl's stats (one line) go to I.stats, its exit code to I.rc, the digest to I.sha
client() {
  local fmt='%{http_code} %{size_download} %{time_total} %{time_starttransfer}\n' rc=0
  local args=(-sS --max-time "$MAXTIME" -w "$fmt" ${RATE:+--limit-rate "$RATE"})
  if [ "$VERIFY" = 0 ]; then
    curl "${args[@]}" -o /dev/null "$url" >"$out/$1.stats" 2>"$out/$1.err" || rc=$?
    echo "$rc" >"$out/$1.rc"
  else
    # the body goes through a fifo into openssl; curl's -w line stays on stdout
    mkfifo "$out/$1.body"
    openssl dgst -sha256 -r <"$out/$1.body" | cut -d' ' -f1 >"$out/$1.sha" &
    curl "${args[@]}" -o "$out/$1.body" "$url" >"$out/$1.stats" 2>"$out/$1.err" || rc=$?
    echo "$rc" >"$out/$1.rc"
    wait
  fi
}

t0=$(now)
for i in $(seq 1 "$n"); do client "$i" & done
wait
t1=$(now)

python3 - "$out" "$n" "$t0" "$t1" "$VERIFY" "${EXPECT_SHA256:-}" "${EXPECT_BYTES:-}" "${WATCH_PID:-}" <<'PY'
import os, statistics, sys
out, n, t0, t1, verify, want_sha, want_bytes, watch = sys.argv[1:]
n, wall = int(n), float(t1) - float(t0)

def read(path, default=""):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default

ok = fail = total = 0
ttfbs = []
for i in range(1, n + 1):
    rc = read("%s/%d.rc" % (out, i), "?")
    fields = (read("%s/%d.stats" % (out, i)).splitlines() or [""])[-1].split()
    code, size, secs, ttfb = (fields + ["000", "0", "0", "0"][len(fields):])[:4]
    good = rc == "0" and code == "200" and (not want_bytes or size == want_bytes)
    sha = "-"
    if verify != "0":
        sha = "ok" if read("%s/%d.sha" % (out, i)) == want_sha else "BAD"
        good = good and sha == "ok"
    err = read("%s/%d.err" % (out, i)).splitlines()
    note = ' err="%s"' % err[0] if err else ""
    print("client %d: %s rc=%s http=%s bytes=%s time_s=%s ttfb_s=%s sha256=%s%s"
          % (i, "ok" if good else "fail", rc, code, size, secs, ttfb, sha, note))
    ok, fail = ok + good, fail + (not good)
    total += int(size) if size.isdigit() else 0
    if code != "000":
        ttfbs.append(float(ttfb))
if ttfbs:
    t = "ttfb_min_s=%.3f ttfb_med_s=%.3f ttfb_max_s=%.3f" % (min(ttfbs), statistics.median(ttfbs), max(ttfbs))
else:
    t = "ttfb_min_s=- ttfb_med_s=- ttfb_max_s=-"
hwm = ""
if watch:
    for line in read("/proc/%s/status" % watch).splitlines():
        if line.startswith("VmHWM:"):
            hwm = " vmhwm_kb=" + line.split()[1]
print("fanout N=%d wall_s=%.3f ok=%d fail=%d bytes=%d agg_GiBps=%.3f %s%s"
      % (n, wall, ok, fail, total, total / wall / 2**30 if wall > 0 else 0, t, hwm))
sys.exit(1 if fail else 0)
PY
