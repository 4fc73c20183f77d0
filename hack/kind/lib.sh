# Shared by hack/kind-*.sh and hack/e2e-kind.sh (sourced, not run).
# shellcheck shell=bash disable=SC2034  # the variables are read by the scripts that source this

CLUSTER="${KIND_CLUSTER:-topoguard}"
CONTEXT="kind-${CLUSTER}"
CILIUM_VERSION="${CILIUM_VERSION:-1.17.6}"
TRAINING_OPERATOR_REF="${TRAINING_OPERATOR_REF:-v1.9.4}"
TOPOGUARD_NAMESPACE="${TOPOGUARD_NAMESPACE:-topoguard-system}"
IMAGE="${TOPOGUARD_IMAGE:-topoguard:dev}"
# node → zone, GPU count (0 = CPU node). The kind node names follow the order in cluster.yaml.
ZONES=(
  "${CLUSTER}-worker:zone-a:4"
  "${CLUSTER}-worker2:zone-a:4"
  "${CLUSTER}-worker3:zone-b:0"
  "${CLUSTER}-worker4:zone-b:0"
)

log() { printf '\033[1m== %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || die "$tool not found (the kind lab needs docker, kind, kubectl and helm)"
  done
}

kc() { kubectl --context "$CONTEXT" "$@"; }
