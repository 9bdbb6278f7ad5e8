#!/usr/bin/env bash
# upstream-bytes.sh - what did a registry serve? Sums DIR/access.log (Apache combined format, as
# docker-registry and nginx write it) so a test or benchmark can count upstream transfers.
# usage: upstream-bytes.sh DIR          one summary line of key=value pairs, then one line per
#                                       blob digest: "  sha256:... gets=N bytes=B"
#        upstream-bytes.sh DIR reset    truncate the log (the start of a measurement)
# keys: requests bytes blob_gets blob_bytes blob_heads manifest_gets manifest_bytes
#       manifest_heads non2xx ns_param (requests whose query carries ns=)
set -eu
[ $# -ge 1 ] || { echo "usage: ${0##*/} DIR [reset]" >&2; exit 2; }
log=$1/access.log
if [ "${2:-}" = reset ]; then : >"$log"; exit 0; fi
[ -f "$log" ] || { echo "${0##*/}: no $log" >&2; exit 1; }
exec python3 - "$log" <<'PY'
import re, sys
from collections import Counter

# ... "GET /v2/repo/blobs/sha256:abc?ns=x HTTP/1.1" 200 1234 ...
LINE = re.compile(r'"(?P<method>[A-Z]+) (?P<target>\S+) [^"]*" (?P<status>\d{3}) (?P<bytes>\d+|-)')
c = Counter()
gets, got = Counter(), Counter()
with open(sys.argv[1], errors="replace") as f:
    for line in f:
        m = LINE.search(line)
        if not m:
            continue
        method, target, status = m["method"], m["target"], m["status"]
        n = 0 if m["bytes"] == "-" else int(m["bytes"])
        path, _, query = target.partition("?")
        c["requests"] += 1
        c["bytes"] += n
        if re.search(r"(^|&)ns=", query):
            c["ns_param"] += 1
        if not status.startswith("2"):
            c["non2xx"] += 1
        if "/blobs/" in path:
            digest = path.rsplit("/blobs/", 1)[1]
            if method == "GET":
                c["blob_gets"] += 1
                c["blob_bytes"] += n
                gets[digest] += 1
                got[digest] += n
            elif method == "HEAD":
                c["blob_heads"] += 1
        elif "/manifests/" in path:
            if method == "GET":
                c["manifest_gets"] += 1
                c["manifest_bytes"] += n
            elif method == "HEAD":
                c["manifest_heads"] += 1
keys = ["requests", "bytes", "blob_gets", "blob_bytes", "blob_heads", "manifest_gets",
        "manifest_bytes", "manifest_heads", "non2xx", "ns_param"]
print(" ".join("%s=%d" % (k, c[k]) for k in keys))
for d in sorted(gets):
    print("  %s gets=%d bytes=%d" % (d, gets[d], got[d]))
PY
