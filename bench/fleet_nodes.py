#!/usr/bin/env python3
"""fleet_nodes.py - many Kubernetes nodes pulling one image at the same moment, containerd style.

Every simulated node replays the requests containerd (`ctr content fetch`, the CRI image pull)
sends to a registry mirror, in containerd's order:

  1. HEAD /v2/<repo>/manifests/<tag>        Accept: OCI index, Docker list, OCI and Docker manifest;
                                             the digest comes from Docker-Content-Digest (without
                                             it containerd GETs the tag and hashes the body)
  2. GET  /v2/<repo>/manifests/<digest>      the index (or manifest list) ...
     GET  /v2/<repo>/manifests/<digest>      ... and the manifest of --platform picked from it
  3. GET  /v2/<repo>/blobs/<config digest>
  4. GET  /v2/<repo>/blobs/<layer digest>    --parallel (3, containerd's default) layers at a time

With --ns every /v2/ request carries `?ns=NAME`, as containerd's requests to a mirror do. Requests
are HTTP/1.1 with keep-alive over a small per-node pool (at most --parallel connections), each
socket bound to the node's own source address, so the server sees one client per node. Nothing is
followed: a redirect, like any status other than 200, fails the node. A connection error, a 429
or a 5xx is retried up to 3 times after 0.5 s, 1 s and 2 s (every failed answer is counted); an
idle pooled connection the server closed is replaced once without counting, as Go's HTTP client
does. A read that gets no byte for --read-timeout (60 s) fails the node, as does --timeout
(600 s) for the whole pull. Bodies are read in pieces of at most 1 MiB and dropped after hashing
or counting, so memory stays small with hundreds of nodes and multi-GiB images. The first
--verify nodes hash every manifest and blob and compare it with its digest; every node checks
Content-Length and the received length against the descriptor's size.

bench/fleet.sh runs one copy per rack inside the rack's node namespace, where the addresses of
--source-range are assigned, all racks with the same --start-at instant:

  python3 bench/fleet_nodes.py --registry 10.39.0.1:5000 --ns ghcr.io --repo fleet/app --tag v1 \\
      --source-range 10.39.0.10:16 --start-at 1712345678.000 --verify 1 --out nodes-0.json

--out gets one JSON document (without --out it goes to stdout); times are wall-clock epoch
seconds, so the files of several racks compare directly:

  {"registry": "10.39.0.1:5000", "ns": "ghcr.io", "repo": "fleet/app", "tag": "v1",
   "platform": "linux/amd64", "start_at": 1712345678.0,
   "nodes": [{"source": "10.39.0.10", "start": t, "first_layer_byte": t, "end": t,
              "seconds": end - start, "bytes": n, "requests": n, "manifest_requests": n,
              "statuses": {"429": 1}, "retries": n, "verified": true, "ok": true,
              "error": null}, ...],
   "image_bytes": n, "manifest_requests": n, "ok": n, "failed": n}

"end" and "seconds" are null for a node that failed; "first_layer_byte" is the first body byte of
any layer; "bytes" counts every body byte received (manifests, blobs, error answers, the part of
an interrupted transfer); "statuses" holds the answers other than 200; "image_bytes" is the size
of the config plus the distinct layers (null when no node got the manifest). One summary line
goes to stderr. Exit status: 0 when every node holds every blob, 1 when any node failed, 2 on a
setup problem (a source address not assigned here, bad arguments).

Standard library only (Python 3.11+).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import hashlib
import ipaddress
import json
import os
import re
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import quote

CHUNK = 1 << 20  # largest body piece read at once
STREAM_LIMIT = 128 << 10  # asyncio read buffer high-water mark per connection
MAX_HEADER_LINE = 16 << 10
MAX_HEADER_BYTES = 64 << 10
MAX_HEADERS = 100
MAX_CHUNK_LINE = 4 << 10
MAX_MANIFEST = 4 << 20  # containerd's limit for a manifest or index
MAX_ERROR_BODY = 64 << 10  # a non-200 body up to this size is drained to keep the connection
RETRY_DELAYS = (0.5, 1.0, 2.0)
USER_AGENT = "containerd/v1.7 (tender bench/fleet_nodes.py)"

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
ACCEPT_MANIFESTS = ", ".join(INDEX_TYPES + MANIFEST_TYPES)

DIGEST_RE = re.compile(r"^(sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128})$")
HEX_RE = re.compile(rb"^[0-9A-Fa-f]{1,16}$")


# ---------------------------------------------------------------------------------------------
# errors


class NodeError(Exception):
    """Fails the node (no retry)."""


class Stalled(NodeError):
    """No byte arrived for the read timeout."""


class ProtocolError(NodeError):
    """The server's answer is not well-formed HTTP/1.1."""


class SourceAddressError(NodeError):
    """The node's source address cannot be bound here."""


class ConnectionLost(Exception):
    """A connection error: retried. `early` when no byte of the answer had arrived."""

    def __init__(self, message: str, early: bool = False) -> None:
        super().__init__(message)
        self.early = early


def unassigned_message(source: str) -> str:
    return f"source address {source} is not assigned here"


# ---------------------------------------------------------------------------------------------
# HTTP/1.1 client pieces


@dataclass
class Response:
    version: str
    status: int
    reason: str
    headers: dict[str, str]

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass
class Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    used: int = 0  # requests written on it

    def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()

    def alive(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()


class Reader:
    """Reads from one connection, every read bounded by the read timeout."""

    def __init__(self, stream: asyncio.StreamReader, timeout: float) -> None:
        self.stream = stream
        self.timeout = timeout

    async def _io(self, coro, early: bool = False):
        deadline = asyncio.timeout(self.timeout)
        try:
            async with deadline:
                return await coro
        except TimeoutError as e:
            if deadline.expired():
                raise Stalled(f"stalled: no data for {self.timeout:g} s") from None
            raise ConnectionLost(f"connection error: {e}", early) from None
        except asyncio.IncompleteReadError as e:
            early = early and not e.partial
            what = "before the answer" if early else "in the middle of the answer"
            raise ConnectionLost(f"connection closed {what}", early) from None
        except asyncio.LimitOverrunError:
            raise ProtocolError("response line longer than the read buffer") from None
        except OSError as e:
            raise ConnectionLost(f"connection error: {e}", early) from None

    async def line(self, limit: int, early: bool = False) -> bytes:
        raw = await self._io(self.stream.readuntil(b"\n"), early)
        if len(raw) > limit:
            raise ProtocolError(f"response line longer than {limit} bytes")
        return raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]

    async def some(self, n: int) -> bytes:
        return await self._io(self.stream.read(n))


async def read_head(reader: Reader) -> Response:
    """Status line and headers; interim 1xx answers are skipped."""
    first = True
    while True:
        line = await reader.line(MAX_HEADER_LINE, early=first)
        first = False
        parts = line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"bad status line {line[:80]!r}")
        version, status = parts[0].decode("ascii", "replace"), int(parts[1])
        reason = parts[2].decode("latin-1") if len(parts) == 3 else ""
        headers = await read_headers(reader, len(line))
        if 100 <= status < 200 and status != 101:
            continue
        return Response(version, status, reason, headers)


async def read_headers(reader: Reader, used: int = 0) -> dict[str, str]:
    headers: dict[str, str] = {}
    count = 0
    while True:
        line = await reader.line(MAX_HEADER_LINE)
        if not line:
            return headers
        used += len(line) + 2
        count += 1
        if used > MAX_HEADER_BYTES or count > MAX_HEADERS:
            raise ProtocolError("response headers too large")
        if line[:1] in (b" ", b"\t"):
            raise ProtocolError("obsolete header line folding")
        name, sep, value = line.partition(b":")
        if not sep or not name or name.strip() != name:
            raise ProtocolError(f"bad header line {line[:80]!r}")
        key = name.decode("latin-1").lower()
        text = value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text


def body_framing(resp: Response, method: str) -> tuple[str, int | None]:
    """("none" | "length" | "chunked" | "close", length) per RFC 9112 section 6.3."""
    if method == "HEAD" or resp.status in (204, 304) or 100 <= resp.status < 200:
        return "none", 0
    te = resp.header("transfer-encoding")
    if te is not None:
        codings = [c.strip().lower() for c in te.split(",") if c.strip()]
        return ("chunked", None) if codings and codings[-1] == "chunked" else ("close", None)
    cl = resp.header("content-length")
    if cl is not None:
        values = {v.strip() for v in cl.split(",")}
        if len(values) != 1 or not next(iter(values)).isdigit():
            raise ProtocolError(f"bad Content-Length {cl!r}")
        return "length", int(values.pop())
    return "close", None


def keeps_alive(resp: Response, framing: str) -> bool:
    tokens = {t.strip().lower() for t in (resp.header("connection") or "").split(",")}
    if framing == "close" or "close" in tokens:
        return False
    return resp.version != "HTTP/1.0" or "keep-alive" in tokens


async def read_exact(reader: Reader, n: int, sink: Callable[[bytes], None]) -> None:
    while n:
        piece = await reader.some(min(CHUNK, n))
        if not piece:
            raise ConnectionLost(f"connection closed with {n} body bytes missing")
        n -= len(piece)
        sink(piece)


async def read_body(reader: Reader, framing: str, length: int | None, sink: Callable[[bytes], None]) -> None:
    if framing == "length":
        await read_exact(reader, length or 0, sink)
    elif framing == "chunked":
        await read_chunked(reader, sink)
    elif framing == "close":
        while piece := await reader.some(CHUNK):
            sink(piece)


async def read_chunked(reader: Reader, sink: Callable[[bytes], None]) -> None:
    while True:
        size_text = (await reader.line(MAX_CHUNK_LINE)).split(b";", 1)[0].strip()
        if not HEX_RE.match(size_text):
            raise ProtocolError(f"bad chunk size {size_text[:20]!r}")
        size = int(size_text, 16)
        if size == 0:
            break
        await read_exact(reader, size, sink)
        if await reader.line(MAX_CHUNK_LINE):
            raise ProtocolError("chunk data not followed by CRLF")
    await read_headers(reader)  # trailers, dropped


# ---------------------------------------------------------------------------------------------
# per-node connection pool


class Pool:
    """Up to `size` keep-alive connections from one source address to the registry."""

    def __init__(self, host: str, port: int, source: str, size: int, timeout: float) -> None:
        self.host, self.port, self.source, self.timeout = host, port, source, timeout
        self.idle: list[Conn] = []
        self.slots = asyncio.Semaphore(size)
        self.all: list[Conn] = []

    async def acquire(self) -> Conn:
        await self.slots.acquire()
        try:
            while self.idle:
                conn = self.idle.pop()
                if conn.alive():
                    return conn
                conn.close()
            return await self.connect()
        except BaseException:
            self.slots.release()
            raise

    def release(self, conn: Conn, reusable: bool) -> None:
        if reusable and conn.alive():
            self.idle.append(conn)
        else:
            conn.close()
        self.slots.release()

    async def connect(self) -> Conn:
        deadline = asyncio.timeout(self.timeout)
        try:
            async with deadline:
                r, w = await asyncio.open_connection(
                    self.host, self.port, local_addr=(self.source, 0), limit=STREAM_LIMIT)
        except TimeoutError as e:
            if deadline.expired():
                raise Stalled(f"connect to {self.host}:{self.port} timed out") from None
            raise ConnectionLost(f"connect to {self.host}:{self.port}: {e}") from None
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:
                raise SourceAddressError(unassigned_message(self.source)) from None
            raise ConnectionLost(f"connect to {self.host}:{self.port}: {e}") from None
        sock = w.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Conn(r, w)
        self.all.append(conn)
        return conn

    async def close(self) -> None:
        for conn in self.all:
            conn.close()
        for conn in self.all:
            try:
                async with asyncio.timeout(1):
                    await conn.writer.wait_closed()
            except (OSError, TimeoutError):
                pass


# ---------------------------------------------------------------------------------------------
# OCI pieces


@dataclass
class Descriptor:
    media_type: str
    digest: str
    size: int | None


def descriptor(obj: object, what: str) -> Descriptor:
    if not isinstance(obj, dict):
        raise NodeError(f"{what}: not a descriptor")
    digest, size = obj.get("digest"), obj.get("size")
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise NodeError(f"{what}: bad digest {digest!r}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise NodeError(f"{what}: bad size {size!r}")
    return Descriptor(str(obj.get("mediaType", "")), digest, size)


def parse_json(body: bytes, what: str) -> dict:
    try:
        doc = json.loads(body)
    except ValueError as e:
        raise NodeError(f"{what}: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise NodeError(f"{what}: not a JSON object")
    return doc


def manifest_kind(resp: Response, doc: dict) -> str:
    """"index" or "manifest": the Content-Type, else the document's mediaType, else its shape."""
    for mt in ((resp.header("content-type") or "").split(";")[0].strip(), doc.get("mediaType")):
        if mt in INDEX_TYPES:
            return "index"
        if mt in MANIFEST_TYPES:
            return "manifest"
    if "manifests" in doc:
        return "index"
    if "layers" in doc and "config" in doc:
        return "manifest"
    raise NodeError(f"unknown manifest type {resp.header('content-type')!r}")


def pick_platform(index: dict, platform: str) -> Descriptor:
    want = platform.split("/")
    entries = index.get("manifests")
    if not isinstance(entries, list):
        raise NodeError("index without a manifests list")
    for i, entry in enumerate(entries):
        p = entry.get("platform") if isinstance(entry, dict) else None
        if not isinstance(p, dict):
            continue
        if p.get("os") != want[0] or p.get("architecture") != want[1]:
            continue
        if len(want) > 2 and p.get("variant") not in (None, want[2]):
            continue
        return descriptor(entry, f"index entry {i}")
    raise NodeError(f"no manifest for {platform} in the index")


def image_blobs(manifest: dict) -> tuple[Descriptor, list[Descriptor]]:
    config = descriptor(manifest.get("config"), "config")
    layers_raw = manifest.get("layers")
    if not isinstance(layers_raw, list):
        raise NodeError("manifest without a layers list")
    layers: list[Descriptor] = []
    seen = {config.digest}
    for i, raw in enumerate(layers_raw):
        d = descriptor(raw, f"layer {i}")
        if d.digest not in seen:  # containerd fetches a blob once
            seen.add(d.digest)
            layers.append(d)
    return config, layers


class Body:
    """Consumes one response body: counts it, optionally hashes it, optionally keeps it."""

    def __init__(self, node: "Node", what: str, expect: Descriptor | None, verify: bool,
                 keep: bool = False, on_first: Callable[[], None] | None = None,
                 size: int | None = None) -> None:
        self.node, self.what, self.expect, self.verify = node, what, expect, verify
        self.keep, self.on_first = keep, on_first
        self.size = size if size is not None else (expect.size if expect else None)
        self.received = 0
        self.hasher = None
        self.data = bytearray()

    def begin(self, length: int | None) -> None:
        """A 200 answer's head arrived: check its length, reset for this attempt."""
        if self.size is not None and length is not None and length != self.size:
            raise NodeError(f"{self.what}: Content-Length {length} but the size is {self.size}")
        if self.keep and length is not None and length > MAX_MANIFEST:
            raise NodeError(f"{self.what}: {length} bytes is larger than a manifest may be")
        self.received = 0
        self.data = bytearray()
        self.hasher = None
        if self.verify and self.expect:
            self.hasher = hashlib.new(self.expect.digest.split(":", 1)[0])

    def __call__(self, piece: bytes) -> None:
        if not self.received and self.on_first:
            self.on_first()
        self.received += len(piece)
        if self.hasher:
            self.hasher.update(piece)
        if self.keep:
            if self.received > MAX_MANIFEST:
                raise NodeError(f"{self.what}: larger than {MAX_MANIFEST} bytes")
            self.data += piece

    def finish(self) -> None:
        if self.size is not None and self.received != self.size:
            raise NodeError(f"{self.what}: got {self.received} bytes, expected {self.size}")
        if self.hasher and self.expect:
            got = f"{self.expect.digest.split(':', 1)[0]}:{self.hasher.hexdigest()}"
            if got != self.expect.digest:
                raise NodeError(f"{self.what}: digest mismatch, got {got}")


# ---------------------------------------------------------------------------------------------
# one node


@dataclass
class Options:
    host: str
    port: int
    ns: str | None
    repo: str
    tag: str
    platform: str
    parallel: int
    timeout: float
    read_timeout: float


@dataclass
class Node:
    source: str
    verify: bool
    opts: Options
    start: float | None = None
    first_layer_byte: float | None = None
    end: float | None = None
    bytes: int = 0
    requests: int = 0
    manifest_requests: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    retries: int = 0
    error: str | None = None
    image_bytes: int | None = None
    pool: Pool | None = None

    # -- the pull --------------------------------------------------------------------------

    async def run(self) -> None:
        self.start = time.time()
        o = self.opts
        self.pool = Pool(o.host, o.port, self.source, o.parallel, o.read_timeout)
        try:
            async with asyncio.timeout(o.timeout):
                await self.pull()
            self.end = time.time()
        except TimeoutError:
            self.error = f"timed out after {o.timeout:g} s"
        except (NodeError, ConnectionLost) as e:
            self.error = str(e)
        except Exception as e:  # a bug here must not hide the other nodes' results
            self.error = f"internal error: {type(e).__name__}: {e}"
        finally:
            await self.pool.close()

    async def pull(self) -> None:
        digest, size = await self.resolve()
        manifest = await self.fetch_manifest(digest, size)
        config, layers = image_blobs(manifest)
        self.image_bytes = (config.size or 0) + sum(d.size or 0 for d in layers)
        await self.fetch_blob(config, "config")
        limit = asyncio.Semaphore(self.opts.parallel)

        async def one(d: Descriptor) -> None:
            async with limit:
                await self.fetch_blob(d, "layer")

        try:
            async with asyncio.TaskGroup() as tg:
                for d in layers:
                    tg.create_task(one(d))
        except ExceptionGroup as eg:
            raise eg.exceptions[0] from None

    async def resolve(self) -> tuple[Descriptor, int | None]:
        """HEAD the tag: the digest and size of what it names (GET the tag when no digest)."""
        path = self.path("manifests", self.opts.tag)
        resp = await self.request("HEAD", path, ACCEPT_MANIFESTS, None)
        digest = resp.header("docker-content-digest")
        length = resp.header("content-length")
        size = int(length) if length and length.isdigit() else None
        if digest and DIGEST_RE.match(digest):
            return Descriptor(resp.header("content-type") or "", digest, size), size
        body = Body(self, f"manifest {self.opts.tag}", None, False, keep=True)
        resp = await self.request("GET", path, ACCEPT_MANIFESTS, body)
        digest = "sha256:" + hashlib.sha256(body.data).hexdigest()
        return Descriptor(resp.header("content-type") or "", digest, len(body.data)), len(body.data)

    async def fetch_manifest(self, desc: Descriptor, size: int | None) -> dict:
        """GET the tag's digest; for an index, GET the --platform manifest it lists."""
        for _ in range(3):  # an index of indexes is allowed once
            body = Body(self, f"manifest {desc.digest}", desc, self.verify, keep=True, size=size)
            resp = await self.request("GET", self.path("manifests", desc.digest), ACCEPT_MANIFESTS, body)
            doc = parse_json(bytes(body.data), f"manifest {desc.digest}")
            if manifest_kind(resp, doc) == "manifest":
                return doc
            desc = pick_platform(doc, self.opts.platform)
            size = desc.size
        raise NodeError("indexes nested too deep")

    async def fetch_blob(self, desc: Descriptor, kind: str) -> None:
        on_first = self.mark_first_layer_byte if kind == "layer" else None
        body = Body(self, f"{kind} {desc.digest}", desc, self.verify, on_first=on_first)
        accept = f"{desc.media_type}, */*" if desc.media_type else "*/*"
        await self.request("GET", self.path("blobs", desc.digest), accept, body)

    def mark_first_layer_byte(self) -> None:
        if self.first_layer_byte is None:
            self.first_layer_byte = time.time()

    def path(self, kind: str, ref: str) -> str:
        p = f"/v2/{quote(self.opts.repo, safe='/')}/{kind}/{quote(ref, safe=':')}"
        return f"{p}?ns={quote(self.opts.ns, safe='')}" if self.opts.ns else p

    # -- one request with containerd's retries ----------------------------------------------

    async def request(self, method: str, path: str, accept: str, body: Body | None) -> Response:
        attempt = 0
        while True:
            try:
                resp = await self.exchange(method, path, accept, body)
            except ConnectionLost as e:
                failure = str(e)
            else:
                if resp.status == 200:
                    return resp
                key = str(resp.status)
                self.statuses[key] = self.statuses.get(key, 0) + 1
                if resp.status != 429 and resp.status < 500:
                    note = " (redirects are not followed)" if 300 <= resp.status < 400 else ""
                    raise NodeError(f"{method} {path}: HTTP {resp.status}{note}")
                failure = f"HTTP {resp.status}"
            if attempt == len(RETRY_DELAYS):
                raise NodeError(f"{method} {path}: {failure} (after {attempt} retries)")
            await asyncio.sleep(RETRY_DELAYS[attempt])
            attempt += 1
            self.retries += 1

    async def exchange(self, method: str, path: str, accept: str, body: Body | None) -> Response:
        """One request and its whole answer on a pooled connection."""
        assert self.pool is not None
        conn = await self.pool.acquire()
        reusable = False
        try:
            resp, conn = await self.send(conn, method, path, accept)
            reader = Reader(conn.reader, self.opts.read_timeout)
            framing, length = body_framing(resp, method)
            if resp.status != 200:
                if framing == "none" or (framing == "length" and (length or 0) <= MAX_ERROR_BODY):
                    await read_body(reader, framing, length, self.count)
                    reusable = keeps_alive(resp, framing)
                return resp
            if body is not None:
                body.begin(length)
            sink = self.counting(body) if body is not None else self.count
            await read_body(reader, framing, length, sink)
            if body is not None:
                body.finish()
            reusable = keeps_alive(resp, framing)
            return resp
        finally:
            self.pool.release(conn, reusable)

    async def send(self, conn: Conn, method: str, path: str, accept: str) -> tuple[Response, Conn]:
        """Write the request, read the answer's head. A pooled connection the server had closed
        before answering is replaced by a fresh one, once (Go's transport does the same)."""
        for fresh in (False, True):
            reused = conn.used > 0
            try:
                await self.write(conn, method, path, accept, count=not fresh)
                return await read_head(Reader(conn.reader, self.opts.read_timeout)), conn
            except ConnectionLost as e:
                if fresh or not (reused and e.early):
                    conn.close()
                    raise
                conn.close()
                conn = await self.pool.connect()  # type: ignore[union-attr]
        raise AssertionError("unreachable")

    async def write(self, conn: Conn, method: str, path: str, accept: str, count: bool = True) -> None:
        host = self.opts.host
        host = f"[{host}]" if ":" in host else host
        head = (f"{method} {path} HTTP/1.1\r\nHost: {host}:{self.opts.port}\r\n"
                f"User-Agent: {USER_AGENT}\r\nAccept: {accept}\r\n\r\n")
        if count:  # the transparent resend on a fresh connection is the same request
            self.requests += 1
            if "/manifests/" in path:
                self.manifest_requests += 1
        conn.used += 1
        try:
            conn.writer.write(head.encode("latin-1"))
            async with asyncio.timeout(self.opts.read_timeout):
                await conn.writer.drain()
        except TimeoutError:
            raise Stalled(f"stalled: request not sent in {self.opts.read_timeout:g} s") from None
        except OSError as e:
            raise ConnectionLost(f"connection error: {e}", early=True) from None

    def count(self, piece: bytes) -> None:
        self.bytes += len(piece)

    def counting(self, body: Body) -> Callable[[bytes], None]:
        def sink(piece: bytes) -> None:
            self.bytes += len(piece)
            body(piece)
        return sink

    # -- results ---------------------------------------------------------------------------

    def result(self) -> dict:
        ok = self.error is None and self.end is not None
        return {
            "source": self.source,
            "start": rounded(self.start),
            "first_layer_byte": rounded(self.first_layer_byte),
            "end": rounded(self.end) if ok else None,
            "seconds": rounded(self.end - self.start) if ok and self.start else None,
            "bytes": self.bytes,
            "requests": self.requests,
            "manifest_requests": self.manifest_requests,
            "statuses": dict(sorted(self.statuses.items())),
            "retries": self.retries,
            "verified": self.verify,
            "ok": ok,
            "error": self.error,
        }


def rounded(t: float | None) -> float | None:
    return None if t is None else round(t, 6)


# ---------------------------------------------------------------------------------------------
# command line, setup, the fleet


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Simulated Kubernetes nodes pulling one image at once, replaying containerd's "
                    "requests against a registry mirror (see the module docstring).")
    p.add_argument("--registry", required=True, metavar="HOST:PORT", help="the mirror, plain HTTP/1.1")
    p.add_argument("--ns", metavar="NAME", help="add ?ns=NAME to every /v2/ request (e.g. ghcr.io)")
    p.add_argument("--repo", required=True, metavar="NAME", help="repository, e.g. fleet/app")
    p.add_argument("--tag", required=True)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--sources", metavar="IP[,IP...]", help="one node per source address")
    src.add_argument("--source-range", metavar="BASE_IP:COUNT", help="COUNT nodes from BASE_IP up")
    p.add_argument("--start-at", type=float, metavar="EPOCH_SECONDS",
                   help="wall-clock instant at which every node starts (default: now)")
    p.add_argument("--verify", type=int, default=1, metavar="N",
                   help="the first N nodes check sha256 of every manifest and blob (default 1)")
    p.add_argument("--parallel", type=int, default=3, help="layers at once per node (default 3)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per node overall (600)")
    p.add_argument("--read-timeout", type=float, default=60.0, help="seconds per read (60)")
    p.add_argument("--platform", default="linux/amd64", metavar="OS/ARCH[/VARIANT]")
    p.add_argument("--out", metavar="FILE", help="write the JSON results here (default stdout)")
    args = p.parse_args(argv)
    if args.parallel < 1 or args.verify < 0 or args.timeout <= 0 or args.read_timeout <= 0:
        p.error("--parallel must be >= 1, --verify >= 0, the timeouts > 0")
    if len(args.platform.split("/")) not in (2, 3):
        p.error("--platform is OS/ARCH or OS/ARCH/VARIANT")
    return args


def split_host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--registry {text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def expand_sources(args: argparse.Namespace) -> list[str]:
    if args.sources:
        return [str(ipaddress.ip_address(s.strip())) for s in args.sources.split(",") if s.strip()]
    base, sep, count = args.source_range.rpartition(":")
    if not sep or not count.isdigit() or int(count) < 1:
        raise ValueError(f"--source-range {args.source_range!r} is not BASE_IP:COUNT")
    first = ipaddress.ip_address(base.strip("[]"))
    return [str(first + i) for i in range(int(count))]


def check_sources(sources: list[str]) -> str | None:
    """Bind each source address once: the message for the first that is not assigned here."""
    for s in sources:
        family = socket.AF_INET6 if ipaddress.ip_address(s).version == 6 else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((s, 0))
            except OSError as e:
                if e.errno == errno.EADDRNOTAVAIL:
                    return unassigned_message(s)
                return f"cannot bind source address {s}: {e}"
    return None


def raise_fd_limit(needed: int) -> None:
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < needed:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY
                                                        else needed, hard))
    except (ImportError, ValueError, OSError):
        pass


async def run_fleet(nodes: list[Node], start_at: float | None) -> None:
    if start_at is not None:
        delay = start_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -1:
            print(f"fleet_nodes: --start-at passed {-delay:.1f} s ago, starting now", file=sys.stderr)
    await asyncio.gather(*(n.run() for n in nodes))


def report(args: argparse.Namespace, nodes: list[Node]) -> dict:
    results = [n.result() for n in nodes]
    sizes = [n.image_bytes for n in nodes if n.image_bytes is not None]
    ok = sum(r["ok"] for r in results)
    return {
        "registry": args.registry,
        "ns": args.ns,
        "repo": args.repo,
        "tag": args.tag,
        "platform": args.platform,
        "start_at": args.start_at,
        "nodes": results,
        "image_bytes": sizes[0] if sizes else None,
        "manifest_requests": sum(n.manifest_requests for n in nodes),
        "ok": ok,
        "failed": len(results) - ok,
    }


def summary_line(doc: dict, wall: float) -> str:
    nodes = doc["nodes"]
    secs = sorted(r["seconds"] for r in nodes if r["seconds"] is not None)
    statuses: dict[str, int] = {}
    for r in nodes:
        for k, v in r["statuses"].items():
            statuses[k] = statuses.get(k, 0) + v
    total = sum(r["bytes"] for r in nodes)
    parts = [
        f"registry={doc['registry']}", f"nodes={len(nodes)}", f"ok={doc['ok']}",
        f"failed={doc['failed']}", f"image_bytes={doc['image_bytes']}", f"bytes={total}",
        f"requests={sum(r['requests'] for r in nodes)}", f"wall_s={wall:.3f}",
        f"agg_MiBps={total / wall / (1 << 20):.1f}" if wall > 0 else "agg_MiBps=0",
    ]
    if secs:
        parts.append(f"node_s_min={secs[0]:.3f} node_s_med={statistics.median(secs):.3f} "
                     f"node_s_max={secs[-1]:.3f}")
    parts.append(f"statuses={json.dumps(statuses, separators=(',', ':'))}")
    parts.append(f"retries={sum(r['retries'] for r in nodes)}")
    errors = [f"{r['source']}: {r['error']}" for r in nodes if r["error"]]
    if errors:
        parts.append(f"first_error={json.dumps(errors[0])}")
    return "fleet_nodes: " + " ".join(parts)


def write_json(doc: dict, out: str | None) -> None:
    text = json.dumps(doc, indent=1) + "\n"
    if not out:
        sys.stdout.write(text)
        return
    tmp = f"{out}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        host, port = split_host_port(args.registry)
        sources = expand_sources(args)
    except ValueError as e:
        print(f"fleet_nodes: {e}", file=sys.stderr)
        return 2
    if not sources:
        print("fleet_nodes: no source addresses", file=sys.stderr)
        return 2
    problem = check_sources(sources)
    if problem:
        print(f"fleet_nodes: {problem}", file=sys.stderr)
        return 2
    raise_fd_limit(len(sources) * (args.parallel + 1) + 64)
    opts = Options(host, port, args.ns, args.repo, args.tag, args.platform, args.parallel,
                   args.timeout, args.read_timeout)
    nodes = [Node(s, i < args.verify, opts) for i, s in enumerate(sources)]
    t0 = time.time()
    asyncio.run(run_fleet(nodes, args.start_at))
    wall = time.time() - max(t0, args.start_at or 0)
    doc = report(args, nodes)
    write_json(doc, args.out)
    print(summary_line(doc, wall), file=sys.stderr)
    if any(isinstance(n.error, str) and n.error.startswith("source address") for n in nodes):
        return 2
    return 0 if doc["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
