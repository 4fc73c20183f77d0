#!/usr/bin/env bash
# Build (once per source version) the oracle: hack/oracle/main.go against the Cilium module pinned in
# hack/oracle/go.mod, and print the path of the binary.
#
# The cache key is a hash of go.mod, go.sum and main.go plus GOOS/GOARCH, so a warm run costs a
# `sha256sum`. Modules and build objects live in the standard Go caches (GOMODCACHE, GOCACHE):
# cold, about 107 MB of modules and 3 minutes on 2 cores; warm, seconds.
# Progress goes to stderr; stdout carries only the path. Env: GO, TOPOGUARD_ORACLE_CACHE.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
if ! "$GO" version >/dev/null 2>&1; then
    echo "oracle: no Go toolchain (tried '$GO'); install Go >= 1.26 or set GO=/path/to/go" >&2
    exit 2
fi
key="$(cat "$here/go.mod" "$here/go.sum" "$here/main.go" | sha256sum | cut -c1-16)"
cache_root="${TOPOGUARD_ORACLE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/topoguard-oracle}"
dest="$cache_root/${key}_$("$GO" env GOOS)-$("$GO" env GOARCH)/oracle"
if [[ -x "$dest" ]]; then
    echo "oracle: cached binary $dest" >&2
    echo "$dest"
    exit 0
fi
echo "oracle: building $dest (cold: about 3 minutes)" >&2
mkdir -p "$(dirname "$dest")"
(cd "$here" && GOFLAGS="${GOFLAGS:--mod=mod} -buildvcs=false" nice "$GO" build -trimpath -o "$dest.tmp" .) >&2
mv "$dest.tmp" "$dest"
echo "$dest"
