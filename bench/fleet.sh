#!/usr/bin/env bash
# fleet.sh - issue 38: a simulated fleet pulls one image cold through a tree of caches, in
# network namespaces this script creates (and removes, also after a failure), on links shaped
# with tc. Run as root. One command: `bench/fleet.sh`.
#
#   f38-up    the "internet": docker-registry holding the image, behind a delay line
#             (bench/fleet_delay.py: the kernel here has no netem) on 10.38.0.1
#   f38-par   the site: the parent tier on 10.38.1.1, its uplink to f38-up (UP_MBIT, UP_DELAY_MS,
#             UP_LOSS) and its link to the core (PARENT_MBIT, its egress to every rack)
#   f38-core  a bridge joining the parent and the racks
#   f38-rI    rack I's tier on 10.38.1.(10+I) towards the parent and 10.39.I.1 towards its nodes
#             (RACK_MBIT each way)
#   f38-nI    rack I's NODES nodes, one address each (10.39.I.10, .11, ...): bench/fleet_nodes.py
#             replays containerd's requests for each (HEAD the tag, the index, the platform
#             manifest, the config, the layers three at a time); with REAL_CTR=1 rack 0 also runs a
#             real containerd and `ctr` pulls through the hosts.toml `tender render registries`
#             writes for a node (its rack first, the parent second)
#
# Two arms on the same bed, each cold, every node starting at the same second:
#   tender     parent `tender serve`, one child per rack with `serve --parent`
#   registry2  docker-registry (distribution, = registry:2) in pull-through mode the same way: a
#              parent proxy of the upstream and one proxy per rack of the parent
# Recorded per arm: upstream blob GETs and bytes per object (the registry's access log), the
# parent's egress (its veth counters), per node time until it holds the image (p50, p99, max)
# against the floor the links set, non-200 answers (429s), CPU seconds and peak RSS per tier.
# Prints a Markdown table (BENCH_OUT: appended to that file) and, as stdout's last line, a JSON
# summary (`python3 bench/fleet_model.py check` reads it).
#
# env: RACKS=4 NODES=16 (per rack) IMAGE_MB=64 LAYERS=4 UP_MBIT=50 UP_DELAY_MS=30 UP_LOSS=0 (%)
#      PARENT_MBIT=1000 RACK_MBIT=400 ARMS="tender registry2" REAL_CTR=1 VERIFY=1 (nodes per rack
#      that hash what they get) NODE_TIMEOUT=<10 x the floor, at least 120 s>
#      TENDER_BIN=<repo>/target/release/tender BENCH_OUT= KEEP= (keep WORKDIR)
# usage: bench/fleet.sh [WORKDIR]
set -euo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$BENCH")
RACKS=${RACKS:-4} NODES=${NODES:-16} IMAGE_MB=${IMAGE_MB:-64} LAYERS=${LAYERS:-4}
UP_MBIT=${UP_MBIT:-50} UP_DELAY_MS=${UP_DELAY_MS:-30} UP_LOSS=${UP_LOSS:-0}
PARENT_MBIT=${PARENT_MBIT:-1000} RACK_MBIT=${RACK_MBIT:-400}
ARMS=${ARMS:-tender registry2} REAL_CTR=${REAL_CTR:-1} VERIFY=${VERIFY:-1}
TENDER_BIN=${TENDER_BIN:-$REPO/target/release/tender}
die() { echo "fleet.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (network namespaces and tc)"
for c in ip tc iptables docker-registry python3 curl; do command -v "$c" >/dev/null || die "missing $c"; done
[ -x "$TENDER_BIN" ] || die "no $TENDER_BIN: cargo build --release --bin tender"
[ "$RACKS" -ge 1 ] && [ "$RACKS" -le 64 ] || die "RACKS must be 1..64"
[ "$NODES" -ge 1 ] && [ "$NODES" -le 200 ] || die "NODES must be 1..200 (addresses .10-.209)"
if [ "$REAL_CTR" = 1 ] && ! command -v containerd >/dev/null; then
  echo "fleet.sh: no containerd: REAL_CTR=0" >&2; REAL_CTR=0
fi
# A node that does not hold the image within NODE_TIMEOUT (default: ten times the floor the links
# set, at least 120 s) fails; the arm's figures say how many did.
FLOOR=$(python3 -c "m=$IMAGE_MB*8*1.048576; print(max(m/$UP_MBIT, m*$RACKS/$PARENT_MBIT, m*$NODES/$RACK_MBIT))")
NODE_TIMEOUT=${NODE_TIMEOUT:-$(python3 -c "import math; print(max(120, math.ceil(10 * $FLOOR)))")}
W=${1:-$(mktemp -d /tmp/tenderfleet.XXXXXX)}
mkdir -p "$W/logs"; W=$(cd "$W" && pwd)
REPO_NAME=fleet/app TAG=v1 NSNAME=ghcr.io
NSS=()

in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

teardown() {
  local ns
  for ns in "${NSS[@]}"; do
    # every process the bed started in the namespace, then the namespace (its veths go with it)
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$p" 2>/dev/null || true; done
  done
  sleep 0.5
  for ns in "${NSS[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  NSS=()
  if [ -z "${KEEP:-}" ]; then rm -rf "$W"/data-* "$W/img" "$W"/ctrd-*; fi
}
trap teardown EXIT
trap 'exit 130' INT TERM

mkns() {
  ip netns del "$1" 2>/dev/null || true
  ip netns add "$1"
  NSS+=("$1")
  in_ns "$1" ip link set lo up
}

# shape NS DEV MBIT: the egress of DEV at MBIT (tbf; burst for a 4 ms bucket, at least 64 KiB)
shape() {
  local ns=$1 dev=$2 mbit=$3 burst
  burst=$(( mbit * 1000000 / 8 / 250 )); [ "$burst" -ge 65536 ] || burst=65536
  in_ns "$ns" tc qdisc add dev "$dev" root tbf rate "${mbit}mbit" burst "$burst" latency 200ms
}

# veth NS_A DEV_A NS_B DEV_B
veth() {
  ip link add "$2" type veth peer name "$4"
  ip link set "$2" netns "$1"; ip link set "$4" netns "$3"
  in_ns "$1" ip link set "$2" up; in_ns "$3" ip link set "$4" up
}

bed_up() {
  local i j
  mkns f38-up; mkns f38-par; mkns f38-core
  veth f38-up u0 f38-par pu
  in_ns f38-up ip addr add 10.38.0.1/30 dev u0
  in_ns f38-par ip addr add 10.38.0.2/30 dev pu
  shape f38-up u0 "$UP_MBIT"; shape f38-par pu "$UP_MBIT"
  if [ "$UP_LOSS" != 0 ]; then
    local p; p=$(python3 -c "print($UP_LOSS/100)")
    in_ns f38-par iptables -A INPUT -i pu -m statistic --mode random --probability "$p" -j DROP
    in_ns f38-up iptables -A INPUT -i u0 -m statistic --mode random --probability "$p" -j DROP
  fi
  in_ns f38-core ip link add br0 type bridge
  in_ns f38-core ip link set br0 up
  veth f38-par pc f38-core cp
  in_ns f38-core ip link set cp master br0
  in_ns f38-par ip addr add 10.38.1.1/24 dev pc
  shape f38-par pc "$PARENT_MBIT"
  for ((i = 0; i < RACKS; i++)); do
    mkns "f38-r$i"; mkns "f38-n$i"
    veth "f38-r$i" ru f38-core "cr$i"
    in_ns f38-core ip link set "cr$i" master br0
    in_ns "f38-r$i" ip addr add "10.38.1.$((10 + i))/24" dev ru
    shape f38-core "cr$i" "$RACK_MBIT"; shape "f38-r$i" ru "$RACK_MBIT"
    veth "f38-r$i" rd "f38-n$i" nd
    in_ns "f38-r$i" ip addr add "10.39.$i.1/24" dev rd
    shape "f38-r$i" rd "$RACK_MBIT"; shape "f38-n$i" nd "$RACK_MBIT"
    local mac; mac=$(in_ns "f38-n$i" cat /sys/class/net/nd/address)
    for ((j = 0; j < NODES; j++)); do
      in_ns "f38-n$i" ip addr add "10.39.$i.$((10 + j))/24" dev nd
      # the rack knows its nodes' addresses up front: a wave of new neighbours must not cost ARP
      in_ns "f38-r$i" ip neigh replace "10.39.$i.$((10 + j))" lladdr "$mac" dev rd nud permanent
    done
    if [ "$REAL_CTR" = 1 ] && [ "$i" = 0 ]; then in_ns "f38-n$i" ip addr add "10.39.$i.9/24" dev nd; fi
  done
}

# registry DIR NS ADDR [REMOTE]: docker-registry in NS on ADDR (pull-through with REMOTE)
registry() {
  local dir=$1 ns=$2 addr=$3 remote=${4:-}
  mkdir -p "$dir/data"
  {
    printf 'version: 0.1\nlog: {level: warn, formatter: text, accesslog: {disabled: false}}\n'
    printf 'storage:\n  filesystem: {rootdirectory: %s}\n  cache: {blobdescriptor: inmemory}\n' "$dir/data"
    printf 'http: {addr: "%s", secret: "fleet"}\nhealth: {storagedriver: {enabled: false}}\n' "$addr"
    if [ -n "$remote" ]; then printf 'proxy: {remoteurl: "%s"}\n' "$remote"; fi
  } >"$dir/config.yml"
  # not through in_ns: $! must be the process that becomes the server (ip netns exec execs it)
  ip netns exec "$ns" docker-registry serve "$dir/config.yml" >>"$dir/access.log" 2>>"$dir/registry.log" </dev/null &
  echo $! >"$dir/pid"
  wait_http "$ns" "http://$addr/v2/" || { tail -5 "$dir/registry.log" >&2; die "docker-registry on $addr did not start"; }
}

wait_http() {
  local ns=$1 url=$2 i
  for ((i = 0; i < 200; i++)); do
    in_ns "$ns" curl -s -o /dev/null --max-time 2 "$url" && return 0
    sleep 0.1
  done
  return 1
}

# tender NAME NS LISTEN CONFIG_YAML [ARGS...]
tender() {
  local name=$1 ns=$2 listen=$3 yaml=$4; shift 4
  printf '%s' "$yaml" >"$W/$name.yaml"
  ip netns exec "$ns" "$TENDER_BIN" serve --config "$W/$name.yaml" --data "$W/data-$name" --listen "$listen" \
    --log-format json "$@" >"$W/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$W/$name.pid"
  wait_http "$ns" "http://$listen/healthz" || { tail -5 "$W/logs/$name.log" >&2; die "tender $name did not start"; }
}

cpu_of() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
hwm_of() { awk '/VmHWM/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
tx_of() { in_ns "$1" cat "/sys/class/net/$2/statistics/tx_bytes"; }

start_upstream() {
  registry "$W/up" f38-up 127.0.0.1:5001
  in_ns f38-up python3 "$BENCH/fleet_delay.py" --listen 10.38.0.1:5000 --target 127.0.0.1:5001 \
    --delay-ms "$UP_DELAY_MS" --stats "$W/delay.json" >"$W/logs/delay.log" 2>&1 &
  wait_http f38-up "http://10.38.0.1:5000/v2/" || die "the delay line did not start"
  echo "fleet.sh: pushing a ${IMAGE_MB} MiB image in $LAYERS layers" >&2
  in_ns f38-up python3 "$BENCH/fleet_image.py" --registry 127.0.0.1:5001 --repo "$REPO_NAME" --tag "$TAG" \
    --size-mb "$IMAGE_MB" --layers "$LAYERS" --work "$W/img" >"$W/image.json"
}

# arm NAME: start the tiers of one arm, run the nodes, measure; writes $W/arm-NAME.json
arm() {
  local name=$1 i port pids=() t0 start_at tiers=() cpu0=() par_tx0 ctr_pid=""
  rm -rf "$W"/data-* "$W/p2-"*
  : >"$W/up/access.log"
  if [ "$name" = tender ]; then
    port=5000
    tender parent f38-par 10.38.1.1:$port "$(printf 'upstreams:\n  - name: %s\n    url: http://10.38.0.1:5000\n' "$NSNAME")"
    tiers+=("$(cat "$W/parent.pid")")
    for ((i = 0; i < RACKS; i++)); do
      tender "child$i" "f38-r$i" 0.0.0.0:$port 'upstreams: []
' --parent "http://10.38.1.1:$port"
      tiers+=("$(cat "$W/child$i.pid")")
    done
  else
    port=5001
    registry "$W/p2-parent" f38-par 10.38.1.1:$port http://10.38.0.1:5000
    tiers+=("$(cat "$W/p2-parent/pid")")
    for ((i = 0; i < RACKS; i++)); do
      registry "$W/p2-child$i" "f38-r$i" 0.0.0.0:$port "http://10.38.1.1:$port"
      tiers+=("$(cat "$W/p2-child$i/pid")")
    done
  fi
  for p in "${tiers[@]}"; do cpu0+=("$(cpu_of "$p")"); done
  for ((i = 0; i < RACKS; i++)); do in_ns "f38-r$i" nstat -rn >/dev/null; in_ns "f38-n$i" nstat -rn >/dev/null; done
  par_tx0=$(tx_of f38-par pc)
  start_at=$(python3 -c 'import time; print(f"{time.time() + 2:.3f}")')
  for ((i = 0; i < RACKS; i++)); do
    in_ns "f38-n$i" python3 "$BENCH/fleet_nodes.py" --registry "10.39.$i.1:$port" --ns "$NSNAME" \
      --repo "$REPO_NAME" --tag "$TAG" --source-range "10.39.$i.10:$NODES" --start-at "$start_at" \
      --verify "$VERIFY" --timeout "$NODE_TIMEOUT" --read-timeout "$NODE_TIMEOUT" \
      --out "$W/nodes-$name-$i.json" 2>"$W/logs/nodes-$name-$i.log" &
    pids+=($!)
  done
  if [ "$REAL_CTR" = 1 ]; then ctr_pull "$name" "$port" "$start_at" & ctr_pid=$!; fi
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  if [ -n "$ctr_pid" ]; then wait "$ctr_pid" || failed=1; fi
  [ "$failed" = 0 ] || echo "fleet.sh: $name: some nodes failed (see $W/logs)" >&2
  local cpus=() hwms=()
  for ((i = 0; i < ${#tiers[@]}; i++)); do
    cpus+=("$(python3 -c "print(($(cpu_of "${tiers[$i]}") - ${cpu0[$i]}) / $(getconf CLK_TCK))")")
    hwms+=("$(hwm_of "${tiers[$i]}")")
  done
  local par_tx; par_tx=$(( $(tx_of f38-par pc) - par_tx0 ))
  # TCP trouble on the racks' side: listen queue overflows at the rack tiers, SYNs the nodes sent
  # again (counters of this arm: nstat -z after a reset at the start)
  local tcp_listen=0 tcp_syn=0 n
  for ((i = 0; i < RACKS; i++)); do
    n=$(in_ns "f38-r$i" nstat -az TcpExtListenDrops | awk '/ListenDrops/ {print $2}'); tcp_listen=$((tcp_listen + ${n:-0}))
    n=$(in_ns "f38-n$i" nstat -az TcpExtTCPSynRetrans | awk '/SynRetrans/ {print $2}'); tcp_syn=$((tcp_syn + ${n:-0}))
  done
  echo "{\"listen_drops\": $tcp_listen, \"syn_retransmits\": $tcp_syn}" >"$W/tcp-$name.json"
  local ctr_args=()
  if [ "$REAL_CTR" = 1 ]; then ctr_args=(--ctr "$W/ctr-$name.json"); fi
  python3 "$BENCH/fleet_report.py" arm --name "$name" --image "$W/image.json" --nodes "$W"/nodes-"$name"-*.json \
    --upstream-log "$W/up/access.log" --parent-tx "$par_tx" --cpu "${cpus[@]}" --hwm-kib "${hwms[@]}" \
    --tcp "$W/tcp-$name.json" "${ctr_args[@]}" >"$W/arm-$name.json"
  for p in "${tiers[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${tiers[@]}"; do for ((i = 0; i < 100; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done; done
}

# ctr_pull ARM PORT START_AT: a real containerd in rack 0's node namespace pulls through the
# hosts.toml a node gets from `tender render registries` (its rack first, the parent second)
ctr_pull() {
  local name=$1 port=$2 start_at=$3 d="$W/ctrd-$1" t0 t1 rc=0
  mkdir -p "$d"
  cat >"$d/config.toml" <<TOML
version = 2
root = "$d/root"
state = "$d/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$d/containerd.sock"
[ttrpc]
  address = "$d/containerd.sock.ttrpc"
[debug]
  address = "$d/debug.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$d/opt"
TOML
  "$TENDER_BIN" render registries --format containerd --out "$d/certs.d" \
    --mirror "http://10.39.0.1:$port" --mirror "http://10.38.1.1:$port" --registry "$NSNAME" >/dev/null
  in_ns f38-n0 containerd --config "$d/config.toml" >"$W/logs/containerd-$name.log" 2>&1 &
  local cpid=$! i
  for ((i = 0; i < 100; i++)); do in_ns f38-n0 ctr --address "$d/containerd.sock" version >/dev/null 2>&1 && break; sleep 0.1; done
  python3 -c "import time; time.sleep(max(0, $start_at - time.time()))"
  t0=$(date +%s.%N)
  in_ns f38-n0 timeout "$NODE_TIMEOUT" ctr --address "$d/containerd.sock" content fetch --hosts-dir "$d/certs.d" \
    "$NSNAME/$REPO_NAME:$TAG" >"$W/logs/ctr-$name.log" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  kill -TERM "$cpid" 2>/dev/null || true
  wait "$cpid" 2>/dev/null || true
  printf '{"ok": %s, "seconds": %s}\n' "$([ $rc = 0 ] && echo true || echo false)" \
    "$(python3 -c "print(round($t1 - $t0, 3))")" >"$W/ctr-$name.json"
  return $rc
}

echo "fleet.sh: $RACKS racks x $NODES nodes, ${IMAGE_MB} MiB image; upstream ${UP_MBIT} Mbit/s +${UP_DELAY_MS} ms (loss ${UP_LOSS}%), parent ${PARENT_MBIT} Mbit/s, racks ${RACK_MBIT} Mbit/s; work in $W" >&2
bed_up
start_upstream
for a in $ARMS; do
  echo "fleet.sh: arm $a" >&2
  arm "$a"
done
python3 "$BENCH/fleet_report.py" summary --work "$W" --arms $ARMS --racks "$RACKS" --nodes "$NODES" \
  --up-mbit "$UP_MBIT" --up-delay-ms "$UP_DELAY_MS" --up-loss "$UP_LOSS" --parent-mbit "$PARENT_MBIT" \
  --rack-mbit "$RACK_MBIT" --node-timeout "$NODE_TIMEOUT" --image "$W/image.json" --markdown "$W/fleet.md" >"$W/summary.json"
cat "$W/fleet.md"
if [ -n "${BENCH_OUT:-}" ]; then cat "$W/fleet.md" >>"$BENCH_OUT"; fi
tail -n 1 "$W/summary.json"
