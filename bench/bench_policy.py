"""Policy benchmark: verdict cost against the number of policies in the snapshot.

Run: `.venv/bin/python bench/bench_policy.py [--quick]`. Prints one row per policy count with the
one-off cost of compiling the index and the per-verdict cost for a single port and for the whole
port range (collective traffic). The verdict cost should stay flat: rules are looked up by
namespace and by a label of their subject selector, not scanned.

The synthetic cluster: policies spread over 50 namespaces (a tenth in the job's namespace), each
selecting its own `app=svc-N` with an ingress allow from `app=client-N` on a port and an egress
allow to the same namespace; plus a fixed handful of cluster-wide policies and the seed lab's
zone policies that actually select the job's pods.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.cache.files import build_snapshot
from app.models.network import ALL_PORTS, Endpoint, PortRange
from app.policy import build_index, check_flow

JOB_NAMESPACE = "ml-demo"
COUNTS = (100, 500, 1000, 2000, 5000)


def _cnp(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def synthetic_policies(count: int) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        namespace = JOB_NAMESPACE if i % 10 == 0 else f"team-{i % 50}"
        out.append(_cnp(f"svc-{i}", namespace, {
            "endpointSelector": {"matchLabels": {"app": f"svc-{i}"}},
            "ingress": [{"fromEndpoints": [{"matchLabels": {"app": f"client-{i}"}}],
                         "toPorts": [{"ports": [{"port": str(1000 + i % 5000), "protocol": "TCP"}]}]}],
            "egress": [{"toEndpoints": [{}]}],
        }))
    zone_policy = {
        "endpointSelector": {"matchLabels": {"zone": "zone-a"}},
        "ingress": [{"fromEndpoints": [{"matchLabels": {"zone": "zone-a"}}]}],
        "egress": [{"toEndpoints": [{"matchLabels": {"zone": "zone-a"}}]},
                   {"toEndpoints": [{"matchLabels": {"io.kubernetes.pod.namespace": "kube-system"}}]}],
    }
    out.append(_cnp("allow-intra-zone-a", JOB_NAMESPACE, zone_policy))
    for j, entity in enumerate(("world", "host", "remote-node")):
        out.append({"apiVersion": "cilium.io/v2", "kind": "CiliumClusterwideNetworkPolicy",
                    "metadata": {"name": f"cw-{j}"},
                    "spec": {"endpointSelector": {}, "ingressDeny": [{"fromEntities": [entity]}],
                             "enableDefaultDeny": {"ingress": False}}})
    return out


def _endpoint(role: str, index: int) -> Endpoint:
    return Endpoint(
        namespace=JOB_NAMESPACE,
        labels={"role": role, "zone": "zone-a", "training.kubeflow.org/replica-index": str(index)},
        namespace_labels={"kubernetes.io/metadata.name": JOB_NAMESPACE},
        name=f"{role}-{index}",
    )


def _per_call_us(fn: Callable[[], object], *, min_seconds: float) -> float:
    """Median of 5 batches, each sized to take about min_seconds / 5."""
    fn()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_seconds / 25:
        fn()
        calls += 1
    batch = max(calls * 5, 10)
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - start) / batch * 1e6)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter timing windows")
    opts = parser.parse_args()
    window = 0.5 if opts.quick else 1.5
    worker, coordinator = _endpoint("worker", 1), _endpoint("master", 0)
    header = ("policies", "index build ms", "verdict 1 port us", "verdict 1-65535 us")
    print(f"{header[0]:>8} | {header[1]:>14} | {header[2]:>17} | {header[3]:>18} | verdict")
    print(f"{'-' * 8}-+-{'-' * 14}-+-{'-' * 17}-+-{'-' * 18}-+--------")
    for count in COUNTS:
        objects = synthetic_policies(count)
        snapshot = build_snapshot(objects)
        start = time.perf_counter()
        build_index(snapshot)
        build_ms = (time.perf_counter() - start) * 1e3
        verdict = check_flow(snapshot, worker, coordinator, PortRange.single(23456), "TCP").verdict
        single = _per_call_us(lambda s=snapshot: check_flow(s, worker, coordinator, PortRange.single(23456), "TCP"),
                              min_seconds=window)
        whole = _per_call_us(lambda s=snapshot: check_flow(s, worker, coordinator, ALL_PORTS, "TCP"),
                             min_seconds=window)
        print(f"{len(objects):>8} | {build_ms:>14.1f} | {single:>17.1f} | {whole:>18.1f} | {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
