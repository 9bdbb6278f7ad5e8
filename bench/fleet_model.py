#!/usr/bin/env python3
"""fleet_model.py - time to fleet for a tree of caches: how long until the last node holds an image.

usage:
  fleet_model.py predict [--config FILE.json] [options] [--json]
  fleet_model.py check SUMMARY.json [--arm tender] [options] [--json]
  fleet_model.py scale [options] [--json | --markdown]

The topology
  levels 2: upstream (site internet link) -> P parents -> one child per rack -> nodes
  levels 1: upstream -> P flat replicas (one tier, shared storage) -> nodes
  racks = ceil(nodes / nodes_per_rack). Every tier fetches each object once and streams it on
  while the bytes arrive (cut-through): a child serves its nodes while its parent is still
  fetching, so one object crosses each link once.

The model
  Each hop h has a capacity C_h and carries f_h concurrent flows of the same image:
    upstream link        C = upstream x eff            f = upstream_fetches (1: one fetch)
    parent CPU           C = cores_p / cpu_p GiB/s     f = flows on the parent's egress
    parent egress        C = parent_nic x eff          f = ceil(racks / P)   (flat: ceil(nodes / P))
    rack uplink          C = uplink x eff              f = 1                 (flat: nodes in the rack)
    child CPU            C = cores_c / cpu_c GiB/s     f = nodes in the rack
    child egress         C = child_nic x eff           f = nodes in the rack
    node NIC             C = node_nic x eff            f = 1
  (a hop with capacity 0 is not modelled). Each flow gets a fair share C_h / f_h of its hop and,
  with cut-through, a node receives at the slowest share along its path:
    rate       = min_h (C_h / f_h)
    transfer   = image_bits / rate
    startup    = rounds x sum_h delay_h   (rounds: requests in a row before the layer bytes flow:
                 HEAD tag, index, manifest, layer; delay_h: one request's first-byte delay on hop h)
    max        = startup + transfer
  The floor is the slowest link moving the bytes it must carry: max_h (f_h x image_bits / C_h).
  Under fair share with cut-through the transfer equals the floor: nothing is lost to waiting
  for a tier to finish. For contrast the output also gives store-and-forward, where each tier
  serves only once its own fill has ended: sum over tiers of image_bits / (slowest share into
  that tier).

  Nodes finish at the same time under fair share, so p50 = p99 = max within one rack size; a
  smaller last rack finishes earlier, and the percentiles are taken over all nodes (nearest rank).
  --spread S (a p99/p50 ratio measured on the bed; default 1.0) models unfair sharing: a
  saturated link still moves all its bytes by the same time (work conservation), so max and p99
  stay and p50 = startup + transfer / S.

  CPU: cpu_s_per_gib is CPU-seconds per GiB a tier SENDS downstream (its own fill included),
  measured: tender's user + system time over a wave divided by the GiB it sent. A tier is
  CPU-bound when cores / cpu_s_per_gib is below its egress. 0 cores = CPU not modelled.

  Link speeds are in Gbit/s (10^9 bit/s), image sizes in bytes; eff (default 0.94) is the share of
  a link's line rate that TCP payload gets: 1448 payload bytes per 1538 on the wire with a 1500
  MTU (Ethernet preamble, header, FCS, gap; IP and TCP headers with timestamps). A tc-shaped veth
  counts 1514 bytes per packet: 0.956.

check reads the JSON summary bench/fleet.sh prints as its last line:
  {"racks": R, "nodes_per_rack": N, "image_bytes": B,
   "links": {"upstream_mbit": x, "upstream_delay_ms": d, "parent_mbit": y, "rack_mbit": z},
   "tender": {"p50_s": .., "p99_s": .., "max_s": .., "cpu_s_per_gib": {"parent": .., "child": ..}}}
  upstream_delay_ms is the delay line's one-way delay (bench/fleet_delay.py holds each direction),
  so the upstream hop's first-byte delay is 2 x d. Optional: "levels", "parents", "cores" (the
  bed's cores, shared by every tier: adds a CPU floor, total CPU-seconds / cores), and any
  option below as a top-level key. Prints predicted against measured p50, p99, max with the
  relative error (predicted - measured) / measured.

scale prints 1,000 and 10,000 nodes, a 2 GiB image, 10 and 25 GbE racks (child NIC = node NIC =
rack speed), 32 and 40 nodes per rack, upstream 1 and 10 Gbit/s, two levels (one parent on
100 GbE: --parent-gbit) and one level (flat replicas on shared storage: 1 x 100, 4 x 100,
8 x 25 GbE; the nodes' NIC never binds there), one upstream fetch, with the store-and-forward
time beside; then what the deadline (60 s) needs.

Standard library only (Python 3.11).
"""
import argparse
import json
import math
import sys

GIB = 1 << 30

# name: (default, type, help). Every one is a --flag (dashes) and a JSON key (underscores).
PARAMS = {
    "image_bytes": (2 * GIB, int, "image size in bytes"),
    "nodes": (1000, int, "number of nodes pulling at once"),
    "nodes_per_rack": (32, int, "nodes per rack (per child tender)"),
    "levels": (2, int, "1: one flat tier of --parents replicas; 2: parents -> rack children"),
    "parents": (1, int, "tenders in the top tier (parents, or flat replicas with --levels 1)"),
    "upstream_fetches": (1, int, "concurrent fetches on the site link (1: one fetch; independent replicas: P)"),
    "upstream_gbit": (1.0, float, "site internet link, Gbit/s"),
    "parent_gbit": (100.0, float, "NIC egress of each top-tier tender, Gbit/s"),
    "child_gbit": (10.0, float, "NIC egress of each rack tender, Gbit/s"),
    "node_gbit": (10.0, float, "node NIC, Gbit/s (0: not modelled)"),
    "uplink_gbit": (0.0, float, "rack uplink towards the site, Gbit/s (0: not modelled)"),
    "upstream_delay": (0.2, float, "first-byte delay of one request from the upstream, s"),
    "parent_delay": (0.001, float, "first-byte delay of one request on the parent hop, s"),
    "child_delay": (0.001, float, "first-byte delay of one request on the child hop, s"),
    "rounds": (4, int, "requests in a row before the layer bytes flow (HEAD tag, index, manifest, layer)"),
    "parent_cpu": (0.6, float, "parent CPU-seconds per GiB sent"),
    "child_cpu": (0.6, float, "child CPU-seconds per GiB sent"),
    "parent_cores": (16.0, float, "cores of each top-tier tender (0: CPU not modelled)"),
    "child_cores": (4.0, float, "cores of each rack tender (0: CPU not modelled)"),
    "shared_cores": (0.0, float, "cores shared by every tier (a test bed on one machine; 0: none)"),
    "efficiency": (0.94, float, "usable share of a link's line rate (TCP over Ethernet, 1500 MTU)"),
    "spread": (1.0, float, "measured p99/p50 ratio (1.0: fair share)"),
    "deadline": (60.0, float, "the time-to-fleet goal, s"),
}


def defaults():
    return {k: v[0] for k, v in PARAMS.items()}


def gib_per_s_to_gbit(g):
    return g * GIB * 8 / 1e9


def fmt_rate(gbit):
    if gbit == math.inf:
        return "-"
    if gbit >= 1:
        return f"{gbit:.2f} Gbit/s"
    return f"{gbit * 1000:.0f} Mbit/s"


def fmt_bytes(b):
    if b >= GIB:
        return f"{b / GIB:,.1f} GiB"
    return f"{b / (1 << 20):,.0f} MiB"


def fmt_s(s):
    return f"{s:,.1f} s"


def group_sizes(total, per_group):
    """Split `total` items in groups of at most `per_group`: {size: how many groups}."""
    full, rest = divmod(total, per_group)
    out = {}
    if full:
        out[per_group] = full
    if rest:
        out[rest] = out.get(rest, 0) + 1
    return out


def spread_evenly(total, bins):
    """`total` items over `bins` bins as evenly as possible: {load: how many bins}."""
    q, r = divmod(total, bins)
    out = {}
    if r:
        out[q + 1] = r
    if bins - r and q:
        out[q] = bins - r
    return out


def model(p):
    """Everything the model says about one configuration, as a dict."""
    img_bits = p["image_bytes"] * 8
    nodes, npr, levels, parents = p["nodes"], p["nodes_per_rack"], p["levels"], p["parents"]
    if levels not in (1, 2):
        raise ValueError("levels must be 1 or 2")
    if min(nodes, npr, parents, p["upstream_fetches"]) < 1:
        raise ValueError("nodes, nodes_per_rack, parents and upstream_fetches must be >= 1")
    if p["image_bytes"] <= 0 or p["efficiency"] <= 0 or p["spread"] < 1:
        raise ValueError("image_bytes and efficiency must be > 0, spread >= 1")
    eff = p["efficiency"]
    racks = math.ceil(nodes / npr)
    rack_sizes = group_sizes(nodes, npr)  # {nodes in the rack: racks}
    top = "parent" if levels == 2 else "replica"

    def link(gbit):
        return gbit * 1e9 * eff / 1e9 if gbit > 0 else 0.0

    def cpu(cores, cpu_s):
        return gib_per_s_to_gbit(cores / cpu_s) if cores > 0 and cpu_s > 0 else 0.0

    # hops common to every node; per-group hops are added below
    if levels == 2:
        top_flows = math.ceil(racks / parents)  # the busiest parent
    else:
        top_flows = math.ceil(nodes / parents)  # the busiest replica
    hops = [
        {"hop": "upstream link", "cap": link(p["upstream_gbit"]), "flows": p["upstream_fetches"]},
        {"hop": f"{top} CPU", "cap": cpu(p["parent_cores"], p["parent_cpu"]), "flows": top_flows,
         "cpu_s_per_gib": p["parent_cpu"], "cores": p["parent_cores"]},
        {"hop": f"{top} egress", "cap": link(p["parent_gbit"]), "flows": top_flows},
    ]
    worst = max(rack_sizes)
    if levels == 2:
        hops += [
            {"hop": "rack uplink", "cap": link(p["uplink_gbit"]), "flows": 1},
            {"hop": "child CPU", "cap": cpu(p["child_cores"], p["child_cpu"]), "flows": worst,
             "per_rack": True, "cpu_s_per_gib": p["child_cpu"], "cores": p["child_cores"]},
            {"hop": "child egress", "cap": link(p["child_gbit"]), "flows": worst, "per_rack": True},
        ]
    else:
        hops += [{"hop": "rack uplink", "cap": link(p["uplink_gbit"]), "flows": worst, "per_rack": True}]
    hops.append({"hop": "node NIC", "cap": link(p["node_gbit"]), "flows": 1})
    hops = [h for h in hops if h["cap"] > 0]

    # the bed: every tier on the same cores. Total CPU-seconds / cores is a floor for the wave.
    sent_gib = {"top": 0.0, "child": 0.0}
    if levels == 2:
        sent_gib["top"] = racks * p["image_bytes"] / GIB
        sent_gib["child"] = nodes * p["image_bytes"] / GIB
    else:
        sent_gib["top"] = nodes * p["image_bytes"] / GIB
    shared_cpu_s = sent_gib["top"] * p["parent_cpu"] + sent_gib["child"] * p["child_cpu"]
    if p["shared_cores"] > 0:
        t = shared_cpu_s / p["shared_cores"]
        # as a hop: one flow per node, each at image_bits / t
        hops.append({"hop": "shared CPU", "cap": img_bits * nodes / t / 1e9, "flows": nodes,
                     "cpu_s": shared_cpu_s, "cores": p["shared_cores"]})

    for h in hops:
        h["per_flow"] = h["cap"] / h["flows"]
        h["bytes"] = h["flows"] * p["image_bytes"]
        h["floor_s"] = h["flows"] * img_bits / (h["cap"] * 1e9)

    # per-node completion by class of node (rack size in a tree, replica load when flat)
    if levels == 2:
        classes = {}
        for size, count in rack_sizes.items():
            classes[size] = {"nodes": size * count, "rack_flows": size}
    else:
        loads = spread_evenly(nodes, parents)
        classes = {load: {"nodes": load * count, "top_flows": load} for load, count in loads.items()}
    hop_delays = [p["upstream_delay"], p["parent_delay"]] + ([p["child_delay"]] if levels == 2 else [])
    startup = p["rounds"] * sum(hop_delays)
    per_node = []
    for key, c in classes.items():
        rates = []
        for h in hops:
            f = h["flows"]
            if levels == 2 and h.get("per_rack"):
                f = c["rack_flows"]
            if levels == 1 and h["hop"].startswith("replica"):
                f = c["top_flows"]
            rates.append((h["cap"] / f, h["hop"]))
        rate, neck = min(rates)
        transfer = img_bits / (rate * 1e9)
        per_node.append({"class": key, "nodes": c["nodes"], "rate": rate, "bottleneck": neck,
                         "transfer_s": transfer})
    per_node.sort(key=lambda c: c["transfer_s"])

    def pct(q):
        need = max(1, math.ceil(q / 100 * nodes))
        seen = 0
        for c in per_node:
            seen += c["nodes"]
            if seen >= need:
                return c
        return per_node[-1]

    c50, c99, cmax = pct(50), pct(99), per_node[-1]
    floor_hop = max(hops, key=lambda h: h["floor_s"])

    # store and forward: a tier serves only after its fill ended; the worst path
    chain = []  # slowest share into each tier, in order
    into_top = [h for h in hops if h["hop"] == "upstream link"]
    top_out = [h for h in hops if h["hop"].startswith(top) or h["hop"] == "shared CPU"]
    if levels == 2:
        child_in = top_out + [h for h in hops if h["hop"] == "rack uplink"]
        node_in = [h for h in hops if h.get("per_rack") or h["hop"] == "node NIC"]
        chain = [into_top, child_in, node_in]
    else:
        node_in = top_out + [h for h in hops if h["hop"] in ("rack uplink", "node NIC")]
        chain = [into_top, node_in]
    saf = 0.0
    for stage in chain:
        if stage:
            saf += img_bits / (min(h["per_flow"] for h in stage) * 1e9)
    saf += startup

    # what a tier needs to keep its NIC busy
    cores_needed = {}
    if p["parent_cpu"] > 0:
        cores_needed[top] = link(p["parent_gbit"]) * 1e9 / 8 / GIB * p["parent_cpu"]
    if levels == 2 and p["child_cpu"] > 0:
        cores_needed["child"] = link(p["child_gbit"]) * 1e9 / 8 / GIB * p["child_cpu"]
    per_flow = {h["hop"]: h["per_flow"] for h in hops}
    cpu_bound = [name for name, rate in per_flow.items()
                 if name.endswith(" CPU") and name != "shared CPU"
                 and rate < per_flow.get(name.replace("CPU", "egress"), math.inf)]

    def t(c, spread=1.0):
        return startup + c["transfer_s"] / spread

    res = {
        "inputs": dict(p),
        "racks": racks if levels == 2 else None,
        "rack_sizes": {str(k): v for k, v in sorted(rack_sizes.items())},
        "top_tier": top,
        "hops": [{k: h[k] for k in ("hop", "cap", "flows", "per_flow", "bytes", "floor_s")} for h in hops],
        "startup_s": startup,
        "rate_gbit": cmax["rate"],
        "bottleneck": cmax["bottleneck"],
        "transfer_s": cmax["transfer_s"],
        "p50_s": t(c50, p["spread"]),
        "p99_s": t(c99),
        "max_s": t(cmax),
        "floor_s": floor_hop["floor_s"],
        "floor_link": floor_hop["hop"],
        "store_and_forward_s": saf,
        "cores_to_fill_nic": cores_needed,
        "cpu_bound": cpu_bound,
        "shared_cpu_s": shared_cpu_s,
        "deadline_s": p["deadline"],
        "meets_deadline": t(c99) < p["deadline"],
    }
    return res


def describe(p, r):
    lv = p["levels"]
    if lv == 2:
        sizes = ", ".join(f"{v} of {k}" for k, v in sorted(r["rack_sizes"].items(), key=lambda kv: -int(kv[0])))
        topo = (f"2 levels: {p['nodes']:,} nodes in {r['racks']:,} racks ({sizes} nodes), "
                f"{p['parents']} parent(s)")
    else:
        topo = f"1 level: {p['nodes']:,} nodes on {p['parents']} flat replica(s)"
    return f"{topo}; image {fmt_bytes(p['image_bytes'])} ({p['image_bytes']:,} bytes); efficiency {p['efficiency']}"


def print_prediction(p, r, out=sys.stdout):
    w = out.write
    w(describe(p, r) + "\n\n")
    rows = [("hop", "capacity", "flows", "per flow", "bytes on it", "floor")]
    for h in r["hops"]:
        rows.append((h["hop"], fmt_rate(h["cap"]), f"{h['flows']:,}", fmt_rate(h["per_flow"]),
                     fmt_bytes(h["bytes"]), fmt_s(h["floor_s"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(widths[j]) for j, c in enumerate(row) if j]
        mark = "  <- bottleneck" if i and row[0] == r["bottleneck"] else ""
        w("  ".join(cells) + mark + "\n")
    w("\n")
    hops = "upstream + parent + child" if p["levels"] == 2 else "upstream + replica"
    w(f"startup    {fmt_s(r['startup_s'])}  ({p['rounds']} requests x first-byte delays of {hops})\n")
    w(f"per node   {fmt_rate(r['rate_gbit'])} at the bottleneck ({r['bottleneck']})\n")
    w(f"floor      {fmt_s(r['floor_s'])}  ({r['floor_link']})\n")
    w(f"p50 {fmt_s(r['p50_s'])}   p99 {fmt_s(r['p99_s'])}   max {fmt_s(r['max_s'])}   (spread {p['spread']})\n")
    w(f"store-and-forward at each tier instead: {fmt_s(r['store_and_forward_s'])}\n")
    need = ", ".join(f"{k} {v:.2f}" for k, v in r["cores_to_fill_nic"].items())
    if need:
        w(f"cores to keep the NIC busy: {need}" + (f"; CPU-bound: {', '.join(r['cpu_bound'])}" if r["cpu_bound"] else "") + "\n")
    verdict = "met" if r["meets_deadline"] else "missed"
    w(f"p99 < {p['deadline']:.0f} s: {verdict}\n")


# ---------- scale ----------

def scale_rows(base):
    rows = []
    for nodes in (1000, 10000):
        for rack in (10.0, 25.0):
            for up in (1.0, 10.0):
                for npr in (32, 40):
                    p = dict(base, nodes=nodes, levels=2, parents=1, upstream_fetches=1,
                             nodes_per_rack=npr, child_gbit=rack, node_gbit=rack, upstream_gbit=up)
                    rows.append((p, model(p), f"1 parent, {base['parent_gbit']:g} GbE"))
        # flat: the nodes' own NIC (10 or 25 GbE) never binds, so one set of rows serves both
        for up in (1.0, 10.0):
            for reps, gbit in ((1, 100.0), (4, 100.0), (8, 25.0)):
                p = dict(base, nodes=nodes, levels=1, parents=reps, upstream_fetches=1,
                         parent_gbit=gbit, node_gbit=10.0, upstream_gbit=up)
                rows.append((p, model(p), f"{reps} x {gbit:g} GbE flat"))
    return rows


def scale_needs(base):
    """What p99 < deadline needs, for a 2 GiB image, per rack speed and scale."""
    img_bits = base["image_bytes"] * 8
    eff = base["efficiency"]
    startup2 = base["rounds"] * (base["upstream_delay"] + base["parent_delay"] + base["child_delay"])
    budget = base["deadline"] - startup2
    out = {"budget_s": budget, "startup_s": startup2}
    out["upstream_min_mbit"] = img_bits / budget / eff / 1e6
    out["upstream_min_mbit_line_rate"] = img_bits / budget / 1e6
    out["nodes_per_rack_max"] = {}
    for rack in (10.0, 25.0):
        out["nodes_per_rack_max"][f"{rack:g}"] = math.floor(rack * 1e9 * eff * budget / img_bits)
    out["nodes_per_rack_max_line_rate"] = {f"{r:g}": math.floor(r * 1e9 * base["deadline"] / img_bits)
                                           for r in (10.0, 25.0)}
    out["parent_min_gbit"] = {}
    for nodes in (1000, 10000):
        for npr in (32, 40):
            racks = math.ceil(nodes / npr)
            out["parent_min_gbit"][f"{nodes}/{npr}"] = racks * img_bits / budget / eff / 1e9
    return out


def print_scale(base, rows, needs, markdown, out=sys.stdout):
    w = out.write
    head = ["nodes", "levels", "top tier", "rack NIC", "nodes/rack", "upstream", "children", "bottleneck",
            "per node", "p50", "p99", "max", f"p99 < {base['deadline']:g} s", "store-and-forward max"]
    body = []
    for p, r, top in rows:
        body.append([
            f"{p['nodes']:,}", str(p["levels"]), top,
            f"{p['node_gbit']:g} GbE" if p["levels"] == 2 else "10 or 25 GbE",
            str(p["nodes_per_rack"]) if p["levels"] == 2 else "-",
            f"{p['upstream_gbit']:g} Gbit/s", f"{r['racks']:,}" if r["racks"] else "-",
            r["bottleneck"], fmt_rate(r["rate_gbit"]), fmt_s(r["p50_s"]), fmt_s(r["p99_s"]),
            fmt_s(r["max_s"]), "yes" if r["meets_deadline"] else "no", fmt_s(r["store_and_forward_s"])])
    if markdown:
        w("| " + " | ".join(head) + " |\n")
        w("|" + "|".join("---" for _ in head) + "|\n")
        for b in body:
            w("| " + " | ".join(b) + " |\n")
    else:
        widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
        for x in [head] + body:
            w("  ".join(c.ljust(widths[i]) for i, c in enumerate(x)) + "\n")
    w("\n")
    w(f"assumptions: image {fmt_bytes(base['image_bytes'])}, efficiency {base['efficiency']}, "
      f"one upstream fetch, startup {needs['startup_s']:.2f} s ({base['rounds']} requests; upstream "
      f"{base['upstream_delay']} s, parent {base['parent_delay']} s, child {base['child_delay']} s), "
      f"CPU {base['parent_cpu']}/{base['child_cpu']} CPU-s per GiB sent on {base['parent_cores']:g}/"
      f"{base['child_cores']:g} cores (top tier/child), rack uplinks not modelled, spread {base['spread']}\n")
    w(f"p99 < {base['deadline']:g} s needs, with {needs['budget_s']:.1f} s left after startup:\n")
    w(f"  upstream >= {needs['upstream_min_mbit']:.0f} Mbit/s line rate "
      f"({needs['upstream_min_mbit_line_rate']:.0f} Mbit/s of payload: one copy within the deadline)\n")
    for rack, n in needs["nodes_per_rack_max"].items():
        w(f"  nodes per {rack} GbE rack tender <= {n} "
          f"(<= {needs['nodes_per_rack_max_line_rate'][rack]} at full line rate, no startup)\n")
    for k, g in needs["parent_min_gbit"].items():
        nodes, npr = k.split("/")
        w(f"  parent egress >= {g:.1f} Gbit/s for {int(nodes):,} nodes at {npr} per rack\n")


# ---------- check ----------

def check(summary, opts, arm):
    p = defaults()
    links = summary.get("links", {})
    racks = int(summary["racks"])
    npr = int(summary["nodes_per_rack"])
    p.update(
        nodes=racks * npr, nodes_per_rack=npr, image_bytes=int(summary["image_bytes"]),
        levels=int(summary.get("levels", 2)), parents=int(summary.get("parents", 1)),
        upstream_gbit=float(links["upstream_mbit"]) / 1000,
        upstream_delay=2 * float(links.get("upstream_delay_ms", 0)) / 1000,
        parent_gbit=float(links["parent_mbit"]) / 1000,
        child_gbit=float(links["rack_mbit"]) / 1000,
        node_gbit=0.0, parent_delay=0.0002, child_delay=0.0002,
        parent_cores=0.0, child_cores=0.0,
    )
    if p["levels"] == 1:
        p["nodes_per_rack"] = p["nodes"]
    meas = summary[arm]
    cpu = meas.get("cpu_s_per_gib") or {}
    if "parent" in cpu:
        p["parent_cpu"] = float(cpu["parent"])
    if "child" in cpu:
        p["child_cpu"] = float(cpu["child"])
    if "cores" in summary:
        p["shared_cores"] = float(summary["cores"])
    for k in PARAMS:  # optional top-level overrides in the summary, then the command line
        if k in summary and k not in ("levels", "parents", "nodes_per_rack"):
            p[k] = PARAMS[k][1](summary[k])
    p.update(opts)
    r = model(p)
    cmp = {}
    for k in ("p50_s", "p99_s", "max_s"):
        m = meas.get(k)
        err = (r[k] - m) / m if m else None
        cmp[k] = {"predicted": r[k], "measured": m, "rel_error": err}
    spread = meas["p99_s"] / meas["p50_s"] if meas.get("p50_s") and meas.get("p99_s") else None
    return p, r, cmp, spread


def print_check(p, r, cmp, spread, arm, out=sys.stdout):
    w = out.write
    print_prediction(p, r, out)
    w(f"\narm {arm}: predicted against measured\n")
    rows = [("", "predicted", "measured", "error")]
    for k, c in cmp.items():
        e = "-" if c["rel_error"] is None else f"{c['rel_error'] * 100:+.1f}%"
        m = "-" if c["measured"] is None else fmt_s(c["measured"])
        rows.append((k[:-2], fmt_s(c["predicted"]), m, e))
    widths = [max(len(x[i]) for x in rows) for i in range(4)]
    for x in rows:
        w("  ".join([x[0].ljust(widths[0])] + [x[i].rjust(widths[i]) for i in (1, 2, 3)]) + "\n")
    if spread:
        w(f"measured spread p99/p50 = {spread:.2f} (pass --spread {spread:.2f} to model it)\n")


# ---------- command line ----------

def add_params(ap, skip=()):
    for k, (d, typ, hlp) in PARAMS.items():
        if k in skip:
            continue
        ap.add_argument("--" + k.replace("_", "-"), type=typ, default=None, help=f"{hlp} (default {d})")


def given(ns):
    return {k: v for k, v in vars(ns).items() if k in PARAMS and v is not None}


def main(argv=None):
    ap = argparse.ArgumentParser(description="Time to fleet for a tree of tender caches.",
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("predict", help="one configuration from flags and/or a JSON file")
    pr.add_argument("--config", help="JSON object with any of the option names (underscores) as keys")
    add_params(pr)
    pr.add_argument("--json", action="store_true")
    ck = sub.add_parser("check", help="predicted against a bench/fleet.sh summary")
    ck.add_argument("summary", help="the summary JSON (a file, or - for stdin; the last line is read)")
    ck.add_argument("--arm", default="tender", help="which arm of the summary to compare (default tender)")
    add_params(ck)
    ck.add_argument("--json", action="store_true")
    sc = sub.add_parser("scale", help="1,000 and 10,000 nodes, 2 GiB, 10/25 GbE racks, 1 and 2 levels")
    add_params(sc, skip=("nodes", "nodes_per_rack", "levels", "parents", "upstream_fetches",
                         "upstream_gbit", "child_gbit", "node_gbit"))
    sc.add_argument("--json", action="store_true")
    sc.add_argument("--markdown", action="store_true", help="the table in Markdown")
    a = ap.parse_args(argv)

    try:
        if a.cmd == "predict":
            p = defaults()
            if a.config:
                with open(a.config) as f:
                    cfg = json.load(f)
                unknown = set(cfg) - set(PARAMS)
                if unknown:
                    ap.error(f"unknown keys in {a.config}: {', '.join(sorted(unknown))}")
                p.update({k: PARAMS[k][1](v) for k, v in cfg.items()})
            p.update(given(a))
            r = model(p)
            if a.json:
                json.dump(r, sys.stdout, indent=2)
                sys.stdout.write("\n")
            else:
                print_prediction(p, r)
        elif a.cmd == "check":
            text = sys.stdin.read() if a.summary == "-" else open(a.summary).read()
            lines = [ln for ln in text.strip().splitlines() if ln.strip()]
            try:
                summary = json.loads(text)
            except json.JSONDecodeError:
                summary = json.loads(lines[-1])
            p, r, cmp, spread = check(summary, given(a), a.arm)
            if a.json:
                json.dump({"prediction": r, "arm": a.arm, "compare": cmp, "measured_spread": spread},
                          sys.stdout, indent=2)
                sys.stdout.write("\n")
            else:
                print_check(p, r, cmp, spread, a.arm)
        else:
            base = defaults()
            base.update(given(a))
            rows = scale_rows(base)
            needs = scale_needs(base)
            if a.json:
                json.dump({"rows": [{"top_tier": t, **r} for _, r, t in rows], "needs": needs},
                          sys.stdout, indent=2)
                sys.stdout.write("\n")
            else:
                print_scale(base, rows, needs, a.markdown)
    except (ValueError, KeyError) as e:
        what = f"missing key {e}" if isinstance(e, KeyError) else str(e)
        print(f"fleet_model.py: {what}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
