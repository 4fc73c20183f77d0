#!/usr/bin/env bash
# Build (once per machine) the kube-apiserver and etcd binaries the end-to-end suite runs, from the
# Go modules pinned in hack/envtest/go.mod, and print the directory that holds them.
#
#   hack/envtest/build.sh            -> prints e.g. ~/.cache/topoguard-envtest/kube-v1.36.3_etcd-v3.6.8_linux-amd64
#
# The cache key is the pinned versions plus GOOS/GOARCH, so a warm run costs a `--version` call.
# Progress goes to stderr; stdout carries only the directory, so callers can do DIR=$(build.sh).
# Env: GO (default: go on PATH, else /usr/local/go/bin/go), TOPOGUARD_ENVTEST_CACHE (cache root).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
if ! "$GO" version >/dev/null 2>&1; then
    echo "envtest: no Go toolchain (tried '$GO'); install Go >= 1.26 or set GO=/path/to/go" >&2
    exit 2
fi

# The pins live in go.mod only; read them back rather than repeating them here.
pin() { awk -v m="$1" '$1 == m && $2 ~ /^v/ { print $2; exit }' "$here/go.mod"; }
kube_version="$(pin k8s.io/kubernetes)"
etcd_version="$(pin go.etcd.io/etcd/server/v3)"
if [[ -z "$kube_version" || -z "$etcd_version" ]]; then
    echo "envtest: cannot read the k8s.io/kubernetes / etcd pins from $here/go.mod" >&2
    exit 2
fi
goos="$("$GO" env GOOS)"
goarch="$("$GO" env GOARCH)"
cache_root="${TOPOGUARD_ENVTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/topoguard-envtest}"
dest="$cache_root/kube-${kube_version}_etcd-${etcd_version}_${goos}-${goarch}"

usable() {
    [[ -x "$dest/kube-apiserver" && -x "$dest/etcd" ]] &&
        "$dest/kube-apiserver" --version >/dev/null 2>&1 &&
        "$dest/etcd" --version >/dev/null 2>&1
}

if usable; then
    echo "envtest: cached binaries in $dest" >&2
    echo "$dest"
    exit 0
fi

mkdir -p "$cache_root"
# One build at a time per machine: a second caller waits, then finds the cache warm.
exec 9>"$cache_root/.build.lock"
flock 9
if usable; then
    echo "$dest"
    exit 0
fi

work="$(mktemp -d "$cache_root/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
minor="${kube_version#v1.}"
minor="${minor%%.*}"
# Stamp the release into the binary the way the Kubernetes build does (hack/lib/version.sh),
# so /version and the emulation-version checks report v1.36.x rather than v0.0.0-master.
kube_ldflags="-s -w"
kube_ldflags+=" -X k8s.io/component-base/version.gitVersion=${kube_version}"
kube_ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
kube_ldflags+=" -X k8s.io/component-base/version.gitMinor=${minor}"
kube_ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"

export GOFLAGS=-mod=mod CGO_ENABLED=0
start=$SECONDS
echo "envtest: building kube-apiserver ${kube_version} + etcd ${etcd_version} with $("$GO" version) (cold build; cached afterwards)" >&2
(
    cd "$here"
    "$GO" build -trimpath -ldflags "-s -w" -o "$work/etcd" go.etcd.io/etcd/server/v3
    echo "envtest: etcd built after $((SECONDS - start))s" >&2
    "$GO" build -trimpath -ldflags "$kube_ldflags" -o "$work/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
)
echo "envtest: kube-apiserver built after $((SECONDS - start))s" >&2
"$work/kube-apiserver" --version >&2
# NB: not `| head -1`: head exits after one line, etcd gets SIGPIPE writing the next, and under pipefail the
# build fails (and the trap deletes it) depending on timing; it did in a cold .ci/run.
etcd_version_text="$("$work/etcd" --version)"
echo "${etcd_version_text%%$'\n'*}" >&2
# Publish atomically: readers either see no directory or a complete one.
chmod 755 "$work"
rm -rf "$dest"
mv "$work" "$dest"
trap - EXIT
echo "$dest"
