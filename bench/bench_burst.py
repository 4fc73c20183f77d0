"""A burst of admissions against one snapshot with the reservation ledger: where the jobs go, and what a review costs.

    .venv/bin/python bench/bench_burst.py [--quick]

The cluster: three zones of 8-GPU nodes with the NVIDIA taint, idle, of 8, 4 and 2 nodes (64, 32 and
16 GPUs), no policies. The burst: 100 PyTorchJobs of 8 GPUs (1 CPU Master + 2 Workers x 4), reviewed
one after the other through the server's own pipeline (`pipeline.answer` with one `InFlight`, as a
replica runs them): each admitted job holds its GPUs in flight, so the next review sees them taken.
The first 14 fill the zones (8 + 4 + 2 jobs), the rest wait spread over them in proportion to their GPUs.

Run once with no stored jobs, and once with 5,000 stored, pinned jobs in another namespace (see
`_stored`: 500 of them hold reservations, in a zone the burst cannot use, so the spread stays that of
an empty ledger): the ledger is built once per snapshot (its cost is printed apart) and a review reads
its per-zone totals, so the per-review cost must not grow with the jobs in the cluster.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from typing import Any

from app.admission import pipeline
from app.admission.inflight import InFlight
from app.cache.files import build_snapshot
from app.config import Settings
from app.engine import ledger
from app.models.cluster import Snapshot

NS = "ml"
ZONES = {"zone-a": 8, "zone-b": 4, "zone-c": 2}  # 8-GPU nodes per zone
GPU = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}


def _node(zone: str, i: int) -> dict[str, Any]:
    name = f"{zone}-gpu-{i}"
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone}},
        "spec": {"taints": [GPU_TAINT]},
        "status": {"allocatable": {GPU: "8"}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _template(gpus: int) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "pytorch", "image": "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime"}
    spec: dict[str, Any] = {"containers": [container]}
    if gpus:
        container["resources"] = {"limits": {GPU: gpus}}
        spec["tolerations"] = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
    return {"spec": spec}


def pytorchjob(name: str, namespace: str = NS, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace, **meta},
        "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": _template(0)},
                                         "Worker": {"replicas": 2, "template": _template(4)}}},
    }


def _stored(i: int) -> dict[str, Any]:
    """A stored job elsewhere, pinned to a zone of the burst: half finished, half suspended (neither reserves),
    except every tenth, pinned to `zone-old` whose nodes are gone: those reserve, in a zone no review ranks."""
    zone = "zone-old" if i % 10 == 0 else list(ZONES)[i % 3]
    job = pytorchjob(f"old-{i}", "archive", annotations={"topoguard.io/zone": zone})
    if i % 2 == 1:
        job["spec"]["runPolicy"] = {"suspend": True}
    elif zone != "zone-old":
        job["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    return job


def build_cluster(stored_jobs: int) -> Snapshot:
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n, "labels": {"topoguard.io/enabled": "true"}}}
        for n in (NS, "archive")
    ]
    objects += [_node(zone, i) for zone, count in ZONES.items() for i in range(count)]
    objects += [_stored(i) for i in range(stored_jobs)]
    return build_snapshot(objects, revision=f"burst-{stored_jobs}")


def review(job: dict[str, Any], uid: str) -> pipeline.ReviewRequest:
    gvk = {"group": "kubeflow.org", "version": "v1", "kind": "PyTorchJob"}
    return pipeline.parse_review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": gvk, "resource": {**gvk, "resource": "pytorchjobs"}, "name": job["metadata"]["name"],
        "namespace": NS, "operation": "CREATE", "object": job, "dryRun": False}})


def burst(snapshot: Snapshot, settings: Settings, size: int) -> tuple[list[str], list[float]]:
    flight = InFlight()
    zones, times = [], []
    requests = [review(pytorchjob(f"sweep-{i}"), f"uid-{i}") for i in range(size)]
    for request in requests:
        start = time.perf_counter()
        outcome = pipeline.answer(request, snapshot=snapshot, settings=settings, operation="mutate",
                                   in_flight=flight)
        times.append(time.perf_counter() - start)
        if outcome.decision is None or outcome.decision.zone is None:
            raise SystemExit(f"bench: a job of the burst was not admitted: {outcome.review}")
        zones.append(outcome.decision.zone)
    return zones, times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round (CI smoke)")
    opts = parser.parse_args()
    rounds = 1 if opts.quick else 5
    settings = Settings()
    gpus = {zone: 8 * n for zone, n in ZONES.items()}
    print(f"zones (GPUs): {gpus}; burst of 100 jobs x 8 GPUs = 800 GPUs asked of {sum(gpus.values())}")
    print("stored jobs   ledger ms   review p50 ms   review p95 ms   first 14 (fit now)            all 100")
    for stored in (0, 5000):
        snapshot = build_cluster(stored)
        start = time.perf_counter()
        ledger.ledger_of(snapshot, gpu_resources=settings.gpu_resources)
        built = time.perf_counter() - start
        times: list[float] = []
        for _ in range(rounds):
            zones, round_times = burst(snapshot, settings, 100)
            times += round_times
        first = dict(sorted(Counter(zones[:14]).items()))
        every = dict(sorted(Counter(zones).items()))
        p95 = statistics.quantiles(times, n=20)[-1]
        print(f"{stored:>11}   {built * 1000:9.2f}   {statistics.median(times) * 1000:13.3f}   "
              f"{p95 * 1000:13.3f}   {first!s:<28}  {every}")
        if first != {"zone-a": 8, "zone-b": 4, "zone-c": 2}:
            print("bench: the jobs that fit now did not fill the zones", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
