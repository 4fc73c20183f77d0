"""JobSet: pod counts, coordinator, labels and the collective flows."""

from __future__ import annotations

from typing import Any

import pytest

from app import jobs
from app.jobs import jobset as js
from app.models.job import JobGroup
from tests.unit.jobs.builders import GPU_RESOURCES, container, jobset, rjob, template


def parse(raw: dict[str, Any]) -> JobGroup:
    return jobs.parse_job(raw, gpu_resources=GPU_RESOURCES)


@pytest.mark.parametrize(
    "entry, want",
    [
        pytest.param(rjob("w"), 1, id="defaults: one job of one pod"),
        pytest.param(rjob("w", replicas=3), 3, id="replicas jobs of one pod"),
        pytest.param(rjob("w", replicas=2, parallelism=4, completions=4), 8, id="replicas times parallelism"),
        pytest.param(rjob("w", parallelism=4, completions=2), 2, id="completions below parallelism cap the pods"),
        pytest.param(rjob("w", completions=4), 1, id="completions alone run one pod at a time"),
        pytest.param(rjob("w", parallelism=3), 3, id="parallelism without completions"),
        pytest.param(rjob("w", replicas=0, parallelism=3), 0, id="zero replicas"),
    ],
)
def test_pod_count(entry: dict[str, Any], want: int) -> None:
    assert parse(jobset(entry)).replica("w").count == want


@pytest.mark.parametrize(
    "raw, want",
    [
        pytest.param(
            jobset(rjob("workers"), rjob("driver"), coordinator={"replicatedJob": "driver"}),
            "driver",
            id="spec.coordinator wins",
        ),
        pytest.param(
            jobset(rjob("workers"), rjob("driver")), "workers", id="without spec.coordinator the first replicatedJob"
        ),
        pytest.param(
            jobset(rjob("init"), rjob("workers", depends_on=[{"name": "init", "status": "Complete"}])),
            "workers",
            id="an initializer others wait to complete is skipped",
        ),
    ],
)
def test_coordinator(raw: dict[str, Any], want: str) -> None:
    assert parse(raw).coordinator == want


def test_pod_labels_are_the_stable_jobset_and_job_labels() -> None:
    raw = jobset(
        rjob("driver", template(container(), labels={"app": "x", js.JOBSET_NAME_LABEL: "spoof"})),
        rjob("workers", replicas=2),
        coordinator={"replicatedJob": "driver", "jobIndex": 0, "podIndex": 0},
        network={"subdomain": "net"},
    )
    group = parse(raw)
    coordinator = "js-driver-0-0.net"
    assert dict(group.replica("driver").pod_labels) == {
        "app": "x",
        js.JOBSET_NAME_LABEL: "js",
        js.REPLICATED_JOB_NAME_LABEL: "driver",
        js.REPLICATED_JOB_REPLICAS_LABEL: "1",
        js.GROUP_NAME_LABEL: "default",
        js.COORDINATOR_LABEL: coordinator,
        js.JOB_INDEX_LABEL: "0",
        js.BATCH_JOB_NAME_LABEL: "js-driver-0",
        js.LEGACY_JOB_NAME_LABEL: "js-driver-0",
    }
    assert dict(group.replica("workers").pod_labels) == {
        js.JOBSET_NAME_LABEL: "js",
        js.REPLICATED_JOB_NAME_LABEL: "workers",
        js.REPLICATED_JOB_REPLICAS_LABEL: "2",
        js.GROUP_NAME_LABEL: "default",
        js.COORDINATOR_LABEL: coordinator,
    }
    assert (group.replica("workers").index_label, dict(group.group_selector)) == (
        js.COMPLETION_INDEX_LABEL,
        {js.JOBSET_NAME_LABEL: "js"},
    )


def test_collectives_join_gpu_jobs_and_the_coordinator_but_not_initializers() -> None:
    raw = jobset(
        rjob("init", template(container(gpus=1))),
        rjob("launcher", depends_on=[{"name": "init", "status": "Complete"}]),
        rjob("workers", template(container(gpus=8)), replicas=2, depends_on=[{"name": "launcher", "status": "Ready"}]),
        rjob("metrics"),
    )
    group = parse(raw)
    assert group.coordinator == "launcher"
    assert {(f.src, f.dst, f.purpose) for f in group.flows} == {
        ("launcher", "workers", "collective"),
        ("workers", "launcher", "collective"),
        ("workers", "workers", "collective"),
    }


def test_template_path_points_into_the_job_template() -> None:
    group = parse(jobset(rjob("a"), rjob("b")))
    assert [r.template_path for r in group.replicas] == [
        "/spec/replicatedJobs/0/template/spec/template",
        "/spec/replicatedJobs/1/template/spec/template",
    ]
