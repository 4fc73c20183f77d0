#!/usr/bin/env bash
# make chart-lint: lint and render charts/topoguard with a real helm, validate every rendered
# object against the Kubernetes schemas, check deploy/topoguard.yaml is current, run tests/chart.
#
# 1. helm lint --strict, default values and each charts/topoguard/ci/*.yaml
# 2. helm template for the same value sets → build/chart/<name>.yaml
# 3. kubernetes-validate --strict against the oldest supported (Chart.yaml kubeVersion) and the
#    newest Kubernetes the installed kubernetes-validate knows; CRD-backed kinds skipped with a note
# 4. deploy/render.sh --check
# 5. Prometheus's promtool (built from its Go module, hack/go-tool.sh): `check rules` on the chart's rules as
#    rendered with and without the optional ones, `test rules` tests/chart/promtool/*.test.yaml
# 6. Grafana's dashboard-linter (built from its Go module) on charts/topoguard/files/dashboard.json
# 7. pytest -q tests/chart (helm install/upgrade against a real apiserver when one is built)
set -euo pipefail
cd "$(dirname "$0")/.."

CHART=charts/topoguard
OUT=build/chart
NAMESPACE=topoguard-system
PY=.venv/bin/python
MIN_KUBE=1.30.0
HELM="$(hack/helm.sh)"
export HELM
NEWEST_KUBE="$("$PY" -c 'import kubernetes_validate.utils as u; print(u.latest_version())')"

rm -rf "$OUT" && mkdir -p "$OUT"
value_sets=(default)
for f in "$CHART"/ci/*.yaml; do value_sets+=("$f"); done

echo "== helm lint --strict ($("$HELM" version --short))"
for v in "${value_sets[@]}"; do
  args=()
  [[ "$v" != default ]] && args=(-f "$v")
  "$HELM" lint --strict "$CHART" --namespace "$NAMESPACE" "${args[@]}" | sed -n 's/^\(1 chart.*\)/  '"${v##*/}"': \1/p;/\[\(ERROR\|WARNING\)\]/p'
done

echo "== helm template"
rendered=()
for v in "${value_sets[@]}"; do
  name="$(basename "$v" .yaml)"
  args=()
  [[ "$v" != default ]] && args=(-f "$v")
  "$HELM" template topoguard "$CHART" --namespace "$NAMESPACE" "${args[@]}" > "$OUT/$name.yaml"
  echo "  $name: $(grep -c '^kind:' "$OUT/$name.yaml") objects → $OUT/$name.yaml"
  rendered+=("$OUT/$name.yaml")
done

echo "== kubernetes-validate --strict"
"$PY" tests/chart/k8svalidate.py -k "$MIN_KUBE" -k "$NEWEST_KUBE" "${rendered[@]}"

echo "== deploy/topoguard.yaml"
deploy/render.sh --check

if command -v shellcheck >/dev/null; then
  echo "== shellcheck"
  shellcheck -x hack/chart-lint.sh hack/go-tool.sh hack/helm.sh hack/kind-*.sh hack/e2e-kind.sh hack/kind/lib.sh deploy/*.sh
  echo "  clean"
fi

PROMTOOL="$(hack/go-tool.sh promtool)"
export TOPOGUARD_PROMTOOL="$PROMTOOL"
echo "== promtool ($(basename "$(dirname "$PROMTOOL")"))"
rm -rf build/promtool
"$PY" -m tests.chart.promrules build/promtool >/dev/null
"$PROMTOOL" check rules build/promtool/no-prices.rules.yaml build/promtool/topoguard.rules.yaml
"$PROMTOOL" test rules build/promtool/*.test.yaml

LINTER="$(hack/go-tool.sh dashboard-linter)"
echo "== dashboard-linter"
"$LINTER" lint --strict --config hack/dashboard-linter/lint.yaml "$CHART/files/dashboard.json"
echo "  clean"

# The helm install/upgrade lifecycle tests need a real kube-apiserver; use the e2e suite's binaries
# when they are already built (hack/envtest/build.sh), never build them from here.
if [[ -z "${TOPOGUARD_ENVTEST_BIN:-}" ]]; then
  for dir in "${TOPOGUARD_ENVTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/topoguard-envtest}"/kube-*; do
    if [[ -x "$dir/kube-apiserver" && -x "$dir/etcd" ]]; then export TOPOGUARD_ENVTEST_BIN="$dir"; fi
  done
fi
echo "== pytest tests/chart (apiserver for helm install/upgrade: ${TOPOGUARD_ENVTEST_BIN:-none, those tests skip})"
.venv/bin/pytest -q -p no:cacheprovider tests/chart
