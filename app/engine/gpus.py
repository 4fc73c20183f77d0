"""The GPUs of a snapshot and of a job, however the cluster hands them out. PURE.

- `gpu_kinds`: the `gpuResources` setting (names and `prefix*` patterns) resolved against what the nodes
  offer, plus what DRA offers: the extended resource names a GPU DeviceClass maps (KEP-5004) and the
  selection keys of the device counter (engine/devices.py). Every part of the engine that counts GPUs (the
  zone index, the ledger, the audit, the map) takes the resolved names from here, so they count the same GPUs.
- `with_devices`: a job's replicas with the GPUs their DRA claims and mapped extended resources ask for
  added to `gpus` (in selection keys / resource names the zone index offers), and what cannot be judged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

from app.engine import devices
from app.models.cluster import IdentityMemo, Snapshot, canonical
from app.models.job import JobGroup, Replica
from app.models.resources import DEFAULT_GPU_RESOURCES, exact_names, gpu_matcher

DEFAULT_GPU_DEVICE_CLASSES = devices.GPU_DEVICE_CLASS_DEFAULTS

# By the identity of the snapshot's nodes and published devices (the watch cache keeps them while unchanged).
_KINDS: IdentityMemo[tuple[str, ...]] = IdentityMemo(16)


def inventory_of(snapshot: Snapshot, gpu_resources: Sequence[str], gpu_device_classes: Sequence[str]
                 ) -> devices.DeviceInventory | None:
    """The snapshot's DRA device inventory; None when it holds no DeviceClass (nothing to count)."""
    if not snapshot.device_classes:
        return None
    return devices.device_inventory(snapshot, gpu_device_classes=gpu_device_classes, gpu_resources=gpu_resources)


def gpu_kinds(snapshot: Snapshot, gpu_resources: Sequence[str] = DEFAULT_GPU_RESOURCES,
              gpu_device_classes: Sequence[str] | None = None) -> tuple[str, ...]:
    """Every resource name that counts as GPUs here, sorted (see the module docstring); without
    `gpu_device_classes`, only what pods request and nodes' allocatable offer (what the ledger counts)."""
    entries = canonical(tuple(gpu_resources))
    inventory = inventory_of(snapshot, entries, gpu_device_classes) if gpu_device_classes is not None else None

    def build() -> tuple[str, ...]:
        is_gpu = gpu_matcher(entries)
        found = set(exact_names(entries))
        for node in snapshot.nodes:
            found.update(r for r in node.allocatable if is_gpu(r))
            found.update(r for r in node.unparsable if is_gpu(r))
        if inventory is not None:
            found.update(inventory.keys())
            found.update(r for r, c in inventory.mapped.items() if c in inventory.gpu_classes)
        return canonical(tuple(sorted(found)))

    # NB: what is allocated changes no name: keyed by the devices published, so claim churn reuses the names.
    return _KINDS.get((snapshot.nodes, inventory and inventory.published, entries), build)


def dra_key(inventory: devices.DeviceInventory, resource: str) -> str:
    """The selection key whose devices serve `resource` on a node without it in allocatable ("" for none):
    the key itself, or the key of the GPU class that maps the extended resource name."""
    if resource in inventory.key_classes:
        return resource
    mapped = inventory.mapped.get(resource)
    return inventory.key(mapped) if mapped in inventory.gpu_classes else ""


class Devices(NamedTuple):
    """A group as `with_devices` resolves it. (A named tuple: one is made per decision, most often for a group
    with nothing to resolve, and a frozen dataclass's __init__ sets each field through object.__setattr__.)"""

    group: JobGroup
    problems: tuple[str, ...] = ()
    # The NVIDIA ComputeDomain its pods join ("namespace/name", uid) and the replicas whose pods do.
    domain: str = ""
    domain_uid: str = ""
    domain_replicas: tuple[str, ...] = ()


def with_devices(group: JobGroup, snapshot: Snapshot, gpu_resources: Sequence[str],
                 gpu_device_classes: Sequence[str]) -> Devices:
    """The group with each replica's DRA GPUs in `gpus`, and why a replica's GPUs cannot be judged (if so).

    - A request for an extended resource a GPU DeviceClass maps (KEP-5004; `deviceclass.resource.kubernetes.io/
      <class>` or its `extendedResourceName`) is a GPU request of that name.
    - Each claim a pod makes from a ResourceClaimTemplate asks for its GPU devices per pod (`count`; an `All`
      request at least one device). A named ResourceClaim is one claim that all pods share: its devices are
      not counted per pod; a replica with no other GPU asks for one device of its selection, so it is still
      placed where such devices are.
    - Requests for other mapped extended resources are served through DRA too: the scheduler does not compare
      them with allocatable, so neither does the resource check.
    """
    inventory = inventory_of(snapshot, gpu_resources, gpu_device_classes)
    if inventory is None or not any(r.claims or _mapped_requests(r, inventory) for r in group.replicas):
        if any(r.claims for r in group.replicas):
            names = sorted({c.template or c.claim for r in group.replicas for c in r.claims})
            return Devices(group, (f"its pods claim devices through DRA ({', '.join(names)}), but the cluster has "
                                   "no DeviceClass (resource.k8s.io/v1) to count them with",))
        return Devices(group)
    problems: list[str] = []
    domains: dict[str, tuple[str, str]] = {}
    replicas = tuple(_resolved(r, group.namespace, snapshot, inventory, problems, domains) for r in group.replicas)
    domain, uid = next(iter(domains.values()), ("", ""))
    if len({d for d, _ in domains.values()}) > 1:
        problems.append("its pods join more than one ComputeDomain (" +
                        ", ".join(sorted({d for d, _ in domains.values()})) + ")")
    return Devices(dataclasses.replace(group, replicas=replicas), tuple(dict.fromkeys(problems)), domain, uid,
                   tuple(domains))


def _mapped_requests(replica: Replica, inventory: devices.DeviceInventory) -> list[str]:
    return [r for r in replica.requests if r in inventory.mapped]


def _resolved(replica: Replica, namespace: str, snapshot: Snapshot, inventory: devices.DeviceInventory,
              problems: list[str], domains: dict[str, tuple[str, str]]) -> Replica:
    gpus = dict(replica.gpus)
    requests = dict(replica.requests)
    for name in _mapped_requests(replica, inventory):
        if inventory.mapped[name] in inventory.gpu_classes:
            gpus.setdefault(name, requests[name])
        else:
            requests.pop(name)  # served by a DRA driver's devices: not an allocatable to compare
    if replica.claims:
        demand = devices.claim_demand(snapshot, inventory, namespace, replica.claims)
        problems.extend(f"{replica.key}: {p}" for p in demand.problems)
        if demand.compute_domain:
            domains[replica.key] = (demand.compute_domain, demand.compute_domain_uid)
        for key, count in demand.per_pod.items():
            gpus[key] = gpus.get(key, 0) + count
        for key in demand.all_mode:
            gpus[key] = max(gpus.get(key, 0), 1)
        if not gpus:
            for shared in demand.shared:
                for key, count in shared.demand.items():
                    gpus[key] = max(gpus.get(key, 0), min(count, 1))
    for key in gpus:
        if key in inventory.unknown:
            problems.append(f"{replica.key}: cannot count the devices of {key}: {inventory.unknown[key]}")
    if gpus == replica.gpus and requests == replica.requests:
        return replica
    return dataclasses.replace(replica, gpus={r: n for r, n in sorted(gpus.items()) if n > 0}, requests=requests)
