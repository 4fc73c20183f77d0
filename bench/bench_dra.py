"""DRA device counting at scale: 5,000 nodes x 8 GPUs published as ResourceSlices (40,000 devices) and 20,000
allocated ResourceClaims, as NVIDIA's DRA driver publishes them (every device with its own uuid and PCI bus id).

    .venv/bin/python bench/bench_dra.py [--nodes 5000] [--gpus 8] [--claims 20000]

Reported:
- projecting the raw objects (what the watch cache does once per object) and the projections' memory
  (tracemalloc: what the snapshot holds for them);
- building the device inventory cold (every slice evaluated: the first snapshot), and again after one claim
  changed (the next snapshot: per-slice selections reused, allocations recounted), and for an unchanged
  snapshot's successor (the whole inventory reused);
- what `offers()` and `claim_demand()` then cost a review.
Not part of `make test`: it only prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import threading
import time
import tracemalloc
from types import MappingProxyType
from typing import Any

from app.cache import projections
from app.engine import devices
from app.models.cluster import NodeInfo, Snapshot
from app.models.dra import PodClaimRef

GPU_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
             "spec": {"extendedResourceName": "nvidia.com/gpu", "selectors": [{"cel": {"expression": (
                 "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'")}}]}}
MIG_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "mig.nvidia.com"},
             "spec": {"selectors": [{"cel": {"expression": (
                 "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'")}}]}}
TEMPLATE = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "eight-gpus", "namespace": "team-a"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 8}}]}}}}


def node_slice(node: int, gpus: int) -> dict[str, Any]:
    name = f"gpu-{node:05d}"
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{name}-gpu.nvidia.com-x7k2p"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": name,
                     "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {
                         "type": {"string": "gpu"}, "uuid": {"string": f"GPU-{node:08x}-{i:04x}-7660-471eed407181"},
                         "productName": {"string": "NVIDIA H100 80GB HBM3"}, "brand": {"string": "Nvidia"},
                         "architecture": {"string": "Hopper"}, "cudaComputeCapability": {"version": "9.0.0"},
                         "driverVersion": {"version": "580.126.20"}, "cudaDriverVersion": {"version": "13.0.0"},
                         "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x18 + i:02x}:00.0"},
                         "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{i // 2:02x}"}},
                         "capacity": {"memory": {"value": "80Gi"}}} for i in range(gpus)]}}


def claim(index: int, nodes: int, gpus: int) -> dict[str, Any]:
    node, device = index % nodes, (index // nodes) % gpus
    name = f"gpu-{node:05d}"
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"trainer-{index}-gpus-abcde", "namespace": "team-a",
                         "annotations": {"resource.kubernetes.io/pod-claim-name": "gpus"}},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                           "count": 1}}]}},
            "status": {"allocation": {
                "devices": {"results": [{"request": "gpus", "driver": "gpu.nvidia.com", "pool": name,
                                         "device": f"gpu-{device}"}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [name]}]}]}},
                "reservedFor": [{"resource": "pods", "name": f"trainer-{index}", "uid": f"uid-{index}"}]}}


def timed(what: str, run: Any, repeat: int = 1) -> Any:
    """Wall and CPU time (this process's: on a shared machine the wall time includes waiting for a core)."""
    took, cpu, result = [], [], None
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.process_time()
        result = run()
        took.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    print(f"  {what:58s} {statistics.median(took) * 1000:9.1f} ms wall {statistics.median(cpu) * 1000:9.1f} ms cpu"
          + (f" (median of {repeat})" if repeat > 1 else ""))
    return result


def fresh(snapshot: Snapshot, **fields: Any) -> Snapshot:
    return dataclasses.replace(snapshot, **fields, _memo={}, _memo_lock=threading.Lock(), _memo_building={})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--claims", type=int, default=20000)
    args = parser.parse_args()
    # Through JSON, as a list response arrives: every object's strings its own (the projections share them).
    raw_slices = json.loads(json.dumps([node_slice(n, args.gpus) for n in range(args.nodes)]))
    raw_claims = json.loads(json.dumps([claim(i, args.nodes, args.gpus) for i in range(args.claims)]))
    print(f"{args.nodes} nodes x {args.gpus} GPUs = {args.nodes * args.gpus} devices, {args.claims} allocated claims")

    timed("project the ResourceSlices", lambda: tuple(map(projections.project_resource_slice, raw_slices)))
    timed("project the ResourceClaims", lambda: tuple(map(projections.project_resource_claim, raw_claims)))
    gc.collect()
    tracemalloc.start()  # again, measured: tracemalloc slows what it traces several times over
    before = tracemalloc.get_traced_memory()[0]
    slices = tuple(map(projections.project_resource_slice, raw_slices))
    claims = tuple(map(projections.project_resource_claim, raw_claims))
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    gc.freeze()  # as the watch cache freezes what it publishes (a full collection would visit every device)
    print(f"  {'projections held (slices + claims)':58s} {held / 2**20:9.1f} MiB")
    print(f"  {'load average (1 min) while measuring':58s} {os.getloadavg()[0]:9.1f}")

    nodes = tuple(NodeInfo(f"gpu-{n:05d}", MappingProxyType({"topology.kubernetes.io/zone": f"zone-{n % 3}"}), (),
                           MappingProxyType({}), True, False) for n in range(args.nodes))
    classes = MappingProxyType({c["metadata"]["name"]: projections.project_device_class(c)
                                for c in (GPU_CLASS, MIG_CLASS)})
    template = projections.project_claim_template(TEMPLATE)
    snapshot = Snapshot(nodes=nodes, resource_slices=slices, resource_claims=claims, device_classes=classes,
                        claim_templates=MappingProxyType({("team-a", "eight-gpus"): template}))

    def inventory(s: Snapshot) -> devices.DeviceInventory:
        return devices.device_inventory(s, gpu_device_classes=devices.GPU_DEVICE_CLASS_DEFAULTS,
                                        gpu_resources=("nvidia.com/gpu",))

    built = timed("inventory, cold (every slice's devices evaluated)", lambda: inventory(snapshot))
    one_more = (*claims[:-1], projections.project_resource_claim(claim(args.claims, args.nodes, args.gpus)))
    timed("inventory after one claim changed (slices' matches reused)",
          lambda: inventory(fresh(snapshot, resource_claims=tuple(list(one_more)))), repeat=3)
    timed("inventory of a successor with the same DRA objects (reused)",
          lambda: inventory(fresh(snapshot, revision="next")), repeat=3)
    free = sum(built.offers(n.name).get(devices.selection_key("gpu.nvidia.com"), (0, 0))[1] for n in nodes)
    print(f"  free GPUs counted: {free} of {args.nodes * args.gpus}")
    timed("offers() for every node", lambda: [built.offers(n.name) for n in nodes])
    timed("claim_demand() of a pod naming its claim template",
          lambda: devices.claim_demand(snapshot, built, "team-a", [PodClaimRef("gpus", template="eight-gpus")]),
          repeat=5)


if __name__ == "__main__":
    main()
