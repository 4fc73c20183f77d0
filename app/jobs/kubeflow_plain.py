"""The kubeflow.org adapter's plain case: a job written the usual way, read in one pass.

`kubeflow.parse` reads a job field by field so that it can name every malformed field with its
path. Nearly every job the webhook sees is well formed and written with exact JSON types; for
those, `read_plain` builds the same `JobGroup` in one pass: no field paths, no error list, no
records between the template and the `Replica`, the frozen records filled in by `build_record`,
and the flows built (by `kubeflow.build_flows`, the same code) once per shape of job. Whatever
it does not recognise as plain (a value of another type or out of range, a value the operator
rejects, a missing coordinator, initContainers, ...) it leaves to `kubeflow.parse`, which reports
the errors or reads the unusual fields. tests/unit/jobs/test_kubeflow_plain.py holds the two to
the same groups.

This runs on every admission review of a kubeflow.org job (issue 4: the per-review work should
cost no more than the HTTP plumbing).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from app.jobs import kubeflow
from app.jobs.kubeflow import Framework
from app.jobs.pointers import escape_json_pointer
from app.jobs.records import build_record
from app.jobs.templates import EMPTY_FACTS, PodFacts, read_plain_pod_template, read_plain_string_map
from app.models import labels as L
from app.models.cluster import BoundedMemo
from app.models.job import Flow, JobGroup, Replica
from app.models.network import PortRange

# One replica spec as read: (key as written, canonical type, pod count, template, template facts).
_PlainSpec = tuple[str, str, int, "dict[str, Any] | None", PodFacts]
# What the flows of a replica depend on: (key, pods (2 for two or more), asks for GPUs, framework port).
_Member = tuple[str, int, bool, int]
_Members = tuple[_Member, ...]
# Flows by shape of job: the reviews of one job, and of most jobs alike, need the same flows (frozen,
# so groups share them). Bounded, as replica keys are user data.
FLOWS_MEMO_SIZE = 1024
_FLOWS: BoundedMemo[tuple[Hashable, ...], tuple[Flow, ...]] = BoundedMemo(FLOWS_MEMO_SIZE)


def parse(
    raw: Any, framework: Framework, *, gpu_resources: Sequence[str], namespace: str, collective_ports: PortRange
) -> JobGroup:
    """`kubeflow.parse`, in one pass when the job is written the usual way."""
    group = read_plain(raw, framework, gpu_resources, namespace, collective_ports)
    if group is not None:
        return group
    return kubeflow.parse(raw, framework, gpu_resources=gpu_resources, namespace=namespace,
                          collective_ports=collective_ports)


def read_plain(
    raw: Any, framework: Framework, gpu_resources: Sequence[str], namespace: str, collective_ports: PortRange
) -> JobGroup | None:
    """The group `kubeflow.parse` gives for `raw`, or None when `raw` is not plain.

    Plain: dicts, lists, strs, ints and bools where the field readers accept them, every value
    one they take without an error, and the templates plain for `read_plain_pod_template`.
    Returns a group only where `kubeflow.parse` returns that same group (same values, dict key
    orders and fresh dicts); never raises on any JSON value.
    """
    if type(raw) is not dict:
        return None
    meta = _read_plain_meta(raw.get("metadata"), namespace)
    spec = raw.get("spec")
    if meta is None or type(spec) is not dict:
        return None
    specs = _read_plain_specs(spec.get(framework.map_key), framework, gpu_resources)
    rendezvous = _read_plain_rendezvous(spec, framework)
    if specs is None or rendezvous is None:
        return None
    coordinator = _choose_coordinator(specs, framework)
    if coordinator is None:
        return None
    name = meta[0]
    group_selector = {L.KF_OPERATOR_NAME: framework.operator_name}
    if name:
        group_selector[L.KF_JOB_NAME] = name.replace("/", "-")
    launcher_is_worker = spec.get("runLauncherAsWorker") is True
    replicas: list[Replica] = []
    members: list[_Member] = []
    for s in specs:
        replica, port = _build_replica(s, framework, name, group_selector, coordinator, launcher_is_worker)
        replicas.append(replica)
        members.append((s[0], s[2] if s[2] < 2 else 2, bool(replica.gpus), port))
    return build_record(
        JobGroup,
        {
            "api_version": framework.api_version,
            "kind": framework.kind,
            "name": name,
            "namespace": meta[1],
            "replicas": tuple(replicas),
            "coordinator": coordinator,
            "flows": _flows(tuple(members), coordinator, framework, rendezvous, replicas, collective_ports),
            "group_selector": group_selector,
            "annotations": meta[2],
            "supports_spread": True,
            "composed_from": "",
        },
    )


def _read_plain_meta(metadata: Any, namespace: str) -> tuple[str, str, dict[str, str]] | None:
    """(name, namespace, annotations) as `groups.read_job_meta` reads them; None if not plain."""
    if type(metadata) is not dict:
        return None
    name, generate_name = metadata.get("name"), metadata.get("generateName")
    own_namespace = metadata.get("namespace")
    annotations = read_plain_string_map(metadata.get("annotations"))
    if (
        not (type(name) is str or name is None)
        or not (type(generate_name) is str or generate_name is None)
        or not (name or generate_name)  # one of the two is required
        or not (type(own_namespace) is str or own_namespace is None)
        or annotations is None
    ):
        return None
    return name or "", own_namespace or namespace, annotations


def _read_plain_specs(replica_map: Any, framework: Framework, gpu_resources: Sequence[str]) -> list[_PlainSpec] | None:
    """The replica specs in map order; None when the map or any spec is not plain."""
    if type(replica_map) is not dict or not replica_map:
        return None
    out: list[_PlainSpec] = []
    folded_types = framework.types_by_folded_name
    seen: set[str] = set()
    for key, body in replica_map.items():
        if type(key) is not str or not key:
            return None
        canonical = folded_types.get(key.lower())
        if canonical is None:
            if framework.api_version == "kubeflow.org/v2beta1":
                continue  # mpi-operator ignores other keys (kubeflow._read_specs)
            if not framework.open_types:
                return None
            canonical = key
        folded = canonical.lower()
        if folded in seen or type(body) is not dict:
            return None
        seen.add(folded)
        count = body.get("replicas")
        if count is None:
            count = framework.default_replicas.get(canonical, 1)
        elif type(count) is not int or count < 0:
            return None
        template = body.get("template")
        facts = EMPTY_FACTS if template is None else read_plain_pod_template(template, gpu_resources)
        if facts is None:
            return None
        out.append((key, canonical, count, template, facts))
    return out


def _read_plain_rendezvous(spec: dict[str, Any], framework: Framework) -> kubeflow.Rendezvous | None:
    """The rendezvous `kubeflow._read_rendezvous` reads; None if not plain."""
    policy = spec.get("elasticPolicy")
    if framework.kind != "PyTorchJob" or policy is None:
        return kubeflow.NO_RENDEZVOUS
    if type(policy) is not dict:
        return None
    port, host = policy.get("rdzvPort"), policy.get("rdzvHost")
    if port is not None and (type(port) is not int or port < 1):
        return None
    if host is not None and type(host) is not str:
        return None
    return kubeflow.Rendezvous(port, bool(host))


def _choose_coordinator(specs: list[_PlainSpec], framework: Framework) -> str | None:
    """The coordinator's key as `kubeflow._choose_coordinator` picks it; None where that is an error."""
    for wanted in framework.coordinator_types:
        for s in specs:
            if s[1] == wanted:
                return s[0]
    if framework.coordinator_required or not specs:
        return None
    return specs[0][0]


def _build_replica(
    spec: _PlainSpec,
    framework: Framework,
    name: str,
    group_selector: dict[str, str],
    coordinator: str,
    launcher_is_worker: bool,
) -> tuple[Replica, int]:
    """(the replica, its framework port), as `kubeflow._build_replica` and `make_replica` make them."""
    key, canonical, count, template, facts = spec
    is_coordinator = key == coordinator
    pod_ports, framework_port = kubeflow.framework_ports(facts, framework)
    role = kubeflow.replica_role(framework, key, canonical, name, group_selector, template=template,
                                 service_account=facts.service_account, is_coordinator=is_coordinator,
                                 launcher_is_worker=launcher_is_worker)
    labels = {**facts.labels, **role.labels}  # operator labels win over the template's (make_replica)
    if count == 1:
        labels.update(role.leader)
    replica = build_record(
        Replica,
        {
            "key": key,
            "role": key.lower(),
            "count": count,
            "template_path": f"{framework.map_pointer}/{escape_json_pointer(key)}/template",
            "template": template if template is not None else {},
            "pod_labels": labels,
            "index_label": role.index_label,
            "gpus": dict(facts.gpus),
            "ports": pod_ports,
            "service_account": role.service_account,
            "host_network": facts.host_network,
            "placement": facts.placement,
            "is_coordinator": is_coordinator,
            "leader_labels": role.leader,
            "seed": {},
            "requests": dict(facts.requests),
            "claims": facts.claims,
        },
    )
    return replica, framework_port


def _flows(
    members: _Members, coordinator: str, framework: Framework, rendezvous: kubeflow.Rendezvous,
    replicas: Sequence[Replica], collective_ports: PortRange,
) -> tuple[Flow, ...]:
    """The group's flows, built by `kubeflow.build_flows` once per shape of job (`_FLOWS`).

    The shape (`members`) holds what the flows depend on: which replicas have no pod, one, or two
    and more (flows.py pairs a replica with itself only then), ask for GPUs, and their ports; with the
    collectives' range.
    """
    key = (framework.shape, framework.port_name, coordinator, rendezvous, members, collective_ports)
    found = _FLOWS.get(key)
    if found is None:
        ports = {m[0]: m[3] for m in members}
        found = tuple(kubeflow.build_flows(replicas, ports, coordinator, framework, rendezvous, collective_ports))
        _FLOWS.put(key, found)
    return found
