"""Audit benchmark: one pass of `engine.audit` over the running training jobs of a large cluster.

Run: `.venv/bin/python bench/bench_audit.py [--quick | --full]` (`--quick`, the default: 200 jobs,
100 policies; `--full`: the issue-12 target, 2,000 running jobs of 16 pods each with 1,000 policies).
Pinned to one core. Prints the snapshot build (projection, once per change in the cache), the
first pass on a fresh snapshot (cold: policy index, zone index, pod matching and every verdict
computed) and a later pass on the same snapshot, against the 2 s target.

The synthetic cluster: 100 namespaces (opted in) with 20 PyTorchJobs each (1 CPU Master + 15
one-GPU Workers, pods labelled `app=<job>` and `zone=<zone>`), 3 zones of 8-GPU nodes; per namespace
three intra-zone CNPs (the seed lab's) and service CNPs selecting `app=svc-N` from `app=client-N`, so
policies read the `app` label and every job's pods look different to them (no verdict shared across
jobs). One job in twenty runs its Master in another zone (split and blocked), one in fifty has two
Workers still pending.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.cache.files import build_snapshot
from app.config import Settings
from app.engine.audit import audit

TARGET_SECONDS = 2.0
ZONES = ("zone-a", "zone-b", "zone-c")
NAMESPACES = 100
GPUS_PER_NODE = 8
KF = "training.kubeflow.org"


def _cnp(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def policies(namespaces: list[str], count: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for ns in namespaces:
        for zone in ZONES:
            out.append(_cnp(f"allow-intra-{zone}", ns, {
                "endpointSelector": {"matchLabels": {"zone": zone}},
                "ingress": [{"fromEndpoints": [{"matchLabels": {"zone": zone}}]}],
                "egress": [{"toEndpoints": [{"matchLabels": {"zone": zone}}]},
                           {"toEndpoints": [{"matchLabels": {"io.kubernetes.pod.namespace": "kube-system"}}]}],
            }))
    i = 0
    while len(out) < count:
        ns = namespaces[i % len(namespaces)]
        out.append(_cnp(f"svc-{i}", ns, {
            "endpointSelector": {"matchLabels": {"app": f"svc-{i}"}},
            "ingress": [{"fromEndpoints": [{"matchLabels": {"app": f"client-{i}"}}],
                         "toPorts": [{"ports": [{"port": str(1000 + i % 5000), "protocol": "TCP"}]}]}],
        }))
        i += 1
    return out[:count]


def template(labels: dict[str, str], gpus: int) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "pytorch", "image": "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return {"metadata": {"labels": labels}, "spec": {"containers": [container]}}


def cluster(jobs: int, pods_per_job: int, policy_count: int) -> list[dict[str, Any]]:
    namespaces = [f"team-{n}" for n in range(NAMESPACES)]
    workers = pods_per_job - 1
    gpu_nodes = -(-jobs * workers // GPUS_PER_NODE) + len(ZONES)
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": ns, "labels": {"topoguard.io/enabled": "true"}}} for ns in namespaces
    ]
    node_names = []
    for n in range(gpu_nodes):
        zone = ZONES[n % len(ZONES)]
        node_names.append((f"gpu-{n}", zone))
        objects.append({"apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": f"gpu-{n}", "labels": {"topology.kubernetes.io/zone": zone,
                                                                     "kubernetes.io/hostname": f"gpu-{n}"}},
                        "status": {"allocatable": {"nvidia.com/gpu": str(GPUS_PER_NODE), "cpu": "96"},
                                   "conditions": [{"type": "Ready", "status": "True"}]}})
    objects += policies(namespaces, policy_count)
    by_zone: dict[str, list[str]] = {z: [n for n, nz in node_names if nz == z] for z in ZONES}
    slot: Counter[str] = Counter()
    for j in range(jobs):
        ns, name = namespaces[j % NAMESPACES], f"train-{j}"
        zone = ZONES[j % len(ZONES)]
        labels = {"app": name, "zone": zone}
        objects.append({
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-{j}", "annotations": {"topoguard.io/zone": zone}},
            "spec": {"pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": template(labels, 0)},
                "Worker": {"replicas": workers, "template": template(labels, 1)},
            }},
            "status": {"conditions": [{"type": "Running", "status": "True"}]},
        })
        split, pending = j % 20 == 7, j % 50 == 3
        for role, index in [("master", 0), *(("worker", i) for i in range(workers))]:
            pod_zone = ZONES[(j + 1) % len(ZONES)] if split and role == "master" else zone
            nodes = by_zone[pod_zone]
            bound = not (pending and role == "worker" and index >= workers - 2)
            node = nodes[(slot[pod_zone] // GPUS_PER_NODE) % len(nodes)] if bound else ""
            if bound:
                slot[pod_zone] += 1
            pod_labels = {**labels, "zone": pod_zone if split else zone,
                          f"{KF}/operator-name": "pytorchjob-controller", f"{KF}/job-name": name,
                          f"{KF}/replica-type": role, f"{KF}/replica-index": str(index)}
            if role == "master":
                pod_labels[f"{KF}/job-role"] = "master"
            spec: dict[str, Any] = template({}, 1 if role == "worker" else 0)["spec"]
            spec["containers"][0]["ports"] = [{"name": "pytorchjob-port", "containerPort": 23456}]
            if node:
                spec["nodeName"] = node
            objects.append({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{name}-{role}-{index}", "namespace": ns, "labels": pod_labels,
                             "ownerReferences": [{"kind": "PyTorchJob", "name": name, "controller": True}]},
                "spec": spec, "status": {"phase": "Running" if node else "Pending"},
            })
    return objects


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="200 jobs x 16 pods, 100 policies (the default)")
    size.add_argument("--full", action="store_true", help="2,000 jobs x 16 pods, 1,000 policies (the target)")
    args = parser.parse_args()
    jobs, pods, policy_count = (2000, 16, 1000) if args.full else (200, 16, 100)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    settings = Settings(zone_identity_label="zone")
    objects = cluster(jobs, pods, policy_count)
    start = time.perf_counter()
    snapshot = build_snapshot(objects, revision="bench")
    built = time.perf_counter() - start
    def timed() -> tuple[tuple[Any, ...], float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        got = audit(snapshot, settings)
        return got, time.perf_counter() - wall, time.process_time() - cpu

    result, cold, cold_cpu = timed()
    warm = [timed() for _ in range(3)]
    assert all(again == result for again, _, _ in warm)
    found = Counter(f.type for a in result for f in a.findings)
    print(f"cluster: {jobs:,} running jobs x {pods} pods ({len(snapshot.pods):,} pods), {len(snapshot.policies):,} "
          f"policies, {len(snapshot.nodes):,} nodes; one core")
    print(f"snapshot build (projections, job shapes): {built:.2f} s")
    print(f"audit pass, cold (fresh snapshot):  {cold:.3f} s wall, {cold_cpu:.3f} s CPU   target < "
          f"{TARGET_SECONDS:.0f} s: {'OK' if cold_cpu < TARGET_SECONDS else 'OVER'} "
          "(on CPU time: the machine may be shared)")
    print(f"audit pass, warm (same snapshot):   {min(w for _, w, _ in warm):.3f} s wall, "
          f"{min(c for _, _, c in warm):.3f} s CPU")
    print(f"jobs audited {len(result):,}, with findings {sum(1 for a in result if a.findings):,}; "
          f"findings {dict(sorted(found.items()))}")


if __name__ == "__main__":
    main()
