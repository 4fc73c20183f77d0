#!/usr/bin/env bash
# `make e2e-datapath`: the seed lab and reach cases on Cilium's real datapath (root; no Docker).
#
#   1. hack/datapath/deps.sh installs clang-19 (the agent compiles its BPF programs at run time),
#      iproute2, iptables/ipset from Debian when missing;
#   2. hack/envtest/build.sh (kube-apiserver + etcd) and hack/datapath/build.sh (cilium-agent,
#      cilium-cni, cilium-dbg from the Cilium Go module) build or reuse their cached binaries;
#      hack/datapath/framework.sh installs (or reuses) JAX on CPU from its hashed lock;
#   3. pytest runs tests/e2e_datapath: the agent in a network namespace of its own as the node, pods
#      as network namespaces wired by CNI ADD, real TCP/UDP probes. See docs/e2e.md.
# Extra arguments go to pytest (e.g. `hack/e2e-datapath.sh -k differential`).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $EUID -ne 0 ]]; then
    echo "e2e-datapath: needs root (network and mount namespaces, BPF)" >&2
    exit 2
fi
started=$SECONDS
hack/datapath/deps.sh
envtest_dir="$(hack/envtest/build.sh)"
datapath_dir="$(hack/datapath/build.sh)"
framework_python="$(hack/datapath/framework.sh)"
echo "e2e-datapath: binaries ready after $((SECONDS - started))s (${envtest_dir}, ${datapath_dir})"
export TOPOGUARD_ENVTEST_BIN="$envtest_dir" TOPOGUARD_DATAPATH_BIN="$datapath_dir"
export TOPOGUARD_DATAPATH_FRAMEWORK="$framework_python"
tests_started=$SECONDS
status=0
# Agent start-up compiles the datapath (a minute or more on a busy 2-core box): a longer per-test timeout.
.venv/bin/pytest -q -s tests/e2e_datapath -p no:cacheprovider -o timeout=900 "$@" || status=$?
echo "e2e-datapath: tests took $((SECONDS - tests_started))s (total $((SECONDS - started))s)"
exit "$status"
