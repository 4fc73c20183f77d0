#!/usr/bin/env bash
# Delete the topoguard kind lab.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/kind/lib.sh
source hack/kind/lib.sh
need kind
kind delete cluster --name "$CLUSTER"
