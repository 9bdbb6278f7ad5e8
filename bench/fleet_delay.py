#!/usr/bin/env python3
"""fleet_delay.py - a delay line for the fleet bench's upstream link (bench/fleet.sh).

The machine's kernel has no netem, so the link's latency is added here: a TCP proxy that holds
every chunk it reads for DELAY_MS before writing it on, in each direction, in order. It does not
limit the rate (tc's tbf on the veth does) and adds no buffering beyond what the delay needs
(bounded, so a reader that stops reading stops the proxy reading too).

It counts the bytes it passed in each direction and writes them to --stats on SIGTERM/SIGINT
and every second, as JSON: {"down": bytes to the clients, "up": bytes from them, "conns": n}.

usage: fleet_delay.py --listen IP:PORT --target IP:PORT --delay-ms 30 [--stats FILE]
"""

import argparse
import asyncio
import json
import signal
import time

CHUNK = 64 * 1024
# At most this many chunks in flight per direction (4 MiB): far above a 50 Mbit/s x 30 ms link.
QUEUE = 64

stats = {"down": 0, "up": 0, "conns": 0}


async def pump(reader, writer, delay, key):
    queue: asyncio.Queue = asyncio.Queue(QUEUE)

    async def read():
        try:
            while True:
                data = await reader.read(CHUNK)
                await queue.put((time.monotonic() + delay, data))
                if not data:
                    return
        except (ConnectionError, OSError):
            await queue.put((time.monotonic(), b""))

    async def write():
        try:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                stats[key] += len(data)
                await writer.drain()
        except (ConnectionError, OSError):
            return

    await asyncio.gather(read(), write())


async def handle(client_r, client_w, target, delay):
    stats["conns"] += 1
    try:
        server_r, server_w = await asyncio.open_connection(*target)
    except OSError:
        client_w.close()
        return
    try:
        await asyncio.gather(
            pump(client_r, server_w, delay, "up"),
            pump(server_r, client_w, delay, "down"),
        )
    finally:
        for w in (client_w, server_w):
            try:
                w.close()
            except OSError:
                pass


def hostport(s):
    host, _, port = s.rpartition(":")
    return host, int(port)


async def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--delay-ms", type=float, default=30.0)
    ap.add_argument("--stats")
    a = ap.parse_args()
    delay = a.delay_ms / 1000.0
    target = hostport(a.target)
    host, port = hostport(a.listen)
    server = await asyncio.start_server(lambda r, w: handle(r, w, target, delay), host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def dump():
        if a.stats:
            with open(a.stats + ".tmp", "w") as f:
                json.dump(stats, f)
            import os

            os.replace(a.stats + ".tmp", a.stats)

    async with server:
        while not stop.is_set():
            dump()
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
    dump()


if __name__ == "__main__":
    asyncio.run(main())
