"""The collectives' ports: the kernel's ephemeral range by default, settings `collectivePorts`, a job's annotation
`topoguard.io/collective-ports`; the frameworks' fixed ports stay flows of their own (issue 24)."""

from __future__ import annotations

from typing import Any

import pytest

from app import jobs
from app.cache import projections
from app.models.job import JobGroup
from app.models.labels import COLLECTIVE_PORTS_ANNOTATION
from app.models.network import EPHEMERAL_PORTS, PortRange
from tests.unit.jobs.builders import GPU_RESOURCES, container, jobset, load_fixture, rjob, template, trainjob

PINNED = PortRange(40000, 40100)


def annotated(raw: dict[str, Any], value: Any) -> dict[str, Any]:
    return {**raw, "metadata": {**raw["metadata"], "annotations": {COLLECTIVE_PORTS_ANNOTATION: value}}}


def collective_ranges(group: JobGroup) -> set[PortRange]:
    return {f.ports for f in group.flows if f.purpose == "collective"}


def fixed(group: JobGroup) -> set[tuple[str, str, str, str]]:
    return {(f.src, f.dst, str(f.ports), f.purpose) for f in group.flows if f.purpose != "collective"}


def test_default_is_the_kernel_ephemeral_range() -> None:
    # Linux Documentation/networking/ip-sysctl.rst: ip_local_port_range defaults to 32768 60999.
    group = jobs.parse_job(load_fixture("pytorch-mnist-nccl.yaml"), gpu_resources=GPU_RESOURCES)
    assert collective_ranges(group) == {PortRange(32768, 60999)}


@pytest.mark.parametrize(
    "fixture, fixed_flows",
    [
        pytest.param("pytorch-mnist-nccl.yaml", {("Worker", "Master", "23456", "rendezvous")}, id="pytorch"),
        pytest.param("mpi-v2-tensorflow-benchmarks.yaml", {("Launcher", "Worker", "22", "launcher")}, id="mpi ssh"),
        pytest.param("paddle-gpu.yaml", {("Worker", "Worker", "37777", "rendezvous")}, id="paddle"),
    ],
)
def test_settings_and_annotation_set_the_range_and_leave_the_fixed_ports(
    fixture: str, fixed_flows: set[tuple[str, str, str, str]]
) -> None:
    raw = load_fixture(fixture)
    by_setting = jobs.parse_job(raw, gpu_resources=GPU_RESOURCES, collective_ports=PortRange(50000, 50100))
    assert collective_ranges(by_setting) == {PortRange(50000, 50100)}
    assert fixed(by_setting) == fixed_flows
    # The job's own annotation wins over the setting: it is what its pods were told to bind.
    by_job = jobs.parse_job(annotated(raw, "40000-40100"), gpu_resources=GPU_RESOURCES,
                            collective_ports=PortRange(50000, 50100))
    assert collective_ranges(by_job) == {PINNED}
    assert fixed(by_job) == fixed_flows


@pytest.mark.parametrize(
    "value, fragment",
    [
        pytest.param("every", "is not a port or a port range", id="words"),
        pytest.param("40100-40000", "ascending", id="descending"),
        pytest.param("0-40000", "1-65535", id="port 0"),
        pytest.param("40000-", "is not a port or a port range", id="open end"),
    ],
)
def test_unusable_annotation_is_a_field_error_naming_it(value: str, fragment: str) -> None:
    raw = annotated(load_fixture("pytorch-mnist-nccl.yaml"), value)
    with pytest.raises(jobs.InvalidJobError) as caught:
        jobs.parse_job(raw, gpu_resources=GPU_RESOURCES)
    (error,) = caught.value.errors
    assert error.path == f"metadata.annotations[{COLLECTIVE_PORTS_ANNOTATION}]"
    assert fragment in error.message and "e.g. \"40000-40100\"" in error.message


def test_unusable_annotation_is_reported_with_the_job_s_other_errors() -> None:
    raw = annotated(load_fixture("pytorch-mnist-nccl.yaml"), "nope")
    raw["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = -1
    with pytest.raises(jobs.InvalidJobError) as caught:
        jobs.parse_job(raw, gpu_resources=GPU_RESOURCES)
    paths = [e.path for e in caught.value.errors]
    assert paths[0] == f"metadata.annotations[{COLLECTIVE_PORTS_ANNOTATION}]"
    assert "spec.pytorchReplicaSpecs.Worker.replicas" in paths


def test_an_annotation_that_is_not_a_string_is_left_to_the_metadata_reader() -> None:
    raw = annotated(load_fixture("pytorch-mnist-nccl.yaml"), 40000)
    with pytest.raises(jobs.InvalidJobError, match=r"metadata\.annotations"):
        jobs.parse_job(raw, gpu_resources=GPU_RESOURCES)


def test_a_stored_job_s_audit_shape_uses_the_same_range() -> None:
    raw = {**load_fixture("pytorch-mnist-nccl.yaml")}
    raw["metadata"] = {**raw["metadata"], "namespace": "ml"}
    shape = projections.project_job(raw, collective_ports=PortRange(50000, 50100))
    assert shape is not None and shape.shape is not None
    assert {f.ports for f in shape.shape.flows if f.purpose == "collective"} == {PortRange(50000, 50100)}
    pinned = projections.project_job(annotated(raw, "40000-40100"), collective_ports=PortRange(50000, 50100))
    assert pinned is not None and pinned.shape is not None
    assert {f.ports for f in pinned.shape.flows if f.purpose == "collective"} == {PINNED}
    broken = projections.project_job(annotated(raw, "x"))
    assert broken is not None and broken.shape is not None
    assert COLLECTIVE_PORTS_ANNOTATION in broken.shape.problem


def test_trainjob_reads_the_annotation_too() -> None:
    raw = annotated(trainjob(numNodes=2, resourcesPerNode={"limits": {"nvidia.com/gpu": 1}}), "40000-40100")
    group = jobs.parse_job(raw, gpu_resources=GPU_RESOURCES, namespace="ml")
    assert collective_ranges(group) == {PINNED}
    assert ("node", "node", "29500", "rendezvous") in fixed(group)


def test_jobset_peers_reach_the_coordinator_on_the_tcp_ports_it_declares() -> None:
    declared = container(gpus=1, ports=[{"name": "rdzv", "containerPort": 29500},
                                        {"containerPort": 29500, "name": "again"},  # one flow per port
                                        {"containerPort": 5353, "protocol": "UDP"}])
    raw = jobset(rjob("leader", template(declared)), rjob("workers", template(container(gpus=1)), replicas=2),
                 coordinator={"replicatedJob": "leader"})
    group = jobs.parse_job(raw, gpu_resources=GPU_RESOURCES)
    assert fixed(group) == {("workers", "leader", "29500", "rendezvous")}
    assert {f.port_name for f in group.flows if f.purpose == "rendezvous"} == {"rdzv"}
    assert collective_ranges(group) == {EPHEMERAL_PORTS}
    # Without declared ports there is no port to name: only the collectives are required.
    plain = jobs.parse_job(jobset(rjob("leader", template(container(gpus=1))), rjob("w", template(container(gpus=1)))),
                           gpu_resources=GPU_RESOURCES)
    assert fixed(plain) == set()
