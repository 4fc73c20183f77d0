#!/usr/bin/env bash
# `make e2e`: end-to-end tests against a real kube-apiserver + etcd (no Docker, no kubelet).
#
#   1. hack/envtest/build.sh builds both binaries from the Go modules pinned in hack/envtest/go.mod,
#      or reuses ~/.cache/topoguard-envtest/<versions>/ (cold: minutes; warm: a second).
#   2. pytest runs tests/e2e with TOPOGUARD_ENVTEST_BIN pointing at them; the suite starts etcd,
#      kube-apiserver and `topoguard serve` on 127.0.0.1 and tears them down afterwards.
#
# TOPOGUARD_UPSTREAM_CRDS: a directory tree of the real Kubeflow/JobSet CRDs; defaults to
# ../shared/upstream when that exists, else the suite uses its own small CRDs (tests/e2e/crds/).
# Extra arguments go to pytest (e.g. `hack/e2e-apiserver.sh -k dry_run -x`).
set -euo pipefail
cd "$(dirname "$0")/.."

started=$SECONDS
bin_dir="$(hack/envtest/build.sh)"
echo "e2e: kube-apiserver + etcd ready in ${bin_dir} after $((SECONDS - started))s"
export TOPOGUARD_ENVTEST_BIN="$bin_dir"

if [[ -z "${TOPOGUARD_UPSTREAM_CRDS:-}" && -d ../shared/upstream ]]; then
    TOPOGUARD_UPSTREAM_CRDS="$(cd ../shared/upstream && pwd)"
    export TOPOGUARD_UPSTREAM_CRDS
fi
echo "e2e: CRDs from ${TOPOGUARD_UPSTREAM_CRDS:-tests/e2e/crds (no upstream directory)}"

tests_started=$SECONDS
mkdir -p build && touch build/.e2e-started
status=0
.venv/bin/pytest -q tests/e2e -p no:cacheprovider "$@" || status=$?
echo "e2e: tests took $((SECONDS - tests_started))s (total $((SECONDS - started))s)"
# The lossless scenarios (make e2e-lossless) write their table here; show it with the run.
if [[ -f build/e2e-lossless.md && build/e2e-lossless.md -nt build/.e2e-started ]]; then
    cat build/e2e-lossless.md build/e2e-lossless-notes.md
fi
exit "$status"
