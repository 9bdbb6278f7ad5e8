#!/usr/bin/env bash
# scripts/test-clone.sh - prove that the repository stands alone: clone HEAD into an empty
# temporary directory (nothing beside it, no sibling directories, no state of this checkout), then run the
# unit and in-process tests there and one end-to-end test (skopeo) through the clone's own
# scripts/test.sh. CARGO_TARGET_DIR is this checkout's target directory, so only the workspace's
# own crates are compiled again.
# usage: scripts/test-clone.sh          (E2E_TEST=t3_skopeo picks the e2e test)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$here/target}
case $target in /*) ;; *) target=$here/$target ;; esac
tmp=$(mktemp -d /tmp/tender-clone.XXXXXX)
# The clone's builds of the workspace's own crates land under the same names as this checkout's
# and their fingerprints hold paths relative to the workspace, so cargo here would take them as
# fresh, with the clone's CARGO_MANIFEST_DIR baked in. Drop them on the way out: the next build
# here compiles the workspace's crates again (dependencies stay).
forget_clone_builds() {
  local pkgs
  pkgs=$(sed -n 's/^name = "\(tender[a-z0-9-]*\)"$/-p \1/p' "$here"/crates/*/Cargo.toml | sort -u)
  # shellcheck disable=SC2086 # one -p NAME pair per workspace crate
  (cd "$here" && cargo clean -q $pkgs) || true
  rm -rf "$tmp"
}
trap forget_clone_builds EXIT
git clone -q --no-hardlinks "$here" "$tmp/tender"
cd "$tmp/tender"
echo "test-clone: $(git log -1 --format='%h %s') in $tmp/tender (alone: $(ls -A "$tmp"))"
if grep -rn --exclude-dir=.git -e '[.][.]/shared' . ; then
  echo "test-clone: the repository refers to a directory beside it" >&2
  exit 1
fi
export CARGO_TARGET_DIR=$target
# the e2e tests take the binary from TENDER_BIN or the target directory: the clone's build
unset TENDER_BIN TENDER_HARNESS
cargo test --workspace --exclude tender-e2e --no-fail-fast
SKIP_UNIT=1 SKIP_DEPLOY=1 E2E_FILTER=${E2E_TEST:-t3_skopeo} bash scripts/test.sh
