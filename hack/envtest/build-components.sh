#!/usr/bin/env bash
# Build (once per machine) the rest of the control plane `make e2e-full` runs next to the envtest
# kube-apiserver: the real kube-scheduler and kube-controller-manager, and the real training-job
# operators, each from Go modules pinned in this directory, and cache each binary by its go.sum.
#
#   hack/envtest/build-components.sh OUT_DIR [COMPONENT...]
#
# COMPONENT is one of: kube-scheduler kube-controller-manager training-operator jobset trainer kueue
# (default: all of them, one after the other: the CI box has 2 cores). For each one OUT_DIR gets
#   NAME.bin      the absolute path of the cached binary, when it built (or was cached);
#   NAME.module   the module's directory in the Go module cache (its CRDs live there);
#   NAME.version  the pinned version;
#   NAME.error    instead of NAME.bin when the build failed: the command and the last lines of its output.
# A component that fails does not stop the others; the exit status is 1 if any failed, so callers
# (hack/e2e-full.sh) can still run what did build and the tests skip the rest naming NAME.error.
#
# Where the pins live:
#   kube-scheduler, kube-controller-manager: hack/envtest/go.mod (the same k8s.io/kubernetes as the
#     apiserver; that module's replace lines are what makes k8s.io/kubernetes buildable as a dependency);
#   the operators: hack/envtest/components/NAME/go.mod, one module each, because their k8s.io
#     dependencies differ (training-operator v0.36.3, JobSet v0.36.0, Trainer and Kueue v0.36.2) and one
#     module would force a single version on all of them. Each go.mod requires only the operator, so
#     the build list is the operator's own.
# Cache: ${TOPOGUARD_ENVTEST_CACHE:-~/.cache/topoguard-envtest}/NAME-VERSION_SUM_GOOS-GOARCH/, where SUM
# is the first 12 hex digits of sha256(go.mod + go.sum): a changed pin or a changed dependency is a
# new directory, never a stale binary. Builds go to a temporary directory renamed when complete, under
# one lock per component, so concurrent callers wait and then find the cache warm.
# Env: GO (default: go on PATH, else /usr/local/go/bin/go).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
if [[ $# -lt 1 ]]; then
    echo "usage: $0 OUT_DIR [COMPONENT...]" >&2
    exit 2
fi
out="$1"
shift
mkdir -p "$out"
out="$(cd "$out" && pwd)"
all=(kube-scheduler kube-controller-manager training-operator jobset trainer kueue)
if [[ $# -gt 0 ]]; then components=("$@"); else components=("${all[@]}"); fi

fail_all() {
    for name in "${components[@]}"; do
        rm -f "$out/$name.bin"
        printf '%s\n' "$1" >"$out/$name.error"
    done
    echo "components: $1" >&2
    exit 1
}
"$GO" version >/dev/null 2>&1 || fail_all "no Go toolchain (tried '$GO'); install Go >= 1.26 or set GO=/path/to/go"
goos="$("$GO" env GOOS)"
goarch="$("$GO" env GOARCH)"
cache_root="${TOPOGUARD_ENVTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/topoguard-envtest}"
mkdir -p "$cache_root"

# The required version of module $2 in $1/go.mod (a `require (...)` block line or a one-line require).
pin() {
    awk -v m="$2" '$1 == "require" && $2 == m { print $3; exit } $1 == m && $2 ~ /^v/ { print $2; exit }' "$1/go.mod"
}
sum_key() { cat "$1/go.mod" "$1/go.sum" | sha256sum | cut -c1-12; }

# describe NAME -> sets module_dir (the go.mod directory), module, package, binary
describe() {
    case "$1" in
        kube-scheduler | kube-controller-manager)
            module_dir="$here" module=k8s.io/kubernetes package="k8s.io/kubernetes/cmd/$1" binary="$1" ;;
        training-operator)
            module_dir="$here/components/$1" module=github.com/kubeflow/training-operator
            package="$module/cmd/training-operator.v1" binary=training-operator ;;
        jobset)
            module_dir="$here/components/$1" module=sigs.k8s.io/jobset package="$module" binary=jobset-controller ;;
        trainer)
            module_dir="$here/components/$1" module=github.com/kubeflow/trainer/v2
            package="$module/cmd/trainer-controller-manager" binary=trainer-controller-manager ;;
        kueue)
            module_dir="$here/components/$1" module=sigs.k8s.io/kueue package="$module/cmd/kueue" binary=kueue ;;
        *)
            echo "components: unknown component '$1' (known: ${all[*]})" >&2
            exit 2 ;;
    esac
}

build_one() {
    local name="$1" version key dest ldflags work log start
    describe "$name"
    version="$(pin "$module_dir" "$module")"
    key="$(sum_key "$module_dir")"
    dest="$cache_root/${name}-${version}_${key}_${goos}-${goarch}"
    rm -f "$out/$name.bin" "$out/$name.error" "$out/$name.module"
    printf '%s\n' "$version" >"$out/$name.version"
    if [[ ! -x "$dest/$binary" ]]; then
        exec 8>"$cache_root/.build-$name.lock"
        flock 8
    fi
    if [[ ! -x "$dest/$binary" ]]; then
        ldflags="-s -w"
        if [[ "$module" == k8s.io/kubernetes ]]; then
            # As build.sh does for kube-apiserver: report the release, not v0.0.0-master.
            local minor="${version#v1.}"
            minor="${minor%%.*}"
            ldflags+=" -X k8s.io/component-base/version.gitVersion=${version}"
            ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor}"
            ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
        fi
        work="$(mktemp -d "$cache_root/.build-$name.XXXXXX")"
        log="$work/build.log"
        start=$SECONDS
        echo "components: building $name $version ($package) with $("$GO" version | cut -d' ' -f3)" >&2
        # -mod=readonly: the go.sum in the repository is the pin; a build never rewrites it.
        if ! (cd "$module_dir" && GOFLAGS=-mod=readonly CGO_ENABLED=0 \
                "$GO" build -trimpath -ldflags "$ldflags" -o "$work/$binary" "$package") >"$log" 2>&1; then
            {
                echo "go build $package ($module $version, in ${module_dir#"$repo/"}) failed after $((SECONDS - start))s:"
                tail -n 30 "$log"
            } >"$out/$name.error"
            rm -rf "$work"
            exec 8>&-
            echo "components: $name FAILED (see $out/$name.error)" >&2
            return 1
        fi
        echo "$((SECONDS - start))" >"$work/build-seconds"
        rm -f "$log"
        chmod 755 "$work"
        rm -rf "$dest"
        mv "$work" "$dest"
        echo "components: $name built in $((SECONDS - start))s -> $dest" >&2
    else
        echo "components: $name cached in $dest" >&2
    fi
    exec 8>&-
    printf '%s\n' "$dest/$binary" >"$out/$name.bin"
    # The module's own directory in the module cache: the CRDs that match this controller.
    (cd "$module_dir" && GOFLAGS=-mod=readonly "$GO" list -m -f '{{.Dir}}' "$module") >"$out/$name.module"
}

status=0
for name in "${components[@]}"; do
    build_one "$name" || status=1
done
exit "$status"
