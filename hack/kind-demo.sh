#!/usr/bin/env bash
# Before/after demo on the kind lab (the seed lab's story, with topoguard doing the fix):
#   before: the namespace is not opted in; the lab job's Master lands in zone-b, its GPU workers in
#           zone-a, and the zone policies drop the workers' traffic to the Master: Running pods,
#           no training.
#   after:  the namespace is opted in; topoguard pins the whole job to zone-a (and rewrites the
#           `zone` identity label), and refuses a job that is split by construction.
# Needs the lab (hack/kind-up.sh) and topoguard installed with config.zoneIdentityLabel=zone
# (hack/e2e-kind.sh installs it that way).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/kind/lib.sh
source hack/kind/lib.sh
need kubectl

placement() {
  kc -n ml-demo get pods -l training.kubeflow.org/job-name=ml-training \
    -o custom-columns='POD:.metadata.name,NODE:.spec.nodeName,ZONE-LABEL:.metadata.labels.zone,PHASE:.status.phase'
  local node
  for node in $(kc -n ml-demo get pods -l training.kubeflow.org/job-name=ml-training -o jsonpath='{.items[*].spec.nodeName}'); do
    printf '  %s is in %s\n' "$node" "$(kc get node "$node" -o jsonpath='{.metadata.labels.topology\.kubernetes\.io/zone}')"
  done | sort -u
}

run_job() {
  kc -n ml-demo delete pytorchjob ml-training --ignore-not-found --wait >/dev/null
  kc apply -f deploy/samples/pytorchjob-lab.yaml
  sleep "${SETTLE_SECONDS:-30}"
  placement
}

log "BEFORE: ml-demo not opted in"
kc label namespace ml-demo topoguard.io/enabled=false --overwrite >/dev/null
run_job
echo "  → Master in zone-b, workers in zone-a; deny-cross-zone-gpu-traffic drops worker → Master."

log "AFTER: ml-demo opted in (topoguard.io/enabled=true)"
kc label namespace ml-demo topoguard.io/enabled=true --overwrite >/dev/null
run_job
printf '  topoguard.io/zone:     %s\n' "$(kc -n ml-demo get pytorchjob ml-training -o jsonpath='{.metadata.annotations.topoguard\.io/zone}')"
printf '  topoguard.io/decision: %s\n' "$(kc -n ml-demo get pytorchjob ml-training -o jsonpath='{.metadata.annotations.topoguard\.io/decision}')"

log "AFTER: a job split across zones by construction"
kc apply -f deploy/samples/pytorchjob-split.yaml || echo "  → refused at admission, with the reason above."
