"""An Image Factory stand-in for the tests and benchmarks (run by factory-upstream.sh).

It behaves like the factory's direct download path: every GET of an existing file answers 200
with the whole file (Range is ignored, no Accept-Ranges, ETag or Last-Modified), with
Content-Length unless --no-length makes the body close-delimited. --rate limits each
connection's sending rate (MB/s, 10^6 bytes). One access-log line per request, written when the
response ends:

  TIME PEER METHOD PATH range="RANGE|-" status=S bytes=SENT secs=S end=done|client-gone|error
"""

import argparse
import http.server
import os
import sys
import threading
import time
import urllib.parse

TYPES = {".xz": "application/x-xz", ".gz": "application/gzip", ".zst": "application/zstd",
         ".iso": "application/x-iso9660-image"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("port", type=int)
    ap.add_argument("log")
    ap.add_argument("--rate", type=float, default=0.0, help="MB/s per connection, 0 = unlimited")
    ap.add_argument("--no-length", action="store_true", help="close-delimited bodies")
    a = ap.parse_args()
    root = os.path.realpath(a.root)
    log = open(a.log, "a", buffering=1)
    log_lock = threading.Lock()
    rate = a.rate * 1e6

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def version_string(self):
            return "factory-upstream"

        def log_message(self, *args):
            pass  # the access log below replaces http.server's

        def do_GET(self):
            self.answer(True)

        def do_HEAD(self):
            self.answer(False)

        def file(self):
            rel = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
            path = os.path.realpath(os.path.join(root, rel))
            if os.path.commonpath([root, path]) != root or not os.path.isfile(path):
                return None
            return path

        def answer(self, body):
            start = time.monotonic()
            status, sent, end = 0, 0, "done"
            try:
                path = self.file()
                if path is None:
                    status = 404
                    text = b"not found\n"
                    self.send_response(404)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(text)))
                    self.end_headers()
                    if body:
                        self.wfile.write(text)
                    return
                size = os.path.getsize(path)
                status = 200
                self.send_response(200)
                self.send_header("Content-Type", TYPES.get(os.path.splitext(path)[1], "application/octet-stream"))
                self.send_header("Content-Disposition", 'attachment; filename="%s"' % os.path.basename(path))
                if a.no_length:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                else:
                    self.send_header("Content-Length", str(size))
                self.end_headers()
                if body:
                    sent = self.send_file(path, size)
                    if sent < size:
                        end = "error"
            except (BrokenPipeError, ConnectionResetError):
                end = "client-gone"
                self.close_connection = True
            except Exception as e:  # noqa: BLE001 - logged, the connection is dropped
                end = "error"
                self.close_connection = True
                print("error: %r" % (e,), file=sys.stderr, flush=True)
            finally:
                rng = (self.headers.get("Range") or "-").replace('"', "'").replace(" ", "%20")
                line = '%s %s:%d %s %s range="%s" status=%d bytes=%d secs=%.3f end=%s\n' % (
                    time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()), self.client_address[0],
                    self.client_address[1], self.command, self.path.replace(" ", "%20"), rng, status,
                    sent, time.monotonic() - start, end)
                with log_lock:
                    log.write(line)

        def send_file(self, path, size):
            sent = 0
            t0 = time.monotonic()
            with open(path, "rb") as f:
                while sent < size:
                    n = os.sendfile(self.connection.fileno(), f.fileno(), sent, min(1 << 20, size - sent))
                    if n == 0:
                        break
                    sent += n
                    if rate > 0:
                        early = t0 + sent / rate - time.monotonic()
                        if early > 0:
                            time.sleep(early)  # pacing the link, not synchronisation
            return sent

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 512  # caches without a lock open one connection per client at once

    Server(("127.0.0.1", a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
