#!/usr/bin/env python3
"""Check tender's rendered Kubernetes manifests for the security context and wiring it must have.

usage: check-manifests.py RENDERED.yaml...              exit 1 listing every violation
       check-manifests.py --self-test RENDERED.yaml...  every known weakening must be caught
       check-manifests.py --config-out DIR RENDERED.yaml...
                                                        also write each file's tender.yaml
                                                        (the ConfigMap's) to DIR/<name>.tender.yaml

The pod security is the one Cozystack runs its in-cluster mirror with (spec §5.1): non-root uid
65532, read-only root filesystem, no privilege escalation, every capability dropped, the
RuntimeDefault seccomp profile, no service-account token. Replicas and their PodDisruptionBudget
must agree with the config: several replicas only on a shared bucket (storage.s3), each with a
data directory of its own, and a budget that neither blocks drains nor lets every replica go; the
bucket's key files must come from a Secret mounted read-only, and the NetworkPolicy must let
tender reach the bucket's port. A data claim must be in the render and in the pod's namespace.
Run by deploy/test.sh.
"""

import copy
import math
import os
import sys
import urllib.parse

import yaml

UID = 65532
PORT = 5000
PORT_NAME = "registry"
CONFIG_DIR = "/etc/tender"
CONFIG_KEY = "tender.yaml"
DATA_MOUNT = "/var/lib/tender"
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


def load(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def objects(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def selects(selector, labels):
    """A matchLabels selector (all this repo uses) picks a pod with these labels."""
    match = (selector or {}).get("matchLabels") or {}
    return bool(match) and all(labels.get(k) == v for k, v in match.items())


def namespace_of(obj):
    """The namespace an object lands in; None (the current namespace at apply time) when unset."""
    return (obj.get("metadata") or {}).get("namespace")


def port_matches(port, container_port):
    return port in (PORT_NAME, container_port)


def replica_count(w):
    """The pods a workload runs at once (1 for the kinds without spec.replicas)."""
    if w.get("kind") in ("Deployment", "StatefulSet", "ReplicaSet"):
        return (w.get("spec") or {}).get("replicas", 1)
    return 1


def scaled(value, replicas):
    """A PDB's int-or-percent against the replica count (percentages round up, as Kubernetes does)."""
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(replicas * int(value[:-1]) / 100)
    return int(value)


def allowed_disruptions(pdb_spec, replicas):
    if "maxUnavailable" in pdb_spec:
        return scaled(pdb_spec["maxUnavailable"], replicas)
    if "minAvailable" in pdb_spec:
        return replicas - scaled(pdb_spec["minAvailable"], replicas)
    return replicas


def endpoint_port(s3):
    """The TCP port tender dials for storage.s3: the endpoint's, else 443 (AWS by region)."""
    endpoint = s3.get("endpoint")
    if not endpoint:
        return 443
    u = urllib.parse.urlsplit(str(endpoint))
    return u.port or (80 if u.scheme == "http" else 443)


def egress_allows_tcp(rules, port):
    """Some egress rule admits TCP to this port (a rule without ports admits every port)."""
    for r in rules or []:
        ports = r.get("ports")
        if not ports:
            return True
        for p in ports:
            if p.get("protocol", "TCP") != "TCP":
                continue
            first = p.get("port")
            if first is None or (isinstance(first, int) and first <= port <= p.get("endPort", first)):
                return True
    return False


def check(docs):
    """Every violation, as a list of messages (empty: all good)."""
    errs = []

    def need(cond, msg):
        if not cond:
            errs.append(msg)

    workloads = [d for d in docs if d.get("kind") in WORKLOAD_KINDS] + objects(docs, "Pod")
    need(len(workloads) == 1, f"expected exactly one workload, found {len(workloads)}")
    configmaps = {c["metadata"]["name"]: c for c in objects(docs, "ConfigMap")}
    # A claim is found by name in the pod's own namespace: one rendered into another namespace
    # (an overlay without `namespace:`) leaves the pod Pending, unbound.
    claims = {(namespace_of(c), c["metadata"]["name"]) for c in objects(docs, "PersistentVolumeClaim")}

    for w in workloads:
        wname = f"{w['kind']}/{w['metadata'].get('name')}"
        tmpl = w if w["kind"] == "Pod" else (w.get("spec") or {}).get("template") or {}
        meta = tmpl.get("metadata") or {}
        spec = tmpl.get("spec") or {}
        labels = meta.get("labels") or {}
        psc = spec.get("securityContext") or {}

        # --- pod security ---
        need(spec.get("automountServiceAccountToken") is False, f"{wname}: automountServiceAccountToken must be false")
        need(psc.get("runAsNonRoot") is True, f"{wname}: pod securityContext.runAsNonRoot must be true")
        need(psc.get("runAsUser") == UID, f"{wname}: pod securityContext.runAsUser must be {UID}")
        need((psc.get("seccompProfile") or {}).get("type") == "RuntimeDefault",
             f"{wname}: pod securityContext.seccompProfile.type must be RuntimeDefault")
        for host in ("hostNetwork", "hostPID", "hostIPC"):
            need(not spec.get(host), f"{wname}: {host} must not be set")

        containers = spec.get("initContainers", []) + spec.get("containers", [])
        need(bool(spec.get("containers")), f"{wname}: no containers")
        for c in containers:
            cname = f"{wname} container {c.get('name')}"
            csc = c.get("securityContext") or {}
            need(csc.get("allowPrivilegeEscalation") is False, f"{cname}: allowPrivilegeEscalation must be false")
            need(csc.get("readOnlyRootFilesystem") is True, f"{cname}: readOnlyRootFilesystem must be true")
            need(not csc.get("privileged"), f"{cname}: privileged must not be set")
            caps = csc.get("capabilities") or {}
            need(caps.get("drop") == ["ALL"], f"{cname}: capabilities.drop must be [ALL]")
            need(not caps.get("add"), f"{cname}: capabilities.add must be empty")
            need(csc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True, f"{cname}: must run as non-root")
            need(csc.get("runAsUser", psc.get("runAsUser")) == UID, f"{cname}: must run as uid {UID}")
            seccomp = (csc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
            need(seccomp == "RuntimeDefault", f"{cname}: seccompProfile must be RuntimeDefault (is {seccomp})")

        # --- the tender container: config, port, probes, volumes ---
        main = [c for c in spec.get("containers", []) if c.get("name") == "tender"]
        need(len(main) == 1, f"{wname}: expected one container named tender")
        if not main:
            continue
        c = main[0]
        args = c.get("args") or []
        config_path = f"{CONFIG_DIR}/{CONFIG_KEY}"
        has_config = any(a == "--config" and args[i + 1:i + 2] == [config_path] for i, a in enumerate(args)) \
            or f"--config={config_path}" in args
        need(has_config, f"{wname}: tender must be started with --config {config_path} (args: {args})")
        ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
        need(ports.get(PORT_NAME) == PORT, f"{wname}: container port {PORT_NAME} must be {PORT}")
        for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
            get = (c.get(probe) or {}).get("httpGet") or {}
            need(get.get("path") == path and port_matches(get.get("port"), PORT),
                 f"{wname}: {probe} must be httpGet {path} on the registry port (is {get})")
        ann = meta.get("annotations") or {}
        need(ann.get("prometheus.io/scrape") == "true", f"{wname}: annotation prometheus.io/scrape must be \"true\"")
        need(ann.get("prometheus.io/port") == str(PORT), f"{wname}: annotation prometheus.io/port must be \"{PORT}\"")
        need(ann.get("prometheus.io/path") == "/metrics", f"{wname}: annotation prometheus.io/path must be /metrics")

        volumes = {v.get("name"): v for v in spec.get("volumes") or []}
        templates = {t["metadata"]["name"] for t in (w.get("spec") or {}).get("volumeClaimTemplates") or []}
        mounts = {m.get("mountPath"): m for m in c.get("volumeMounts") or []}
        cfg_mount = mounts.get(CONFIG_DIR)
        need(cfg_mount is not None and cfg_mount.get("readOnly") is True, f"{wname}: {CONFIG_DIR} must be mounted read-only")
        config = {}
        if cfg_mount:
            cm_name = ((volumes.get(cfg_mount.get("name")) or {}).get("configMap") or {}).get("name")
            cm = configmaps.get(cm_name)
            need(cm is not None, f"{wname}: {CONFIG_DIR} must come from a ConfigMap in the same render (is {cm_name})")
            need(cm is not None and CONFIG_KEY in (cm.get("data") or {}), f"{wname}: ConfigMap {cm_name} has no {CONFIG_KEY}")
            if cm is not None and CONFIG_KEY in (cm.get("data") or {}):
                try:
                    config = yaml.safe_load(cm["data"][CONFIG_KEY]) or {}
                except yaml.YAMLError as e:
                    errs.append(f"ConfigMap {cm_name}: {CONFIG_KEY} is not YAML: {e}")
        s3 = ((config.get("storage") or {}) if isinstance(config, dict) else {}).get("s3")
        replicas = replica_count(w)
        data_mount = mounts.get(DATA_MOUNT)
        need(data_mount is not None and not data_mount.get("readOnly"), f"{wname}: {DATA_MOUNT} must be a writable mount")
        if data_mount:
            vname = data_mount.get("name")
            vol = volumes.get(vname) or {}
            kinds = sorted(k for k in vol if k != "name")
            if vname in templates and not vol:
                pass  # a StatefulSet volumeClaimTemplate
            elif kinds == ["emptyDir"]:
                pass
            elif kinds == ["persistentVolumeClaim"]:
                claim = vol["persistentVolumeClaim"].get("claimName")
                ns = namespace_of(w)
                elsewhere = sorted(n or "no namespace" for n, c in claims if c == claim and n != ns)
                need((ns, claim) in claims,
                     f"{wname}: data claim {claim} is not in the render in the pod's namespace {ns}"
                     + (f" (it is in {', '.join(elsewhere)})" if elsewhere else ""))
            else:
                errs.append(f"{wname}: {DATA_MOUNT} must be an emptyDir or a PersistentVolumeClaim (is {kinds})")
            need(replicas <= 1 or kinds != ["persistentVolumeClaim"],
                 f"{wname}: {replicas} replicas on the one claim of {DATA_MOUNT}: each needs its own data directory "
                 "(tender locks it): an emptyDir or volumeClaimTemplates")

        # --- replicas: one cache, or several on a shared bucket ---
        need(replicas <= 1 or s3 is not None,
             f"{wname}: {replicas} replicas without storage.s3 are {replicas} separate caches, each fetching "
             "everything from the upstreams: run one, or share a bucket (deploy/overlays/s3)")
        for key in ("accessKeyIdFile", "secretAccessKeyFile"):
            path = (s3 or {}).get(key)
            if not path:
                continue
            path = str(path)
            under = [m for m in mounts if path.startswith(m.rstrip("/") + "/")]
            if not under:
                errs.append(f"{wname}: storage.s3.{key} {path} is on no volume mount")
                continue
            mp = max(under, key=len)
            secret = (volumes.get(mounts[mp].get("name")) or {}).get("secret")
            need(secret is not None, f"{wname}: storage.s3.{key} {path} must come from a Secret volume (is {mp})")
            need(mounts[mp].get("readOnly") is True, f"{wname}: the Secret of storage.s3.{key} must be mounted read-only")
            if secret is not None:
                need(not secret.get("optional"), f"{wname}: the Secret of storage.s3.{key} must not be optional")
                rel = path[len(mp.rstrip("/")) + 1:]
                items = [i.get("path") for i in secret.get("items") or []]
                need(not items or rel in items, f"{wname}: storage.s3.{key} {path}: the Secret volume has no item {rel} (has {items})")

        # --- the objects around it ---
        svcs = [s for s in objects(docs, "Service") if labels and all(
            labels.get(k) == v for k, v in ((s.get("spec") or {}).get("selector") or {"": None}).items())]
        need(bool(svcs), f"{wname}: no Service selects the pod")
        for s in svcs:
            targets = [p.get("targetPort") for p in s["spec"].get("ports") or []]
            need(bool(targets) and all(port_matches(t, PORT) for t in targets),
                 f"Service/{s['metadata']['name']}: every port must target the registry port (targets {targets})")
        pdbs = [p for p in objects(docs, "PodDisruptionBudget") if selects((p.get("spec") or {}).get("selector"), labels)]
        need(bool(pdbs), f"{wname}: no PodDisruptionBudget selects the pod")
        for p in pdbs:
            pname = f"PodDisruptionBudget/{p['metadata']['name']}"
            allowed = allowed_disruptions(p.get("spec") or {}, replicas)
            need(allowed >= 1, f"{pname}: allows {allowed} evictions (replicas: {replicas}): it would block every node drain")
            need(replicas <= 1 or allowed < replicas, f"{pname}: lets all {replicas} replicas be evicted at once")
        nps = [n for n in objects(docs, "NetworkPolicy") if selects((n.get("spec") or {}).get("podSelector"), labels)]
        need(bool(nps), f"{wname}: no NetworkPolicy selects the pod")
        for n in nps:
            ns = n["spec"]
            nname = f"NetworkPolicy/{n['metadata']['name']}"
            need(sorted(ns.get("policyTypes") or []) == ["Egress", "Ingress"], f"{nname}: policyTypes must be Ingress and Egress")
            ingress_ports = [p.get("port") for r in ns.get("ingress") or [] for p in r.get("ports") or []]
            need(bool(ingress_ports) and all(port_matches(p, PORT) for p in ingress_ports),
                 f"{nname}: ingress must be limited to the registry port (is {ingress_ports})")
            need(all(r.get("from") for r in ns.get("ingress") or []), f"{nname}: every ingress rule must name its sources")
            egress = {(p.get("protocol", "TCP"), p.get("port")) for r in ns.get("egress") or [] for p in r.get("ports") or []}
            for want in (("UDP", 53), ("TCP", 53), ("TCP", 443), ("TCP", 80)):
                need(want in egress, f"{nname}: egress must allow {want[0]} {want[1]}")
        if s3 is not None:
            port = endpoint_port(s3)
            need(any(egress_allows_tcp(n["spec"].get("egress"), port) for n in nps),
                 f"{wname}: no NetworkPolicy egress rule lets tender reach the storage.s3 endpoint's TCP port {port}")
    return errs


def _container(docs):
    w = [d for d in docs if d.get("kind") in WORKLOAD_KINDS][0]
    return w["spec"]["template"]["spec"]["containers"][0]


def _pod(docs):
    return [d for d in docs if d.get("kind") in WORKLOAD_KINDS][0]["spec"]["template"]


def _drop_kind(kind):
    def mutate(docs):
        docs[:] = [d for d in docs if d.get("kind") != kind]
    return mutate


def _workload(docs):
    return [d for d in docs if d.get("kind") in WORKLOAD_KINDS][0]


def _config_map(docs):
    return [c for c in objects(docs, "ConfigMap") if CONFIG_KEY in (c.get("data") or {})][0]


def _s3(docs):
    return (yaml.safe_load(_config_map(docs)["data"][CONFIG_KEY]).get("storage") or {}).get("s3")


def _edit_s3(docs, **changes):
    cm = _config_map(docs)
    config = yaml.safe_load(cm["data"][CONFIG_KEY])
    config["storage"]["s3"].update(changes)
    cm["data"][CONFIG_KEY] = yaml.safe_dump(config)


def _pdb(docs):
    return objects(docs, "PodDisruptionBudget")[0]["spec"]


def _key_mounts(docs):
    """The volume mounts other than the config and the data (the storage.s3 Secret's)."""
    return [m for m in _container(docs)["volumeMounts"] if m["mountPath"] not in (CONFIG_DIR, DATA_MOUNT)]


def _data_on_shared_claim(docs):
    for v in _pod(docs)["spec"]["volumes"]:
        if v["name"] == "data":
            v.pop("emptyDir", None)
            v["persistentVolumeClaim"] = {"claimName": "tender-data"}
    docs.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "tender-data"},
                 "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})


# Each weakening that must make check() fail.
MUTATIONS = {
    "readOnlyRootFilesystem removed": lambda d: _container(d)["securityContext"].pop("readOnlyRootFilesystem"),
    "allowPrivilegeEscalation true": lambda d: _container(d)["securityContext"].update(allowPrivilegeEscalation=True),
    "capabilities not dropped": lambda d: _container(d)["securityContext"].pop("capabilities"),
    "a capability added": lambda d: _container(d)["securityContext"]["capabilities"].update(add=["NET_ADMIN"]),
    "privileged": lambda d: _container(d)["securityContext"].update(privileged=True),
    "container runs as root": lambda d: _container(d)["securityContext"].update(runAsUser=0),
    "pod runs as root": lambda d: (_pod(d)["spec"]["securityContext"].update(runAsUser=0),
                                   _container(d)["securityContext"].pop("runAsUser")),
    "runAsNonRoot removed": lambda d: (_pod(d)["spec"]["securityContext"].pop("runAsNonRoot"),
                                       _container(d)["securityContext"].pop("runAsNonRoot")),
    "seccomp Unconfined": lambda d: _container(d)["securityContext"].update(seccompProfile={"type": "Unconfined"}),
    "pod seccomp removed": lambda d: _pod(d)["spec"]["securityContext"].pop("seccompProfile"),
    "service-account token mounted": lambda d: _pod(d)["spec"].pop("automountServiceAccountToken"),
    "hostNetwork": lambda d: _pod(d)["spec"].update(hostNetwork=True),
    "readiness on /healthz": lambda d: _container(d)["readinessProbe"]["httpGet"].update(path="/healthz"),
    "liveness removed": lambda d: _container(d).pop("livenessProbe"),
    "no scrape annotation": lambda d: _pod(d)["metadata"]["annotations"].pop("prometheus.io/scrape"),
    "no --config": lambda d: _container(d).update(args=[]),
    "data on hostPath": lambda d: [v.update(hostPath={"path": "/srv"}) or v.pop("emptyDir", None)
                                   or v.pop("persistentVolumeClaim", None)
                                   for v in _pod(d)["spec"]["volumes"] if v["name"] == "data"],
    "no NetworkPolicy": _drop_kind("NetworkPolicy"),
    "no PodDisruptionBudget": _drop_kind("PodDisruptionBudget"),
    "no Service": _drop_kind("Service"),
    "no ConfigMap": _drop_kind("ConfigMap"),
    "ingress from everywhere": lambda d: [n["spec"]["ingress"][0].pop("from") for n in objects(d, "NetworkPolicy")],
    "PDB blocks drains": lambda d: _pdb(d).update(maxUnavailable=0),
}


def _claims(docs):
    return objects(docs, "PersistentVolumeClaim")


def _uses_a_claim(docs):
    return any("persistentVolumeClaim" in v for v in _pod(docs)["spec"].get("volumes") or [])

# Weakenings that exist only for some renders: (applies to these docs, mutate).
CONDITIONAL_MUTATIONS = {
    "two replicas without storage.s3": (lambda d: _s3(d) is None, lambda d: _workload(d)["spec"].update(replicas=2)),
    "PDB lets every replica go": (lambda d: replica_count(_workload(d)) > 1,
                                  lambda d: _pdb(d).update(maxUnavailable=replica_count(_workload(d)))),
    "replicas share one claim": (lambda d: replica_count(_workload(d)) > 1, _data_on_shared_claim),
    "the data claim in another namespace than the pod": (
        lambda d: _uses_a_claim(d) and bool(_claims(d)),
        lambda d: [c["metadata"].update(namespace="default") for c in _claims(d)]),
    "the data claim without a namespace": (
        lambda d: _uses_a_claim(d) and bool(_claims(d)) and namespace_of(_workload(d)) is not None,
        lambda d: [c["metadata"].pop("namespace", None) for c in _claims(d)]),
    "s3 key Secret not mounted": (lambda d: bool(_s3(d) and _key_mounts(d)),
                                  lambda d: [_container(d)["volumeMounts"].remove(m) for m in _key_mounts(d)]),
    "s3 key Secret optional": (lambda d: bool(_s3(d) and _key_mounts(d)),
                               lambda d: [v["secret"].update(optional=True) for v in _pod(d)["spec"]["volumes"] if "secret" in v]),
    "s3 key file not in the Secret's items": (
        lambda d: bool(_s3(d) and (_s3(d) or {}).get("accessKeyIdFile")),
        lambda d: _edit_s3(d, accessKeyIdFile=str(_s3(d)["accessKeyIdFile"]) + "-typo")),
    "s3 endpoint on a port egress does not allow": (lambda d: _s3(d) is not None,
                                                     lambda d: _edit_s3(d, endpoint="https://s3.invalid:9000")),
}


def main(argv):
    self_test = "--self-test" in argv
    argv = [a for a in argv if a != "--self-test"]
    config_out = None
    if "--config-out" in argv:
        i = argv.index("--config-out")
        config_out = argv[i + 1]
        del argv[i:i + 2]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    failed = False
    for path in argv:
        docs = load(path)
        errs = check(docs)
        for e in errs:
            print(f"check-manifests: {path}: {e}", file=sys.stderr)
        failed |= bool(errs)
        if not errs:
            print(f"check-manifests: {path}: {len(docs)} objects, security context and wiring ok")
        if config_out:
            cms = [c for c in objects(docs, "ConfigMap") if CONFIG_KEY in (c.get("data") or {})]
            if len(cms) != 1:
                print(f"check-manifests: {path}: expected one ConfigMap with {CONFIG_KEY}, found {len(cms)}", file=sys.stderr)
                failed = True
            else:
                name = os.path.splitext(os.path.basename(path))[0]
                with open(os.path.join(config_out, f"{name}.{CONFIG_KEY}"), "w", encoding="utf-8") as f:
                    f.write(cms[0]["data"][CONFIG_KEY])
        if self_test and not errs:
            mutations = list(MUTATIONS.items()) + [
                (what, mutate) for what, (applies, mutate) in CONDITIONAL_MUTATIONS.items() if applies(docs)]
            missed = []
            for what, mutate in mutations:
                weakened = copy.deepcopy(docs)
                mutate(weakened)
                if not check(weakened):
                    missed.append(what)
            for what in missed:
                print(f"check-manifests: {path}: self-test: weakening not caught: {what}", file=sys.stderr)
            failed |= bool(missed)
            if not missed:
                print(f"check-manifests: {path}: self-test: all {len(mutations)} weakenings that apply caught")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
