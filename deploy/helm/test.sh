#!/usr/bin/env bash
# deploy/helm/test.sh - test the tender Helm chart (deploy/helm/tender) without a cluster, with the
# real Helm v4 and kubectl (scripts/install-helm.sh):
#   1. the chart's copies of deploy/monitoring/tender-rules.yaml and tender-dashboard.json are
#      byte-identical to the originals;
#   2. `helm lint --strict` with the defaults and with every variant below;
#   3. `helm template` of the variants: default, namespace (namespace.create), pvc, s3, full
#      (s3 on a non-default port, TLS with a cert-manager Certificate, client auth, admin token,
#      upstream credentials, ServiceMonitor, PrometheusRule, dashboard), and `helm install
#      --dry-run=client` of each (no cluster), which must install the same objects;
#   4. every rendered object valid for Kubernetes $K8S_VERSION (kubernetes-validate --strict, as
#      deploy/test.sh; the CRD kinds Certificate, ServiceMonitor and PrometheusRule have no schema
#      there and are the only ones allowed to be skipped);
#   5. deploy/check-manifests.py --self-test on every render (security context and wiring);
#   6. object for object: default == `kubectl kustomize deploy/base` without its Namespace,
#      namespace == deploy/base, pvc == deploy/overlays/pvc, s3 == deploy/overlays/s3 (ConfigMap
#      name hashes and the config's YAML formatting normalised, volume lists compared as sets);
#      the PrometheusRule's groups == tender-rules.yaml's, the dashboard ConfigMap == the JSON file;
#   7. what the chart must refuse: an unknown value, a config key the chart owns, 2 replicas
#      without s3, credentials without auth or public;
#   8. that this script fails: run on a copy of the chart without readOnlyRootFilesystem, and on
#      one whose Service lost a port, it must exit non-zero for that reason.
# env: TENDER_TEST_CACHE (default ~/.cache/tender-test), K8S_VERSION, CHART (the chart to test,
#      default deploy/helm/tender; used by step 8), KEEP=1 keeps the work directory.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)

K8S_VERSION=${K8S_VERSION:-1.37.0}
KV_VERSION=1.37.0          # kubernetes-validate, as deploy/test.sh (the same venv)
CACHE=${TENDER_TEST_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/tender-test}
VENV=$CACHE/deploy-venv-$KV_VERSION
CHART=${CHART:-deploy/helm/tender}
CRD_KINDS="Certificate PrometheusRule ServiceMonitor"

die() { echo "deploy/helm/test.sh: FAIL: $*" >&2; exit 1; }
log() { echo "deploy/helm/test.sh: $*"; }

WORK=$(mktemp -d /tmp/tender-helm-test.XXXXXX)
cleanup() { if [ -n "${KEEP:-}" ]; then echo "deploy/helm/test.sh: kept $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT

# --- tools --------------------------------------------------------------------------------------
BIN=$(bash scripts/install-helm.sh) || die "scripts/install-helm.sh could not install helm and kubectl"
HELM=$BIN/helm KUBECTL=$BIN/kubectl
if [ ! -x "$VENV/bin/kubernetes-validate" ]; then
  log "creating $VENV (kubernetes-validate==$KV_VERSION)"
  python3 -m venv "$VENV" || die "python3 -m venv $VENV failed (apt-get install python3-venv)"
  "$VENV/bin/pip" install -q --disable-pip-version-check "kubernetes-validate==$KV_VERSION" PyYAML \
    || die "pip install kubernetes-validate==$KV_VERSION failed"
fi
PY=$VENV/bin/python
log "helm $("$HELM" version --short), kubectl $("$KUBECTL" version --client | sed -n 's/^Client Version: //p'), chart $CHART"

# --- 1. copied files ----------------------------------------------------------------------------
for f in tender-rules.yaml tender-dashboard.json; do
  cmp -s "deploy/monitoring/$f" "$CHART/files/$f" \
    || die "$CHART/files/$f differs from deploy/monitoring/$f: copy it again (cp deploy/monitoring/$f $CHART/files/)"
done
log "files/tender-rules.yaml and files/tender-dashboard.json are identical to deploy/monitoring's"

# --- the variants -------------------------------------------------------------------------------
mkdir -p "$WORK/values"
: >"$WORK/values/default.yaml"
printf 'namespace:\n  create: true\n' >"$WORK/values/namespace.yaml"
# deploy/overlays/pvc: the claim, Recreate, and its config's cache cap
printf 'storage:\n  type: pvc\nconfig:\n  listen: 0.0.0.0:5000\n  data: /var/lib/tender/data\n  logFormat: json\n  defaultUpstream: docker.io\n  imageFactory: https://factory.talos.dev\n  cache:\n    maxSize: 80Gi\n    gcInterval: 5m\n' >"$WORK/values/pvc.yaml"
# deploy/overlays/s3: three replicas on the placeholder bucket
printf 'storage:\n  type: s3\nreplicas: 3\n' >"$WORK/values/s3.yaml"
cat >"$WORK/values/full.yaml" <<'EOF'
replicas: 2
storage:
  type: s3
  s3:
    endpoint: https://seaweed.s3.invalid:8333   # not 9000: check-manifests.py --self-test moves it to 9000
    bucket: fleet
    region: eu-west-1
    prefix: fleet-a
    credentialsSecret: tender-s3
    extra:
      pathStyle: true
      chunkSize: 16Mi
tls:
  enabled: true
  clientCA: true
  certManager:
    enabled: true
    issuerRef:
      name: internal-ca
auth:
  htpasswd:
    secretName: tender-htpasswd
  tokens:
    secretName: tender-tokens
  anonymousPull: true
admin:
  tokenSecret:
    name: tender-admin
  listen: 0.0.0.0:5001
upstreams:
  - name: docker.io
    url: https://registry-1.docker.io
    credentials:
      username: robot
      secretName: hub-credentials
  - name: ghcr.io
    url: https://ghcr.io
    staleMaxAge: 168h
instanceLabel: true
commonLabels:
  team: platform
serviceMonitor:
  enabled: true
  labels:
    release: prometheus
  bearerTokenSecret:
    name: tender-tokens
    key: tokens
prometheusRule:
  enabled: true
dashboard:
  enabled: true
EOF
VARIANTS="default namespace pvc s3 full"

# --- 2. lint --------------------------------------------------------------------------------------
for v in $VARIANTS; do
  "$HELM" lint --strict --namespace tender -f "$WORK/values/$v.yaml" "$CHART" >"$WORK/lint-$v.log" 2>&1 \
    || die "helm lint --strict ($v): $(cat "$WORK/lint-$v.log")"
done
log "helm lint --strict passes with the defaults and every variant ($VARIANTS)"

# --- 3. render ------------------------------------------------------------------------------------
RENDERED=()
for v in $VARIANTS; do
  "$HELM" template tender "$CHART" --namespace tender -f "$WORK/values/$v.yaml" >"$WORK/$v.yaml" 2>"$WORK/$v.err" \
    || die "helm template ($v): $(cat "$WORK/$v.err")"
  log "rendered $v: $(grep -c '^kind:' "$WORK/$v.yaml") objects ($(grep '^kind:' "$WORK/$v.yaml" | cut -d' ' -f2 | sort | tr '\n' ' '))"
  RENDERED+=("$WORK/$v.yaml")
  # `helm install` as the README gives it, short of the cluster (no kubeconfig): the release
  # installs the same objects the template renders.
  KUBECONFIG=/nonexistent "$HELM" install tender "$CHART" --namespace tender -f "$WORK/values/$v.yaml" \
    --dry-run=client >"$WORK/install-$v.txt" 2>"$WORK/install-$v.err" \
    || die "helm install --dry-run=client ($v): $(cat "$WORK/install-$v.err")"
  grep -q '^STATUS: pending-install' "$WORK/install-$v.txt" || die "helm install ($v): no pending install"
  [ "$(grep -c '^kind:' "$WORK/install-$v.txt")" -eq "$(grep -c '^kind:' "$WORK/$v.yaml")" ] \
    || die "helm install ($v) installs other objects than helm template renders"
done
log "helm install --dry-run=client installs every variant ($VARIANTS)"

# --- 4. Kubernetes schemas ------------------------------------------------------------------------
"$VENV/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" "${RENDERED[@]}" >"$WORK/kv.log" 2>&1 \
  || die "kubernetes-validate --strict -k $K8S_VERSION rejected a render: $(cat "$WORK/kv.log")"
# Only the CRD kinds may go without a schema.
while read -r line; do
  kind=$(sed -n 's/.*find schema for kind \([A-Za-z]*\) .*/\1/p' <<<"$line")
  case " $CRD_KINDS " in *" $kind "*) ;; *) die "kubernetes-validate: $line" ;; esac
done < <(grep -i "schema" "$WORK/kv.log" || true)
log "every object is valid for Kubernetes $K8S_VERSION (strict); not schema-checked (CRDs): $CRD_KINDS"

# --- 5. security context and wiring -------------------------------------------------------------
"$PY" deploy/check-manifests.py --self-test "${RENDERED[@]}" >"$WORK/check.log" 2>&1 \
  || die "deploy/check-manifests.py: $(cat "$WORK/check.log")"
log "deploy/check-manifests.py --self-test passes on every render"

# --- 6. object for object -------------------------------------------------------------------------
for k in base overlays/pvc overlays/s3; do
  "$KUBECTL" kustomize "deploy/$k" >"$WORK/kustomize-${k#overlays/}.yaml" 2>"$WORK/kustomize.err" \
    || die "kubectl kustomize deploy/$k: $(cat "$WORK/kustomize.err")"
done
cat >"$WORK/compare.py" <<'EOF'
"""compare.py A.yaml B.yaml [--ignore-kind K]... [--default-namespace NS]: the same objects?"""
import difflib, json, re, sys
import yaml
args = sys.argv[1:]
a_path, b_path = args[:2]
ignore, default_ns = set(), None
i = 2
while i < len(args):
    if args[i] == "--ignore-kind": ignore.add(args[i + 1])
    elif args[i] == "--default-namespace": default_ns = args[i + 1]
    i += 2
HASHED = re.compile(r"^(.*-config)-[a-z0-9]{10}$")
notes = []
def norm(path, fill_ns):
    out = {}
    with open(path, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    for d in docs:
        d = json.loads(json.dumps(d))
        meta = d["metadata"]
        meta["name"] = HASHED.sub(r"\1-HASH", meta["name"])
        if fill_ns and d["kind"] != "Namespace" and "namespace" not in meta:
            notes.append(f"{path}: {d['kind']}/{meta['name']} has no metadata.namespace (taken as {fill_ns})")
            meta["namespace"] = fill_ns
        if d["kind"] == "ConfigMap" and "tender.yaml" in (d.get("data") or {}):
            d["data"]["tender.yaml"] = yaml.safe_load(d["data"]["tender.yaml"])
        if d["kind"] == "Deployment":
            pod = d["spec"]["template"]["spec"]
            for v in pod.get("volumes", []):
                if "configMap" in v:
                    v["configMap"]["name"] = HASHED.sub(r"\1-HASH", v["configMap"]["name"])
            pod["volumes"] = sorted(pod.get("volumes", []), key=lambda v: v["name"])
            for c in pod.get("containers", []):
                c["volumeMounts"] = sorted(c.get("volumeMounts", []), key=lambda m: m["mountPath"])
        key = (d["kind"], meta["name"])
        if key in out:
            sys.exit(f"{path}: {key} twice")
        out[key] = d
    return out
a, b = norm(a_path, default_ns), norm(b_path, None)
bad = []
for k in sorted(set(a) | set(b)):
    if k[0] in ignore:
        continue
    if k not in b: bad.append(f"{k[0]}/{k[1]} only in {a_path}"); continue
    if k not in a: bad.append(f"{k[0]}/{k[1]} only in {b_path}"); continue
    if a[k] != b[k]:
        diff = difflib.unified_diff(yaml.safe_dump(a[k]).splitlines(), yaml.safe_dump(b[k]).splitlines(),
                                    a_path, b_path, lineterm="", n=2)
        bad.append(f"{k[0]}/{k[1]} differs:\n" + "\n".join(diff))
for n in notes:
    print(f"compare: WARNING: {n}")
for m in bad:
    print(f"compare: {m}", file=sys.stderr)
n = len([k for k in a if k[0] not in ignore])
print(f"compare: {b_path} == {a_path}: {n} objects" if not bad else f"compare: {len(bad)} difference(s)")
sys.exit(1 if bad else 0)
EOF
compare() { "$PY" "$WORK/compare.py" "$@" || die "the chart's render differs from kustomize's (above): $*"; }
compare "$WORK/kustomize-base.yaml" "$WORK/default.yaml" --ignore-kind Namespace
compare "$WORK/kustomize-base.yaml" "$WORK/namespace.yaml"
# kubectl kustomize deploy/overlays/pvc emits its PersistentVolumeClaim without a namespace (the
# base's namespace: applies to the base's resources only): reported, and compared as in tender.
compare "$WORK/kustomize-pvc.yaml" "$WORK/pvc.yaml" --ignore-kind Namespace --default-namespace tender
compare "$WORK/kustomize-s3.yaml" "$WORK/s3.yaml" --ignore-kind Namespace
log "default == deploy/base (less its Namespace), namespace.create == deploy/base, pvc == deploy/overlays/pvc, s3 == deploy/overlays/s3"

"$PY" - "$WORK/full.yaml" "$CHART/files/tender-rules.yaml" "$CHART/files/tender-dashboard.json" <<'EOF' \
  || die "the PrometheusRule or the dashboard ConfigMap is not the file it is made from"
import json, sys, yaml
rendered, rules, dashboard = sys.argv[1:4]
docs = [d for d in yaml.safe_load_all(open(rendered, encoding="utf-8")) if d]
[rule] = [d for d in docs if d["kind"] == "PrometheusRule"]
assert rule["spec"]["groups"] == yaml.safe_load(open(rules, encoding="utf-8"))["groups"], "PrometheusRule groups"
[cm] = [d for d in docs if d["kind"] == "ConfigMap" and "tender-dashboard.json" in d.get("data", {})]
text = open(dashboard, encoding="utf-8").read()
assert cm["data"]["tender-dashboard.json"].rstrip("\n") == text.rstrip("\n"), "dashboard text"
json.loads(cm["data"]["tender-dashboard.json"])
assert cm["metadata"]["labels"].get("grafana_dashboard") == "1"
[sm] = [d for d in docs if d["kind"] == "ServiceMonitor"]
assert sm["spec"]["endpoints"][0]["port"] == "registry" and sm["spec"]["endpoints"][0]["scheme"] == "https"
[cert] = [d for d in docs if d["kind"] == "Certificate"]
[dep] = [d for d in docs if d["kind"] == "Deployment"]
tls = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
assert tls and tls[0]["secret"]["secretName"] == cert["spec"]["secretName"], "Certificate secret mounted"
print("compare: PrometheusRule groups == files/tender-rules.yaml, dashboard ConfigMap == files/tender-dashboard.json")
EOF

# --- 7. what the chart refuses --------------------------------------------------------------------
refuses() { # refuses WHAT PATTERN helm-args...
  local what=$1 pattern=$2; shift 2
  if "$HELM" template tender "$CHART" --namespace tender "$@" >/dev/null 2>"$WORK/refuse.err"; then
    die "the chart accepted $what"
  fi
  grep -q -- "$pattern" "$WORK/refuse.err" || die "$what was refused for another reason: $(cat "$WORK/refuse.err")"
}
refuses "an unknown value (storage.typo)" "additional properties 'typo' not allowed" --set storage.typo=1
refuses "a misspelt top-level value (replica)" "additional properties 'replica' not allowed" --set replica=2
refuses "config.upstreams (the chart writes it)" "invalid propertyName 'upstreams'" --set config.upstreams=x
refuses "2 replicas on an emptyDir" "need storage.type s3" --set replicas=2
refuses "2 replicas on a claim" "need storage.type s3" --set replicas=2 --set storage.type=pvc
refuses "upstream credentials without auth or public" "served only to authenticated clients" \
  --set 'upstreams[0].name=docker.io' --set 'upstreams[0].url=https://registry-1.docker.io' \
  --set 'upstreams[0].credentials.secretName=hub'
refuses "a listen port other than 5000" "use port 5000" --set config.listen=0.0.0.0:8080
log "the chart refuses unknown values, owned config keys, replicas without s3, unguarded credentials, another port"

# --- 8. this test fails when it must --------------------------------------------------------------
if [ -z "${HELM_TEST_INNER:-}" ]; then
  for breakage in readonly service-port; do
    cp -r "$CHART" "$WORK/broken-$breakage"
    case $breakage in
      readonly) sed -i '/readOnlyRootFilesystem: true/d' "$WORK/broken-$breakage/templates/deployment.yaml"
                want="readOnlyRootFilesystem must be true" ;;
      service-port) "$PY" - "$WORK/broken-$breakage/templates/service.yaml" <<'EOF'
import sys
p = sys.argv[1]
s = open(p).read()
cut = s.index("    - name: registry\n")
end = s.index("      protocol: TCP\n", cut) + len("      protocol: TCP\n")
open(p, "w").write(s[:cut] + s[end:])
EOF
                want="Service/tender differs" ;;
    esac
    if CHART="$WORK/broken-$breakage" HELM_TEST_INNER=1 bash "$0" >"$WORK/broken-$breakage.log" 2>&1; then
      die "a chart copy with the breakage '$breakage' passed this test"
    fi
    grep -q "$want" "$WORK/broken-$breakage.log" \
      || die "the '$breakage' copy failed for another reason: $(tail -5 "$WORK/broken-$breakage.log")"
    log "a chart copy with the breakage '$breakage' fails this test ($want), as it must"
  done
fi
echo "deploy/helm/test.sh: all checks passed"
