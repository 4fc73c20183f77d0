#!/usr/bin/env bash
# Build (once per version) cilium-agent and cilium-cni from the Cilium Go module pinned in
# hack/datapath/go.mod, copy the module's BPF sources beside them (the agent compiles its datapath
# at run time from --lib-dir/bpf), and print the directory that holds them:
#
#   hack/datapath/build.sh   -> e.g. ~/.cache/topoguard-datapath/cilium-v1.20.2_<go.mod+go.sum>_linux-amd64
#                               containing cilium-agent, cilium-cni, cilium-dbg, lib/bpf/
#
# The cache key is the pinned Cilium version, a hash of go.mod + go.sum (the gobgp replace line) and
# GOOS/GOARCH, so a warm run costs a `--version` call. One build per machine at a time (flock).
# Progress goes to stderr; stdout carries only the directory. Env: GO, TOPOGUARD_DATAPATH_CACHE.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
if ! "$GO" version >/dev/null 2>&1; then
    echo "datapath: no Go toolchain (tried '$GO'); install Go >= 1.26 or set GO=/path/to/go" >&2
    exit 2
fi
cilium_version="$(awk '$1 == "require" && $2 == "github.com/cilium/cilium" { print $3; exit }
                       $1 == "github.com/cilium/cilium" && $2 ~ /^v/ { print $2; exit }' "$here/go.mod")"
if [[ -z "$cilium_version" ]]; then
    echo "datapath: cannot read the github.com/cilium/cilium pin from $here/go.mod" >&2
    exit 2
fi
key="$(cat "$here/go.mod" "$here/go.sum" 2>/dev/null | sha256sum | cut -c1-12)"
cache_root="${TOPOGUARD_DATAPATH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/topoguard-datapath}"
dest="$cache_root/cilium-${cilium_version}_${key}_$("$GO" env GOOS)-$("$GO" env GOARCH)"

usable() {
    [[ -x "$dest/cilium-agent" && -x "$dest/cilium-cni" && -x "$dest/cilium-dbg" && -f "$dest/lib/bpf/bpf_lxc.c" &&
        -f "$dest/crds/ciliumpodippools.yaml" ]] &&
        "$dest/cilium-agent" --version >/dev/null 2>&1
}
if usable; then
    echo "datapath: cached binaries in $dest" >&2
    echo "$dest"
    exit 0
fi

mkdir -p "$cache_root"
exec 9>"$cache_root/.build.lock"
flock 9
if usable; then
    echo "$dest"
    exit 0
fi

work="$(mktemp -d "$cache_root/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
start=$SECONDS
echo "datapath: building cilium-agent, cilium-cni, cilium-dbg ${cilium_version} with $("$GO" version) (cold: 10-20 min on 2 cores; cached afterwards)" >&2
(
    cd "$here"
    nice "$GO" build -trimpath -ldflags "-s -w" -o "$work/cilium-cni" github.com/cilium/cilium/plugins/cilium-cni
    echo "datapath: cilium-cni built after $((SECONDS - start))s" >&2
    nice "$GO" build -trimpath -ldflags "-s -w" -o "$work/cilium-dbg" github.com/cilium/cilium/cilium-dbg
    echo "datapath: cilium-dbg built after $((SECONDS - start))s" >&2
    nice "$GO" build -trimpath -ldflags "-s -w" -o "$work/cilium-agent" github.com/cilium/cilium/daemon
    echo "datapath: cilium-agent built after $((SECONDS - start))s" >&2
    src="$("$GO" list -m -f '{{.Dir}}' github.com/cilium/cilium)"
    mkdir -p "$work/lib"
    cp -r "$src/bpf" "$work/lib/bpf"
    chmod -R u+w "$work/lib"
    mkdir -p "$work/crds"
    # v2 and v2alpha1: the agent waits for CRDs of both (e.g. CiliumPodIPPool) before it is ready.
    cp "$src"/pkg/k8s/apis/cilium.io/client/crds/v2*/*.yaml "$work/crds/"
)
echo "datapath: built in $((SECONDS - start))s" >&2
"$work/cilium-agent" --version >&2 || true
chmod 755 "$work"
rm -rf "$dest"
mv "$work" "$dest"
trap - EXIT
echo "$dest"
