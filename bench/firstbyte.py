#!/usr/bin/env python3
"""firstbyte.py - N concurrent GETs of one URL that record when each client got its first BODY byte.

usage: firstbyte.py URL N [--sha256 HEX] [--expect-bytes B] [--maxtime S]

curl's time_starttransfer is the time of the response *headers*; a cache can send headers at once
and then make a follower wait for the whole upstream transfer. This client reads the status line
and headers, then one body byte (that instant is fbb), then the rest of the body (hashed with
--sha256, else only counted). All clients start together (a barrier); every time is in seconds
since that common start, so fbb_max_s is "the last client's first body byte". Every client is its
own process (forked, then waiting for the common start instant): threads of one interpreter share
the GIL, and with many clients a late thread could wait a second for it before even sending its
request, which would be charged to the server. sent_max_s is when the last request was written.

prints one line per client, then
  fanout N=.. wall_s=.. ok=.. fail=.. bytes=.. agg_GiBps=.. hdr_max_s=.. fbb_min_s=.. fbb_med_s=.. fbb_max_s=..
  [vmhwm_kb=.. when WATCH_PID is set]
exit status 1 if any client failed (connection error, non-200, wrong size, wrong sha256).
Standard library only; loopback URLs only.
"""
import argparse
import hashlib
import http.client
import os
import statistics
import sys
import multiprocessing
import time
import urllib.parse

CHUNK = 1 << 20


def vmhwm_kb(pid):
    try:
        with open("/proc/%s/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return line.split()[1]
    except OSError:
        pass
    return "?"


def client(i, url, args, t0, results):
    r = {"i": i, "status": 0, "bytes": 0, "sent": None, "hdr": None, "fbb": None, "end": None, "sha": "-",
         "err": ""}
    u = urllib.parse.urlsplit(url)
    path = u.path + ("?" + u.query if u.query else "")
    try:
        time.sleep(max(0.0, t0[0] - time.monotonic()))
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=args.maxtime)
        conn.request("GET", path, headers={"User-Agent": "tender-bench-firstbyte/1"})
        r["sent"] = time.monotonic() - t0[0]
        resp = conn.getresponse()
        r["hdr"] = time.monotonic() - t0[0]
        r["status"] = resp.status
        h = hashlib.sha256() if args.sha256 else None
        first = resp.read(1)
        if first:
            r["fbb"] = time.monotonic() - t0[0]
            r["bytes"] = len(first)
            if h:
                h.update(first)
        buf = bytearray(CHUNK)
        mv = memoryview(buf)
        deadline = time.monotonic() + args.maxtime
        while first:
            n = resp.readinto(mv)
            if not n:
                break
            r["bytes"] += n
            if h:
                h.update(mv[:n])
            if time.monotonic() > deadline:
                r["err"] = "maxtime"
                break
        r["end"] = time.monotonic() - t0[0]
        if h:
            r["sha"] = "ok" if h.hexdigest() == args.sha256 else "BAD"
        conn.close()
    except Exception as e:  # noqa: BLE001 - one failed client is a result, not a crash
        r["err"] = repr(e)
        r["end"] = time.monotonic() - t0[0]
    results.put(r)


def fmt(v):
    return "-" if v is None else "%.3f" % v


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("url")
    p.add_argument("n", type=int)
    p.add_argument("--sha256", default="", help="hex sha256 every body must have (hashes every body)")
    p.add_argument("--expect-bytes", type=int, default=None)
    p.add_argument("--maxtime", type=float, default=900.0)
    args = p.parse_args()
    host = urllib.parse.urlsplit(args.url).hostname or ""
    if not (host.startswith("127.") or host == "localhost"):
        sys.exit("firstbyte.py: refusing non-loopback target: %s" % args.url)
    if args.n < 1:
        sys.exit("firstbyte.py: bad N: %d" % args.n)
    args.sha256 = args.sha256.lower()

    # CLOCK_MONOTONIC is one clock for every process: the children wait for the same instant,
    # far enough ahead for all of them to have been forked.
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    t0 = [time.monotonic() + 0.3 + 0.02 * args.n]
    procs = [ctx.Process(target=client, args=(i, args.url, args, t0, results), daemon=True) for i in range(args.n)]
    for pr in procs:
        pr.start()
    out = [results.get() for _ in procs]
    wall = time.monotonic() - t0[0]
    for pr in procs:
        pr.join()
    out.sort(key=lambda r: r["i"])

    ok = fail = total = 0
    fbbs, hdrs, sents = [], [], []
    for r in out:
        good = r["status"] == 200 and not r["err"] and r["sha"] != "BAD"
        if args.expect_bytes is not None and r["bytes"] != args.expect_bytes:
            good = False
        ok += good
        fail += not good
        total += r["bytes"]
        if r["fbb"] is not None:
            fbbs.append(r["fbb"])
        if r["hdr"] is not None:
            hdrs.append(r["hdr"])
        if r["sent"] is not None:
            sents.append(r["sent"])
        print("client %d: %s http=%d bytes=%d sent_s=%s hdr_s=%s fbb_s=%s time_s=%s sha256=%s%s" % (
            r["i"] + 1, "ok" if good else "fail", r["status"], r["bytes"], fmt(r["sent"]), fmt(r["hdr"]), fmt(r["fbb"]),
            fmt(r["end"]), r["sha"], (' err="%s"' % r["err"]) if r["err"] else ""))
    # a client that never got a body byte counts as "never": fbb_max is then reported as "-"
    fbb_max = max(fbbs) if len(fbbs) == args.n else None
    extra = ""
    if os.environ.get("WATCH_PID"):
        extra = " vmhwm_kb=%s" % vmhwm_kb(os.environ["WATCH_PID"])
    print("fanout N=%d wall_s=%.3f ok=%d fail=%d bytes=%d agg_GiBps=%.3f hdr_max_s=%s fbb_min_s=%s "
          "fbb_med_s=%s fbb_max_s=%s sent_max_s=%s%s" % (
              args.n, wall, ok, fail, total, total / wall / (1 << 30) if wall > 0 else 0,
              fmt(max(hdrs) if hdrs else None), fmt(min(fbbs) if fbbs else None),
              fmt(statistics.median(fbbs) if fbbs else None), fmt(fbb_max), fmt(max(sents) if sents else None),
              extra))
    sys.exit(1 if fail else 0)


if __name__ == "__main__":
    main()
