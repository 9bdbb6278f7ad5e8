#!/usr/bin/env bash
# scripts/test-systemd.sh - check deploy/systemd/tender.service without a running systemd.
#   1. systemd-analyze verify: the unit parses, its directives exist (ExecStart pointed at the
#      built binary, since verify looks for the executable);
#   2. systemd-analyze security --offline=yes: the exposure score must stay at most 2.0 ("OK");
#   3. the unit's restrictions emulated (as scripts/test-image.sh does for the image): in a
#      private mount namespace every mount read-only (ProtectSystem=strict) but a tmpfs state
#      directory at /var/lib/tender (StateDirectory=, mode from StateDirectoryMode=), an empty
#      /tmp (PrivateTmp=), /home and /root hidden (ProtectHome=); the unit's ExecStart run
#      as an unprivileged uid with no capabilities, no_new_privs and the unit's UMask=. It
#      must answer /readyz, /healthz and /v2/, write its data only to the state directory with
#      the modes tender promises (0711 data directory, 0600 files), and exit 0 on SIGTERM.
# Runs as root (mounts). Needs systemd (systemd-analyze), util-linux, curl.
# env: TENDER_BIN (default target/debug/tender), KEEP=1 keeps the work directory.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
UNIT=$ROOT/deploy/systemd/tender.service

die() { echo "test-systemd.sh: FAIL: $*" >&2; exit 1; }
log() { echo "test-systemd.sh: $*"; }

[ "$(id -u)" -eq 0 ] || die "run as root: the test mounts"
command -v systemd-analyze >/dev/null || die "systemd-analyze is missing (apt-get install systemd)"
for t in unshare setpriv mount findmnt curl; do
  command -v "$t" >/dev/null || die "$t is missing"
done
TENDER_BIN=${TENDER_BIN:-$ROOT/target/debug/tender}
[ -x "$TENDER_BIN" ] || die "no tender binary at $TENDER_BIN: run 'cargo build --bin tender'"

# Not under /tmp: the emulation puts an empty tmpfs there.
WORK=$(mktemp -d /var/tmp/tender-systemd-test.XXXXXX)
PID=
cleanup() {
  [ -z "$PID" ] || kill -KILL "$PID" 2>/dev/null || true
  if [ -n "${KEEP:-}" ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

prop() { # KEY: the unit's value of KEY (the last one wins, as in systemd)
  sed -n "s/^$1=//p" "$UNIT" | tail -1
}

# --- 1. verify ------------------------------------------------------------------------------
sed "s#^ExecStart=/usr/local/bin/tender #ExecStart=$TENDER_BIN #" "$UNIT" >"$WORK/tender.service"
grep -q "^ExecStart=$TENDER_BIN " "$WORK/tender.service" || die "ExecStart does not start /usr/local/bin/tender"
out=$(systemd-analyze verify "$WORK/tender.service" 2>&1) || die "systemd-analyze verify: $out"
[ -z "$out" ] || die "systemd-analyze verify printed: $out"
log "verify: clean"

# --- 2. security ----------------------------------------------------------------------------
sec=$(systemd-analyze security --offline=yes --no-pager "$WORK/tender.service" 2>&1) || die "systemd-analyze security: $sec"
score=$(sed -n 's/.*Overall exposure level for tender.service: \([0-9.]*\).*/\1/p' <<<"$sec")
[ -n "$score" ] || die "no exposure score in: $(tail -3 <<<"$sec")"
awk -v s="$score" 'BEGIN { exit !(s <= 2.0) }' || die "exposure $score is above 2.0: $(grep '✗' <<<"$sec")"
log "security: exposure $score ($(grep -c '✗' <<<"$sec") findings open)"

# --- 2b. safe defaults (issue 32): loopback unless TLS and auth are set, a memory wall --------------
CONF=$ROOT/deploy/systemd/tender.yaml
grep -qE '^listen: 127\.0\.0\.1:[0-9]+$' "$CONF" \
  || die "deploy/systemd/tender.yaml must listen on loopback (plain HTTP, no client authentication): $(grep '^listen:' "$CONF")"
! grep -qE '^(tls|auth):' "$CONF" || die "deploy/systemd/tender.yaml: check the listen rule against its tls/auth"
[ -n "$(prop MemoryMax)" ] && [ -n "$(prop MemoryHigh)" ] || die "the unit has no MemoryHigh=/MemoryMax="
log "defaults: listen $(sed -n 's/^listen: //p' "$CONF"), MemoryHigh=$(prop MemoryHigh) MemoryMax=$(prop MemoryMax)"

# --- 3. run under the unit's restrictions -------------------------------------------------------
umask_v=$(prop UMask); mode=$(prop StateDirectoryMode); state=/var/lib/$(prop StateDirectory)
[ "$umask_v" = 0077 ] && [ "$mode" = 0711 ] && [ "$state" = /var/lib/tender ] \
  || die "UMask=$umask_v StateDirectoryMode=$mode StateDirectory=$state: the test expects 0077, 0711, tender"
grep -q '^ProtectSystem=strict$' "$UNIT" && grep -q '^PrivateTmp=yes$' "$UNIT" && grep -q '^ProtectHome=yes$' "$UNIT" \
  && grep -q '^NoNewPrivileges=yes$' "$UNIT" && grep -q '^CapabilityBoundingSet=$' "$UNIT" \
  || die "the unit no longer has the restrictions this test emulates"
read -r -a exec_argv <<<"$(prop ExecStart)"
[ "${exec_argv[0]}" = /usr/local/bin/tender ] || die "ExecStart: ${exec_argv[*]}"
exec_argv[0]=/mnt/tender
cp "$TENDER_BIN" "$WORK/tender"
# The config the unit names, from deploy/systemd with the listen address on loopback and no
# upstream reached: bound read-only where the unit expects it.
mkdir -p "$WORK/etc-tender"
sed -e 's/^listen: .*/listen: 127.0.0.1:0/' "$ROOT/deploy/systemd/tender.yaml" >"$WORK/etc-tender/tender.yaml"
U=64951 # no such user on a test machine: stands for the static `tender` user

# shellcheck disable=SC2016 # expanded by the inner shell
INNER='
set -eu
W=$1 U=$2 MODE=$3 UMASK=$4; shift 4
mount --make-rprivate /
# StateDirectory=: /var/lib/tender, owned by the service user, on a tmpfs (host /var/lib hidden).
mount -t tmpfs -o size=64m,mode=0755 state /var/lib
mkdir -m "$MODE" /var/lib/tender && chown "$U:$U" /var/lib/tender
mount --bind /var/lib/tender /var/lib/tender
# ConfigurationDirectory= and the binary: on a tmpfs at /mnt, read-only below (the checkout
# may sit where the service user cannot reach).
mount -t tmpfs -o size=1g,mode=0755 etc-tender /mnt
cp "$W/etc-tender/tender.yaml" /mnt/ && chmod 0644 /mnt/tender.yaml
cp "$W/tender" /mnt/tender && chmod 0755 /mnt/tender
# PrivateTmp=, ProtectHome=.
mount -t tmpfs -o size=16m,mode=1777 tmp /tmp
for h in /home /root; do [ -d "$h" ] && mount -t tmpfs -o size=1m,mode=0000 hidden "$h"; done
# ProtectSystem=strict: every mount read-only but the state directory.
findmnt -rno TARGET | sort -r | while read -r m; do
  case "$m" in /var/lib/tender | /tmp | /proc | /proc/* | /sys | /sys/* | /dev | /dev/*) continue ;; esac
  mount -o remount,bind,ro "$m" 2>/dev/null || true
done
exec setpriv --reuid="$U" --regid="$U" --clear-groups --no-new-privs --inh-caps=-all --bounding-set=-all \
  sh -c "umask $UMASK; exec \"\$@\"" sh "$@"
'
# The unit's --config path is /etc/tender/tender.yaml; /etc itself stays the host's, so the
# config sits at /mnt (read-only) and the argument is rewritten to it.
for i in "${!exec_argv[@]}"; do
  [ "${exec_argv[$i]}" = /etc/tender/tender.yaml ] && exec_argv[$i]=/mnt/tender.yaml
done
unshare --mount --propagation private -- sh -c "$INNER" inner "$WORK" "$U" "$mode" "$umask_v" "${exec_argv[@]}" \
  >"$WORK/serve.log" 2>&1 &
PID=$!
port=
for _ in $(seq 300); do
  port=$(sed -n 's/.*tender serving on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$WORK/serve.log" | head -1)
  [ -n "$port" ] && break
  kill -0 "$PID" 2>/dev/null || die "tender exited under the unit's restrictions: $(tail -5 "$WORK/serve.log")"
  sleep 0.1
done
[ -n "$port" ] || die "tender did not start within 30 s: $(tail -5 "$WORK/serve.log")"
for p in /readyz /healthz /v2/; do
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$port$p" || true)
  [ "$code" = 200 ] || die "$p answered $code"
done
st=/proc/$PID/status
grep -Eq "^Uid:\s+$U\s+$U\s+$U\s+$U$" "$st" || die "$(grep ^Uid "$st")"
grep -Eq '^CapEff:\s+0+$' "$st" && grep -Eq '^CapBnd:\s+0+$' "$st" || die "capabilities: $(grep ^Cap "$st" | tr '\n' ' ')"
grep -Eq '^NoNewPrivs:\s+1$' "$st" || die "no_new_privs is not set"
awk '$5 == "/" { print $6 }' "/proc/$PID/mountinfo" | grep -Eq '(^|,)ro(,|$)' || die "the root filesystem is writable"
data=/proc/$PID/root/var/lib/tender
[ "$(stat -c '%u %a' "$data")" = "$U 711" ] || die "state directory: $(stat -c '%u %a' "$data"), want $U 711"
[ "$(stat -c '%u %a' "$data/tender-data.json")" = "$U 600" ] || die "tender-data.json: $(stat -c '%u %a' "$data/tender-data.json")"
[ "$(stat -c '%a' "$data/goldens")" = 755 ] || die "goldens: $(stat -c '%a' "$data/goldens"), want 755 (qemu reads goldens)"
bad=$(find "$data" -mindepth 1 -maxdepth 1 ! -name goldens -perm /077 -printf '%p %m\n')
[ -z "$bad" ] || die "open to other users: $bad"
kill -TERM "$PID"
rc=0
for _ in $(seq 150); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
wait "$PID" || rc=$?
PID=
[ "$rc" -eq 0 ] || die "exit $rc after SIGTERM: $(tail -5 "$WORK/serve.log")"
log "run: /readyz /healthz /v2/ on 127.0.0.1:$port as uid $U (no capabilities, no_new_privs, read-only root, umask $umask_v), data only in $state (0711, files 0600, goldens 0755), exit 0 on SIGTERM"
