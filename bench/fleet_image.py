#!/usr/bin/env python3
"""fleet_image.py - the image the fleet bench's nodes pull (bench/fleet.sh).

Builds a two-platform OCI image: an index naming a linux/amd64 manifest (a config and LAYERS
uncompressed tar layers of random bytes, about SIZE_MB in all, so containerd can unpack them)
and a small linux/arm64 one; pushes it to a registry over its HTTP API (monolithic uploads)
under REPO:TAG, and prints one JSON line: the index, manifest and blob digests and sizes.

usage: fleet_image.py --registry HOST:PORT --repo fleet/app --tag v1 --size-mb 64 --layers 4 --work DIR
"""

import argparse
import hashlib
import http.client
import io
import json
import os
import tarfile
import urllib.parse

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"


def random_tar(path, name, size):
    """A tar holding one file of `size` random bytes; returns (digest, size)."""

    class Random(io.RawIOBase):
        def __init__(self, n):
            self.left = n

        def readable(self):
            return True

        def readinto(self, b):
            n = min(len(b), self.left)
            b[:n] = os.urandom(n)
            self.left -= n
            return n

    with open(path, "wb") as f:
        with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as t:
            info = tarfile.TarInfo(name)
            info.size = size
            info.mode = 0o644
            t.addfile(info, io.BufferedReader(Random(size), 1 << 20))
    return file_digest(path)


def file_digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest(), os.path.getsize(path)


class Registry:
    def __init__(self, hostport, repo):
        self.hostport, self.repo = hostport, repo

    def conn(self):
        host, _, port = self.hostport.rpartition(":")
        return http.client.HTTPConnection(host, int(port), timeout=600)

    def blob(self, digest, body, size):
        c = self.conn()
        c.request("HEAD", f"/v2/{self.repo}/blobs/{digest}")
        r = c.getresponse()
        r.read()
        if r.status == 200:
            return
        c.request("POST", f"/v2/{self.repo}/blobs/uploads/", body=b"", headers={"Content-Length": "0"})
        r = c.getresponse()
        r.read()
        if r.status != 202:
            raise SystemExit(f"upload start: HTTP {r.status}")
        loc = urllib.parse.urlsplit(r.getheader("Location"))
        query = (loc.query + "&" if loc.query else "") + "digest=" + urllib.parse.quote(digest)
        c.request(
            "PUT",
            f"{loc.path}?{query}",
            body=body,
            headers={"Content-Length": str(size), "Content-Type": "application/octet-stream"},
        )
        r = c.getresponse()
        r.read()
        if r.status != 201:
            raise SystemExit(f"upload {digest}: HTTP {r.status}")

    def manifest(self, ref, media_type, body):
        c = self.conn()
        c.request("PUT", f"/v2/{self.repo}/manifests/{ref}", body=body, headers={"Content-Type": media_type})
        r = c.getresponse()
        r.read()
        if r.status != 201:
            raise SystemExit(f"manifest {ref}: HTTP {r.status}")


def push_manifest(reg, config, layers, arch):
    cfg = json.dumps(config, sort_keys=True).encode()
    cdigest = "sha256:" + hashlib.sha256(cfg).hexdigest()
    reg.blob(cdigest, cfg, len(cfg))
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": cdigest, "size": len(cfg)},
        "layers": [{"mediaType": OCI_LAYER, "digest": d, "size": s} for d, s in layers],
    }
    body = json.dumps(manifest, sort_keys=True).encode()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    reg.manifest(digest, OCI_MANIFEST, body)
    return {"digest": digest, "size": len(body), "config": [cdigest, len(cfg)], "arch": arch}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--registry", required=True)
    ap.add_argument("--repo", required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--size-mb", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    reg = Registry(a.registry, a.repo)
    total = a.size_mb << 20
    layers = []
    for i in range(a.layers):
        # Uneven layers, as images have: the first is the largest.
        share = total * (a.layers - i) * 2 // (a.layers * (a.layers + 1))
        path = os.path.join(a.work, f"layer{i}.tar")
        d, s = random_tar(path, f"layer{i}.bin", max(share - 2048, 1))
        with open(path, "rb") as f:
            reg.blob(d, f, s)
        layers.append((d, s))
        os.remove(path)
    diff_ids = [d for d, _ in layers]
    amd64 = push_manifest(
        reg,
        {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": diff_ids}, "config": {}},
        layers,
        "amd64",
    )
    small = os.urandom(1024)
    sd = "sha256:" + hashlib.sha256(small).hexdigest()
    arm_tar = os.path.join(a.work, "arm.tar")
    ad, asz = random_tar(arm_tar, "arm.bin", 1024)
    with open(arm_tar, "rb") as f:
        reg.blob(ad, f, asz)
    os.remove(arm_tar)
    arm64 = push_manifest(
        reg,
        {"architecture": "arm64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [ad]}, "config": {}, "x": sd},
        [(ad, asz)],
        "arm64",
    )
    index = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [
            {
                "mediaType": OCI_MANIFEST,
                "digest": m["digest"],
                "size": m["size"],
                "platform": {"architecture": m["arch"], "os": "linux"},
            }
            for m in (amd64, arm64)
        ],
    }
    body = json.dumps(index, sort_keys=True).encode()
    reg.manifest(a.tag, OCI_INDEX, body)
    image_bytes = amd64["config"][1] + sum(s for _, s in layers)
    print(
        json.dumps(
            {
                "index": "sha256:" + hashlib.sha256(body).hexdigest(),
                "manifest": amd64["digest"],
                "config": amd64["config"][0],
                "layers": [{"digest": d, "size": s} for d, s in layers],
                "image_bytes": image_bytes,
            }
        )
    )


if __name__ == "__main__":
    main()
