#!/usr/bin/env python3
"""Cross-check tender's YAML with PyYAML, a YAML 1.1 reader (issue 22, item 1).

For every YAML 1.1 implicit form (booleans in any case, nulls, integers in every base including
base 60, floats, .inf/.nan, timestamps, <<, =) placed in every string field of a pool file,
`tender render pool` either refuses the value or prints YAML in which PyYAML reads that value
back as the same string, and reads every other scalar with the type tender meant. The same for
`tender render cozystack` with such upstream names, cluster, namespace, pool and schematic.

Usage: scripts/check-yaml11.py [path/to/tender]   (default: target/debug/tender)
Exit 0 when every case agrees, 1 on the first disagreement, 2 when PyYAML or tender is missing.
"""

import json
import os
import subprocess
import sys

try:
    import yaml
except ImportError:
    print("check-yaml11: PyYAML is not installed (apt-get install python3-yaml)", file=sys.stderr)
    sys.exit(2)

FORMS = [
    "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "true", "True", "TRUE", "false", "False",
    "FALSE", "on", "On", "ON", "off", "Off", "OFF", "~", "null", "Null", "NULL", ".inf", ".Inf", "-.INF",
    ".nan", ".NaN", "<<", "=", "0000:07:00.0", "190:20:30", "0b1010", "0777", "0x1f", "1_000", "1e3",
    "0o17", "1.5", "1.13", "0", "12", "2001-12-14", "2001-12-14t21:59:43.10-05:00", "1e10", "0.5",
    "a1", "replicated",
]
FIELDS = ["cluster", "namespace", "pool", "storageClass", "instanceType", "gpus", "roles"]
# Keys whose values tender writes as numbers or booleans on purpose.
TYPED = {"logical", "physical", "cores", "threads", "sockets", "maxSurge", "maxUnavailable", "wipe",
         "logSerialConsole", "maxUnhealthy", "overridePath", "skipFallback", "insecureSkipVerify"}


def pool_file(field, value):
    base = {"cluster": "kubernetes-test", "namespace": "tenant-test", "pool": "md0"}
    if field == "gpus":
        base["gpus"] = [{"name": value}]
    elif field == "roles":
        base["roles"] = [value]
    else:
        base[field] = value
    # JSON is YAML: every value is quoted, so the input itself is unambiguous.
    return json.dumps(base)


def walk(node, key, found, problems):
    if isinstance(node, dict):
        for k, v in node.items():
            if not isinstance(k, str):
                problems.append(f"key {k!r} is a {type(k).__name__}")
            else:
                found.append(k)
            walk(v, k, found, problems)
    elif isinstance(node, list):
        for v in node:
            walk(v, key, found, problems)
    elif isinstance(node, str):
        found.append(node)
    elif isinstance(node, (bool, int)) and key in TYPED:
        pass
    else:
        problems.append(f"{key}: {node!r} is a {type(node).__name__}")


def main():
    tender = sys.argv[1] if len(sys.argv) > 1 else os.path.join("target", "debug", "tender")
    if not os.access(tender, os.X_OK):
        print(f"check-yaml11: {tender} is not an executable (build tender first)", file=sys.stderr)
        return 2
    checked = 0
    for field in FIELDS:
        for form in FORMS:
            run = subprocess.run([tender, "render", "pool", "-f", "-"], input=pool_file(field, form),
                                 capture_output=True, text=True, check=False)
            if run.returncode != 0:
                continue  # refused: nothing rendered
            found, problems = [], []
            for doc in yaml.safe_load_all(run.stdout):
                walk(doc, "", found, problems)
            if problems or not any(form in s for s in found):
                print(f"check-yaml11: {field}={form!r}: PyYAML reads it differently: {problems or 'value not found'}")
                print(run.stdout)
                return 1
            checked += 1
    # render cozystack: upstream names (registry hosts) and a catalog schematic in YAML 1.1 forms.
    hosts = [f for f in FORMS if all(c.isdigit() or c.islower() or c in ".-" for c in f) and f and f[0].isalnum()]
    config = "upstreams:\n" + "".join(f"- name: '{h}'\n  url: https://example.org\n" for h in hosts)
    config += "catalog:\n  images:\n  - schematicID: '0777'\n    version: v1.13.6\n"
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"check-yaml11-{os.getpid()}.yaml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(config)
    try:
        run = subprocess.run([tender, "render", "cozystack", "--config", path, "--mirror", "http://m.example:5000",
                              "--cluster", "on", "--namespace", "no", "--pool", "y", "--os-image", "builtin",
                              "--cozystack", "golden-catalog"],
                             capture_output=True, text=True, check=False)
    finally:
        os.unlink(path)
    if run.returncode != 0:
        print(f"check-yaml11: render cozystack failed: {run.stderr}")
        return 1
    found, problems = [], []
    for doc in yaml.safe_load_all(run.stdout):
        walk(doc, "", found, problems)
    missing = [h for h in hosts + ["0777", "on", "no", "on-y"] if h not in found]
    if problems or missing:
        print(f"check-yaml11: render cozystack: PyYAML reads it differently: {problems or missing}")
        print(run.stdout)
        return 1
    checked += 1
    print(f"check-yaml11: {checked} renders read the same in PyYAML (YAML 1.1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
