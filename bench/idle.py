#!/usr/bin/env python3
"""idle.py HOST PORT N PATH HOLD_S [--auth HEADER] - issue 23's idle keep-alive client.

Opens N HTTP/1.1 connections to HOST:PORT (at most 256 connecting at once), sends one
`GET PATH` on each, reads the whole response (Content-Length) and keeps the connection open.
When all are done it prints `ready open=.. ok=.. fail=..` (flushed), holds them HOLD_S seconds,
checks how many the server closed meanwhile, prints `done still_open=.. closed=..` and exits.
Needs N + a few file descriptors (ulimit -n).
"""
import asyncio
import sys


async def one(host, port, req, sem, conns, stats):
    async with sem:
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(host, port), 60)
            w.write(req)
            head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 60)
            status = int(head.split(b" ", 2)[1])
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if length:
                await asyncio.wait_for(r.readexactly(length), 60)
            if 200 <= status < 400:
                stats["ok"] += 1
            else:
                stats["fail"] += 1
            conns.append((r, w))
        except Exception as e:  # noqa: BLE001 - every failure counts, the first is shown
            stats["fail"] += 1
            stats.setdefault("err", repr(e))


async def main():
    a = sys.argv[1:]
    host, port, n, path, hold = a[0], int(a[1]), int(a[2]), a[3], float(a[4])
    auth = a[a.index("--auth") + 1] if "--auth" in a else None
    req = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
    if auth:
        req += f"Authorization: {auth}\r\n"
    req = (req + "\r\n").encode()
    sem = asyncio.Semaphore(256)
    conns, stats = [], {"ok": 0, "fail": 0}
    await asyncio.gather(*(one(host, port, req, sem, conns, stats) for _ in range(n)))
    print(f"ready open={len(conns)} ok={stats['ok']} fail={stats['fail']} err={stats.get('err', '-')!r}", flush=True)
    await asyncio.sleep(hold)
    closed = sum(1 for r, _ in conns if r.at_eof())
    print(f"done still_open={len(conns) - closed} closed={closed}", flush=True)
    for _, w in conns:
        w.close()


if __name__ == "__main__":
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    asyncio.run(main())
