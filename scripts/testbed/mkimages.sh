#!/usr/bin/env bash
# mkimages.sh - build the synthetic test images and push them (mkimages.py has the details).
# usage: mkimages.sh REGISTRY     e.g. 127.0.0.1:5000 (plain HTTP)
# env: KUBELET_LAYERS_MB="30 5" INSTALLER_LAYERS_MB="80" BIG_MB=1024 (MiB; empty/0 skips),
#      WORK=DIR (reuse layers; default a new temp dir), SEED=ocibench, GZIP_LEVEL=1
set -eu
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
[ $# -eq 1 ] || { echo "usage: ${0##*/} REGISTRY" >&2; exit 2; }
loopback_only "$1"
need skopeo python3
exec python3 "$here/mkimages.py" "$1"
