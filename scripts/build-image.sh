#!/usr/bin/env bash
# scripts/build-image.sh [OUT_DIR] - build tender's container image without a container engine.
#
# Assembles a minimal root filesystem from the release binary and exactly the shared libraries it
# needs (ldd), Debian's CA bundle, /etc/passwd + /etc/group with the non-root user 65532 `tender`,
# the config mount point /etc/tender and the data mount point /var/lib/tender (owned by 65532),
# turns it into a one-layer OCI image with umoci and exports it with skopeo:
#
#   OUT_DIR/tender-oci/         OCI image layout (tag = VERSION)
#   OUT_DIR/tender-oci.tar      OCI archive          (skopeo copy oci-archive:... docker://REGISTRY/tender:TAG)
#   OUT_DIR/tender-docker.tar   docker-archive       (docker load -i / podman load -i)
#   OUT_DIR/image.env           IMAGE_TAG, IMAGE_DIGEST (manifest), IMAGE_REF, ...
#
# Entrypoint ["/usr/local/bin/tender","serve"], user 65532:65532, port 5000/tcp, default
# arguments --listen 0.0.0.0:5000 --data /var/lib/tender/data (Kubernetes replaces them with
# --config; see deploy/). The same binary and SOURCE_DATE_EPOCH give the same manifest digest.
#
# env: TENDER_BIN   the binary (default target/release/tender: cargo build --release --bin tender)
#      IMAGE_NAME   name in the docker-archive (default tender)
#      VERSION      tag and org.opencontainers.image.version (default: git describe --tags --always --dirty)
#      IMAGE_SOURCE org.opencontainers.image.source (default: git remote origin; omitted if none)
#      SOURCE_DATE_EPOCH  file mtimes and image creation time (default: the last commit's time)
#      STRIP=0      keep the binary's debug info (default: objcopy --strip-debug, about 1/4 the size)
# Needs root (files in the layer are owned by 0 and 65532), umoci, skopeo, ca-certificates;
# installs the missing packages with apt-get as root.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

die() { echo "build-image.sh: $*" >&2; exit 1; }

OUT=${1:-$ROOT/target/image}
BIN=${TENDER_BIN:-$ROOT/target/release/tender}
IMAGE_NAME=${IMAGE_NAME:-tender}
UID_TENDER=65532
PORT=5000

[ "$(id -u)" -eq 0 ] || die "run as root: the image's files must be owned by root and by uid $UID_TENDER"
[ -x "$BIN" ] || die "no binary at $BIN: run 'cargo build --release --bin tender' first, or set TENDER_BIN"

need_pkgs=()
command -v umoci >/dev/null || need_pkgs+=(umoci)
command -v skopeo >/dev/null || need_pkgs+=(skopeo)
[ -f /etc/ssl/certs/ca-certificates.crt ] || need_pkgs+=(ca-certificates)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  echo "build-image.sh: installing ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q || die "apt-get update failed"
  apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" || die "could not install ${need_pkgs[*]}"
fi

if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
  REVISION=$(git -C "$ROOT" rev-parse HEAD)
  VERSION=${VERSION:-$(git -C "$ROOT" describe --tags --always --dirty)}
  SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct)}
  IMAGE_SOURCE=${IMAGE_SOURCE:-$(git -C "$ROOT" remote get-url origin 2>/dev/null || true)}
else
  REVISION=unknown
  VERSION=${VERSION:-unknown}
  SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-0}
  IMAGE_SOURCE=${IMAGE_SOURCE:-}
fi
[[ $VERSION =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "VERSION '$VERSION' is not a valid image tag"
[[ $SOURCE_DATE_EPOCH =~ ^[0-9]+$ ]] || die "SOURCE_DATE_EPOCH '$SOURCE_DATE_EPOCH' is not a number of seconds"
CREATED=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)

WORK=$(mktemp -d /tmp/tender-image.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
STAGE=$WORK/rootfs
mkdir -p "$STAGE"

# --- the binary -------------------------------------------------------------------------------
install -d -m 0755 "$STAGE/usr/local/bin"
if [ "${STRIP:-1}" != 0 ] && command -v objcopy >/dev/null; then
  objcopy --strip-debug "$BIN" "$STAGE/usr/local/bin/tender"
else
  cp "$BIN" "$STAGE/usr/local/bin/tender"
fi
chmod 0755 "$STAGE/usr/local/bin/tender"
# A binary being rebuilt while we copied it would not start: check the copy, not the source.
BIN_VERSION=$("$STAGE/usr/local/bin/tender" --version) || die "the copied binary does not run ($BIN)"

# --- exactly the shared libraries it loads, at the paths ldd resolves --------------------------
ldd_out=$(ldd "$STAGE/usr/local/bin/tender" 2>&1) || true
if grep -q "not found" <<<"$ldd_out"; then
  die "a shared library of $BIN is missing on this machine: $(grep 'not found' <<<"$ldd_out")"
fi
libs=()
if ! grep -Eq "not a dynamic executable|statically linked" <<<"$ldd_out"; then
  while read -r line; do
    case $line in
      *"=> /"*) libs+=("$(awk '{print $3}' <<<"$line")") ;;  # libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)
      /*) libs+=("$(awk '{print $1}' <<<"$line")") ;;         # /lib64/ld-linux-x86-64.so.2 (0x...)
    esac
  done <<<"$ldd_out"
  [ "${#libs[@]}" -gt 0 ] || die "ldd listed no libraries for a dynamic binary: $ldd_out"
fi
for lib in "${libs[@]}"; do
  install -d -m 0755 "$STAGE$(dirname "$lib")"
  cp -L "$lib" "$STAGE$lib"     # the file itself under the name the loader asks for
  chmod 0755 "$STAGE$lib"
done

# --- /etc -------------------------------------------------------------------------------------
install -d -m 0755 "$STAGE/etc" "$STAGE/etc/ssl/certs" "$STAGE/etc/tender"
install -m 0644 /etc/ssl/certs/ca-certificates.crt "$STAGE/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\ntender:x:%s:%s:tender:/var/lib/tender:/sbin/nologin\n' \
  "$UID_TENDER" "$UID_TENDER" >"$STAGE/etc/passwd"
printf 'root:x:0:\ntender:x:%s:\n' "$UID_TENDER" >"$STAGE/etc/group"
printf 'hosts: files dns\n' >"$STAGE/etc/nsswitch.conf"
chmod 0644 "$STAGE/etc/passwd" "$STAGE/etc/group" "$STAGE/etc/nsswitch.conf"

# --- mount points: data (writable by tender), tmp, and what runtimes mount over -----------------
install -d -m 0755 -o "$UID_TENDER" -g "$UID_TENDER" "$STAGE/var/lib/tender"
install -d -m 1777 "$STAGE/tmp"
install -d -m 0755 "$STAGE/dev" "$STAGE/proc" "$STAGE/sys"

# Fixed timestamps: the same inputs give the same layer.
find "$STAGE" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

# --- the OCI image ----------------------------------------------------------------------------
LAYOUT=$WORK/oci
umoci init --layout "$LAYOUT"
umoci new --image "$LAYOUT:$VERSION"
umoci insert --image "$LAYOUT:$VERSION" \
  --history.created "$CREATED" --history.created_by "scripts/build-image.sh: rootfs" \
  --history.comment "$BIN_VERSION, $(basename "$BIN") + ${#libs[@]} libraries" \
  "$STAGE" /
labels=(
  "org.opencontainers.image.title=tender"
  "org.opencontainers.image.description=OCI pull-through registry mirror and Talos Image Factory cache"
  "org.opencontainers.image.version=$VERSION"
  "org.opencontainers.image.revision=$REVISION"
  "org.opencontainers.image.created=$CREATED"
)
[ -n "$IMAGE_SOURCE" ] && labels+=("org.opencontainers.image.source=$IMAGE_SOURCE")
label_args=()
for l in "${labels[@]}"; do
  label_args+=("--config.label=$l" "--manifest.annotation=$l")
done
umoci config --image "$LAYOUT:$VERSION" \
  --created "$CREATED" --os linux --architecture "$(dpkg --print-architecture 2>/dev/null || echo amd64)" \
  --config.user "$UID_TENDER:$UID_TENDER" \
  --config.exposedports "$PORT/tcp" \
  --config.workingdir /var/lib/tender \
  --config.volume /var/lib/tender \
  --config.env "PATH=/usr/local/bin" \
  --config.entrypoint /usr/local/bin/tender --config.entrypoint serve \
  --config.cmd=--listen --config.cmd="0.0.0.0:$PORT" --config.cmd=--data --config.cmd=/var/lib/tender/data \
  --config.stopsignal SIGTERM \
  "${label_args[@]}" \
  --history.created "$CREATED" --history.created_by "scripts/build-image.sh: config"
umoci gc --layout "$LAYOUT"

# --- export -----------------------------------------------------------------------------------
mkdir -p "$OUT"
rm -rf "$OUT/tender-oci" "$OUT/tender-oci.tar" "$OUT/tender-docker.tar"
cp -a "$LAYOUT" "$OUT/tender-oci"
skopeo copy --quiet "oci:$LAYOUT:$VERSION" "oci-archive:$OUT/tender-oci.tar:$VERSION"
skopeo copy --quiet "oci:$LAYOUT:$VERSION" "docker-archive:$OUT/tender-docker.tar:$IMAGE_NAME:$VERSION"

DIGEST=$(skopeo inspect --raw "oci:$OUT/tender-oci:$VERSION" | sha256sum | awk '{print "sha256:" $1}')
SIZE=$(du -sb "$OUT/tender-oci.tar" | awk '{print $1}')
cat >"$OUT/image.env" <<EOF
IMAGE_TAG=$VERSION
IMAGE_DIGEST=$DIGEST
IMAGE_REF=$IMAGE_NAME:$VERSION
IMAGE_REVISION=$REVISION
IMAGE_CREATED=$CREATED
IMAGE_LAYOUT=$OUT/tender-oci
EOF
echo "build-image.sh: $IMAGE_NAME:$VERSION $DIGEST ($((SIZE / 1024 / 1024)) MiB, $BIN_VERSION, libraries: ${libs[*]:-none})"
echo "build-image.sh: $OUT/tender-oci.tar  $OUT/tender-docker.tar  $OUT/tender-oci/"
