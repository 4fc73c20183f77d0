"""Pieces every adapter shares: the job's own metadata and assembling a `Replica`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from app.jobs.errors import FieldError
from app.jobs.records import build_record, build_tuple
from app.jobs.templates import NamedContainerPort, PodFacts, is_object, read_mapping, read_str, read_string_map
from app.models.cluster import ContainerPort
from app.models.job import Replica


class JobMeta(NamedTuple):
    """metadata.name/namespace/annotations of the job itself."""

    name: str  # "" only when the apiserver will generate it (generateName, mutating admission)
    namespace: str
    annotations: Mapping[str, str]


def read_job_meta(raw: Mapping[str, Any], namespace: str, errors: list[FieldError]) -> JobMeta:
    """The job's identity; `namespace` (the AdmissionRequest's) fills an absent metadata.namespace.

    NB: on CREATE with `generateName` the apiserver names the object only after mutating
    admission, so `name` may be empty; adapters then leave name-derived pod labels out rather
    than guess them.
    """
    metadata = raw.get("metadata")
    if type(metadata) is not dict:
        metadata = read_mapping(metadata, "metadata", errors)
    written = metadata.get("name")
    name = written if type(written) is str else read_str(written, "metadata.name", errors)
    generate_name = metadata.get("generateName")
    if generate_name is not None:
        generate_name = read_str(generate_name, "metadata.generateName", errors)
    if not written and not generate_name:
        errors.append(FieldError("metadata.name", "is required"))
    own_namespace = metadata.get("namespace")
    if type(own_namespace) is not str:
        own_namespace = read_str(own_namespace, "metadata.namespace", errors)
    annotations = read_string_map(metadata.get("annotations"), "metadata.annotations", errors)
    return build_tuple(JobMeta, (name, own_namespace or namespace, annotations))


def make_replica(
    *,
    key: str,
    role: str,
    count: int,
    template_path: str,
    template: Any,
    facts: PodFacts,
    operator_labels: Mapping[str, str],
    index_label: str,
    is_coordinator: bool,
    leader_labels: Mapping[str, str] | None = None,
    ports: tuple[ContainerPort, ...] | None = None,
) -> Replica:
    """A `Replica`; operator labels win over template labels, as the operators merge them.

    `leader_labels` are carried by pod index 0 only; with a single pod they join `pod_labels`.
    """
    template_labels, gpus, named_ports, _, service_account, host_network, placement, requests, claims = facts
    leader = dict(leader_labels or {})
    labels = {**template_labels, **operator_labels}
    if count == 1:
        labels.update(leader)
    return build_record(  # every field, in declaration order (records.py)
        Replica,
        {
            "key": key,
            "role": role,
            "count": count,
            "template_path": template_path,
            "template": template if type(template) is dict or is_object(template) else {},
            "pod_labels": labels,
            "index_label": index_label,
            "gpus": dict(gpus),
            "ports": ports if ports is not None else tuple([p.port for p in named_ports]),
            "service_account": service_account,
            "host_network": host_network,
            "placement": placement,
            "is_coordinator": is_coordinator,
            "leader_labels": leader,
            "seed": {},
            "requests": dict(requests),
            "claims": claims,
        },
    )


def find_named_port(ports: tuple[NamedContainerPort, ...], container: str, name: str) -> ContainerPort | None:
    """The port called `name` in `container`."""
    for p in ports:
        if p.container == container and p.port.name == name:
            return p.port
    return None
