"""Synthetic, valid OCI images for the tests and benchmarks, pushed to a registry with skopeo.

Each layer is a reproducible tar.gz holding one file of pseudo-random (incompressible) bytes:
SHAKE-256 of the seed, the layer's name and a block number, so every machine builds the same
digests for the same settings. Images (sizes in MiB; an empty list or 0 skips the image):

  siderolabs/kubelet:v1.33.1    OCI index, linux/amd64 + linux/arm64/v8   KUBELET_LAYERS_MB ("30 5")
  siderolabs/installer:v1.10.5  OCI manifest, linux/amd64                 INSTALLER_LAYERS_MB ("80")
  bench/big:1g                  OCI manifest, linux/amd64, one layer      BIG_MB (1024)

The OCI layout is WORK/layout (its index.json names the images kubelet, installer, big); layers
are reused from an earlier run in the same WORK. WORK/images.env gets one KEY=VALUE per line:
KUBELET_REF KUBELET_INDEX KUBELET_AMD64 KUBELET_ARM64 INSTALLER_REF INSTALLER_MANIFEST BIG_REF
BIG_REPO BIG_DIGEST BIG_SIZE.
"""

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zlib

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
BLOCK = 1 << 20


class Layout:
    def __init__(self, root):
        self.root = root
        self.blobs = os.path.join(root, "blobs", "sha256")
        os.makedirs(self.blobs, exist_ok=True)
        with open(os.path.join(root, "oci-layout"), "w") as f:
            f.write('{"imageLayoutVersion":"1.0.0"}')

    def path(self, digest):
        return os.path.join(self.blobs, digest.split(":", 1)[1])

    def put_json(self, doc):
        data = json.dumps(doc, separators=(",", ":"), sort_keys=False).encode()
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        with open(self.path(digest), "wb") as f:
            f.write(data)
        return {"digest": digest, "size": len(data)}


class GzipSink:
    """File-like: hashes what tar writes (the diff_id), gzips it, hashes and stores the result."""

    def __init__(self, out, level):
        self.out = out
        self.tar_hash = hashlib.sha256()
        self.gz_hash = hashlib.sha256()
        self.size = 0
        # wbits 31: a gzip member with no name and mtime 0, the same bytes on every run
        self.z = zlib.compressobj(level, zlib.DEFLATED, 31)

    def _emit(self, data):
        if data:
            self.gz_hash.update(data)
            self.size += len(data)
            self.out.write(data)

    def write(self, data):
        self.tar_hash.update(data)
        self._emit(self.z.compress(data))
        return len(data)

    def close(self):
        self._emit(self.z.flush())


class Keystream:
    """A read()-able stream of N pseudo-random bytes derived from KEY."""

    def __init__(self, key, size):
        self.key, self.left, self.block, self.buf = key.encode(), size, 0, b""

    def read(self, n=-1):
        if n < 0:
            n = self.left
        n = min(n, self.left)
        while len(self.buf) < n:
            self.buf += hashlib.shake_256(self.key + b"/%d" % self.block).digest(BLOCK)
            self.block += 1
        out, self.buf = self.buf[:n], self.buf[n:]
        self.left -= n
        return out


def tar_entry(name, size=0, directory=False):
    ti = tarfile.TarInfo(name)
    ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "", ""
    if directory:
        ti.type, ti.mode = tarfile.DIRTYPE, 0o755
    else:
        ti.size, ti.mode = size, 0o644
    return ti


def layer(layout, work, seed, level, name, mib):
    """A layer with one file opt/bench/NAME.bin of MIB MiB; (descriptor, diff_id)."""
    key = "%s-%s-%d" % (seed, name, mib)
    memo = os.path.join(work, "layers", key)
    if os.path.exists(memo):
        with open(memo) as f:
            digest, size, diff = f.read().split()
        if os.path.exists(layout.path(digest)):
            return {"mediaType": LAYER, "digest": digest, "size": int(size)}, diff
    os.makedirs(os.path.dirname(memo), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=layout.blobs, prefix=".layer-")
    with os.fdopen(fd, "wb") as out:
        sink = GzipSink(out, level)
        with tarfile.open(fileobj=sink, mode="w|", format=tarfile.USTAR_FORMAT) as tar:
            tar.addfile(tar_entry("opt", directory=True))
            tar.addfile(tar_entry("opt/bench", directory=True))
            tar.addfile(tar_entry("opt/bench/%s.bin" % name, mib * BLOCK), Keystream(key, mib * BLOCK))
        sink.close()
    digest = "sha256:" + sink.gz_hash.hexdigest()
    diff = "sha256:" + sink.tar_hash.hexdigest()
    os.replace(tmp, layout.path(digest))
    with open(memo, "w") as f:
        f.write("%s %d %s\n" % (digest, sink.size, diff))
    return {"mediaType": LAYER, "digest": digest, "size": sink.size}, diff


def image(layout, work, seed, level, name, arch, sizes):
    """Config and manifest of a linux/ARCH image; the manifest's descriptor."""
    layers, diffs = [], []
    for i, mib in enumerate(sizes, 1):
        desc, diff = layer(layout, work, seed, level, "%s-%s-%d" % (name, arch, i), mib)
        layers.append(desc)
        diffs.append(diff)
    config = layout.put_json({
        "created": "1970-01-01T00:00:00Z", "architecture": arch, "os": "linux",
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                   "Labels": {"bench.image": name}},
        "rootfs": {"type": "layers", "diff_ids": diffs},
    })
    manifest = layout.put_json({"schemaVersion": 2, "mediaType": MANIFEST,
                                "config": dict(mediaType=CONFIG, **config), "layers": layers})
    return dict(mediaType=MANIFEST, **manifest)


def mib_list(var, default):
    text = os.environ.get(var, default)
    return [int(x) for x in text.split()]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: mkimages.sh REGISTRY   (127.0.0.1:PORT, plain HTTP)")
    registry = sys.argv[1]
    if not (registry.startswith("127.") or registry.startswith("localhost")):
        sys.exit("mkimages: not a loopback registry: %s" % registry)
    seed = os.environ.get("SEED", "ocibench")
    level = int(os.environ.get("GZIP_LEVEL", "1"))
    work = os.environ.get("WORK") or tempfile.mkdtemp(prefix="mkimages.")
    layout = Layout(os.path.join(work, "layout"))
    refs, env = [], []  # (layout name, repo:tag, descriptor)

    kubelet = mib_list("KUBELET_LAYERS_MB", "30 5")
    if kubelet:
        amd = image(layout, work, seed, level, "kubelet", "amd64", kubelet)
        arm = image(layout, work, seed, level, "kubelet", "arm64", kubelet)
        index = layout.put_json({"schemaVersion": 2, "mediaType": INDEX, "manifests": [
            dict(amd, platform={"architecture": "amd64", "os": "linux"}),
            dict(arm, platform={"architecture": "arm64", "os": "linux", "variant": "v8"}),
        ]})
        refs.append(("kubelet", "siderolabs/kubelet:v1.33.1", dict(mediaType=INDEX, **index)))
        env += [("KUBELET_REF", "siderolabs/kubelet:v1.33.1"), ("KUBELET_INDEX", index["digest"]),
                ("KUBELET_AMD64", amd["digest"]), ("KUBELET_ARM64", arm["digest"])]
    installer = mib_list("INSTALLER_LAYERS_MB", "80")
    if installer:
        m = image(layout, work, seed, level, "installer", "amd64", installer)
        refs.append(("installer", "siderolabs/installer:v1.10.5", m))
        env += [("INSTALLER_REF", "siderolabs/installer:v1.10.5"), ("INSTALLER_MANIFEST", m["digest"])]
    big = int(os.environ.get("BIG_MB", "1024") or 0)
    if big > 0:
        m = image(layout, work, seed, level, "big", "amd64", [big])
        refs.append(("big", "bench/big:1g", m))
        with open(layout.path(m["digest"])) as f:
            blob = json.load(f)["layers"][0]
        env += [("BIG_REF", "bench/big:1g"), ("BIG_REPO", "bench/big"),
                ("BIG_DIGEST", blob["digest"]), ("BIG_SIZE", str(blob["size"]))]

    with open(os.path.join(layout.root, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [
            dict(desc, annotations={"org.opencontainers.image.ref.name": name}) for name, _, desc in refs]}, f)

    for name, ref, desc in refs:
        # --preserve-digests: skopeo fails rather than rewrite a manifest
        subprocess.run(["skopeo", "copy", "-q", "--all", "--preserve-digests", "--dest-tls-verify=false",
                        "oci:%s:%s" % (layout.root, name), "docker://%s/%s" % (registry, ref)],
                       check=True, stdin=subprocess.DEVNULL)
        repo = ref.split(":", 1)[0]
        req = urllib.request.Request("http://%s/v2/%s/manifests/%s" % (registry, repo, desc["digest"]),
                                     method="HEAD", headers={"Accept": desc["mediaType"]})
        with urllib.request.urlopen(req, timeout=10) as r:
            got = r.headers.get("Docker-Content-Digest")
        if got != desc["digest"]:
            sys.exit("mkimages: %s/%s announces %s, not %s" % (registry, ref, got, desc["digest"]))
        print("pushed %s/%s %s" % (registry, ref, desc["digest"]), file=sys.stderr)

    with open(os.path.join(work, "images.env"), "w") as f:
        for k, v in env:
            f.write("%s=%s\n" % (k, v))
    for k, v in env:
        print("%s=%s" % (k, v))


if __name__ == "__main__":
    main()
