#!/usr/bin/env bash
# `make oracle`: differential test of topoguard's policy verdicts against Cilium's own policy code.
#
#   1. hack/oracle/build.sh builds the Go oracle (Cilium v1.20.2 from the Go module proxy) or reuses
#      the cached binary;
#   2. hack/oracle/compare.py runs every reach table case of the test suite plus seeded generated
#      cases through both and fails on any disagreement not listed in hack/oracle/known-differences.yaml.
# Extra arguments go to compare.py (e.g. `hack/oracle.sh --generated 2000 --seed 7`).
set -euo pipefail
cd "$(dirname "$0")/.."
binary="$(hack/oracle/build.sh)"
exec .venv/bin/python hack/oracle/compare.py --oracle "$binary" "$@"
