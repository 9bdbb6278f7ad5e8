#!/usr/bin/env python3
"""small_setup.py - data for bench/small.sh (issue 23).

  small_setup.py gen OUT UPSTREAM_URL N MIN_BYTES MAX_BYTES BIG_MB
      N random blobs (MIN..MAX bytes, fixed seed) pushed to UPSTREAM_URL as bench/small, an OCI
      image manifest (config + one of the blobs as its layer) pushed as bench/small:v1, and one
      BIG_MB blob (0: none) as bench/big. The same bytes are laid out as files under OUT/www at
      the URLs a registry answers, for nginx: /v2/bench/small/blobs/sha256:HEX,
      /v2/bench/small/manifests/v1 and /v2/bench/small/manifests/sha256:HEX,
      /v2/bench/big/blobs/sha256:HEX. Writes OUT/blobs.txt (one path a line) and OUT/small.env.
      With BENCH_SIGN=1 the manifest is signed as `cosign sign --key` signs it (the public key in
      OUT/cosign.pub; needs python3-cryptography).
  small_setup.py warm BASE PATHS_FILE [--insecure] [--auth HEADER] [--head]
      GET (or HEAD) every path once through BASE, 8 at a time; exit 1 unless every answer is 200
      with the file's length (checked against OUT/www when it exists next to PATHS_FILE).
"""
import hashlib
import http.client
import json
import os
import random
import ssl
import sys
import threading
import urllib.parse

REPO, BIG_REPO, TAG = "bench/small", "bench/big", "v1"
MT = "application/vnd.oci.image.manifest.v1+json"


def conn(base, insecure=False):
    u = urllib.parse.urlsplit(base)
    if u.scheme == "https":
        ctx = ssl.create_default_context()
        if insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return http.client.HTTPSConnection(u.hostname, u.port, context=ctx, timeout=120)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=120)


def push_blob(c, repo, data=None, path=None, size=None, digest=None):
    c.request("POST", f"/v2/{repo}/blobs/uploads/", headers={"Content-Length": "0"})
    r = c.getresponse()
    r.read()
    if r.status != 202:
        sys.exit(f"upload start {repo}: {r.status}")
    loc = r.getheader("Location")
    u = urllib.parse.urlsplit(loc)
    target = u.path + "?" + (u.query + "&" if u.query else "") + "digest=" + digest
    hdr = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
    if path:
        with open(path, "rb") as f:
            c.request("PUT", target, body=f, headers=hdr)
    else:
        c.request("PUT", target, body=data, headers=hdr)
    r = c.getresponse()
    r.read()
    if r.status != 201:
        sys.exit(f"upload {repo} {digest}: {r.status}")


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def gen(out, up, n, lo, hi, big_mb):
    rnd = random.Random(23)
    www = os.path.join(out, "www")
    c = conn(up)
    paths, sizes = [], []
    for _ in range(n):
        data = rnd.randbytes(rnd.randint(lo, hi))
        d = "sha256:" + hashlib.sha256(data).hexdigest()
        push_blob(c, REPO, data=data, size=len(data), digest=d)
        p = f"/v2/{REPO}/blobs/{d}"
        write(www + p, data)
        paths.append(p)
        sizes.append(len(data))
    cfg = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    cd = "sha256:" + hashlib.sha256(cfg).hexdigest()
    push_blob(c, REPO, data=cfg, size=len(cfg), digest=cd)
    write(www + f"/v2/{REPO}/blobs/{cd}", cfg)
    layer = paths[0].rsplit("/", 1)[1]
    man = json.dumps({
        "schemaVersion": 2, "mediaType": MT,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": len(cfg)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer, "size": sizes[0]}],
    }, indent=3).encode()
    md = "sha256:" + hashlib.sha256(man).hexdigest()
    c.request("PUT", f"/v2/{REPO}/manifests/{TAG}", body=man, headers={"Content-Type": MT})
    r = c.getresponse()
    r.read()
    if r.status != 201:
        sys.exit(f"manifest push: {r.status}")
    write(www + f"/v2/{REPO}/manifests/{TAG}", man)
    write(www + f"/v2/{REPO}/manifests/{md}", man)
    if os.environ.get("BENCH_SIGN") == "1":
        sign(c, md, out)
    env = {"N_BLOBS": n, "BLOB_BYTES": sum(sizes), "MANIFEST_DIGEST": md, "MANIFEST_SIZE": len(man),
           "TAG_PATH": f"/v2/{REPO}/manifests/{TAG}", "DIGEST_PATH": f"/v2/{REPO}/manifests/{md}",
           "BIG_SIZE": 0, "BIG_PATH": ""}
    if big_mb > 0:
        size = big_mb * 1048576
        tmp = os.path.join(out, "big.tmp")
        h = hashlib.sha256()
        # incompressible, fast: sha256 counter stream is too slow; os.urandom per MiB is fine
        with open(tmp, "wb") as f:
            for _ in range(big_mb):
                b = os.urandom(1048576)
                h.update(b)
                f.write(b)
        bd = "sha256:" + h.hexdigest()
        push_blob(c, BIG_REPO, path=tmp, size=size, digest=bd)
        p = f"/v2/{BIG_REPO}/blobs/{bd}"
        os.makedirs(os.path.dirname(www + p), exist_ok=True)
        os.replace(tmp, www + p)
        env.update(BIG_SIZE=size, BIG_PATH=p)
    with open(os.path.join(out, "blobs.txt"), "w") as f:
        f.write("".join(p + "\n" for p in paths))
    with open(os.path.join(out, "small.env"), "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in env.items()))
    print(" ".join(f"{k}={v}" for k, v in env.items()))


def sign(c, md, out):
    """cosign's tag-scheme signature of the manifest `md` (a fresh P-256 key), as `cosign sign
    --key` pushes it: the simple-signing payload blob, an empty config, and the manifest
    `sha256-<hex>.sig`; the public key goes to OUT/cosign.pub (for imageVerification)."""
    import base64
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    key = ec.generate_private_key(ec.SECP256R1())
    payload = json.dumps({"critical": {"identity": {"docker-reference": f"up/{REPO}"},
                                       "image": {"docker-manifest-digest": md},
                                       "type": "cosign container image signature"}, "optional": None},
                         separators=(",", ":")).encode()
    sig = base64.b64encode(key.sign(payload, ec.ECDSA(hashes.SHA256()))).decode()
    pd = "sha256:" + hashlib.sha256(payload).hexdigest()
    push_blob(c, REPO, data=payload, size=len(payload), digest=pd)
    empty = b"{}"
    ed = "sha256:" + hashlib.sha256(empty).hexdigest()
    push_blob(c, REPO, data=empty, size=len(empty), digest=ed)
    sig_manifest = json.dumps({
        "schemaVersion": 2, "mediaType": MT,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": ed, "size": len(empty)},
        "layers": [{"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json", "digest": pd,
                    "size": len(payload), "annotations": {"dev.cosignproject.cosign/signature": sig}}],
    }).encode()
    tag = md.replace(":", "-") + ".sig"
    c.request("PUT", f"/v2/{REPO}/manifests/{tag}", body=sig_manifest, headers={"Content-Type": MT})
    r = c.getresponse()
    r.read()
    if r.status != 201:
        sys.exit(f"signature push: {r.status}")
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    write(os.path.join(out, "cosign.pub"), pub)


def warm(base, paths_file, insecure, auth, head):
    paths = [p.strip() for p in open(paths_file) if p.strip()]
    www = os.path.join(os.path.dirname(os.path.abspath(paths_file)), "www")
    bad = []
    lock = threading.Lock()
    idx = iter(range(len(paths)))

    def worker():
        c = conn(base, insecure)
        while True:
            with lock:
                i = next(idx, None)
            if i is None:
                return
            p = paths[i]
            hdr = {"Authorization": auth} if auth else {}
            hdr["Accept"] = MT
            c.request("HEAD" if head else "GET", p, headers=hdr)
            r = c.getresponse()
            body = r.read()
            want = os.path.getsize(www + p) if os.path.exists(www + p) else None
            got = int(r.getheader("Content-Length") or -1) if head else len(body)
            if r.status != 200 or (want is not None and got != want):
                with lock:
                    bad.append(f"{p} {r.status} {got}/{want}")

    ts = [threading.Thread(target=worker) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(f"warm {base} paths={len(paths)} bad={len(bad)}")
    for b in bad[:5]:
        print("  " + b, file=sys.stderr)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[:1] == ["gen"] and len(a) == 7:
        gen(a[1], a[2], int(a[3]), int(a[4]), int(a[5]), int(a[6]))
    elif a[:1] == ["warm"] and len(a) >= 3:
        auth = a[a.index("--auth") + 1] if "--auth" in a else None
        warm(a[1], a[2], "--insecure" in a, auth, "--head" in a)
    else:
        sys.exit(__doc__)
