"""The connections a distributed training framework needs between the replicas of one job.

Three shapes cover every supported framework (research/kubeflow-formats.md):

- rendezvous: every pod dials the coordinator on one port (torch `MASTER_PORT`, XGBoost's
  tracker, Paddle's `PADDLE_MASTER`, JAX's coordinator, Trainer's 29500);
- all-to-all: TensorFlow's `TF_CONFIG` lists every task and each dials each on its port;
- launcher: MPI's launcher reaches every worker (ssh for mpi-operator v2beta1).

On top of these, collective libraries (NCCL, Gloo, most MPI transports) open connections between
all ranks to listeners bound on port 0, so on ports the kernel picks from its ephemeral range
(`EPHEMERAL_PORTS`, 32768-60999 unless the pods' sysctl says otherwise): the GPU replicas (and the
coordinator) need each other on that range (purpose "collective"), not on every port. The range is
the setting `collectivePorts`; a job that pins its ports (e.g. its pods set the namespaced sysctl
`net.ipv4.ip_local_port_range`) says which with the annotation `topoguard.io/collective-ports`
(`collective_ports`). The frameworks' fixed ports are the flows above, never folded into the range.
Not in the default range: Open MPI's TCP BTL (the first free port from 1024, `btl_tcp_port_min_v4`)
and XGBoost's rabit before 2.0 (from 9010); such jobs name their range with the annotation (README,
"Limits and known gaps").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from app.jobs.errors import FieldError, join_path
from app.models.job import Flow
from app.models.labels import COLLECTIVE_PORTS_ANNOTATION
from app.models.network import PortRange

SSH_PORT = 22


class Member(NamedTuple):
    """The part of a replica the flow builder needs."""

    key: str
    pods: int
    gpus: int


def has_peer(members: Sequence[Member]) -> bool:
    """True when the job runs more than one pod, so there is anything to connect."""
    return sum(m.pods for m in members) > 1


def build_rendezvous(members: Sequence[Member], coordinator: str, port: int, *, port_name: str = "") -> list[Flow]:
    """Every pod of every replica → the coordinator's pod on `port`.

    A replica flows to itself only when it has a pod besides the coordinator's (Worker-only
    PyTorchJob: workers 1..n-1 → worker-0).
    """
    ports = PortRange.single(port)
    return [
        Flow(m.key, coordinator, ports, "TCP", "rendezvous", port_name)
        for m in members
        if m.pods > 0 and (m.key != coordinator or m.pods > 1)
    ]


def build_all_to_all(members: Sequence[Member], ports: dict[str, tuple[int, str]]) -> list[Flow]:
    """Every replica → every replica on the destination's own port (`ports[key] = (port, name)`)."""
    return [
        Flow(src.key, dst.key, PortRange.single(ports[dst.key][0]), "TCP", "all-to-all", ports[dst.key][1])
        for src, dst in _pairs([m for m in members if m.pods > 0])
    ]


def build_launcher(launcher: str, workers: Iterable[Member], port: int, *, port_name: str = "") -> list[Flow]:
    """The MPI launcher → every worker on the remote-shell port."""
    ports = PortRange.single(port)
    return [
        Flow(launcher, w.key, ports, "TCP", "launcher", port_name) for w in workers if w.pods > 0 and w.key != launcher
    ]


def build_collective(
    members: Sequence[Member], coordinator: str, ports: PortRange, *, cpu_collectives: bool = True
) -> list[Flow]:
    """TCP `ports` (the collectives' range, `collective_ports`) between the replicas that take part in
    collectives, both ways.

    The participants are the replicas that ask for GPUs plus the coordinator. When no replica
    asks for GPUs, every replica takes part if the framework's CPU collectives open their own
    sockets (Gloo, MPI's TCP transport, Rabit), and none does if they run over the framework's
    own port (`cpu_collectives=False`: TensorFlow's ring all-reduce goes through its gRPC server).
    """
    active = [m for m in members if m.pods > 0]
    if any(m.gpus > 0 for m in active):
        active = [m for m in active if m.gpus > 0 or m.key == coordinator]
    elif not cpu_collectives:
        return []
    return [Flow(src.key, dst.key, ports, "TCP", "collective") for src, dst in _pairs(active)]


def collective_ports(raw: Any, default: PortRange) -> tuple[PortRange, list[FieldError]]:
    """The range a job's collectives use: its annotation `topoguard.io/collective-ports` (`40000-40100`)
    when it has one, else `default` (settings `collectivePorts`); an unusable annotation is a FieldError
    naming it. Metadata of the wrong type is left to the adapter's own reader, which reports it."""
    metadata = raw.get("metadata") if type(raw) is dict or isinstance(raw, Mapping) else None
    annotations = metadata.get("annotations") if type(metadata) is dict or isinstance(metadata, Mapping) else None
    value = (annotations.get(COLLECTIVE_PORTS_ANNOTATION)
             if type(annotations) is dict or isinstance(annotations, Mapping) else None)
    if not isinstance(value, str):
        return default, []
    try:
        return PortRange.parse(value), []
    except ValueError as e:
        where = join_path("metadata.annotations", COLLECTIVE_PORTS_ANNOTATION)
        return default, [FieldError(where, f"{e}; it names the TCP ports the job's NCCL/Gloo/MPI "
                                           f"collectives use, e.g. \"40000-40100\"")]


def _pairs(members: Sequence[Member]) -> list[tuple[Member, Member]]:
    """Ordered pairs, a replica with itself only when it has two or more pods."""
    return [(a, b) for a in members for b in members if a.key != b.key or b.pods > 1]
