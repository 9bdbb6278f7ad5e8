#!/usr/bin/env bash
# bench/bundle.sh - on demand: carrying a ~2 GiB release across an air gap (issue 21).
#
# The release: the test bed's synthetic images pushed to docker-registry (a two-platform kubelet
# index, an installer and one big image; incompressible layers), warmed into a tender's data
# directory. Then, per repetition, with the page cache dropped before each step and `sync`
# inside each timing:
#   export      tender export --data (a directory)    vs  cp -r of that directory
#   export tar  tender export --data (a .tar)         vs  cp of that tar
#   import      tender import of the directory        vs  cp -r of the directory
#   import tar  tender import of the tar              vs  cp of the tar
# on the same disk. Import hashes every byte once (and writes it once); export copies store
# objects that were verified when committed. Aim: tender >= 0.5x cp's throughput.
#
# Needs root (drop_caches), docker-registry, skopeo, python3, ~4 x the release size free under
# $TMPDIR. Prints a Markdown table for BENCHMARKS.md (section "## Air-gap bundles").
# env: REPS=3, KUBELET_LAYERS_MB="256 128" (per platform), INSTALLER_LAYERS_MB="512 256", BIG_MB=512,
#      IMAGES_DIR (keep the generated layers there and reuse them in the next run)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
HARNESS=${HARNESS:-$ROOT/scripts/testbed}
REPS=${REPS:-3}
export KUBELET_LAYERS_MB=${KUBELET_LAYERS_MB:-"256 128"}
export INSTALLER_LAYERS_MB=${INSTALLER_LAYERS_MB:-"512 256"}
export BIG_MB=${BIG_MB:-512}

[ "$(id -u)" -eq 0 ] || { echo "bundle.sh: needs root (drop_caches)" >&2; exit 2; }
for t in docker-registry skopeo python3 curl; do
  command -v "$t" >/dev/null || { echo "bundle.sh: needs $t (scripts/test.sh installs it)" >&2; exit 2; }
done

cargo build --release --bin tender >&2
TENDER=$ROOT/target/release/tender

WORK=$(mktemp -d "${TMPDIR:-/tmp}/tender-bundle-bench.XXXXXX")
TPID=""
cleanup() {
  [ -n "$TPID" ] && kill "$TPID" 2>/dev/null || true
  "$HARNESS/upstream.sh" stop "$WORK/upstream" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

PORT=$((20000 + RANDOM % 20000))
"$HARNESS/upstream.sh" start "$WORK/upstream" "$PORT" >&2
IMG_DIR=${IMAGES_DIR:-$WORK/images}
WORK="$IMG_DIR" "$HARNESS/mkimages.sh" "127.0.0.1:$PORT" >&2
. "$IMG_DIR/images.env"
IMAGES=("ghcr.io/$KUBELET_REF" "ghcr.io/$INSTALLER_REF" "ghcr.io/$BIG_REF")
PLATFORMS=(--platform linux/amd64 --platform linux/arm64)

cat >"$WORK/tender.yaml" <<EOF
upstreams:
  - name: ghcr.io
    url: http://127.0.0.1:$PORT
EOF
"$TENDER" prefetch --data "$WORK/data" --config "$WORK/tender.yaml" --quiet "${PLATFORMS[@]}" "${IMAGES[@]}" >&2
RELEASE_BYTES=$(du -sb "$WORK/data/objects" | cut -f1)
# The release is in the store: the upstream and the image sources go (disk), and the steps run
# with the upstream offline, as on an air-gapped side (nothing is asked of the network).
"$HARNESS/upstream.sh" stop "$WORK/upstream" >&2
rm -rf "$WORK/upstream" "$WORK/images"   # (an IMAGES_DIR of the caller's is kept)
echo "offline: true" >>"$WORK/tender.yaml"

drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
# seconds taken by "$@" followed by sync
timed() {
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >/dev/null
  sync
  t1=$(date +%s.%N)
  python3 -c "print(f'{$t1 - $t0:.2f}')"
}

declare -A T
for r in $(seq 1 "$REPS"); do
  for form in dir tar; do
    out=$WORK/bundle-$r; [ $form = tar ] && out=$WORK/bundle-$r.tar
    drop; T[export-$form-$r]=$(timed "$TENDER" export --out "$out" --data "$WORK/data" --config "$WORK/tender.yaml" --quiet "${PLATFORMS[@]}" "${IMAGES[@]}")
    drop; T[cp-$form-$r]=$(timed cp -r "$out" "$WORK/copy-$form-$r")
    rm -rf "$WORK/copy-$form-$r"
    drop; T[import-$form-$r]=$(timed "$TENDER" import "$out" --data "$WORK/import-$form-$r" --config "$WORK/tender.yaml")
    rm -rf "$WORK/import-$form-$r" "$out"
  done
  echo "bundle.sh: repetition $r done" >&2
done

python3 - "$REPS" "$RELEASE_BYTES" "$(nproc)" "$(git -C "$ROOT" rev-parse --short HEAD)" <<'EOF' "${!T[@]}" -- "${T[@]}"
import statistics, sys
reps, size, cores, head = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
rest = sys.argv[5:]
sep = rest.index("--")
t = dict(zip(rest[:sep], map(float, rest[sep + 1:])))
def med(key):
    v = [t[f"{key}-{r}"] for r in range(1, reps + 1)]
    m = statistics.median(v)
    return m, f"{m:.2f} s" + (f" [{min(v):.2f}–{max(v):.2f}]" if min(v) != max(v) else "")
print(f"Release: {size / 2**30:.2f} GiB of objects; {reps} repetition(s), median [min–max]; HEAD `{head}`, {cores} cores.\n")
print("| step | form | tender | cp (same bytes, same disk) | tender throughput / cp's |")
print("|---|---|---|---|---|")
for step in ("export", "import"):
    for form in ("dir", "tar"):
        tm, ts = med(f"{step}-{form}")
        cm, cs = med(f"cp-{form}")
        print(f"| {step} | {'directory' if form == 'dir' else 'tar'} | {ts} | {cs} | **{cm / tm:.2f}x** |")
EOF
