#!/usr/bin/env bash
# End-to-end on kind: build the image, install the chart, submit the seed lab's jobs, check what
# topoguard did. Needs docker, kind, kubectl, helm; creates the lab with hack/kind-up.sh if needed.
#
#   hack/e2e-kind.sh                 run every check, exit 1 on the first failure
#   KEEP_CLUSTER=1 hack/e2e-kind.sh  (default) the cluster stays up; hack/kind-down.sh removes it
#
# Run by `TOPOGUARD_E2E_KIND=1 .venv/bin/pytest tests/chart/test_kind.py` (skipped otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/kind/lib.sh
source hack/kind/lib.sh
if ! command -v helm >/dev/null; then PATH="$(dirname "$(hack/helm.sh)"):$PATH"; fi
need docker kind kubectl helm

passed=0
check() {  # check "description" command...
  local what="$1"; shift
  if "$@"; then passed=$((passed + 1)); echo "  ok: $what"; else die "FAILED: $what"; fi
}

kind get clusters 2>/dev/null | grep -qx "$CLUSTER" || hack/kind-up.sh

log "building $IMAGE and loading it into kind"
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

log "installing the chart"
helm upgrade --install topoguard charts/topoguard --kube-context "$CONTEXT" \
  --namespace "$TOPOGUARD_NAMESPACE" --create-namespace \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
  --set config.zoneIdentityLabel=zone --set networkPolicy.enabled=true \
  --wait --timeout 5m
kc -n "$TOPOGUARD_NAMESPACE" rollout status deployment/topoguard --timeout=180s

ca_bundle() { kc get mutatingwebhookconfiguration topoguard -o jsonpath='{.webhooks[0].clientConfig.caBundle}'; }
secret_ca() { kc -n "$TOPOGUARD_NAMESPACE" get secret topoguard-tls -o jsonpath='{.data.ca\.crt}'; }
same_ca() { [[ -n "$(ca_bundle)" && "$(ca_bundle)" == "$(secret_ca)" ]]; }
check "webhook caBundle is the CA in the Secret" same_ca

log "the lab job: pinned to the one zone that is open and has GPUs"
kc -n ml-demo delete pytorchjob --all --wait >/dev/null
kc apply -f deploy/samples/pytorchjob-lab.yaml
job_jsonpath() { kc -n ml-demo get pytorchjob ml-training -o jsonpath="$1"; }
check "annotation topoguard.io/zone=zone-a" test "$(job_jsonpath '{.metadata.annotations.topoguard\.io/zone}')" = zone-a
check "annotation topoguard.io/decision is set" test -n "$(job_jsonpath '{.metadata.annotations.topoguard\.io/decision}')"
check "Master's zone identity label rewritten to zone-a" \
  test "$(job_jsonpath '{.spec.pytorchReplicaSpecs.Master.template.metadata.labels.zone}')" = zone-a
check "Master pinned to zone-a by nodeAffinity" \
  grep -q zone-a <<<"$(job_jsonpath '{.spec.pytorchReplicaSpecs.Master.template.spec.affinity.nodeAffinity}')"
check "Master tolerates the GPU-pool taint" \
  grep -q '"key":"gpu"' <<<"$(job_jsonpath '{.spec.pytorchReplicaSpecs.Master.template.spec.tolerations}')"

if kc get crd pytorchjobs.kubeflow.org >/dev/null && kc -n kubeflow get deployment training-operator >/dev/null 2>&1; then
  log "the operator's pods all land in zone-a"
  # Master + 2 Workers. The fake GPUs become allocatable at the kubelet's next status update.
  scheduled() {
    kc -n ml-demo get pods -l training.kubeflow.org/job-name=ml-training -o jsonpath='{.items[*].spec.nodeName}' | wc -w
  }
  deadline=$((SECONDS + 300))
  until (( $(scheduled) >= 3 )); do
    ((SECONDS < deadline)) || die "the lab job's pods were not all scheduled within 300 s"
    sleep 5
  done
  pod_zones() {
    local node
    for node in $(kc -n ml-demo get pods -l training.kubeflow.org/job-name=ml-training -o jsonpath='{.items[*].spec.nodeName}'); do
      kc get node "$node" -o jsonpath='{.metadata.labels.topology\.kubernetes\.io/zone}{"\n"}'
    done | sort -u
  }
  check "every replica scheduled in zone-a" test "$(pod_zones)" = zone-a
fi

log "a job split across zones by construction is refused, naming the zones"
split_out="$(kc apply -f deploy/samples/pytorchjob-split.yaml 2>&1 || true)"
while IFS= read -r line; do echo "    $line"; done <<<"$split_out"
check "split job refused" grep -q 'denied the request' <<<"$split_out"
check "refusal names zone-b" grep -q 'zone-b' <<<"$split_out"
check "split job was not created" bash -c "! kubectl --context $CONTEXT -n ml-demo get pytorchjob split >/dev/null 2>&1"

log "a namespace that did not opt in is left alone"
kc create namespace topoguard-e2e-off --dry-run=client -o yaml | kc apply -f - >/dev/null
sed 's/namespace: ml-demo/namespace: topoguard-e2e-off/' deploy/samples/pytorchjob-lab.yaml | kc apply -f - >/dev/null
check "no topoguard annotation outside opted-in namespaces" \
  test -z "$(kc -n topoguard-e2e-off get pytorchjob ml-training -o jsonpath='{.metadata.annotations.topoguard\.io/zone}')"
kc delete namespace topoguard-e2e-off --wait=false >/dev/null

log "helm upgrade keeps the certificate"
before="$(ca_bundle)"
helm upgrade topoguard charts/topoguard --kube-context "$CONTEXT" --namespace "$TOPOGUARD_NAMESPACE" \
  --reuse-values --wait --timeout 5m >/dev/null
check "caBundle unchanged by an upgrade" test "$(ca_bundle)" = "$before"
check "caBundle still matches the Secret" same_ca

log "e2e-kind: $passed checks passed"
