#!/usr/bin/env bash
# testdata/cozystack/run-reconcile-job.sh - run the talos-reconcile Job script of a rendered
# Cozystack chart (`helm template` output of packages/apps/kubernetes-nodes or
# packages/apps/kubernetes) with a recording `kubectl`, and keep what it applies.
#
#   run-reconcile-job.sh RENDERED.yaml OUTDIR
#
# For every Job whose name contains "-talos-reconcile-": its script (container `kubectl`,
# command ["sh", "-ec", SCRIPT]) runs under `sh -ec` with the Job's plain env values, fake values
# for the secretKeyRef ones (TALOS_TOKEN, CLUSTER_ID, CLUSTER_SECRET, BOOTSTRAP_TOKEN), and a
# `kubectl` first on PATH that answers the four lookups the script waits for (Service ClusterIP
# 10.95.0.10, the two CA Secrets, kube-dns 10.96.0.10) and the KamajiControlPlane uid, and
# records everything else. Output, per Job: OUTDIR/<job>.calls (one kubectl argv per line),
# OUTDIR/<job>.applied.yaml (what `kubectl apply -f -` read: the TalosConfigTemplate),
# OUTDIR/<job>.talos.yaml (its spec.template.spec.data: the worker's Talos machine config),
# OUTDIR/<job>.log (the script's output). Exit 1 if a script fails or no Job is found.
# Needs python3 with PyYAML (Debian: python3-yaml), sh.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 RENDERED.yaml OUTDIR" >&2; exit 2; }
RENDERED=$1 OUT=$2
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# The recording kubectl.
mkdir -p "$OUT/bin"
cat >"$OUT/bin/kubectl" <<'EOF'
#!/bin/sh
# recording kubectl: argv to $KUBECTL_CALLS; canned answers for the reconcile Job's reads
printf '%s\n' "$*" >>"$KUBECTL_CALLS"
case "$*" in
  *"get svc kube-dns"*) printf '10.96.0.10' ;;
  *"get svc "*) printf '10.95.0.10' ;;
  *"get secret "*"-talos-ca "*) printf 'VEFMT1MtQ0EtUEVN' ;;   # base64 "TALOS-CA-PEM"
  *"get secret "*"-ca "*) printf 'SzhTLUNBLVBFTQ==' ;;          # base64 "K8S-CA-PEM"
  *"get kamajicontrolplane "*) printf '00000000-0000-0000-0000-00000000c0de' ;;
  *"apply -f -"*) cat >>"$KUBECTL_APPLIED" ;;
  *"patch "*) : ;;
  *) echo "recording kubectl: unexpected call: $*" >&2; exit 1 ;;
esac
EOF
chmod +x "$OUT/bin/kubectl"

# Each Job's script and plain env, as NAME\0SCRIPT and NAME.env files.
python3 - "$RENDERED" "$OUT" <<'EOF'
import shlex, sys, yaml
rendered, out = sys.argv[1:3]
n = 0
with open(rendered, encoding="utf-8") as f:
    for doc in yaml.safe_load_all(f):
        if not doc or doc.get("kind") != "Job" or "-talos-reconcile-" not in doc["metadata"]["name"]:
            continue
        name = doc["metadata"]["name"]
        [c] = [c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == "kubectl"]
        cmd = c["command"]
        assert cmd[:2] == ["sh", "-ec"] and len(cmd) == 3, f"{name}: unexpected command {cmd[:2]}"
        with open(f"{out}/{name}.sh", "w", encoding="utf-8") as s:
            s.write(cmd[2])
        with open(f"{out}/{name}.env", "w", encoding="utf-8") as e:
            fake = {"TALOS_TOKEN": "fake-talos-token", "CLUSTER_ID": "fake-cluster-id",
                    "CLUSTER_SECRET": "fake-cluster-secret", "BOOTSTRAP_TOKEN": "abcdef.0123456789abcdef"}
            for v in c.get("env", []):
                value = v["value"] if "value" in v else fake[v["name"]]
                e.write(f"export {v['name']}={shlex.quote(str(value))}\n")
        n += 1
if n == 0:
    sys.exit(f"{rendered}: no talos-reconcile Job")
EOF

rc=0
for script in "$OUT"/*.sh; do
  job=$(basename "$script" .sh)
  : >"$OUT/$job.calls"; : >"$OUT/$job.applied.yaml"
  if ! ( . "$OUT/$job.env"
         export PATH="$OUT/bin:$PATH" KUBECTL_CALLS="$OUT/$job.calls" KUBECTL_APPLIED="$OUT/$job.applied.yaml"
         sh -ec "$(cat "$script")" ) >"$OUT/$job.log" 2>&1; then
    echo "run-reconcile-job.sh: $job: the script failed: $(tail -3 "$OUT/$job.log")" >&2
    rc=1; continue
  fi
  python3 - "$OUT/$job.applied.yaml" "$OUT/$job.talos.yaml" <<'EOF' || rc=1
import sys, yaml
with open(sys.argv[1], encoding="utf-8") as f:
    [tct] = [d for d in yaml.safe_load_all(f) if d]
assert tct["kind"] == "TalosConfigTemplate", tct["kind"]
with open(sys.argv[2], "w", encoding="utf-8") as f:
    f.write(tct["spec"]["template"]["spec"]["data"])
EOF
  echo "$OUT/$job: $(wc -l <"$OUT/$job.calls") kubectl calls, TalosConfigTemplate in $job.applied.yaml, machine config in $job.talos.yaml"
done
exit "$rc"
