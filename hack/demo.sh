#!/usr/bin/env bash
# The seed lab, end to end and offline: `topoguard explain` draws the zone map for the lab's
# PyTorchJob, `topoguard review` answers a real admission.k8s.io/v1 AdmissionReview for it exactly
# as the webhook would, and the returned JSON Patch is applied to show the job before and after.
# Needs only `make install` (the Makefile's demo target depends on it). Exits 0 on success.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN="${BIN:-$ROOT/.venv/bin}"
TOPOGUARD="$BIN/topoguard"
PYTHON="$BIN/python"
CLUSTER=examples/lab-cluster.yaml
JOB=examples/pytorchjob-lab.yaml
CONFIG=examples/config.yaml
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

for tool in "$TOPOGUARD" "$PYTHON"; do
  [[ -x "$tool" ]] || { echo "demo: $tool not found; run 'make install' first" >&2; exit 1; }
done

# Bold headings only on a terminal: a log file or a pipe gets plain text, no ANSI escapes.
if [[ -t 1 ]]; then
  step() { printf '\n\033[1m== %s\033[0m\n\n' "$*"; }
else
  step() { printf '\n== %s\n\n' "$*"; }
fi

step "1. The lab: GPU nodes in zone-a (tainted gpu=present), CPU nodes in zone-b, policies keyed on the pod label 'zone'"
"$PYTHON" - "$CLUSTER" <<'EOF'
import sys, yaml
for o in yaml.safe_load_all(open(sys.argv[1])):
    if o and o["kind"] == "Node":
        labels = o["metadata"]["labels"]
        gpus = o["status"]["allocatable"].get("nvidia.com/gpu", "0")
        taints = ",".join(f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in o.get("spec", {}).get("taints", []))
        print(f"  node {o['metadata']['name']:<8} {labels['topology.kubernetes.io/zone']}  gpus={gpus}  taints={taints or '-'}")
    elif o and "Policy" in o["kind"]:
        print(f"  {o['kind']} {o['metadata']['namespace']}/{o['metadata']['name']}")
EOF

step "2. Without a zone identity label: the coordinator's hard-coded zone=zone-b blocks every zone (exit 1)"
set +e
"$TOPOGUARD" explain "$JOB" --cluster "$CLUSTER"
code=$?
set -e
echo "(topoguard explain exited $code)"
[[ $code -eq 1 ]] || { echo "demo: expected exit 1 without zoneIdentityLabel" >&2; exit 1; }

step "3. With zoneIdentityLabel: zone (examples/config.yaml): the map, the chosen zone and the patch"
"$TOPOGUARD" explain "$JOB" --cluster "$CLUSTER" --config "$CONFIG"

step "4. The webhook's answer for the job (topoguard review JOB.yaml wraps it in the apiserver's CREATE review)"
"$TOPOGUARD" review --cluster "$CLUSTER" --config "$CONFIG" --operation mutate "$JOB" > "$WORK/response.json"
"$PYTHON" -c 'import json, sys, yaml; from app.commands.review import wrap_job
print(json.dumps(wrap_job(yaml.safe_load(open(sys.argv[1])))))' "$JOB" > "$WORK/review.json"
"$PYTHON" - "$JOB" "$WORK/response.json" "$WORK/patched.json" <<'EOF'
import base64, copy, json, sys, yaml

job = yaml.safe_load(open(sys.argv[1]))
response = json.load(open(sys.argv[2]))["response"]
print(f"  allowed={response['allowed']}  patchType={response.get('patchType')}  warnings={response.get('warnings', [])}")
ops = json.loads(base64.b64decode(response["patch"])) if response.get("patch") else []
print(f"  {len(ops)} JSON Patch operations")

def apply(doc, ops):  # RFC 6902 add/replace/remove: enough for a webhook's patch
    doc = copy.deepcopy(doc)
    for op in ops:
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
        parent = doc
        for t in tokens[:-1]:
            parent = parent[int(t)] if isinstance(parent, list) else parent[t]
        last = tokens[-1]
        if op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif isinstance(parent, list):
            parent.append(op["value"]) if last == "-" else parent.insert(int(last), op["value"])
        else:
            parent[last] = op["value"]
    return doc

patched = apply(job, ops)
json.dump(patched, open(sys.argv[3], "w"))

def show(title, doc):
    print(f"\n  --- {title}")
    for name, spec in doc["spec"]["pytorchReplicaSpecs"].items():
        tpl = spec["template"]
        pod = tpl.get("spec", {})
        terms = pod.get("affinity", {}).get("nodeAffinity", {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])
        zones = [e for t in terms for e in t.get("matchExpressions", []) if e["key"] == "topology.kubernetes.io/zone"]
        print(f"  {name:<7} labels.zone={tpl.get('metadata', {}).get('labels', {}).get('zone', '-'):<7} "
              f"zone affinity={[z['values'] for z in zones] or '-'}  "
              f"tolerations={[(t.get('key'), t.get('value'), t.get('effect')) for t in pod.get('tolerations', [])] or '-'}")
    print(f"  annotations: {doc['metadata'].get('annotations', {})}")

show("before", job)
show("after", patched)
if not response["allowed"] or not ops:
    sys.exit("demo: expected an allowed response with a patch")
EOF

step "5. Reviewing the patched job again is a no-op (reinvocationPolicy: IfNeeded), and the validating hook accepts it"
"$PYTHON" - "$WORK/review.json" "$WORK/patched.json" > "$WORK/review2.json" <<'EOF'
import json, sys
review = json.load(open(sys.argv[1]))
review["request"]["object"] = json.load(open(sys.argv[2]))
print(json.dumps(review))
EOF
for op in mutate validate; do
  "$TOPOGUARD" review --cluster "$CLUSTER" --config "$CONFIG" --operation "$op" "$WORK/review2.json" > "$WORK/answer-$op.json"
  "$PYTHON" - "$op" "$WORK/answer-$op.json" <<'EOF2'
import json, sys
op, response = sys.argv[1], json.load(open(sys.argv[2]))["response"]
print(f"  {op}: allowed={response['allowed']} patch={'yes' if response.get('patch') else 'none'}")
if not response["allowed"] or (op == "mutate" and response.get("patch")):
    sys.exit(f"demo: expected the second {op} review to allow without a patch")
EOF2
done

step "done"
