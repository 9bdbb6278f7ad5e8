#!/usr/bin/env python3
"""Soak: the hostile-review mix against one tender while honest clients pull (issue 16).

Starts docker-registry (the test bed's upstream.sh) with small synthetic images, and tender in
front of it with client authentication (htpasswd, anonymous pull allowed) and connection caps.
For SOAK_SECONDS (default 300) it runs, all from 127.0.0.0/8:

  silent     sockets that never send a byte, re-opened continuously from 127.0.0.2..127.0.0.21
  slowloris  request heads sent a few bytes at a time, never finished
  methods    requests with distinct 60 KB method names (metric-label growth)
  logins     wrong Basic passwords from many addresses (bcrypt cost), unknown users
  bombs      64 KiB header lines and 16 KiB request targets
  garbage    random bytes, TLS hellos on the plain port, HTTP/2 prefaces that stop
  routes     hostile ns values, dot segments, unknown upstream names

while HONEST (8) clients pull the kubelet index, its manifests and every blob, verifying each
digest, over and over. Every honest request must succeed byte-exact, and tender's peak RSS must
stay under RSS_LIMIT_MIB (256). Prints one summary line of key=value figures; exit 1 when a
check failed, 2 on a setup problem.

usage: bench/soak.py            env: TENDER_BIN (default target/release/tender, else debug),
                                     SOAK_SECONDS=300 HONEST=8 RSS_LIMIT_MIB=256 KEEP=1
"""

import base64
import hashlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BED = os.environ.get("HARNESS") or os.path.join(REPO, "scripts", "testbed")
SECONDS = float(os.environ.get("SOAK_SECONDS", "300"))
HONEST = int(os.environ.get("HONEST", "8"))
RSS_LIMIT = int(os.environ.get("RSS_LIMIT_MIB", "256"))
ACCEPT = ", ".join([
    "application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json"])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary():
    for b in [os.environ.get("TENDER_BIN"), os.path.join(REPO, "target/release/tender"),
              os.path.join(REPO, "target/debug/tender")]:
        if b and os.access(b, os.X_OK):
            return b
    sys.exit("soak: no tender binary (cargo build --release --bin tender, or TENDER_BIN)")


class Stop:
    def __init__(self, until):
        self.until = until
        self.flag = threading.Event()

    def running(self):
        return not self.flag.is_set() and time.monotonic() < self.until


def get(port, path, headers=None, timeout=30):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.headers, r.read()


def honest(port, stop, stats, lock, index):
    """Pull the index, each platform manifest and every blob; verify each digest."""
    while stop.running():
        t0 = time.monotonic()
        try:
            _, _, body = get(port, "/v2/ghcr.io/siderolabs/kubelet/manifests/v1.33.1", {"Accept": ACCEPT})
            assert "sha256:" + hashlib.sha256(body).hexdigest() == index, "index digest"
            for m in json.loads(body)["manifests"]:
                _, _, mb = get(port, "/v2/ghcr.io/siderolabs/kubelet/manifests/" + m["digest"], {"Accept": ACCEPT})
                assert "sha256:" + hashlib.sha256(mb).hexdigest() == m["digest"], "manifest digest"
                doc = json.loads(mb)
                for d in [doc["config"]] + doc["layers"]:
                    _, _, b = get(port, "/v2/ghcr.io/siderolabs/kubelet/blobs/" + d["digest"])
                    assert "sha256:" + hashlib.sha256(b).hexdigest() == d["digest"], "blob digest"
            with lock:
                stats["pulls"] += 1
                stats["pull_max_s"] = max(stats["pull_max_s"], time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 - every failure is counted and reported
            with lock:
                stats["honest_failures"] += 1
                stats.setdefault("first_failure", repr(e))


def attacker(kind, port, stop, stats, lock, n):
    rnd = random.Random(n)
    src = "127.0.0.%d" % (2 + n % 20)
    held = []
    while stop.running():
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(src, 0))
        except OSError:
            with lock:
                stats["attack_refused"] += 1
            time.sleep(0.05)  # pacing the attack, not synchronisation
            continue
        with lock:
            stats["attack_" + kind] += 1
        try:
            if kind == "silent":
                held.append(s)
                if len(held) > 40:
                    held.pop(0).close()
                time.sleep(0.02)
                continue
            if kind == "slowloris":
                for chunk in (b"GET /v2/ HT", b"TP/1.1\r\nHost: x\r\n", b"X-a: b\r\n"):
                    s.sendall(chunk)
                    time.sleep(0.5)
            elif kind == "methods":
                method = ("M%d" % rnd.getrandbits(48)).encode() + b"X" * 60000
                s.sendall(method + b" /v2/ HTTP/1.1\r\nHost: x\r\n\r\n")
                s.recv(4096)
            elif kind == "logins":
                user = rnd.choice(["worker", "nobody%d" % rnd.getrandbits(16)])
                cred = base64.b64encode(("%s:wrong%d" % (user, rnd.getrandbits(20))).encode()).decode()
                s.sendall(("GET /v2/ HTTP/1.1\r\nHost: x\r\nAuthorization: Basic %s\r\n\r\n" % cred).encode())
                s.recv(4096)
            elif kind == "bombs":
                s.sendall(b"GET /v2/" + b"a" * 16384 + b" HTTP/1.1\r\nHost: x\r\nX-b: " + b"b" * 65536 + b"\r\n\r\n")
                s.recv(4096)
            elif kind == "garbage":
                s.sendall(rnd.choice([bytes(rnd.getrandbits(8) for _ in range(512)),
                                      b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
                                      b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00"]))
                s.settimeout(1)
                s.recv(4096)
            elif kind == "routes":
                path = rnd.choice(["/v2/a/b/manifests/latest?ns=evil.example", "/v2/../../etc/passwd",
                                   "/v2/169.254.169.254/x/manifests/latest", "/v2/%2e%2e/x/blobs/sha256:00",
                                   "/v2/a/b/manifests/latest?ns=127.0.0.1:1"])
                s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path).encode())
                s.recv(4096)
        except OSError:
            pass
        finally:
            if kind != "silent":
                s.close()
    for s in held:
        s.close()


def rss_kib(pid, field):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def main():
    for tool in ["docker-registry", "skopeo", "htpasswd", "curl"]:
        if not shutil.which(tool):
            print("soak: %s is not installed (scripts/test.sh installs the packages)" % tool, file=sys.stderr)
            return 2
    work = tempfile.mkdtemp(prefix="tender-soak.")
    up, up_port, port = os.path.join(work, "up"), free_port(), free_port()
    tender = None
    try:
        subprocess.run([os.path.join(BED, "upstream.sh"), "start", up, str(up_port)], check=True,
                       stdout=subprocess.DEVNULL)
        env = dict(os.environ, WORK=os.path.join(work, "img"), KUBELET_LAYERS_MB="4 1",
                   INSTALLER_LAYERS_MB="", BIG_MB="0")
        subprocess.run([os.path.join(BED, "mkimages.sh"), "127.0.0.1:%d" % up_port], check=True, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        images = dict(l.strip().split("=", 1) for l in open(os.path.join(work, "img", "images.env")) if "=" in l)
        subprocess.run(["htpasswd", "-B", "-b", "-c", os.path.join(work, "htpasswd"), "worker", "right-password"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        config = os.path.join(work, "tender.yaml")
        with open(config, "w") as f:
            f.write("listen: 127.0.0.1:%d\ndata: %s\nupstreams:\n  - name: ghcr.io\n    url: http://127.0.0.1:%d\n"
                    "auth:\n  htpasswd: %s\n  anonymousPull: true\nlimits:\n  maxConnections: 512\n"
                    "  maxConnectionsPerAddress: 64\n  maxClientRequests: 256\n"
                    % (port, os.path.join(work, "data"), up_port, os.path.join(work, "htpasswd")))
        log = open(os.path.join(work, "tender.log"), "w")
        tender = subprocess.Popen([binary(), "serve", "--config", config, "--log-format", "json"],
                                  stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 20
        while True:
            try:
                if get(port, "/healthz", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or tender.poll() is not None:
                print("soak: tender did not start (see %s/tender.log)" % work, file=sys.stderr)
                return 2
            time.sleep(0.1)

        stop = Stop(time.monotonic() + SECONDS)
        lock = threading.Lock()
        stats = {"pulls": 0, "honest_failures": 0, "pull_max_s": 0.0, "attack_refused": 0}
        kinds = ["silent"] * 6 + ["slowloris"] * 4 + ["methods", "methods", "logins", "logins", "logins",
                                                       "bombs", "garbage", "routes", "routes"]
        for k in set(kinds):
            stats["attack_" + k] = 0
        threads = [threading.Thread(target=honest, args=(port, stop, stats, lock, images["KUBELET_INDEX"]))
                   for _ in range(HONEST)]
        threads += [threading.Thread(target=attacker, args=(k, port, stop, stats, lock, i))
                    for i, k in enumerate(kinds)]
        for t in threads:
            t.start()
        peak = 0
        healthz_max = 0.0
        while stop.running():
            peak = max(peak, rss_kib(tender.pid, "VmRSS"))
            t0 = time.monotonic()
            try:
                get(port, "/healthz", timeout=5)
                healthz_max = max(healthz_max, time.monotonic() - t0)
            except OSError:
                healthz_max = max(healthz_max, 5.0)
            time.sleep(1)  # sampling interval
        stop.flag.set()
        for t in threads:
            t.join(timeout=60)
        peak = max(peak, rss_kib(tender.pid, "VmHWM"))
        metrics = get(port, "/metrics", {"Authorization": "Basic " + base64.b64encode(b"worker:right-password").decode()})[2]
        ok = stats["honest_failures"] == 0 and stats["pulls"] > 0 and peak < RSS_LIMIT * 1024 and tender.poll() is None
        figures = dict(stats, seconds=int(SECONDS), honest=HONEST, rss_peak_mib=round(peak / 1024, 1),
                       rss_limit_mib=RSS_LIMIT, healthz_max_s=round(healthz_max, 3), metrics_bytes=len(metrics),
                       pull_max_s=round(stats["pull_max_s"], 3), result="pass" if ok else "FAIL")
        print(" ".join("%s=%s" % (k, str(v).replace(" ", "_")) for k, v in figures.items()))
        return 0 if ok else 1
    finally:
        if tender is not None:
            tender.terminate()
            try:
                tender.wait(timeout=30)
            except subprocess.TimeoutExpired:
                tender.kill()
        subprocess.run([os.path.join(BED, "upstream.sh"), "stop", up], stdout=subprocess.DEVNULL)
        if os.environ.get("KEEP") == "1":
            print("soak: kept %s" % work, file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
