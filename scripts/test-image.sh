#!/usr/bin/env bash
# scripts/test-image.sh - build tender's image and run it the way Kubernetes runs it.
#   1. scripts/build-image.sh twice from the same binary and SOURCE_DATE_EPOCH: the manifest
#      digests must be equal (reproducible);
#   2. the image config (entrypoint, user 65532, port, labels from git) and the layer (owners,
#      no setuid file, exactly the binary and the libraries ldd names) are as intended;
#   3. `umoci unpack` the OCI layout (the image's own root filesystem, not the build's staging
#      directory) and run it in a private mount namespace: the root filesystem bind-mounted
#      read-only, a tmpfs owned by 65532 on /var/lib/tender, a minimal /dev, /proc, then
#      chroot as uid/gid 65532 with no_new_privs, listening on 127.0.0.1 (a free port):
#        a. the image's own entrypoint + cmd (only --listen moved to loopback);
#        b. as deploy/base runs it: --config /etc/tender/tender.yaml from the base ConfigMap's
#           file, bind-mounted read-only;
#      each must answer /readyz, /healthz, /v2/ and /metrics, run as 65532 with no capabilities
#      on a read-only root, write its data only to the tmpfs, and exit 0 on SIGTERM.
# Runs as root (mounts, chroot). Needs umoci, skopeo (installed by build-image.sh), curl.
# env: TENDER_BIN (default target/release/tender, else target/debug/tender), KEEP=1 keeps the work dir.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

die() { echo "test-image.sh: FAIL: $*" >&2; exit 1; }
log() { echo "test-image.sh: $*"; }

[ "$(id -u)" -eq 0 ] || die "run as root: the test mounts and chroots"
command -v curl >/dev/null || die "curl is missing (apt-get install curl)"
for t in unshare setpriv chroot mount findmnt; do
  command -v "$t" >/dev/null || die "$t is missing (util-linux / coreutils)"
done
if [ -z "${TENDER_BIN:-}" ]; then
  for b in "$ROOT/target/release/tender" "$ROOT/target/debug/tender"; do
    [ -x "$b" ] && { TENDER_BIN=$b; break; }
  done
fi
[ -x "${TENDER_BIN:-}" ] || die "no tender binary: run 'cargo build --bin tender' (or set TENDER_BIN)"

WORK=$(mktemp -d /tmp/tender-image-test.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  # The mounts live in the runs' private namespaces and vanish with them; never delete through one.
  local left
  left=$(findmnt -rn -o TARGET | grep -F "$WORK" || true)
  if [ -n "$left" ]; then
    sort -r <<<"$left" | while read -r m; do umount -l "$m" 2>/dev/null || true; done
    left=$(findmnt -rn -o TARGET | grep -F "$WORK" || true)
  fi
  if [ -n "$left" ]; then
    echo "test-image.sh: mounts remain under $WORK, not deleting it: $left" >&2
  elif [ -n "${KEEP:-}" ]; then
    echo "test-image.sh: kept $WORK"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT

# --- 1. build twice -----------------------------------------------------------------------------
cp "$TENDER_BIN" "$WORK/tender"      # one set of bytes for both builds (others may rebuild it)
export TENDER_BIN=$WORK/tender
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || echo 0)
VERSION=$(git describe --tags --always --dirty 2>/dev/null || echo test)
export SOURCE_DATE_EPOCH VERSION
t0=$SECONDS
scripts/build-image.sh "$WORK/out1" >"$WORK/build1.log" 2>&1 || die "build-image.sh: $(tail -5 "$WORK/build1.log")"
log "built in $((SECONDS - t0))s: $(head -1 "$WORK/build1.log" | sed 's/^build-image.sh: //')"
scripts/build-image.sh "$WORK/out2" >"$WORK/build2.log" 2>&1 || die "build-image.sh (second): $(tail -5 "$WORK/build2.log")"
d1=$(sed -n 's/^IMAGE_DIGEST=//p' "$WORK/out1/image.env")
d2=$(sed -n 's/^IMAGE_DIGEST=//p' "$WORK/out2/image.env")
if [ -z "$d1" ] || [ "$d1" != "$d2" ]; then die "two builds of the same input differ: $d1 vs $d2"; fi
log "reproducible: both builds are $d1"
OUT=$WORK/out1
TAG=$VERSION
for f in tender-oci.tar tender-docker.tar tender-oci/index.json; do
  [ -s "$OUT/$f" ] || die "build-image.sh did not write $OUT/$f"
done

# --- 2. image config and layer ------------------------------------------------------------------
skopeo inspect --config "oci-archive:$OUT/tender-oci.tar:$TAG" >"$WORK/config.json" || die "skopeo inspect of the OCI archive"
skopeo inspect "docker-archive:$OUT/tender-docker.tar" >"$WORK/docker.json" || die "skopeo inspect of the docker archive"
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
python3 - "$WORK/config.json" "$WORK/docker.json" "$REVISION" "$VERSION" <<'EOF' || die "image config (above)"
import json, sys
cfg = json.load(open(sys.argv[1])); docker = json.load(open(sys.argv[2]))
revision, version = sys.argv[3], sys.argv[4]
c = cfg["config"]; labels = c.get("Labels") or {}
want = {
    "Entrypoint": ["/usr/local/bin/tender", "serve"],
    "User": "65532:65532",
    "ExposedPorts": {"5000/tcp": {}},
}
errs = [f"{k} is {c.get(k)!r}, want {v!r}" for k, v in want.items() if c.get(k) != v]
if cfg.get("os") != "linux": errs.append(f"os {cfg.get('os')}")
if labels.get("org.opencontainers.image.revision") != revision: errs.append(f"revision label {labels.get('org.opencontainers.image.revision')!r}, want {revision}")
if labels.get("org.opencontainers.image.version") != version: errs.append(f"version label {labels.get('org.opencontainers.image.version')!r}, want {version}")
if (docker.get("Labels") or {}) != labels: errs.append("the docker archive's labels differ from the OCI image's")
for e in errs: print("test-image.sh: image config:", e, file=sys.stderr)
sys.exit(1 if errs else 0)
EOF
log "config: entrypoint tender serve, user 65532:65532, 5000/tcp, labels revision=$REVISION version=$VERSION; docker archive agrees"
# The Containerfile (for builders with an engine; none here) must describe the same runtime.
python3 - "$WORK/config.json" Containerfile <<'EOF' || die "Containerfile and build-image.sh disagree (above)"
import json, sys
c = json.load(open(sys.argv[1]))["config"]
final, stage = {}, None
for line in open(sys.argv[2]):
    word, _, rest = line.strip().partition(" ")
    if word == "FROM":
        stage, final = rest, {}
    elif word in ("ENTRYPOINT", "CMD", "USER", "EXPOSE", "VOLUME", "WORKDIR"):
        final[word] = rest.strip()
want = {
    "ENTRYPOINT": c["Entrypoint"], "CMD": c["Cmd"], "USER": c["User"],
    "EXPOSE": " ".join(sorted(c["ExposedPorts"])), "VOLUME": " ".join(sorted(c["Volumes"])),
    "WORKDIR": c["WorkingDir"],
}
errs = []
for k, v in want.items():
    got = final.get(k)
    if k in ("ENTRYPOINT", "CMD"):
        got = json.loads(got) if got else None
    if got != v:
        errs.append(f"{k}: Containerfile has {got!r}, the built image {v!r}")
for e in errs: print("test-image.sh:", e, file=sys.stderr)
sys.exit(1 if errs else 0)
EOF
log "Containerfile's final stage has the same entrypoint, cmd, user, port, volume and workdir"

BUNDLE=$WORK/bundle
umoci unpack --image "$OUT/tender-oci:$TAG" "$BUNDLE" >"$WORK/unpack.log" 2>&1 || die "umoci unpack: $(tail -5 "$WORK/unpack.log")"
RFS=$BUNDLE/rootfs
[ -z "$(find "$RFS" -perm /6000)" ] || die "setuid/setgid files in the image: $(find "$RFS" -perm /6000)"
bad_owner=$(find "$RFS" ! -path "$RFS/var/lib/tender" \( ! -uid 0 -o ! -gid 0 \))
[ -z "$bad_owner" ] || die "files not owned by root: $bad_owner"
[ "$(stat -c %u:%g "$RFS/var/lib/tender")" = 65532:65532 ] || die "/var/lib/tender is not owned by 65532"
files=$(cd "$RFS" && find . -type f | sort | tr '\n' ' ')
mapfile -t expected_libs < <(ldd "$TENDER_BIN" | awk '$2 == "=>" && $3 ~ /^\// {print "." $3} $1 ~ /^\// {print "." $1}')
want_files=$(printf '%s\n' ./etc/group ./etc/nsswitch.conf ./etc/passwd ./etc/ssl/certs/ca-certificates.crt \
  ./usr/local/bin/tender "${expected_libs[@]}" | sort | tr '\n' ' ')
[ "$files" = "$want_files" ] || die "image files: $files; want: $want_files"
grep -q '^tender:x:65532:65532:' "$RFS/etc/passwd" || die "no tender user 65532 in /etc/passwd"
log "layer: $(wc -w <<<"$files") files, all root-owned but /var/lib/tender (65532), no setuid, libraries = ldd's"

# --- 3. run it ----------------------------------------------------------------------------------
# The inner script runs in a private mount namespace (unshare --mount): every mount vanishes
# with the process. Each step execs the next, so the PID we start is tender's.
# shellcheck disable=SC2016 # expanded by the inner shell
INNER='
set -eu
R=$1 CFG=$2; shift 2
mount --bind "$R" "$R"
mount -o remount,bind,ro "$R"
mount -t tmpfs -o size=256m,mode=0755,uid=65532,gid=65532 tender-data "$R/var/lib/tender"
mount -t tmpfs -o size=1m,mode=0755 tender-dev "$R/dev"
mknod -m 0666 "$R/dev/null" c 1 3; mknod -m 0666 "$R/dev/zero" c 1 5
mknod -m 0666 "$R/dev/random" c 1 8; mknod -m 0666 "$R/dev/urandom" c 1 9
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
[ -z "$CFG" ] || mount --bind -o ro "$CFG" "$R/etc/tender"
exec setpriv --no-new-privs chroot --userspec=65532:65532 --groups=65532 "$R" "$@"
'

wait_for_listen() { # LOG PID: print the port tender logged, within 30 s; fail if it exited
  local logf=$1 pid=$2 deadline=$((SECONDS + 30)) port
  while [ "$SECONDS" -lt "$deadline" ]; do
    port=$(sed -n 's/.*tender serving on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$logf" | head -1)
    if [ -n "$port" ]; then echo "$port"; return 0; fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
wait_exit() { # PID SECONDS: its exit status, 124 if still running after SECONDS
  local pid=$1 deadline=$((SECONDS + $2)) rc=0
  while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && return 124
  wait "$pid" || rc=$?
  return "$rc"
}
http() { # URL: the status code (000 if no answer)
  curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$1" || true
}

# run_image NAME CONFIG_DIR ARGV...: run ARGV in the image's root; checks; SIGTERM; exit 0
run_image() {
  local name=$1 cfgdir=$2; shift 2
  local logf=$WORK/$name.log pid port st
  unshare --mount --propagation private -- sh -c "$INNER" inner "$RFS" "$cfgdir" "$@" >"$logf" 2>&1 &
  pid=$!; PIDS+=("$pid")
  port=$(wait_for_listen "$logf" "$pid") || die "$name: tender did not start in the image: $(tail -5 "$logf")"
  [ "$(http "http://127.0.0.1:$port/readyz")" = 200 ] || die "$name: /readyz is not 200"
  [ "$(http "http://127.0.0.1:$port/healthz")" = 200 ] || die "$name: /healthz is not 200"
  curl -s -D "$WORK/$name.v2.headers" -o /dev/null --max-time 5 "http://127.0.0.1:$port/v2/" || true
  grep -q '^HTTP/[0-9.]* 200' "$WORK/$name.v2.headers" || die "$name: /v2/ is not 200: $(head -1 "$WORK/$name.v2.headers")"
  grep -qi '^Docker-Distribution-API-Version: registry/2.0' "$WORK/$name.v2.headers" || die "$name: /v2/ lacks the registry API header"
  # to a file first: grep -q stops reading at its match, and curl's SIGPIPE would fail the pipe
  curl -s --max-time 5 -o "$WORK/$name.metrics" "http://127.0.0.1:$port/metrics" || true
  grep -q '^tender_http_requests_total' "$WORK/$name.metrics" \
    || die "$name: /metrics does not count the requests"
  # The process: its root is the image's, read-only; it is uid/gid 65532 with no capabilities.
  [ "$(readlink "/proc/$pid/exe" | sed 's/ (deleted)$//')" = "$RFS/usr/local/bin/tender" ] \
    || die "$name: pid $pid is $(readlink "/proc/$pid/exe"), not the image's tender"
  st=/proc/$pid/status
  grep -Eq '^Uid:\s+65532\s+65532\s+65532\s+65532$' "$st" || die "$name: $(grep ^Uid "$st")"
  grep -Eq '^Gid:\s+65532\s+65532\s+65532\s+65532$' "$st" || die "$name: $(grep ^Gid "$st")"
  grep -Eq '^Groups:\s+65532\s*$' "$st" || die "$name: $(grep ^Groups "$st")"
  if ! grep -Eq '^CapEff:\s+0+$' "$st" || ! grep -Eq '^CapPrm:\s+0+$' "$st"; then
    die "$name: has capabilities: $(grep ^Cap "$st" | tr '\n' ' ')"
  fi
  grep -Eq '^NoNewPrivs:\s+1$' "$st" || die "$name: no_new_privs is not set"
  awk '$5 == "/" { print $6 }' "/proc/$pid/mountinfo" | grep -Eq '(^|,)ro(,|$)' \
    || die "$name: the root filesystem is not read-only: $(awk '$5 == "/"' "/proc/$pid/mountinfo")"
  [ "$(stat -c %u "/proc/$pid/root/var/lib/tender/data/tender-data.json")" = 65532 ] \
    || die "$name: no data directory written by 65532 under /var/lib/tender/data"
  kill -TERM "$pid"
  local rc=0; wait_exit "$pid" 15 || rc=$?
  [ "$rc" -eq 0 ] || die "$name: exit $rc after SIGTERM: $(tail -5 "$logf")"
  log "$name: served /readyz /healthz /v2/ /metrics on 127.0.0.1:$port as 65532 (no caps, no_new_privs, read-only root), exit 0 on SIGTERM"
}

# a. The image's own entrypoint and cmd, with only the listen address moved to loopback.
mapfile -t argv < <(python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))["config"]
for a in c["Entrypoint"] + [("127.0.0.1:0" if a == "0.0.0.0:5000" else a) for a in c["Cmd"]]:
    print(a)' "$WORK/config.json")
run_image "default-cmd" "" "${argv[@]}"

# b. As deploy/base runs it: the ConfigMap's file at /etc/tender/tender.yaml.
mkdir -p "$WORK/etc-tender"
cp deploy/base/tender.yaml "$WORK/etc-tender/tender.yaml"
run_image "deploy-config" "$WORK/etc-tender" \
  /usr/local/bin/tender serve --config /etc/tender/tender.yaml --listen 127.0.0.1:0

leaked=$(findmnt -rn -o TARGET | grep -F "$WORK" || true)
[ -z "$leaked" ] || die "mounts leaked out of the runs' namespaces: $leaked"
echo "test-image.sh: all checks passed"
