#!/usr/bin/env bash
# shellcheck disable=SC2086  # option strings are split on purpose
# shellcheck disable=SC2153  # TAG_PATH, DIGEST_PATH, ... come from small.env (small_setup.py)
# small.sh - issue 23: small requests and TLS. tender side by side with nginx (sendfile, plain and
# TLS on the same certificate) and registry:2 (docker-registry in proxy mode), in one run, against
# docker-registry as the upstream; writes the "Small requests and TLS (issue 23)" section of
# BENCHMARKS.md (small_report.py).
# usage: bench/small.sh [--quick] [WORKDIR]      (default: a new /tmp/tendersmall.XXXXXX)
#   --quick: 1 repetition, 3 s per load run, a 256 MiB big blob, 3 s hold: checks the plumbing;
#            writes WORKDIR/BENCHMARKS.md unless BENCH_OUT is set
# What one repetition measures (servers on core SRV_CPU, every client on core GEN_CPU, taskset):
#   rss       a fresh tender and a fresh nginx, IDLE_N (10,000) keep-alive connections opened by
#             idle.py, one GET of a small blob on each, then held HOLD_S s: VmRSS / VmHWM
#   small     wrk (small.lua: GET rotating over N_BLOBS distinct 1-4 KiB blobs), plain HTTP/1.1
#             (tender, nginx, registry:2) and TLS HTTP/1.1 (tender, nginx), CONNS connections each
#   h2        h2load over TLS (ALPN h2, 1 stream per connection) over the same blobs (tender, nginx)
#   manifest  the image manifest by tag and by digest: GET with wrk, HEAD with ab (wrk cannot do
#             HEAD), plain HTTP, CONNS connections (tender, nginx, registry:2)
#   auth      the small hits through a tender with client auth on (a bearer token; Basic, whose
#             bcrypt check is paid once and then answered from the verified-credential cache)
#   big       a BIG_MB (1024) blob over TLS (HTTP/1.1) to 8 curl clients at once, time to the last
# Any socket error, timeout or status >= 400 in a run marks that run failed (ok=0).
# env: REPS=3 DUR=5 (seconds per load run) CONNS="64 512" N_BLOBS=1000 MIN_B=1024 MAX_B=4096
#      BIG_MB=1024 BIG_CLIENTS=8 IDLE_N=10000 HOLD_S=5 SRV_CPU=0 GEN_CPU=1 PORT_BASE=17200
#      SETTLE_MAX=30 (each load run first waits, at most this long, for the servers' core to idle)
#      (uses PORT_BASE .. +7) PARTS="rss small h2 manifest auth big" REG2=1 (0: no registry:2)
#      (tender's cache.memory is a quarter of the small blobs' bytes)
#      TENDER_BIN=<repo>/target/release/tender BENCH_OUT=<repo>/BENCHMARKS.md KEEP=1 (keep the data)
#      BIG_PROTOS="tls" (any of plain tls h2: the big part over each); EXTRA_LIMITS="sendBuffer: 0"
#      (one more line under every tender's limits:)
#      SIGNED=1: the manifest is cosign-signed and every tender verifies it (imageVerification):
#      the manifest hits then read a stored verdict (issue 34 (3))
# Raw results: WORKDIR/results.txt; client output in WORKDIR/logs; server logs in their directories.
set -eu
shopt -s inherit_errexit
BENCH=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$BENCH")
H=${HARNESS:-$REPO/scripts/testbed}
. "$H/lib.sh"
need wrk h2load ab nginx docker-registry openssl curl python3 taskset htpasswd
QUICK=0
if [ "${1:-}" = --quick ]; then QUICK=1; shift; fi
if [ "$QUICK" = 1 ]; then D_REPS=1 D_DUR=3 D_BIG=256 D_HOLD=3; else D_REPS=3 D_DUR=5 D_BIG=1024 D_HOLD=5; fi
REPS=${REPS:-$D_REPS} DUR=${DUR:-$D_DUR} BIG_MB=${BIG_MB:-$D_BIG} HOLD_S=${HOLD_S:-$D_HOLD}
CONNS=${CONNS:-64 512} N_BLOBS=${N_BLOBS:-1000} MIN_B=${MIN_B:-1024} MAX_B=${MAX_B:-4096}
BIG_CLIENTS=${BIG_CLIENTS:-8} IDLE_N=${IDLE_N:-10000} SRV_CPU=${SRV_CPU:-0} GEN_CPU=${GEN_CPU:-1}
PARTS=${PARTS:-rss small h2 manifest auth big} REG2=${REG2:-1} SIGNED=${SIGNED:-0}
BIG_PROTOS=${BIG_PROTOS:-tls} EXTRA_LIMITS=${EXTRA_LIMITS:-} SETTLE_MAX=${SETTLE_MAX:-30}
PB=${PORT_BASE:-17200}
UP_PORT=$PB T_PLAIN=$((PB + 1)) T_TLS=$((PB + 2)) T_AUTH=$((PB + 3)) N_PLAIN=$((PB + 4))
N_TLS=$((PB + 5)) R2_PORT=$((PB + 6))
export TENDER_BIN=${TENDER_BIN:-$REPO/target/release/tender}
[ -x "$TENDER_BIN" ] || die "no $TENDER_BIN: cargo build --release -p tender"
# the pinned TLS parameters: nginx is pinned to them; tender (rustls, TLS 1.2 + 1.3, no setting to
# narrow them) follows the client's preference, which is this suite; every TLS client asks for it
TLS_SUITE=TLS_AES_256_GCM_SHA384 TLS_GROUP=X25519

W=${1:-$(mktemp -d /tmp/tendersmall.XXXXXX)}
mkdir -p "$W/logs"; W=$(cd "$W" && pwd)
if [ "$QUICK" = 1 ]; then OUT=${BENCH_OUT:-$W/BENCHMARKS.md}; else OUT=${BENCH_OUT:-$REPO/BENCHMARKS.md}; fi
RES=$W/results.txt; : >"$RES"
cp "$TENDER_BIN" "$W/tender.bin"; TENDER_SRC=$TENDER_BIN; TENDER_BIN=$W/tender.bin
UP=$W/upstream R2=$W/registry2 NG=$W/nginx DATA=$W/data
UPURL=http://127.0.0.1:$UP_PORT
# 10,000 connections need as many descriptors in the client and in each server
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
[ "$(ulimit -n)" -ge $((IDLE_N + 1024)) ] || die "ulimit -n $(ulimit -n) is too small for IDLE_N=$IDLE_N"

IDLE_PID=''
stop_tender() {  # stop_tender NAME
  local _p
  _p=$(cat "$W/tender-$1/pid" 2>/dev/null || true)
  if [ -n "$_p" ] && alive "$_p"; then
    kill -TERM "$_p" 2>/dev/null || true
    for _ in $(seq 100); do alive "$_p" || break; sleep 0.1; done
    ! alive "$_p" || kill -KILL "$_p" 2>/dev/null || true
  fi
  rm -f "$W/tender-$1/pid"
}
stop_nginx() { pid_stop "$NG" nginx; }
cleanup() {
  [ -z "$IDLE_PID" ] || kill "$IDLE_PID" 2>/dev/null || true
  for t in plain tls auth; do stop_tender "$t"; done
  stop_nginx
  "$H/proxy-registry2.sh" stop "$R2" >/dev/null 2>&1 || true
  "$H/upstream.sh" stop "$UP" >/dev/null 2>&1 || true
  [ -n "${KEEP:-}" ] || rm -rf "$UP/data" "$R2/data" "$DATA" "$W"/tender-*/data "$W/tender.bin" \
    "$W"/tender-*/tender.log "$NG/access.log" "$R2/access.log"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

START=$(now)
rec() { echo "$* t=$(awk -v a="$START" -v b="$(now)" 'BEGIN{printf "%.0f", b - a}')" | tee -a "$RES"; }
kv() { tr ' ' '\n' | sed -n "s/^$1=//p" | head -1; }
load() { echo "load1=$(cut -d' ' -f1 /proc/loadavg) rustc=$(pgrep -c -x rustc || true)"; }
status_kb() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
# mem_tree PID KEY : KEY (VmRSS, VmHWM) of PID plus its direct children (nginx: master + worker)
mem_tree() {
  local _s _c
  _s=$(status_kb "$1" "$2")
  for _c in $(pgrep -P "$1" || true); do _s=$((_s + $(status_kb "$_c" "$2"))); done
  echo "$_s"
}
gen() { taskset -c "$GEN_CPU" "$@"; }

# ---------------------------------------------------------------- setup
rec "env date=$(date -u +%FT%TZ) quick=$QUICK nproc=$(nproc) kernel=$(uname -r)" \
  "tender_rev=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo ?)$(git -C "$REPO" diff --quiet HEAD -- crates 2>/dev/null || echo +dirty)" \
  "tender_bin_mtime=$(date -u -d @"$(stat -c %Y "$TENDER_SRC")" +%FT%TZ)" \
  "nginx=$(nginx -v 2>&1 | cut -d/ -f2) registry=$(docker-registry --version | awk '{print $3}')" \
  "wrk=$(wrk -v 2>&1 | awk 'NR==1{print $2}') h2load=$(h2load --version | awk '{print $NF}') openssl=$(openssl version | awk '{print $2}')" \
  "reps=$REPS dur_s=$DUR conns=${CONNS// /,} n_blobs=$N_BLOBS min_b=$MIN_B max_b=$MAX_B big_mb=$BIG_MB" \
  "big_clients=$BIG_CLIENTS idle_n=$IDLE_N hold_s=$HOLD_S srv_cpu=$SRV_CPU gen_cpu=$GEN_CPU parts=${PARTS// /,} reg2=$REG2" \
  "$(load) uptime=\"$(uptime | sed 's/^ *//')\""

# certificate (self-signed, P-256 ECDSA: the same file for both servers)
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=127.0.0.1 \
  -addext subjectAltName=IP:127.0.0.1 -keyout "$W/key.pem" -out "$W/cert.pem" 2>/dev/null
# client credentials for the auth runs
TOKEN=$(openssl rand -hex 24)
echo "$TOKEN" >"$W/tokens"
BPASS=$(openssl rand -hex 12)
htpasswd -B -b -c "$W/htpasswd" bench "$BPASS" 2>/dev/null
BASIC="Basic $(printf 'bench:%s' "$BPASS" | base64 -w0)"
BEARER="Bearer $TOKEN"

taskset -c "$SRV_CPU" "$H/upstream.sh" start "$UP" "$UP_PORT" >/dev/null
T0=$(now)
BENCH_SIGN=$SIGNED python3 "$BENCH/small_setup.py" gen "$DATA" "$UPURL" "$N_BLOBS" "$MIN_B" "$MAX_B" "$BIG_MB" >"$W/logs/setup.txt"
set -a
# shellcheck source=/dev/null  # written by small_setup.py at run time
. "$DATA/small.env"
set +a
echo "$TAG_PATH" >"$DATA/tag.txt"; echo "$DIGEST_PATH" >"$DATA/digest.txt"
[ -z "$BIG_PATH" ] || echo "$BIG_PATH" >"$DATA/big.txt"
FIRST_BLOB=$(head -1 "$DATA/blobs.txt")
find "$UP/data" "$DATA/www" -type f -exec sync {} + 2>/dev/null || true
rec "setup signed=$SIGNED n_blobs=$N_BLOBS blob_bytes=$BLOB_BYTES manifest_size=$MANIFEST_SIZE manifest_digest=$MANIFEST_DIGEST big_size=$BIG_SIZE s=$(awk -v a="$T0" -v b="$(now)" 'BEGIN{printf "%.1f", b - a}')"

# tender: one config per variant, the limits stated so that no request of the bench is refused.
# Its memory cache (cache.memory) holds a quarter of the small blobs' bytes, so that the small
# hits measure what issue 23 asks: more distinct bytes than any in-memory cache holds.
MEM_CACHE=$((BLOB_BYTES / 4))
tender_config() {  # tender_config NAME PORT
  local d=$W/tender-$1
  mkdir -p "$d/data"
  {
    printf 'listen: 127.0.0.1:%s\ndata: %s\nlogFormat: text\n' "$2" "$d/data"
    printf 'defaultUpstream: up\nupstreams:\n  - name: up\n    url: %s\n' "$UPURL"
    printf 'fetch:\n  tagTtl: 1h                    # manifests by tag are measured within the TTL\n'
    printf 'cache:\n  memory: %s                # small objects in memory: less than the %s bytes of small blobs\n' \
      "$MEM_CACHE" "$BLOB_BYTES"
    printf 'limits:\n'
    printf '  maxClientRequests: 16384      # every client is 127.0.0.1: 512 connections + margin\n'
    printf '  maxConnections: 30000         # IDLE_N=%s idle connections + the load clients\n' "$IDLE_N"
    printf '  maxConnectionsPerAddress: 30000\n'
    printf '  firstByteTimeout: 300s        # idle deadlines longer than any hold of the bench\n'
    printf '  headerTimeout: 300s\n  handshakeTimeout: 60s\n  idleTimeout: 300s\n'
    [ -z "$EXTRA_LIMITS" ] || printf '  %s\n' "$EXTRA_LIMITS"
    if [ "$SIGNED" = 1 ]; then
      printf 'imageVerification:             # every manifest hit reads its stored verdict\n'
      printf '  rules:\n    - image: up/bench/*\n      publicKey:\n        key: |\n'
      sed 's/^/          /' "$DATA/cosign.pub"
    fi
    case $1 in
      tls) printf 'tls:\n  cert: %s\n  key: %s\n' "$W/cert.pem" "$W/key.pem" ;;
      auth) printf 'auth:\n  htpasswd: %s\n  tokenFile: %s\n' "$W/htpasswd" "$W/tokens" ;;
    esac
  } >"$d/tender.yaml"
}
tender_start() {  # tender_start NAME : start (pinned) and wait for /healthz
  local d=$W/tender-$1 s=http
  [ "$1" != tls ] || s=https
  : >>"$d/tender.log"
  taskset -c "$SRV_CPU" nohup "$TENDER_BIN" serve --config "$d/tender.yaml" >>"$d/tender.log" 2>&1 </dev/null &
  echo $! >"$d/pid"
  for _ in $(seq 200); do
    curl -skf -o /dev/null --max-time 2 "$s://127.0.0.1:$(tport "$1")/healthz" && return 0
    alive "$(cat "$d/pid")" || break
    sleep 0.1
  done
  tail -5 "$d/tender.log" >&2; die "tender $1 did not come up"
}
tport() { case $1 in plain) echo "$T_PLAIN" ;; tls) echo "$T_TLS" ;; auth) echo "$T_AUTH" ;; esac; }
tpid() { cat "$W/tender-$1/pid"; }
for t in plain tls auth; do tender_config "$t" "$(tport "$t")"; done

nginx_start() {
  mkdir -p "$NG/tmp"
  cat >"$NG/nginx.conf" <<EOF
$([ "$(id -u)" != 0 ] || echo "user root root;")
worker_processes 1;                 # one core, like tender (pinned with taskset)
worker_rlimit_nofile $(ulimit -n);
pid $NG/pid;
error_log $NG/error.log warn;
events { worker_connections $(( $(ulimit -n) - 64 )); }
http {
  access_log $NG/access.log combined;   # every request, like tender's access log
  sendfile on; tcp_nopush on; tcp_nodelay on;
  keepalive_timeout 300s;               # the same idle deadline as tender's config
  keepalive_requests 100000000;
  client_body_temp_path $NG/tmp/body; proxy_temp_path $NG/tmp/proxy;
  fastcgi_temp_path $NG/tmp/fcgi; uwsgi_temp_path $NG/tmp/uwsgi; scgi_temp_path $NG/tmp/scgi;
  types { } default_type application/octet-stream;
  ssl_protocols TLSv1.3;
  ssl_conf_command Ciphersuites $TLS_SUITE;
  ssl_ecdh_curve $TLS_GROUP;
  ssl_certificate $W/cert.pem; ssl_certificate_key $W/key.pem;
  server {
    listen 127.0.0.1:$N_PLAIN;
    listen 127.0.0.1:$N_TLS ssl http2;
    root $DATA/www;
    location = /healthz { access_log off; return 200 "ok\n"; }
    location /v2/bench/small/manifests/ { default_type application/vnd.oci.image.manifest.v1+json; }
  }
}
EOF
  taskset -c "$SRV_CPU" nginx -c "$NG/nginx.conf" -p "$NG" -e "$NG/error.log"
  wait_http "http://127.0.0.1:$N_PLAIN/healthz" 10 || die "nginx did not come up (see $NG/error.log)"
}

# warm every cache: tender (each variant has its own data directory) and registry:2 fetch every
# object once; then each answers from disk
WARM=$DATA/all.txt
cat "$DATA/blobs.txt" "$DATA/tag.txt" "$DATA/digest.txt" >"$WARM"
[ -z "$BIG_PATH" ] || cat "$DATA/big.txt" >>"$WARM"
for t in plain tls auth; do tender_start "$t"; done
nginx_start
{
  python3 "$BENCH/small_setup.py" warm "http://127.0.0.1:$T_PLAIN" "$WARM"
  python3 "$BENCH/small_setup.py" warm "https://127.0.0.1:$T_TLS" "$WARM" --insecure
  python3 "$BENCH/small_setup.py" warm "http://127.0.0.1:$T_AUTH" "$WARM" --auth "$BEARER"
  python3 "$BENCH/small_setup.py" warm "http://127.0.0.1:$N_PLAIN" "$WARM"
  if [ "$REG2" = 1 ]; then
    taskset -c "$SRV_CPU" "$H/proxy-registry2.sh" start "$R2" "$R2_PORT" "$UPURL" >/dev/null
    python3 "$BENCH/small_setup.py" warm "http://127.0.0.1:$R2_PORT" "$WARM"
  fi
} >"$W/logs/warm.txt"
# the auth tender must refuse a request without credentials (auth is really on)
NOAUTH=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$T_AUTH$FIRST_BLOB")
[ "$NOAUTH" = 401 ] || die "tender with auth answered $NOAUTH without credentials"
# what TLS each server negotiates with an OpenSSL client asking for nothing in particular
for p in "tender $T_TLS" "nginx $N_TLS"; do
  set -- $p
  s=$(openssl s_client -connect "127.0.0.1:$2" -brief </dev/null 2>&1 | tr -d '\r')
  rec "tls sys=$1 proto=$(echo "$s" | sed -n 's/^Protocol version: //p')" \
    "suite=$(echo "$s" | sed -n 's/^Ciphersuite: //p') group=$(echo "$s" | sed -n 's/^\(Peer\|Server\) Temp Key: //p' | cut -d, -f1)"
done
sed "s|^|https://127.0.0.1:$T_TLS|" "$DATA/blobs.txt" >"$DATA/h2-tender.txt"
sed "s|^|https://127.0.0.1:$N_TLS|" "$DATA/blobs.txt" >"$DATA/h2-nginx.txt"
rec "warmed $(tr '\n' ' ' <"$W/logs/warm.txt" | sed 's/warm //g') $(load)"

# ---------------------------------------------------------------- runs
# record_run PART TEST SYS CONNS REP TOOL OUTPUT_FILE : one result line from wrk / ab / h2load output
record_run() {
  local o=$7 req=0 rps=0 p50=- p99=- err=0 ok=1 extra=''
  case $6 in
    wrk)
      local l
      l=$(grep '^WRKRESULT' "$o" || true)
      if [ -z "$l" ]; then ok=0; else
        req=$(echo "$l" | kv requests)
        rps=$(echo "$l" | awk '{for(i=1;i<=NF;i++){split($i,a,"=");v[a[1]]=a[2]}; printf "%.0f", v["requests"]/(v["duration_us"]/1e6)}')
        p50=$(echo "$l" | awk '{for(i=1;i<=NF;i++){split($i,a,"=");v[a[1]]=a[2]}; printf "%.2f", v["p50_us"]/1000}')
        p99=$(echo "$l" | awk '{for(i=1;i<=NF;i++){split($i,a,"=");v[a[1]]=a[2]}; printf "%.2f", v["p99_us"]/1000}')
        err=$(echo "$l" | awk '{for(i=1;i<=NF;i++){split($i,a,"=");v[a[1]]=a[2]}; print v["connect"]+v["read"]+v["write"]+v["status"]+v["timeout"]}')
      fi ;;
    ab)
      req=$(awk '/^Complete requests:/{print $3}' "$o")
      rps=$(awk '/^Requests per second:/{printf "%.0f", $4}' "$o")
      p50=$(awk '$1 == "50%" {print $2}' "$o"); p99=$(awk '$1 == "99%" {print $2}' "$o")
      err=$(awk '/^Failed requests:/ || /^Non-2xx responses:/ {s += $3} END {print s + 0}' "$o")
      [ -n "$req" ] || { ok=0; req=0; } ;;
    h2load)
      req=$(awk '/^requests:/{print $2}' "$o")
      rps=$(awk '/^finished in/{gsub(",", ""); printf "%.0f", $4}' "$o")
      # h2load prints no percentiles: its mean and max request time instead
      extra="mean=$(awk '/^time for request:/{print $6}' "$o") max=$(awk '/^time for request:/{print $5}' "$o")"
      err=$(awk '/^requests:/{s += $10 + $12 + $14} /^status codes:/{s += $7 + $9} END {print s + 0}' "$o")
      extra="$extra proto=$(awk '/^TLS Protocol:/{print $3}' "$o") suite=$(awk '/^Cipher:/{print $2}' "$o")"
      extra="$extra group=$(awk '/^Server Temp Key:/{print $4}' "$o") alpn=$(awk '/^Application protocol:/{print $3}' "$o")"
      [ -n "$req" ] || { ok=0; req=0; } ;;
  esac
  [ "${err:-1}" = 0 ] && [ "${req:-0}" -gt 0 ] || ok=0
  rec "$1 test=$2 sys=$3 conns=$4 rep=$5 tool=$6 rps=${rps:-0} p50_ms=${p50:--} p99_ms=${p99:--} requests=$req errors=$err ok=$ok $extra $(load)"
}
# settle : wait (at most SETTLE_MAX s) until the servers' core is idle (>= 90% over 0.5 s). A
# slow server measured before (registry:2 at 512 connections answers for seconds after its
# client gave up, and its upstream with it) must not share the core with the next system's run.
settle() {
  local _i _a _b
  cpu_idle() { awk -v c="cpu$SRV_CPU" '$1 == c {print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }
  for _i in $(seq $((SETTLE_MAX * 2))); do
    _a=$(cpu_idle); sleep 0.5; _b=$(cpu_idle)
    awk -v a="$_a" -v b="$_b" 'BEGIN{split(a, x, " "); split(b, y, " "); t = y[2] - x[2]; exit !(t > 0 && (y[1] - x[1]) / t >= 0.9)}' && return 0
  done
  echo "settle: core $SRV_CPU still busy after ${SETTLE_MAX}s" >&2
}
run_wrk() {  # run_wrk PART TEST SYS CONNS REP BASEURL PATHS [AUTH]
  settle
  local o=$W/logs/$1-$2-$3-c$4-r$5.txt
  WRK_PATHS=$7 WRK_AUTH=${8:-} gen wrk -t1 -c"$4" -d"${DUR}s" --timeout 5s -s "$BENCH/small.lua" "$6" >"$o" 2>&1 || true
  record_run "$1" "$2" "$3" "$4" "$5" wrk "$o"
}
run_ab_head() {  # run_ab_head PART TEST SYS CONNS REP URL
  settle
  local o=$W/logs/$1-$2-$3-c$4-r$5.txt
  gen ab -i -k -q -c "$4" -t "$DUR" -n 100000000 -s 5 -H 'Accept: application/vnd.oci.image.manifest.v1+json' "$6" >"$o" 2>&1 || true
  record_run "$1" "$2" "$3" "$4" "$5" ab "$o"
}
run_h2() {  # run_h2 PART TEST SYS CONNS REP URLFILE
  settle
  local o=$W/logs/$1-$2-$3-c$4-r$5.txt
  gen h2load -t1 -c "$4" -m 1 -D "$DUR" --tls13-ciphers "$TLS_SUITE" -i "$6" >"$o" 2>&1 || true
  record_run "$1" "$2" "$3" "$4" "$5" h2load "$o"
}
# rss_run SYS REP : fresh server, IDLE_N idle keep-alive connections, their memory
rss_run() {
  local port pid o l rss hwm ok
  case $1 in
    tender) stop_tender plain; tender_start plain; port=$T_PLAIN; pid=$(tpid plain) ;;
    nginx) stop_nginx; nginx_start; port=$N_PLAIN; pid=$(cat "$NG/pid") ;;
  esac
  o=$W/logs/rss-$1-r$2.txt
  gen python3 "$BENCH/idle.py" 127.0.0.1 "$port" "$IDLE_N" "$FIRST_BLOB" "$HOLD_S" >"$o" 2>&1 &
  IDLE_PID=$!
  for _ in $(seq 1200); do grep -q '^ready' "$o" && break; alive "$IDLE_PID" || break; sleep 0.1; done
  sleep 1
  rss=$(mem_tree "$pid" VmRSS); hwm=$(mem_tree "$pid" VmHWM)
  wait "$IDLE_PID" || true; IDLE_PID=''
  l="$(grep '^ready' "$o" || echo 'ready open=0 ok=0 fail=?') $(grep '^done' "$o" || echo 'done still_open=0')"
  ok=0
  [ "$(echo "$l" | kv ok)" = "$IDLE_N" ] && [ "$(echo "$l" | kv still_open)" = "$IDLE_N" ] && ok=1
  rec "rss sys=$1 rep=$2 n=$IDLE_N open=$(echo "$l" | kv open) okreq=$(echo "$l" | kv ok) fail=$(echo "$l" | kv fail)" \
    "still_open=$(echo "$l" | kv still_open) vmrss_kb=$rss vmhwm_kb=$hwm ok=$ok $(load)"
}
# big_run SYS REP [PROTO] : BIG_CLIENTS curl clients at once, the big blob over PROTO: tls (the
# default: TLS, HTTP/1.1), plain (HTTP/1.1) or h2 (TLS, HTTP/2)
big_run() {
  local url o t0 t1 okc=0 bad=0 pids='' proto=${3:-tls} ver=--http1.1
  settle
  case $1:$proto in
    tender:tls | tender:h2) url=https://127.0.0.1:$T_TLS$BIG_PATH ;; tender:plain) url=http://127.0.0.1:$T_PLAIN$BIG_PATH ;;
    nginx:tls | nginx:h2) url=https://127.0.0.1:$N_TLS$BIG_PATH ;; nginx:plain) url=http://127.0.0.1:$N_PLAIN$BIG_PATH ;;
  esac
  [ "$proto" != h2 ] || ver=--http2
  o=$W/logs/big-$1-$proto-r$2.txt; : >"$o"
  t0=$(now)
  for _ in $(seq "$BIG_CLIENTS"); do
    gen curl -sk "$ver" --tls13-ciphers "$TLS_SUITE" -o /dev/null -w '%{http_code} %{size_download}\n' "$url" >>"$o" 2>&1 &
    pids="$pids $!"
  done
  for p in $pids; do wait "$p" || true; done   # only the clients: the servers are children too
  t1=$(now)
  okc=$(awk -v s="$BIG_SIZE" '$1 == 200 && $2 == s' "$o" | wc -l); bad=$((BIG_CLIENTS - okc))
  rec "big sys=$1 proto=$proto rep=$2 clients=$BIG_CLIENTS size=$BIG_SIZE wall_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b - a}')" \
    "GiBps=$(awk -v a="$t0" -v b="$t1" -v s="$BIG_SIZE" -v n="$BIG_CLIENTS" 'BEGIN{printf "%.2f", s * n / (b - a) / 1073741824}')" \
    "okc=$okc fail=$bad ok=$([ "$bad" = 0 ] && echo 1 || echo 0) $(load)"
}

has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
R2SYS=''; [ "$REG2" = 1 ] && R2SYS=reg2
base() {  # base SYS [tls] : URL base of a system
  case $1:${2:-} in
    tender:) echo "http://127.0.0.1:$T_PLAIN" ;; tender:tls) echo "https://127.0.0.1:$T_TLS" ;;
    nginx:) echo "http://127.0.0.1:$N_PLAIN" ;; nginx:tls) echo "https://127.0.0.1:$N_TLS" ;;
    reg2:) echo "http://127.0.0.1:$R2_PORT" ;;
  esac
}
for r in $(seq "$REPS"); do
  rec "rep $r date=$(date -u +%FT%TZ) $(load)"
  if has rss; then rss_run tender "$r"; rss_run nginx "$r"; fi
  # the tag stays within its TTL in a restarted tender too: resolve it once more before measuring
  curl -s -o /dev/null "$(base tender)$TAG_PATH"
  for c in $CONNS; do
    if has small; then
      for s in tender nginx $R2SYS; do run_wrk small plain "$s" "$c" "$r" "$(base "$s")" "$DATA/blobs.txt"; done
      for s in tender nginx; do run_wrk small tls "$s" "$c" "$r" "$(base "$s" tls)" "$DATA/blobs.txt"; done
    fi
    if has h2; then
      run_h2 h2 tls tender "$c" "$r" "$DATA/h2-tender.txt"
      run_h2 h2 tls nginx "$c" "$r" "$DATA/h2-nginx.txt"
    fi
    if has manifest; then
      for k in tag digest; do
        for s in tender nginx $R2SYS; do run_wrk manifest "$k-get" "$s" "$c" "$r" "$(base "$s")" "$DATA/$k.txt"; done
        p=$TAG_PATH; [ "$k" = tag ] || p=$DIGEST_PATH
        for s in tender nginx $R2SYS; do run_ab_head manifest "$k-head" "$s" "$c" "$r" "$(base "$s")$p"; done
      done
    fi
    if has auth; then
      # Basic: the first request pays bcrypt once; the rest come from the verified-credential cache
      curl -s -o /dev/null -H "Authorization: $BASIC" "http://127.0.0.1:$T_AUTH$FIRST_BLOB"
      run_wrk auth bearer tender "$c" "$r" "http://127.0.0.1:$T_AUTH" "$DATA/blobs.txt" "$BEARER"
      run_wrk auth basic tender "$c" "$r" "http://127.0.0.1:$T_AUTH" "$DATA/blobs.txt" "$BASIC"
    fi
  done
  if has big && [ -n "$BIG_PATH" ]; then
    for proto in $BIG_PROTOS; do big_run tender "$r" "$proto"; big_run nginx "$r" "$proto"; done
  fi
done

# every request is in the servers' logs: count them, and any status >= 400 (429 included)
t4xx=0
for t in plain tls auth; do
  t4xx=$((t4xx + $(grep -c 'status=\(4\|5\)[0-9][0-9]' "$W/tender-$t/tender.log" || true)))
done
tlines=$(cat "$W"/tender-*/tender.log | grep -c 'request' || true)
n4xx=$(awk '$9 >= 400' "$NG/access.log" | wc -l)
# minus the one 401 the setup asked for (auth is on)
rec "logs tender_lines=$tlines tender_status_ge400=$((t4xx - 1)) nginx_lines=$(wc -l <"$NG/access.log") nginx_status_ge400=$n4xx"
rec "end date=$(date -u +%FT%TZ) $(load) uptime=\"$(uptime | sed 's/^ *//')\""
CMD="bench/small.sh"; [ "$QUICK" != 1 ] || CMD="$CMD --quick"
python3 "$BENCH/small_report.py" "$RES" "$OUT" "$CMD"
echo "== wrote $OUT"
