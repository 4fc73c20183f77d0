#!/usr/bin/env bash
# `make e2e-full`: the end-to-end tests with the real control plane (tests/e2e_full): the envtest
# kube-apiserver + etcd, the real kube-scheduler and kube-controller-manager, training-operator v1.9.4,
# JobSet v0.12.0, Trainer v2.3.0 and Kueue v0.19.0, all built from Go modules and cached by go.sum
# (hack/envtest/build.sh, hack/envtest/build-components.sh; docs/e2e.md).
#
# A component that fails to build does not stop the run: its tests skip, naming the build error
# (build/e2e-full/components/NAME.error), and this script says so at the end. Extra arguments go to
# pytest (e.g. `hack/e2e-full.sh -k kueue -x`).
# E2E_FULL_COMPONENTS_DIR: the components directory another step fills (.ci/run builds in the background
# while the unit tests run); what it lacks is built here.
set -euo pipefail
cd "$(dirname "$0")/.."

started=$SECONDS
bin_dir="$(hack/envtest/build.sh)"
echo "e2e-full: kube-apiserver + etcd ready in ${bin_dir} after $((SECONDS - started))s"
components="${E2E_FULL_COMPONENTS_DIR:-build/e2e-full/components}"
# Always: what another step built is cached (seconds per component), and what it did not build (its chain
# stopped early, or failed) is built here instead of failing the run on a missing directory.
hack/envtest/build-components.sh "$components" || true
failed=()
for error in "$components"/*.error; do
    [[ -e "$error" ]] || continue
    failed+=("$(basename "$error" .error)")
done
echo "e2e-full: components ready after $((SECONDS - started))s${failed:+ (NOT built: ${failed[*]})}"
export TOPOGUARD_ENVTEST_BIN="$bin_dir"
TOPOGUARD_E2E_COMPONENTS="$(cd "$components" && pwd)"
export TOPOGUARD_E2E_COMPONENTS

tests_started=$SECONDS
status=0
.venv/bin/pytest -q tests/e2e_full -p no:cacheprovider -rs "$@" || status=$?
echo "e2e-full: tests took $((SECONDS - tests_started))s (total $((SECONDS - started))s)"
for name in "${failed[@]}"; do
    echo "e2e-full: $name was not built, its tests were skipped:" >&2
    sed 's/^/    /' "$components/$name.error" >&2
done
exit "$status"
