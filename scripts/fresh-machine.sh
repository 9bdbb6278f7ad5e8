#!/usr/bin/env bash
# scripts/fresh-machine.sh - prove README's two commands on a fresh Debian 12: debootstrap a
# bookworm root, bind the host's Rust toolchain into it (rustup and cargo homes, read-only
# toolchain), clone this repository's HEAD into it, then, inside the root:
#   1. cargo run --release --bin tender -- serve     (must answer /v2/ on 127.0.0.1:5000)
#   2. bash scripts/test.sh                          (installs its packages itself, must pass)
# CI's machine keeps packages between runs, so only this shows a missing install step. On
# demand, as root, with network access to the Debian mirror; about an hour on 2 cores.
# usage: scripts/fresh-machine.sh [WORKDIR]   (default /var/tmp/tender-fresh; KEEP=1 keeps it)
# env: MIRROR=http://deb.debian.org/debian  SUITE=bookworm  TEST_ENV="E2E_FILTER=t3_skopeo" (extra
#      environment for test.sh, e.g. to try one e2e test first)
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "fresh-machine.sh: run as root (debootstrap, chroot, mounts)" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "fresh-machine.sh: apt-get install -y debootstrap" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/var/tmp/tender-fresh}
root=$work/root
rustup_home=${RUSTUP_HOME:-$HOME/.rustup} cargo_home=${CARGO_HOME:-$HOME/.cargo}
[ -d "$rustup_home/toolchains" ] || { echo "fresh-machine.sh: no rustup toolchains in $rustup_home" >&2; exit 2; }

mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  [ "${KEEP:-}" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT
bind() { mkdir -p "$2"; mount --bind "$1" "$2"; mounted+=("$2"); [ "${3:-}" != ro ] || mount -o remount,bind,ro "$2"; }

if [ ! -x "$root/bin/bash" ]; then
  mkdir -p "$work"
  # git and ca-certificates: what "a fresh machine has" besides the toolchain (README); python3
  # and qemu-utils likewise; build-essential for crates that compile C
  debootstrap --variant=minbase --include=git,ca-certificates,python3,python3-venv,qemu-utils,build-essential,curl,procps \
    "${SUITE:-bookworm}" "$root" "${MIRROR:-http://deb.debian.org/debian}"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
# the host's own network trust (a site CA, an egress proxy's CA) is the machine's, not the
# project's: carry it in, as a fresh machine on this network would have it
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null
fi
[ ! -f /etc/pip.conf ] || cp /etc/pip.conf "$root/etc/pip.conf"
# the root is a mount point of its own, as a machine's / is (test-image.sh's unshare
# --propagation private needs one)
bind "$root" "$root"
bind /proc "$root/proc"; bind /sys "$root/sys"; bind /dev "$root/dev"; bind /dev/pts "$root/dev/pts"
# /tmp stays the root's own directory on disk, as on a Debian 12 install
bind "$rustup_home" "$root/root/.rustup" ro
# cargo's home: the binaries read-only, the registry cache writable inside the root
mkdir -p "$root/root/.cargo/registry"
bind "$cargo_home/bin" "$root/root/.cargo/bin" ro

rm -rf "$root/root/tender"
git clone -q "$repo" "$root/root/tender"
echo "fresh-machine: $(git -C "$repo" log -1 --format='%h %s') in $root/root/tender"

in_root() {
  chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    RUSTUP_HOME=/root/.rustup CARGO_HOME=/root/.cargo bash -c "cd /root/tender && $1"
}

# 1. run tender on its embedded default
in_root 'cargo build --release --bin tender'
in_root 'set -e; (cargo run -q --release --bin tender -- serve >/tmp/serve.log 2>&1 & echo $! >/tmp/serve.pid)
  for i in $(seq 1 100); do curl -fsS -o /dev/null http://127.0.0.1:5000/v2/ && break; sleep 0.2; done
  curl -fsS -D - -o /dev/null http://127.0.0.1:5000/v2/ | head -1
  kill "$(cat /tmp/serve.pid)"; wait "$(cat /tmp/serve.pid)" 2>/dev/null || true
  grep -q "serving on" /tmp/serve.log || { cat /tmp/serve.log; exit 1; }'
echo "fresh-machine: command 1 (tender serve on the embedded default) answered"

# 2. run every test
in_root "${TEST_ENV:-} bash scripts/test.sh"
echo "fresh-machine: command 2 (bash scripts/test.sh) passed"
