#!/usr/bin/env bash
# bench/clone.sh - on demand: how clone time grows with the golden's size.
#
# Imports two fully written (random, not sparse) goldens of 1 GiB and 4 GiB through a local
# fake Image Factory (python3 http.server, plain `raw` format) into a loop-mounted XFS with
# reflink=1, then times `tender clone --format raw` (a reflink) of each, and a plain copy
# (`cp --reflink=never`) of each for comparison. A clone's cost should barely depend on the
# golden's size (4 GiB / 1 GiB ratio near 1, aim <= 1.5); a copy's grows with it (ratio ~4).
#
# Needs root (loop mount), xfsprogs, python3, and ~12 GiB free under $TMPDIR (sparse files).
# Prints a Markdown table for BENCHMARKS.md (section "## Clone time").
# env: RUNS=5 (clones timed per size; the median is reported), SIZES="1 4" (GiB)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
RUNS=${RUNS:-5}
SIZES=${SIZES:-"1 4"}
SCHEMATIC=ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515

[ "$(id -u)" -eq 0 ] || { echo "clone.sh: needs root (loop-mounted XFS)" >&2; exit 2; }
command -v mkfs.xfs >/dev/null || { echo "clone.sh: needs mkfs.xfs (apt-get install xfsprogs)" >&2; exit 2; }

cargo build --release --bin tender >&2
TENDER=$ROOT/target/release/tender

WORK=$(mktemp -d "${TMPDIR:-/tmp}/tender-clone-bench.XXXXXX")
MNT=$WORK/xfs
LOOP=""
FACTORY_PID=""
cleanup() {
  [ -n "$FACTORY_PID" ] && kill "$FACTORY_PID" 2>/dev/null || true
  mountpoint -q "$MNT" && umount "$MNT" || true
  [ -n "$LOOP" ] && losetup -d "$LOOP" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

truncate -s 14G "$WORK/xfs.img"
mkfs.xfs -q -m reflink=1 "$WORK/xfs.img"
LOOP=$(losetup --find --show "$WORK/xfs.img")
mkdir -p "$MNT"
mount "$LOOP" "$MNT"

# The fake factory: files under $WORK/factory/image/<schematic>/<version>/openstack-amd64.raw
PORT=$((20000 + RANDOM % 20000))
for g in $SIZES; do
  d=$WORK/factory/image/$SCHEMATIC/v1.$g.0
  mkdir -p "$d"
  head -c "$((g * 1024))M" /dev/urandom >"$d/openstack-amd64.raw"
done
(cd "$WORK/factory" && exec python3 -m http.server "$PORT" --bind 127.0.0.1 >/dev/null 2>&1) &
FACTORY_PID=$!
sleep 1

{
  echo "upstreams: []"
  echo "imageFactory: http://127.0.0.1:$PORT"
  echo "data: $WORK/data"
  echo "catalog:"
  echo "  dir: $MNT/goldens"
  echo "  images:"
  for g in $SIZES; do
    echo "    - schematic: $SCHEMATIC"
    echo "      version: v1.$g.0"
    echo "      format: raw"
  done
} >"$WORK/tender.yaml"
"$TENDER" catalog sync --config "$WORK/tender.yaml" >&2

now_ms() { date +%s%3N; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A CLONE COPY
for g in $SIZES; do
  golden=$MNT/goldens/talos-worker-$SCHEMATIC-v1.$g.0.raw
  : >"$WORK/clone.ms"; : >"$WORK/copy.ms"
  for i in $(seq "$RUNS"); do
    sync
    t0=$(now_ms)
    "$TENDER" clone "talos-worker-$SCHEMATIC-v1.$g.0" --config "$WORK/tender.yaml" --pool bench \
      --worker "w$i" --size 20Gi --to "$MNT/w$g-$i.raw" >/dev/null
    echo $(( $(now_ms) - t0 )) >>"$WORK/clone.ms"
    sync
    t0=$(now_ms)
    cp --reflink=never "$golden" "$MNT/copy$g.raw"
    sync -f "$MNT/copy$g.raw"
    echo $(( $(now_ms) - t0 )) >>"$WORK/copy.ms"
    rm -f "$MNT/copy$g.raw"
  done
  CLONE[$g]=$(median <"$WORK/clone.ms")
  COPY[$g]=$(median <"$WORK/copy.ms")
done

set -- $SIZES
small=$1; large=${!#}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a < 1) a = 1; printf "%.2f", b / a }'; }
echo
echo "| golden (fully written) | tender clone --format raw (reflink), median of $RUNS | cp --reflink=never + fsync, median of $RUNS |"
echo "|---|---|---|"
for g in $SIZES; do
  echo "| ${g} GiB | ${CLONE[$g]} ms | ${COPY[$g]} ms |"
done
echo "| ratio ${large} GiB / ${small} GiB | $(ratio "${CLONE[$small]}" "${CLONE[$large]}") | $(ratio "${COPY[$small]}" "${COPY[$large]}") |"
