#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS_PER_TARGET] - build the cargo-fuzz targets in fuzz/ and run each one
# for a bounded time (default 20 s) from its kept corpus. Exits non-zero on the first target
# that crashes, fails a property, times out or leaks, naming the input it saved. See
# docs/fuzzing.md.
#
# Runs on the pinned stable toolchain: cargo-fuzz passes -Z flags (sanitizer, coverage), which
# RUSTC_BOOTSTRAP=1 allows. Installs cargo-fuzz from crates.io when it is missing.
# Built without a sanitizer by default: tender's own code forbids `unsafe`, and AddressSanitizer
# doubles the build (about 2.5 min -> 5 min on 2 cores). The long runs use it.
# env: FUZZ_TARGETS="a b" runs only those; FUZZ_SANITIZER=address (or leak, none);
#      FUZZ_KEEP=1 adds what the run found to fuzz/corpus/ (otherwise new inputs go to a
#      temporary directory and the kept corpus is left as it is); FUZZ_LOG_DIR=DIR keeps the
#      libFuzzer logs there.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
SECONDS_PER_TARGET=${1:-20}
SANITIZER=${FUZZ_SANITIZER:-none}
export RUSTC_BOOTSTRAP=1

case "$SECONDS_PER_TARGET" in
  '' | *[!0-9]*) echo "fuzz.sh: SECONDS_PER_TARGET must be a whole number of seconds, not '$SECONDS_PER_TARGET'" >&2; exit 2 ;;
esac

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz.sh: installing cargo-fuzz (cargo install cargo-fuzz --locked)"
  cargo install cargo-fuzz --locked || { echo "fuzz.sh: could not install cargo-fuzz" >&2; exit 1; }
fi

# target -> dictionary
dict_of() {
  case "$1" in
    oci_*) echo oci ;;
    range) echo range ;;
    image_path) echo image_path ;;
    render_*) echo render ;;
    *) echo "" ;;
  esac
}

cd "$ROOT/fuzz" || exit 1
TARGETS=${FUZZ_TARGETS:-$(cargo fuzz list)}

t0=$(date +%s)
echo "==> fuzz: building the targets in fuzz/ (sanitizer: $SANITIZER)"
cargo fuzz build --sanitizer "$SANITIZER" || { echo "fuzz.sh: the fuzz targets do not build" >&2; exit 1; }
echo "==> fuzz: built in $(( $(date +%s) - t0 ))s"

work=$(mktemp -d /tmp/tender-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
[ -n "${FUZZ_LOG_DIR:-}" ] && mkdir -p "$FUZZ_LOG_DIR"
summary=""
for t in $TARGETS; do
  mkdir -p "corpus/$t" "artifacts/$t"
  if [ -n "${FUZZ_KEEP:-}" ]; then
    dirs=("corpus/$t")
  else
    mkdir -p "$work/$t"
    dirs=("$work/$t" "corpus/$t")
  fi
  args=(-max_total_time="$SECONDS_PER_TARGET" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$ROOT/fuzz/artifacts/$t/")
  d=$(dict_of "$t")
  [ -n "$d" ] && args+=(-dict="dict/$d.dict")
  log="${FUZZ_LOG_DIR:-$work}/$t.log"
  echo "==> fuzz: $t for ${SECONDS_PER_TARGET}s"
  cargo fuzz run --sanitizer "$SANITIZER" "$t" "${dirs[@]}" -- "${args[@]}" >"$log" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n 1)
  corpus=$(find "corpus/$t" -type f | wc -l)
  if [ "$rc" -ne 0 ]; then
    tail -n 60 "$log" >&2
    unit=$(sed -n 's/.*Test unit written to //p' "$log" | tail -n 1)
    echo "fuzz.sh: $t FAILED (exit $rc); input: ${unit:-none saved, see the log above}" >&2
    echo "fuzz.sh: reproduce with: cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer $SANITIZER $t ${unit:-}" >&2
    exit 1
  fi
  line="$t: ${runs:-?} executions in ${secs:-?}s ($(( ${runs:-0} / (${secs:-1} > 0 ? ${secs:-1} : 1) )) exec/s), kept corpus $corpus inputs, no crash"
  echo "    $line"
  summary="$summary$line"$'\n'
done
echo "==> fuzz: every target ran clean in $(( $(date +%s) - t0 ))s"
printf '%s' "$summary"
