"""Decision cost per review at 60 and 5,000 nodes x 10 and 1,000 policies, for a 16-replica PyTorchJob.

    .venv/bin/python bench/bench_engine.py [--quick]

Synthetic clusters: three zones; two thirds of the nodes are 8-GPU nodes with the NVIDIA taint,
half of them partly busy (a running pod holds 4 GPUs); the rest are CPU nodes. Policies: one
intra-zone CNP per zone in the job's namespace keyed on the zone identity label (as in the seed lab),
the rest spread over 50 team namespaces plus a few cluster-wide ones, as a large multi-tenant
cluster has them. The job: 1 CPU Master + 15 Workers x 4 GPUs, zoneIdentityLabel=zone.

Reported per cluster: the one-off per-snapshot preparation (zone index + policy index, done when a
snapshot is published, not per request), then the median and p95 of a full evaluation
(`engine.decide_fresh`; flow verdicts memoized per snapshot), the median of `engine.decide` for a later
job of the same shape (the decision memo), and of the whole review path (parse_job + decide +
build_patch), each on the prepared snapshot.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from app import engine, jobs
from app.cache.files import build_snapshot
from app.config import Settings
from app.engine import patches
from app.models.cluster import Snapshot

ZONES = ("zone-a", "zone-b", "zone-c")
NS = "ml"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def _node(i: int) -> dict[str, Any]:
    zone = ZONES[i % len(ZONES)]
    gpu = (i // len(ZONES)) % 3 != 2
    labels = {
        "kubernetes.io/hostname": f"node-{i}",
        "topology.kubernetes.io/zone": zone,
        "node.kubernetes.io/instance-type": "p4d.24xlarge" if gpu else "m6i.8xlarge",
    }
    allocatable = {"cpu": "96", "memory": "1Ti", "pods": "110", **({"nvidia.com/gpu": "8"} if gpu else {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": f"node-{i}", "labels": labels},
        "spec": {"taints": [GPU_TAINT]} if gpu else {},
        "status": {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _busy_pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"busy-{i}", "namespace": "team-0"},
        "spec": {
            "nodeName": f"node-{i}",
            "containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "4"}}}],
        },
        "status": {"phase": "Running"},
    }


def _policy(i: int) -> dict[str, Any]:
    if i < len(ZONES):
        zone = ZONES[i]
        return {
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumNetworkPolicy",
            "metadata": {"name": f"allow-intra-{zone}", "namespace": NS},
            "spec": {
                "endpointSelector": {"matchLabels": {"zone": zone}},
                "ingress": [{"fromEndpoints": [{"matchLabels": {"zone": zone}}]}],
                "egress": [
                    {"toEndpoints": [{"matchLabels": {"zone": zone}}]},
                    {"toEndpoints": [{"matchLabels": {"io.kubernetes.pod.namespace": "kube-system"}}]},
                ],
            },
        }
    if i % 100 == 3:
        return {
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumClusterwideNetworkPolicy",
            "metadata": {"name": f"ccnp-{i}"},
            "spec": {
                "endpointSelector": {"matchLabels": {"app": f"infra-{i}"}},
                "ingress": [{"fromEntities": ["cluster"]}],
            },
        }
    team = f"team-{i % 50}"
    return {
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumNetworkPolicy",
        "metadata": {"name": f"svc-{i}", "namespace": team},
        "spec": {
            "endpointSelector": {"matchLabels": {"app": f"svc-{i}"}},
            "ingress": [
                {
                    "fromEndpoints": [{"matchLabels": {"app": f"client-{i}"}}],
                    "toPorts": [{"ports": [{"port": str(8000 + i % 1000), "protocol": "TCP"}]}],
                }
            ],
        },
    }


def build_cluster(nodes: int, policies: int) -> Snapshot:
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {}}}
        for name in (NS, "kube-system", *(f"team-{t}" for t in range(50)))
    ]
    objects += [_node(i) for i in range(nodes)]
    # zone-a is the busiest: every GPU node there runs a pod holding 4 GPUs, elsewhere every other one.
    objects += [
        _busy_pod(i)
        for i in range(nodes)
        if _node(i)["status"]["allocatable"].get("nvidia.com/gpu")
        and (i % len(ZONES) == 0 or (i // len(ZONES)) % 2 == 0)
    ]
    objects += [_policy(i) for i in range(policies)]
    return build_snapshot(objects, revision=f"bench-{nodes}-{policies}")


def pytorchjob() -> dict[str, Any]:
    def template(role: str, gpus: int) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "pytorch", "image": "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime"}
        spec: dict[str, Any] = {"containers": [container]}
        if gpus:
            container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
            spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        return {"metadata": {"labels": {"app": "llm", "role": role}}, "spec": spec}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "llm", "namespace": NS},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": template("coordinator", 0)},
                "Worker": {"replicas": 15, "template": template("worker", 4)},
            }
        },
    }


def measure(fn: Callable[[], object], *, budget_seconds: float, max_runs: int) -> list[float]:
    fn()  # warm-up (imports, first-call caches)
    times: list[float] = []
    deadline = time.perf_counter() + budget_seconds
    while len(times) < max_runs and (len(times) < 5 or time.perf_counter() < deadline):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs (CI smoke)")
    opts = parser.parse_args()
    budget, runs = (0.5, 20) if opts.quick else (3.0, 200)
    settings = Settings(zone_identity_label="zone")
    raw = pytorchjob()
    print("cluster                     prepare ms   decide p50   decide p95   memo hit p50   review p50   review p95"
          "   runs  zone")
    for nodes in (60, 5000):
        for policies in (10, 1000):
            snapshot = build_cluster(nodes, policies)
            start = time.perf_counter()
            engine.prepare(snapshot, settings)
            prepared = time.perf_counter() - start
            group = jobs.parse_job(raw, gpu_resources=settings.gpu_resources, namespace=NS)
            decision = engine.decide(group, snapshot, settings)
            if not decision.allowed:
                print(f"bench: unexpected denial at {nodes} nodes: {decision.reasons}", file=sys.stderr)
                return 1

            def review(snapshot: Snapshot = snapshot) -> object:
                g = jobs.parse_job(raw, gpu_resources=settings.gpu_resources, namespace=NS)
                d = engine.decide(g, snapshot, settings)
                return patches.build_patch(raw, g, d, settings)

            # A full evaluation (engine.decide_fresh; flow verdicts memoized per snapshot), then what a later
            # job of the same shape costs (engine.decide: the decision memo).
            decide_t = measure(
                lambda s=snapshot, g=group: engine.decide_fresh(g, s, settings), budget_seconds=budget, max_runs=runs
            )
            hit_t = measure(lambda s=snapshot, g=group: engine.decide(g, s, settings), budget_seconds=budget,
                            max_runs=runs)
            review_t = measure(review, budget_seconds=budget, max_runs=runs)

            def p95(xs: list[float]) -> float:
                return statistics.quantiles(xs, n=20)[-1] if len(xs) >= 20 else max(xs)

            label = f"{nodes:>5} nodes x {policies:>4} policies"
            print(
                f"{label:<27} {ms(prepared)}   {ms(statistics.median(decide_t))}     {ms(p95(decide_t))}       "
                f"{ms(statistics.median(hit_t))}     {ms(statistics.median(review_t))}     {ms(p95(review_t))}   "
                f"{len(decide_t):>4}  {decision.zone}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
