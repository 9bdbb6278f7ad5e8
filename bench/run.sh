#!/usr/bin/env bash
# shellcheck disable=SC2046  # "set -- $(cmd)" splits on purpose
# run.sh - issue #3: tender vs docker-registry in proxy mode (registry:2 pull-through, as Cozystack
# runs it) vs nginx from disk (the ceiling), all in one run against docker-registry as upstream,
# plus the Image Factory case against nginx proxy_cache; writes BENCHMARKS.md (report.py).
# usage: bench/run.sh [WORKDIR]          (default: a new /tmp/tenderbench.XXXXXX)
#        SMOKE=1 bench/run.sh            small sizes, 1 rep, about a minute; writes WORKDIR/BENCHMARKS.md
# parts (PARTS="cold first factory hot"):
#   cold     cold fan-out of one SIZE_MB blob to N = FANOUT_NS clients (test bed fanout.sh: curl +
#            openssl sha256 per client) through tender, registry:2 and - the floors - nginx from
#            disk (same N) and one direct download from the upstream: wall time, upstream bytes
#            (upstream-bytes.sh on docker-registry's access log), VmHWM
#   first    the same blob behind a throttle (throttle.sh, RATE_MBPS per connection, ~5 s per
#            GiB): when does each of N clients (firstbyte.py) get its first BODY byte, compared
#            with one direct transfer through the throttle; tender, registry:2, nginx
#            proxy_cache + proxy_cache_lock
#   factory  one SIZE_MB Image Factory asset from factory-upstream.sh (200 only, Range ignored,
#            RATE_MBPS per connection): tender vs nginx-cache.sh variants (FACTORY_NGINX), floors
#            = one direct download and nginx-files.sh from disk; firstbyte.py --sha256 clients
#   hot      HOT_N clients, body discarded (VERIFY=0): tender vs registry:2 vs nginx, for the blob
#            and the asset; then RSS_N clients for VmHWM
# env: REPS=3 SIZE_MB=1024 RATE_MBPS=200 FANOUT_NS="1 8 32 64" FIRST_NS=$FANOUT_NS
#      FACTORY_NS=$FANOUT_NS FACTORY_NGINX="lock off slice" HOT_N=8 RSS_N=64
#      SETTLE_S=3 PORT_BASE=17100 (uses PORT_BASE .. PORT_BASE+8) MARGIN_GB=8 (free disk kept on top of what
#      a run writes; runs that would not fit are skipped and reported) BENCH_OUT=<repo>/BENCHMARKS.md
#      TENDER_BIN=<repo>/target/release/tender  HARNESS=<repo>/scripts/testbed  KEEP=1 (keep data)
# Everything it starts is stopped on exit. Raw results: WORKDIR/results.txt, logs in WORKDIR/logs.
set -eu
shopt -s inherit_errexit   # a failing command inside $(...) fails the substitution too
BENCH=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$BENCH")
H=${HARNESS:-$REPO/scripts/testbed}
[ -f "$H/lib.sh" ] || { echo "run.sh: no test bed at $H (set HARNESS=)" >&2; exit 1; }
. "$H/lib.sh"
need curl openssl nginx docker-registry skopeo jq python3 awk
export TENDER_BIN=${TENDER_BIN:-$REPO/target/release/tender}
[ -x "$TENDER_BIN" ] || die "no $TENDER_BIN: cargo build --release --bin tender"

SMOKE=${SMOKE:-0}
if [ "$SMOKE" = 1 ]; then
  D_SIZE=16 D_RATE=16 D_REPS=1 D_NS="1 4" D_FNGINX="lock" D_HOT=4 D_RSS=8 D_SETTLE=1
else
  D_SIZE=1024 D_RATE=200 D_REPS=3 D_NS="1 8 32 64" D_FNGINX="lock off slice" D_HOT=8 D_RSS=64 D_SETTLE=3
fi
REPS=${REPS:-$D_REPS} SIZE_MB=${SIZE_MB:-$D_SIZE} RATE_MBPS=${RATE_MBPS:-$D_RATE}
FANOUT_NS=${FANOUT_NS:-$D_NS}; FIRST_NS=${FIRST_NS:-$FANOUT_NS}; FACTORY_NS=${FACTORY_NS:-$FANOUT_NS}
FACTORY_NGINX=${FACTORY_NGINX:-$D_FNGINX} HOT_N=${HOT_N:-$D_HOT} RSS_N=${RSS_N:-$D_RSS}
PARTS=${PARTS:-cold first factory hot} MARGIN_GB=${MARGIN_GB:-8}
SETTLE_TICKS=$(( ${SETTLE_S:-$D_SETTLE} * 2 ))   # half-second ticks without change before a run counts as over
PB=${PORT_BASE:-17100}
UP_PORT=$PB THR_PORT=$((PB + 1)) TENDER_PORT=$((PB + 2)) REG2_PORT=$((PB + 3)) NSTATIC_PORT=$((PB + 4))
FUP_PORT=$((PB + 5)) NCACHE_PORT=$((PB + 6)) NFILES_PORT=$((PB + 7))

W=${1:-$(mktemp -d /tmp/tenderbench.XXXXXX)}
mkdir -p "$W/logs"; W=$(cd "$W" && pwd)
if [ "$SMOKE" = 1 ]; then OUT=${BENCH_OUT:-$W/BENCHMARKS.md}; else OUT=${BENCH_OUT:-$REPO/BENCHMARKS.md}; fi
UP=$W/upstream THR=$W/throttle TEN=$W/tender REG2=$W/registry2 NST=$W/nginx-static
FUP=$W/factory NCA=$W/nginx-cache NFI=$W/nginx-files IMG=$W/img
UPURL=http://127.0.0.1:$UP_PORT THRURL=http://127.0.0.1:$THR_PORT FUPURL=http://127.0.0.1:$FUP_PORT
RES=$W/results.txt; : >"$RES"
# a private copy: others may rebuild target/release/tender while this runs
cp "$TENDER_BIN" "$W/tender.bin"; TENDER_SRC=$TENDER_BIN; export TENDER_BIN=$W/tender.bin
SIZE=$((SIZE_MB * 1048576))
SCHEMATIC=$(printf 'tender-bench-schematic' | openssl dgst -sha256 -r | cut -c1-64)
PROBE_SCHEMATIC=$(printf 'tender-bench-probe' | openssl dgst -sha256 -r | cut -c1-64)
ASSET=/image/$SCHEMATIC/v1.10.5/openstack-amd64.raw.xz
PROBE_ASSET=/image/$PROBE_SCHEMATIC/v1.10.5/openstack-amd64.raw.xz

stop_all() {
  "$BENCH/tender-cache.sh" stop "$TEN" >/dev/null 2>&1 || true
  "$H/proxy-registry2.sh" stop "$REG2" >/dev/null 2>&1 || true
  "$H/nginx-cache.sh" stop "$NCA" >/dev/null 2>&1 || true
  "$H/nginx-static.sh" stop "$NST" >/dev/null 2>&1 || true
  "$BENCH/nginx-files.sh" stop "$NFI" >/dev/null 2>&1 || true
  "$BENCH/throttle.sh" stop "$THR" >/dev/null 2>&1 || true
  "$H/factory-upstream.sh" stop "$FUP" >/dev/null 2>&1 || true
  "$H/upstream.sh" stop "$UP" >/dev/null 2>&1 || true
}
cleanup() {
  stop_all
  [ -n "${KEEP:-}" ] || rm -rf "$UP/data" "$IMG" "$TEN" "$REG2" "$NCA" "$FUP/www" "$W/tender.bin"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

START=$(now)
rec() { echo "$* t=$(secs "$START" "$(now)")" | tee -a "$RES"; }   # t = seconds since the start
kv() { tr ' ' '\n' | sed -n "s/^$1=//p" | head -1; }           # value of KEY in a "k=v k=v" line
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", b - a}'; }
load() { echo "load1=$(cut -d' ' -f1 /proc/loadavg) rustc=$(pgrep -c -x rustc || true)"; }
avail_kb() { df -Pk "$W" | awk 'NR == 2 {print $4}'; }
hwm_of() { awk '/^VmHWM/{print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
# hwm_tree PID : VmHWM of PID plus its direct children (nginx: master + workers), in kB
hwm_tree() {
  local _s _c
  _s=$(hwm_of "$1")
  for _c in $(pgrep -P "$1" || true); do _s=$((_s + $(hwm_of "$_c"))); done
  echo "$_s"
}
# fits BYTES : true when BYTES more on disk still leave MARGIN_GB free
fits() { [ $(( $(avail_kb) - $1 / 1024 )) -ge $((MARGIN_GB * 1048576)) ]; }
# settle DIR UPLOG : wait (max 300 s) until for SETTLE_S (3) s the upstream log, the cache dir and (tender)
# the active fills stop changing and no cache thread is in D state; then fsync its files, so a
# cache's background fill or writeback is counted and does not overlap the next run
settle() {
  local _prev _same _n _pid _d _f _cur
  _prev='' _same=0 _n=0 _pid=$(cat "$1/pid" 2>/dev/null || echo 0)
  while [ "$_same" -lt "$SETTLE_TICKS" ] && [ "$_n" -lt 600 ]; do
    _d=$(cat /proc/"$_pid"/task/*/stat 2>/dev/null | awk '$3 == "D"' | wc -l)
    _f=0
    [ "$1" != "$TEN" ] || _f=$(curl -s --max-time 2 "http://127.0.0.1:$TENDER_PORT/metrics" | awk '$1 == "tender_fills_active" {print $2}')
    _cur="$(wc -c <"$2" 2>/dev/null || echo 0) $(du -sb "$(data_of "$1")" 2>/dev/null | cut -f1) $_d ${_f:-0}"
    if [ "$_cur" = "$_prev" ] && [ "$_d" = 0 ] && [ "${_f:-0}" = 0 ]; then _same=$((_same + 1)); else _same=0; fi
    _prev=$_cur; sleep 0.5; _n=$((_n + 1))
  done
  [ "$_same" -ge "$SETTLE_TICKS" ] || echo "settle: gave up after 300 s" >&2
  # flush the cache's files (not the whole machine's: others compile here) so its writeback
  # does not spill into the next run
  find "$(data_of "$1")" -type f -exec sync {} + 2>/dev/null || true
}
tender_metric() {  # tender_metric NAME : sum of a counter over its labels
  curl -s --max-time 5 "http://127.0.0.1:$TENDER_PORT/metrics" | awk -v n="$1" '$1 ~ "^"n"({|$)" {s += $2} END {printf "%.0f", s}'
}
# start_cache SYS UPSTREAM_URL : fresh (wiped) cache SYS on its port; prints its URL base
start_cache() {
  local _u
  case $1 in
    tender) "$BENCH/tender-cache.sh" stop "$TEN" >/dev/null; rm -rf "$TEN"
            "$BENCH/tender-cache.sh" start "$TEN" "$TENDER_PORT" "$2" >/dev/null || return 1
            echo "http://127.0.0.1:$TENDER_PORT" ;;
    reg2)   "$H/proxy-registry2.sh" stop "$REG2" >/dev/null; rm -rf "$REG2"
            "$H/proxy-registry2.sh" start "$REG2" "$REG2_PORT" "$2" >/dev/null || return 1
            echo "http://127.0.0.1:$REG2_PORT" ;;
    nginx-*) "$H/nginx-cache.sh" stop "$NCA" >/dev/null; rm -rf "$NCA"
            case $1 in
              nginx-lock) set -- "$1" "$2" LOCK=on LOCK_TIMEOUT=600s LOCK_AGE=600s ;;
              nginx-off) set -- "$1" "$2" LOCK=off ;;
              nginx-slice) set -- "$1" "$2" SLICE=8m ;;
              *) die "unknown system $1" ;;
            esac
            _u=$2; shift 2
            env "$@" "$H/nginx-cache.sh" start "$NCA" "$NCACHE_PORT" "$_u" >/dev/null || return 1
            echo "http://127.0.0.1:$NCACHE_PORT" ;;
    *) die "unknown system $1" ;;
  esac
}
# data_of DIR : the part of a cache dir that holds data (logs grow with every /metrics poll)
data_of() { case $1 in "$NCA") echo "$1/cache" ;; *) echo "$1/data" ;; esac; }
dir_of() { case $1 in tender) echo "$TEN" ;; reg2) echo "$REG2" ;; nginx-*) echo "$NCA" ;; esac; }
stop_cache() {
  case $1 in
    tender) cp "$TEN/tender.log" "$W/logs/$2.tender.log" 2>/dev/null || true
            "$BENCH/tender-cache.sh" stop "$TEN" >/dev/null; rm -rf "$TEN" ;;
    reg2)   cp "$REG2/registry.log" "$W/logs/$2.registry2.log" 2>/dev/null || true
            "$H/proxy-registry2.sh" stop "$REG2" >/dev/null; rm -rf "$REG2" ;;
    nginx-*) cp "$NCA/error.log" "$W/logs/$2.nginx-error.log" 2>/dev/null || true
            "$H/nginx-cache.sh" stop "$NCA" >/dev/null; rm -rf "$NCA" ;;
  esac
}
pid_of() { cat "$(dir_of "$1")/pid" 2>/dev/null || echo 0; }
# cpu_probe : the same CPU-bound job each time (1 s of sha256 on every core, MB/s summed): how
# much CPU others leave us (idle: nproc x the single-core speed)
cpu_probe() {
  openssl speed ${1:+-multi "$1"} -evp sha256 -seconds 1 -bytes 1048576 2>/dev/null | awk '$1 == "sha256" {sub(/k$/, "", $2); printf "%.0f", $2 / 1000}'
}

# ---------------------------------------------------------------- setup
echo "== workdir $W (results: $RES, report: $OUT)"
for p in $(seq "$PB" $((PB + 7))); do
  curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$p/" 2>/dev/null && die "port $p is in use (a leftover server? PORT_BASE=)"
  [ $? -eq 7 ] || die "port $p is in use (a leftover server? PORT_BASE=)"
done
need_bytes=$((SIZE * 7))
fits "$need_bytes" || die "not enough disk in $W for 7 x ${SIZE_MB} MiB + ${MARGIN_GB} GiB margin: $(df -h "$W" | tail -1)"
rec "env date=$(date -u +%FT%TZ) smoke=$SMOKE nproc=$(nproc) kernel=$(uname -r)" \
  "mem_total_mb=$(free -m | awk '/^Mem:/{print $2}') mem_avail_mb=$(free -m | awk '/^Mem:/{print $7}')" \
  "tender_rev=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo ?)$(git -C "$REPO" diff --quiet HEAD -- crates 2>/dev/null || echo +dirty)" \
  "tender_bin_mtime=$(date -u -d @"$(stat -c %Y "$TENDER_SRC")" +%FT%TZ) tender_bin_sha256=$(openssl dgst -sha256 -r "$TENDER_BIN" | cut -c1-12)" \
  "registry=$(docker-registry --version | awk '{print $3}') nginx=$(nginx -v 2>&1 | cut -d/ -f2)" \
  "python=$(python3 -c 'import platform; print(platform.python_version())') curl=$(curl --version | awk 'NR==1{print $2}')" \
  "size_mb=$SIZE_MB rate_mbps=$RATE_MBPS reps=$REPS fanout_ns=${FANOUT_NS// /,} first_ns=${FIRST_NS// /,}" \
  "factory_ns=${FACTORY_NS// /,} factory_nginx=${FACTORY_NGINX// /,} hot_n=$HOT_N rss_n=$RSS_N parts=${PARTS// /,}" \
  "cpu_ref_MBps=$(( $(cpu_probe) * $(nproc) )) df_avail_gb=$(( $(avail_kb) / 1048576 )) $(load) uptime=\"$(uptime | sed 's/^ *//')\""
free -h >"$W/logs/free.txt"; df -h "$W" >"$W/logs/df.txt"

"$H/upstream.sh" start "$UP" "$UP_PORT" >/dev/null
T0=$(now)
KUBELET_LAYERS_MB='' INSTALLER_LAYERS_MB='' BIG_MB=$SIZE_MB WORK=$IMG "$H/mkimages.sh" "127.0.0.1:$UP_PORT" >"$W/logs/mkimages.txt"
set -a
# shellcheck source=/dev/null  # written by mkimages.sh at run time
. "$IMG/images.env"
set +a
cp "$IMG/images.env" "$W/images.env"; rm -rf "$IMG"    # the layout is a second copy of the blob
rec "setup blob repo=$BIG_REPO digest=$BIG_DIGEST bytes=$BIG_SIZE mkimages_s=$(secs "$T0" "$(now)")"
"$H/nginx-static.sh" start "$NST" "$NSTATIC_PORT" "$UP/data" >/dev/null
RATE_MBPS=$RATE_MBPS "$BENCH/throttle.sh" start "$THR" "$THR_PORT" "$UPURL" >/dev/null

mkdir -p "$FUP/www$(dirname "$ASSET")" "$FUP/www$(dirname "$PROBE_ASSET")"
T0=$(now)
# incompressible content in a valid .xz container (tender checks an asset's container; mkxz.py
# stores the data uncompressed, so the file is SIZE + 0.005 %)
openssl enc -aes-256-ctr -pbkdf2 -nosalt -pass pass:tender-bench-asset </dev/zero 2>/dev/null |
  head -c "$SIZE" | python3 "$BENCH/mkxz.py" >"$FUP/www$ASSET"
head -c 1048576 "$FUP/www$ASSET" | python3 "$BENCH/mkxz.py" >"$FUP/www$PROBE_ASSET"
ASIZE=$(stat -c %s "$FUP/www$ASSET") PROBE_SIZE=$(stat -c %s "$FUP/www$PROBE_ASSET")
ASHA=$(openssl dgst -sha256 -r "$FUP/www$ASSET" | cut -d' ' -f1)
rec "setup asset path=$ASSET bytes=$ASIZE sha256=$ASHA image_s=$(secs "$T0" "$(now)")"
# The setup just wrote the blob and the asset: flush them now, or their writeback lands in the
# first measurement of a cache that writes (tender, registry:2) and not in the readers' (nginx,
# the direct download). Only these files: others may be compiling here.
T0=$(now)
find "$UP/data" "$FUP/www" -type f -exec sync {} + 2>/dev/null || true
rec "setup flush s=$(secs "$T0" "$(now)")"
RATE_MBPS=$RATE_MBPS "$H/factory-upstream.sh" start "$FUP" "$FUP_PORT" >/dev/null
"$BENCH/nginx-files.sh" start "$NFI" "$NFILES_PORT" "$FUP/www" >/dev/null
BLOB=/v2/$BIG_REPO/blobs/$BIG_DIGEST

# ---------------------------------------------------------------- part cold
# cold_run SYS N REP : one cold fan-out of the blob; SYS = tender | reg2 | nginx (static) | direct
cold_run() {
  local _sys _n _r _tag _pid _extra _url _l _o _s _h _u
  _sys=$1 _n=$2 _r=$3 _tag=cold-$1-n$2-r$3 _pid=0 _extra=''
  case $_sys in
    nginx)  _url=http://127.0.0.1:$NSTATIC_PORT; _pid=$(cat "$NST/pid") ;;
    direct) _url=$UPURL; _pid=$(cat "$UP/pid") ;;
    *)      if ! fits $((2 * BIG_SIZE)); then rec "skip part=cold sys=$_sys N=$_n rep=$_r reason=df avail_gb=$(( $(avail_kb) / 1048576 ))"; return; fi
            if ! _url=$(start_cache "$_sys" "$UPURL"); then rec "error part=cold sys=$_sys N=$_n rep=$_r reason=start-failed"; return; fi
            _pid=$(pid_of "$_sys") ;;
  esac
  "$H/upstream-bytes.sh" "$UP" reset
  _l=$(load)
  _o=$(EXPECT_BYTES=$BIG_SIZE "$H/fanout.sh" "$_url" "$BIG_REPO" "$BIG_DIGEST" "$_n" 2>&1) || true
  echo "$_o" >"$W/logs/$_tag.txt"; _s=$(echo "$_o" | tail -1)
  case $_sys in
    nginx) _h=$(hwm_tree "$_pid") ;;
    *) _h=$(hwm_of "$_pid") ;;
  esac
  case $_sys in tender|reg2) settle "$(dir_of "$_sys")" "$UP/access.log" ;; esac
  _u=$("$H/upstream-bytes.sh" "$UP" | head -1)
  [ "$_sys" != tender ] || _extra="tender_upstream_bytes=$(tender_metric tender_upstream_bytes_total) tender_fills=$(tender_metric tender_fills_started_total)"
  case $_sys in tender|reg2) stop_cache "$_sys" "$_tag" ;; esac
  rec "cold sys=$_sys N=$_n rep=$_r wall_s=$(echo "$_s" | kv wall_s) ok=$(echo "$_s" | kv ok) fail=$(echo "$_s" | kv fail)" \
    "agg_GiBps=$(echo "$_s" | kv agg_GiBps) up_gets=$(echo "$_u" | kv blob_gets) up_bytes=$(echo "$_u" | kv blob_bytes)" \
    "size=$BIG_SIZE vmhwm_kb=$_h $_extra $_l"
}
case " $PARTS " in *" cold "*)
for r in $(seq "$REPS"); do
  rec "probe part=cold rep=$r cpu_sha256_MBps=$(cpu_probe "$(nproc)") $(load)"
  cold_run direct 1 "$r"
  for n in $FANOUT_NS; do for sys in tender reg2 nginx; do cold_run "$sys" "$n" "$r"; done; done
done ;; esac

# ---------------------------------------------------------------- part first
# first_run SYS N REP : N clients (firstbyte.py, bodies counted, not hashed) through SYS in front
# of the throttle; SYS = tender | reg2 | nginx-lock | direct (the throttle itself, N=1)
first_run() {
  local _sys _n _r _tag _pid _extra _url _l _o _s _h _u
  _sys=$1 _n=$2 _r=$3 _tag=first-$1-n$2-r$3 _pid=0 _extra=''
  case $_sys in
    direct) _url=$THRURL ;;
    *)      if ! fits $((2 * BIG_SIZE)); then rec "skip part=first sys=$_sys N=$_n rep=$_r reason=df avail_gb=$(( $(avail_kb) / 1048576 ))"; return; fi
            if ! _url=$(start_cache "$_sys" "$THRURL"); then rec "error part=first sys=$_sys N=$_n rep=$_r reason=start-failed"; return; fi
            _pid=$(pid_of "$_sys") ;;
  esac
  "$H/upstream-bytes.sh" "$UP" reset
  _l=$(load)
  _o=$(python3 "$BENCH/firstbyte.py" "$_url$BLOB" "$_n" --expect-bytes "$BIG_SIZE" 2>&1) || true
  echo "$_o" >"$W/logs/$_tag.txt"; _s=$(echo "$_o" | tail -1)
  _h=0
  case $_sys in direct) ;; nginx-*) _h=$(hwm_tree "$_pid") ;; *) _h=$(hwm_of "$_pid") ;; esac
  [ "$_sys" = direct ] || settle "$(dir_of "$_sys")" "$UP/access.log"
  _u=$("$H/upstream-bytes.sh" "$UP" | head -1)
  [ "$_sys" != tender ] || _extra="tender_upstream_bytes=$(tender_metric tender_upstream_bytes_total) tender_fills=$(tender_metric tender_fills_started_total)"
  [ "$_sys" = direct ] || stop_cache "$_sys" "$_tag"
  rec "first sys=$_sys N=$_n rep=$_r wall_s=$(echo "$_s" | kv wall_s) ok=$(echo "$_s" | kv ok) fail=$(echo "$_s" | kv fail)" \
    "hdr_max_s=$(echo "$_s" | kv hdr_max_s) fbb_min_s=$(echo "$_s" | kv fbb_min_s) fbb_med_s=$(echo "$_s" | kv fbb_med_s)" \
    "fbb_max_s=$(echo "$_s" | kv fbb_max_s) sent_max_s=$(echo "$_s" | kv sent_max_s)" \
    "up_gets=$(echo "$_u" | kv blob_gets) up_bytes=$(echo "$_u" | kv blob_bytes)" \
    "size=$BIG_SIZE vmhwm_kb=$_h $_extra $_l"
}
case " $PARTS " in *" first "*)
for r in $(seq "$REPS"); do
  rec "probe part=first rep=$r cpu_sha256_MBps=$(cpu_probe "$(nproc)") $(load)"
  first_run direct 1 "$r"
  for n in $FIRST_NS; do for sys in tender reg2 nginx-lock; do first_run "$sys" "$n" "$r"; done; done
done ;; esac

# ---------------------------------------------------------------- part factory
# factory_ok : does tender serve /image/ yet? (a 1 MiB asset through a fresh tender)
factory_ok() {
  local _u _c
  _u=$(start_cache tender "$FUPURL") || return 1
  _c=$(curl -s -o /dev/null --max-time 60 -w '%{http_code} %{size_download}' "$_u$PROBE_ASSET" || true)
  stop_cache tender factory-probe
  "$H/factory-upstream.sh" reset "$FUP"
  echo "$_c" >"$W/logs/factory-probe.txt"
  [ "$_c" = "200 $PROBE_SIZE" ]
}
# factory_run SYS N REP : N clients (firstbyte.py --sha256) for the asset; SYS = tender |
# nginx-lock | nginx-off | nginx-slice | direct (the factory upstream, N=1) | files (nginx, disk)
factory_run() {
  local _sys _n _r _tag _pid _extra _url _l _o _s _h _u _need
  _sys=$1 _n=$2 _r=$3 _tag=factory-$1-n$2-r$3 _pid=0 _extra=''
  case $_sys in
    direct) _url=$FUPURL ;;
    files)  _url=http://127.0.0.1:$NFILES_PORT; _pid=$(cat "$NFI/pid") ;;
    *)      _need=$((2 * ASIZE))   # nginx without the lock (and slice, whose upstream ignores Range) writes one copy per client
            case $_sys in nginx-off|nginx-slice) _need=$((_n * ASIZE + ASIZE)) ;; esac
            if ! fits "$_need"; then
              rec "skip part=factory sys=$_sys N=$_n rep=$_r reason=df avail_gb=$(( $(avail_kb) / 1048576 )) need_gb=$(( _need / 1073741824 + MARGIN_GB ))"
              return
            fi
            if ! _url=$(start_cache "$_sys" "$FUPURL"); then rec "error part=factory sys=$_sys N=$_n rep=$_r reason=start-failed"; return; fi
            _pid=$(pid_of "$_sys") ;;
  esac
  "$H/factory-upstream.sh" reset "$FUP"
  _l=$(load)
  _o=$(python3 "$BENCH/firstbyte.py" "$_url$ASSET" "$_n" --expect-bytes "$ASIZE" --sha256 "$ASHA" 2>&1) || true
  echo "$_o" >"$W/logs/$_tag.txt"; _s=$(echo "$_o" | tail -1)
  case $_sys in direct) _h=0 ;; files|nginx-*) _h=$(hwm_tree "$_pid") ;; *) _h=$(hwm_of "$_pid") ;; esac
  case $_sys in direct|files) ;; *) settle "$(dir_of "$_sys")" "$FUP/access.log" ;; esac
  _u=$("$H/factory-upstream.sh" stats "$FUP")
  [ "$_sys" != tender ] || _extra="tender_upstream_bytes=$(tender_metric tender_upstream_bytes_total) tender_fills=$(tender_metric tender_fills_started_total)"
  case $_sys in direct|files) ;; *) stop_cache "$_sys" "$_tag" ;; esac
  rec "factory sys=$_sys N=$_n rep=$_r wall_s=$(echo "$_s" | kv wall_s) ok=$(echo "$_s" | kv ok) fail=$(echo "$_s" | kv fail)" \
    "hdr_max_s=$(echo "$_s" | kv hdr_max_s) fbb_min_s=$(echo "$_s" | kv fbb_min_s) fbb_med_s=$(echo "$_s" | kv fbb_med_s)" \
    "fbb_max_s=$(echo "$_s" | kv fbb_max_s) up_gets=$(echo "$_u" | kv gets) up_bytes=$(echo "$_u" | kv get_bytes)" \
    "up_full=$(echo "$_u" | kv full_gets) up_cut=$(echo "$_u" | kv cut_gets) size=$ASIZE vmhwm_kb=$_h $_extra $_l"
}
TENDER_FACTORY=0
case " $PARTS " in *" factory "*)
if factory_ok; then TENDER_FACTORY=1; fi
rec "factory_available tender=$TENDER_FACTORY probe=\"$(cat "$W/logs/factory-probe.txt")\""
for r in $(seq "$REPS"); do
  rec "probe part=factory rep=$r cpu_sha256_MBps=$(cpu_probe "$(nproc)") $(load)"
  factory_run direct 1 "$r"
  for n in $FACTORY_NS; do
    factory_run files "$n" "$r"
    [ "$TENDER_FACTORY" = 0 ] || factory_run tender "$n" "$r"
    for v in $FACTORY_NGINX; do factory_run "nginx-$v" "$n" "$r"; done
  done
done ;; esac

# ---------------------------------------------------------------- part hot
# hot_run SYS WHAT N REP URL PID : HOT_N (or RSS_N) clients, bodies discarded, through a warm SYS
hot_run() {
  local _o _s _h
  _o=$(VERIFY=0 EXPECT_BYTES=$7 "$H/fanout-url.sh" "$5" "$3" 2>&1) || true
  echo "$_o" >"$W/logs/hot-$2-$1-n$3-r$4.txt"; _s=$(echo "$_o" | tail -1)
  case $1 in nginx*) _h=$(hwm_tree "$6") ;; *) _h=$(hwm_of "$6") ;; esac
  rec "hot what=$2 sys=$1 N=$3 rep=$4 wall_s=$(echo "$_s" | kv wall_s) agg_GiBps=$(echo "$_s" | kv agg_GiBps)" \
    "ok=$(echo "$_s" | kv ok) fail=$(echo "$_s" | kv fail) vmhwm_kb=$_h $(load)"
}
case " $PARTS " in *" hot "*)
# registry blob: warm tender and registry:2 with one GET each (then settle); nginx serves the upstream's file
TU=$(start_cache tender "$UPURL"); curl -sS -o /dev/null "$TU$BLOB"; settle "$TEN" "$UP/access.log"
RU=$(start_cache reg2 "$UPURL"); curl -sS -o /dev/null "$RU$BLOB"; settle "$REG2" "$UP/access.log"
NU=http://127.0.0.1:$NSTATIC_PORT
"$H/upstream-bytes.sh" "$UP" reset
for r in $(seq "$REPS"); do
  rec "probe part=hot rep=$r cpu_sha256_MBps=$(cpu_probe "$(nproc)") $(load)"
  hot_run tender registry "$HOT_N" "$r" "$TU$BLOB" "$(pid_of tender)" "$BIG_SIZE"
  hot_run reg2 registry "$HOT_N" "$r" "$RU$BLOB" "$(pid_of reg2)" "$BIG_SIZE"
  hot_run nginx registry "$HOT_N" "$r" "$NU$BLOB" "$(cat "$NST/pid")" "$BIG_SIZE"
done
hot_run tender registry "$RSS_N" rss "$TU$BLOB" "$(pid_of tender)" "$BIG_SIZE"
hot_run reg2 registry "$RSS_N" rss "$RU$BLOB" "$(pid_of reg2)" "$BIG_SIZE"
hot_run nginx registry "$RSS_N" rss "$NU$BLOB" "$(cat "$NST/pid")" "$BIG_SIZE"
rec "hot_upstream what=registry $("$H/upstream-bytes.sh" "$UP" | head -1)"
stop_cache tender hot-registry; stop_cache reg2 hot-registry
# Image Factory asset: warm tender and nginx proxy_cache (lock); nginx-files serves the file
if [ "$TENDER_FACTORY" = 1 ]; then
  TU=$(start_cache tender "$FUPURL"); curl -sS -o /dev/null "$TU$ASSET"; settle "$TEN" "$FUP/access.log"
fi
CU=$(start_cache nginx-lock "$FUPURL"); curl -sS -o /dev/null "$CU$ASSET"; settle "$NCA" "$FUP/access.log"
FU=http://127.0.0.1:$NFILES_PORT
"$H/factory-upstream.sh" reset "$FUP"
for r in $(seq "$REPS"); do
  [ "$TENDER_FACTORY" = 0 ] || hot_run tender factory "$HOT_N" "$r" "$TU$ASSET" "$(pid_of tender)" "$ASIZE"
  hot_run nginx-lock factory "$HOT_N" "$r" "$CU$ASSET" "$(pid_of nginx-lock)" "$ASIZE"
  hot_run nginx factory "$HOT_N" "$r" "$FU$ASSET" "$(cat "$NFI/pid")" "$ASIZE"
done
[ "$TENDER_FACTORY" = 0 ] || hot_run tender factory "$RSS_N" rss "$TU$ASSET" "$(pid_of tender)" "$ASIZE"
rec "hot_upstream what=factory $("$H/factory-upstream.sh" stats "$FUP")"
[ "$TENDER_FACTORY" = 0 ] || stop_cache tender hot-factory
stop_cache nginx-lock hot-factory ;; esac

rec "end date=$(date -u +%FT%TZ) $(load) uptime=\"$(uptime | sed 's/^ *//')\""
stop_all
CMD="bench/run.sh"
[ "$SMOKE" != 1 ] || CMD="SMOKE=1 $CMD"
python3 "$BENCH/report.py" "$RES" "$OUT" "$CMD"
echo "== wrote $OUT"
