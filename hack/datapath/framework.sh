#!/usr/bin/env bash
# A virtualenv with a real distributed-training framework on CPU (JAX, its Gloo CPU collectives) for
# the datapath suite's rendezvous test, installed from framework.lock (exact versions, every file's
# hash; PyPI only), cached by the lock's hash. Prints the venv's python.
#   hack/datapath/framework.sh  -> ~/.cache/topoguard-datapath/framework-<lock hash>/bin/python
# Not part of topoguard's own dependencies: only this suite runs it. To change the pin, edit
# framework.in and re-run: pip-compile --generate-hashes --strip-extras --allow-unsafe -o framework.lock framework.in
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-python3}"
key="$(sha256sum "$here/framework.lock" | cut -c1-12)"
cache_root="${TOPOGUARD_DATAPATH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/topoguard-datapath}"
dest="$cache_root/framework-$key"
if [[ -x "$dest/bin/python" && -f "$dest/.complete" ]]; then
    echo "$dest/bin/python"
    exit 0
fi
mkdir -p "$cache_root"
exec 9>"$cache_root/.framework.lock"
flock 9
if [[ ! -f "$dest/.complete" ]]; then
    echo "datapath: installing JAX (CPU) into $dest from framework.lock" >&2
    rm -rf "$dest"
    "$PYTHON" -m venv "$dest" >&2
    "$dest/bin/pip" install -q --require-hashes --no-deps -r "$here/framework.lock" >&2
    touch "$dest/.complete"
fi
echo "$dest/bin/python"
