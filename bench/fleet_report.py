#!/usr/bin/env python3
"""fleet_report.py - the figures of bench/fleet.sh.

  arm      one arm (tender or registry2): the nodes' JSON (bench/fleet_nodes.py), the upstream
           registry's access log, the parent's egress bytes, CPU seconds and peak RSS per tier
           (the parent first, then one per rack) -> one JSON document on stdout
  summary  every arm with the bed's settings and the floor the links set -> a Markdown table
           (--markdown FILE) and one JSON line on stdout (`bench/fleet_model.py check` reads it)
"""

import argparse
import glob
import json
import os
import re
import statistics

GIB = float(1 << 30)
# "GET /v2/fleet/app/blobs/sha256:abc?ns=x HTTP/1.1" 200 1234
LINE = re.compile(r'"(?P<method>[A-Z]+) (?P<target>\S+) [^"]*" (?P<status>\d{3}) (?P<bytes>\d+|-)')


def quantile(values, q):
    """The q-quantile (nearest rank) of values."""
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(round(q * len(v) + 0.5)) - 1))
    return v[k]


def upstream(log, image):
    """Blob GETs and bytes per object the upstream served, and its manifest requests."""
    gets, sent = {}, {}
    manifests = 0
    with open(log, errors="replace") as f:
        for line in f:
            m = LINE.search(line)
            if not m:
                continue
            path = m["target"].partition("?")[0]
            n = 0 if m["bytes"] == "-" else int(m["bytes"])
            if "/manifests/" in path:
                manifests += 1
            elif "/blobs/" in path and m["method"] == "GET" and m["status"].startswith("2"):
                d = path.rsplit("/", 1)[1]
                gets[d] = gets.get(d, 0) + 1
                sent[d] = sent.get(d, 0) + n
    wanted = {image["config"]: None, **{l["digest"]: l["size"] for l in image["layers"]}}
    blob_bytes = sum(sent.get(d, 0) for d in wanted)
    return {
        "blob_gets": {d: gets.get(d, 0) for d in wanted},
        "blob_gets_max": max((gets.get(d, 0) for d in wanted), default=0),
        "blob_bytes": blob_bytes,
        "ratio": round(blob_bytes / image["image_bytes"], 3),
        "manifest_requests": manifests,
    }


def arm(a):
    image = json.load(open(a.image))
    nodes = []
    for path in a.nodes:
        nodes.extend(json.load(open(path))["nodes"])
    ok = [n for n in nodes if n.get("ok")]
    seconds = [n["seconds"] for n in ok]
    statuses = {}
    for n in nodes:
        for s, c in (n.get("statuses") or {}).items():
            statuses[s] = statuses.get(s, 0) + c
    firsts = [n["first_layer_byte"] - n["start"] for n in ok if n.get("first_layer_byte")]
    racks = len(a.cpu) - 1
    node_bytes = len(nodes) * image["image_bytes"]
    child_cpu = a.cpu[1:]
    out = {
        "name": a.name,
        "nodes": len(nodes),
        "ok": len(ok),
        "failed": len(nodes) - len(ok),
        "errors": sorted({n["error"] for n in nodes if n.get("error")})[:5],
        "statuses": statuses,
        "verified_nodes": sum(1 for n in ok if n.get("verified")),
        "p50_s": quantile(seconds, 0.5),
        "p99_s": quantile(seconds, 0.99),
        "max_s": max(seconds) if seconds else None,
        "first_layer_byte_p50_s": quantile(firsts, 0.5),
        "upstream": upstream(a.upstream_log, image),
        "parent_egress_bytes": a.parent_tx,
        "parent_egress_ratio": round(a.parent_tx / (racks * image["image_bytes"]), 3) if racks else None,
        "cpu_s": {"parent": round(a.cpu[0], 2), "child_mean": round(statistics.mean(child_cpu), 2) if child_cpu else None,
                  "child_max": round(max(child_cpu), 2) if child_cpu else None},
        # per GiB each tier sent on: the parent to the racks, a child to its nodes
        "cpu_s_per_gib": {
            "parent": round(a.cpu[0] / (racks * image["image_bytes"] / GIB), 3) if racks else None,
            "child": round(sum(child_cpu) / (node_bytes / GIB), 3) if child_cpu else None,
        },
        "rss_mib": {"parent": round(a.hwm_kib[0] / 1024, 1), "child_max": round(max(a.hwm_kib[1:], default=0) / 1024, 1)},
    }
    if a.tcp and os.path.exists(a.tcp):
        out["tcp"] = json.load(open(a.tcp))
    if a.ctr and os.path.exists(a.ctr):
        out["ctr"] = json.load(open(a.ctr))
    print(json.dumps(out))


def fmt(v, unit="", digits=1):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}{unit}"
    return f"{v}{unit}"


def summary(a):
    image = json.load(open(a.image))
    size = image["image_bytes"]
    links = {"upstream_mbit": a.up_mbit, "upstream_delay_ms": a.up_delay_ms, "upstream_loss_pct": a.up_loss,
             "parent_mbit": a.parent_mbit, "rack_mbit": a.rack_mbit}
    # The floor: each link's bytes at its rate; streaming through the hops overlaps them, so the
    # slowest link sets the time (plus latency).
    floors = {
        "upstream": size * 8 / (a.up_mbit * 1e6),
        "parent": a.racks * size * 8 / (a.parent_mbit * 1e6),
        "rack": a.nodes * size * 8 / (a.rack_mbit * 1e6),
    }
    out = {"racks": a.racks, "nodes_per_rack": a.nodes, "image_bytes": size, "layers": len(image["layers"]),
           "links": links, "node_timeout_s": a.node_timeout, "floor_s": round(max(floors.values()), 2),
           "floors_s": {k: round(v, 2) for k, v in floors.items()}}
    arms = {}
    for name in a.arms:
        path = os.path.join(a.work, f"arm-{name}.json")
        if os.path.exists(path):
            arms[name] = json.load(open(path))
    out.update(arms)
    rows = [
        (f"nodes holding the image within {a.node_timeout:.0f} s", lambda r: f"{r['ok']} / {r['nodes']}"),
        ("time to the last node: p50 / p99 / max (s)",
         lambda r: f"{fmt(r['p50_s'])} / {fmt(r['p99_s'])} / {fmt(r['max_s'])}"),
        ("... against the floor", lambda r: f"{r['max_s'] / out['floor_s']:.2f}x" if r["max_s"] else "-"),
        ("first layer byte at a node, p50 (s)", lambda r: fmt(r["first_layer_byte_p50_s"], digits=2)),
        ("upstream bytes / image (target 1.00x)", lambda r: f"{r['upstream']['ratio']:.2f}x"),
        ("upstream GETs of the busiest blob", lambda r: str(r["upstream"]["blob_gets_max"])),
        ("upstream manifest requests", lambda r: str(r["upstream"]["manifest_requests"])),
        ("parent egress / (racks x image)", lambda r: f"{r['parent_egress_ratio']:.2f}x"),
        ("non-200 answers to nodes", lambda r: json.dumps(r["statuses"]) if r["statuses"] else "none"),
        ("CPU s: parent / child (mean)", lambda r: f"{r['cpu_s']['parent']} / {r['cpu_s']['child_mean']}"),
        ("CPU s per GiB sent: parent / child",
         lambda r: f"{r['cpu_s_per_gib']['parent']} / {r['cpu_s_per_gib']['child']}"),
        ("peak RSS MiB: parent / child (max)", lambda r: f"{r['rss_mib']['parent']} / {r['rss_mib']['child_max']}"),
        ("TCP: listen drops at the racks / SYNs the nodes resent",
         lambda r: f"{r['tcp']['listen_drops']} / {r['tcp']['syn_retransmits']}" if "tcp" in r else "-"),
        ("real containerd (ctr content fetch) in rack 0",
         lambda r: (f"{r['ctr']['seconds']} s" if r["ctr"]["ok"] else "failed") if "ctr" in r else "-"),
    ]
    md = [
        f"### {a.racks} racks x {a.nodes} nodes, {size / (1 << 20):.0f} MiB image ({len(image['layers'])} layers)",
        "",
        f"Links: upstream {a.up_mbit} Mbit/s + {a.up_delay_ms} ms (loss {a.up_loss}%), parent egress "
        f"{a.parent_mbit} Mbit/s, each rack {a.rack_mbit} Mbit/s. Floor {out['floor_s']:.1f} s "
        f"(upstream {floors['upstream']:.1f} s, parent {floors['parent']:.1f} s, rack {floors['rack']:.1f} s).",
        "",
        "| | " + " | ".join(arms) + " |",
        "|---|" + "---|" * len(arms),
    ]
    for label, f in rows:
        md.append(f"| {label} | " + " | ".join(f(r) for r in arms.values()) + " |")
    md.append("")
    with open(a.markdown, "w") as f:
        f.write("\n".join(md) + "\n")
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("arm")
    p.add_argument("--name", required=True)
    p.add_argument("--image", required=True)
    p.add_argument("--nodes", nargs="+", required=True)
    p.add_argument("--upstream-log", required=True)
    p.add_argument("--parent-tx", type=int, required=True)
    p.add_argument("--cpu", type=float, nargs="+", required=True)
    p.add_argument("--hwm-kib", type=float, nargs="+", required=True)
    p.add_argument("--ctr")
    p.add_argument("--tcp")
    p = sub.add_parser("summary")
    p.add_argument("--work", required=True)
    p.add_argument("--arms", nargs="+", required=True)
    p.add_argument("--racks", type=int, required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--up-mbit", type=float, required=True)
    p.add_argument("--up-delay-ms", type=float, required=True)
    p.add_argument("--up-loss", type=float, required=True)
    p.add_argument("--parent-mbit", type=float, required=True)
    p.add_argument("--rack-mbit", type=float, required=True)
    p.add_argument("--node-timeout", type=float, required=True)
    p.add_argument("--image", required=True)
    p.add_argument("--markdown", required=True)
    a = ap.parse_args()
    arm(a) if a.cmd == "arm" else summary(a)


if __name__ == "__main__":
    main()
