#!/usr/bin/env bash
# Create the topoguard kind lab: 2 zones, tainted GPU-like nodes with fake nvidia.com/gpu capacity,
# Cilium as the CNI, the Kubeflow training operator, and the seed lab's zone policies.
# Needs docker, kind, kubectl and helm (hack/helm.sh fetches helm + kubectl on linux/amd64).
#
#   hack/kind-up.sh                 create (or reuse) the cluster
#   SKIP_TRAINING_OPERATOR=1 ...    only the CRDs the webhook needs, no operator (no pods)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/kind/lib.sh
source hack/kind/lib.sh
if ! command -v helm >/dev/null; then PATH="$(dirname "$(hack/helm.sh)"):$PATH"; fi
need docker kind kubectl helm

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  log "reusing kind cluster $CLUSTER"
else
  log "creating kind cluster $CLUSTER"
  kind create cluster --name "$CLUSTER" --config hack/kind/cluster.yaml --wait 0s
fi

log "installing Cilium $CILIUM_VERSION"
helm repo add cilium https://helm.cilium.io >/dev/null 2>&1 || true
helm repo update cilium >/dev/null
helm upgrade --install cilium cilium/cilium --kube-context "$CONTEXT" --namespace kube-system \
  --version "$CILIUM_VERSION" --set image.pullPolicy=IfNotPresent --set ipam.mode=kubernetes \
  --set operator.replicas=1 --wait --timeout 10m
kc wait --for=condition=Ready nodes --all --timeout=300s

log "zones, GPU taint and fake GPU capacity"
for entry in "${ZONES[@]}"; do
  IFS=: read -r node zone gpus <<<"$entry"
  kc label node "$node" --overwrite "topology.kubernetes.io/zone=$zone" \
    "gpu=$([[ $gpus -gt 0 ]] && echo true || echo false)" \
    "node-type=$([[ $gpus -gt 0 ]] && echo gpu || echo cpu)" >/dev/null
  if ((gpus > 0)); then
    kc taint node "$node" gpu=present:NoSchedule --overwrite >/dev/null
    # Extended resources can be advertised by patching node status; the kubelet then reports them
    # as allocatable (kubernetes.io docs: "Advertise Extended Resources for a Node").
    kc patch node "$node" --subresource=status --type=json \
      -p "[{\"op\":\"add\",\"path\":\"/status/capacity/nvidia.com~1gpu\",\"value\":\"$gpus\"}]" >/dev/null
  fi
  echo "  $node: zone=$zone gpus=$gpus"
done

if [[ -n "${SKIP_TRAINING_OPERATOR:-}" ]]; then
  log "PyTorchJob CRD only (SKIP_TRAINING_OPERATOR set)"
  kc apply --server-side -f "https://raw.githubusercontent.com/kubeflow/training-operator/${TRAINING_OPERATOR_REF}/manifests/base/crds/kubeflow.org_pytorchjobs.yaml"
else
  log "Kubeflow training operator $TRAINING_OPERATOR_REF"
  # The v1 operator's documented install (kubeflow/training-operator, now kubeflow/trainer, tag v1.9.x).
  kc apply --server-side -k "github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=${TRAINING_OPERATOR_REF}"
  kc -n kubeflow rollout status deployment/training-operator --timeout=300s
fi

log "seed lab namespace and zone policies (deploy/samples)"
kc apply -f deploy/samples/namespace.yaml -f deploy/samples/zone-policies.yaml
kc get nodes -L topology.kubernetes.io/zone,gpu -o wide
log "lab ready: install topoguard with hack/e2e-kind.sh or follow docs/install.md"
