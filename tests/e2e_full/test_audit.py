"""AUDIT (issue 12) on real pods: the audit loop of `topoguard serve` (the pin server, the suite's only
auditor; audit.intervalSeconds 2) looks at the pods the real training-operator created and the real
scheduler bound. The lab job's pods all in zone-a: no `split`. A pod of the job bound by hand to a
zone-c node (spec.nodeName set at creation, as `kubectl` can, bypassing the scheduler and topoguard's
pin): `split`, as a finding on /metrics and a `TopoguardSplit` Event on the job. The pod gone: clear.

The hand-bound pod carries the job's `training.kubeflow.org/job-name` and replica-type labels, which is
how the audit (like the operators) tells a job's pods, but not the operator's `operator-name` label and
no ownerReference, so that training-operator does not adopt it and delete it as a surplus replica.
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable

import pytest

from tests.e2e import kube
from tests.e2e.topoguard import TopoguardServer
from tests.e2e_full.components import Operator
from tests.e2e_full.conftest import clean_namespace, lab_job, record, wait_bound, wait_for

pytestmark = pytest.mark.e2e

NAMESPACE, JOB = "audit", "ml-training"
EVENTS = "/apis/events.k8s.io/v1"
PASS_TIMEOUT_SECONDS = 60.0


def _metric(text: str, series: str, **labels: str) -> float | None:
    """The first sample of `series` with `labels` in Prometheus exposition text, None when there is none."""
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if line.startswith("#") or name != series:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.rsplit(" ", 1)[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def _split(server: TopoguardServer) -> float | None:
    return _metric(server.get_text("/metrics"), "topoguard_audit_job_findings", namespace=NAMESPACE, name=JOB,
                   type="split")


def _after_a_pass(server: TopoguardServer, since: float, check: Callable[[], bool], what: str) -> None:
    """Wait for an audit pass that finished after `since` and then for check()."""
    def passed() -> bool:
        last = _metric(server.get_text("/metrics"), "topoguard_audit_last_pass_timestamp_seconds")
        return last is not None and last > since and check()

    wait_for(passed, what, PASS_TIMEOUT_SECONDS)


def test_audit_sees_a_pod_bound_by_hand_in_another_zone_and_clears_when_it_is_gone(
    admission: kube.Cluster, training_operator: Operator, topoguard: dict[str, TopoguardServer],
) -> None:
    cluster, auditor = admission, topoguard["pin"]
    job = lab_job(NAMESPACE, JOB)
    hand_pod = f"{JOB}-worker-by-hand"
    try:
        cluster.create(job)
        bound = wait_bound(cluster, NAMESPACE, f"training.kubeflow.org/job-name={JOB}", count=5)
        assert set(record("audit: before", cluster, bound).values()) == {"zone-a"}
        _after_a_pass(auditor, time.time(), lambda: _split(auditor) is None,
                      "an audit pass over the bound job without a split")

        worker = next(p for p in bound if p["metadata"]["labels"]["training.kubeflow.org/replica-type"] == "worker")
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": hand_pod, "namespace": NAMESPACE,
            "labels": {k: v for k, v in worker["metadata"]["labels"].items()
                       if k != "training.kubeflow.org/operator-name"}},
            "spec": copy.deepcopy(worker["spec"])}
        pod["spec"]["nodeName"] = "cpu-c-1"
        cluster.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
        _after_a_pass(auditor, time.time(), lambda: (_split(auditor) or 0) >= 1,
                      "the audit to report the job split")
        events = cluster.request("GET", f"{EVENTS}/namespaces/{NAMESPACE}/events")[0]["items"]
        notes = [e.get("note", "") for e in events
                 if e.get("reason") == "TopoguardSplit" and e.get("regarding", {}).get("name") == JOB]
        assert notes and "zone-c" in notes[-1], notes

        cluster.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{hand_pod}", {"gracePeriodSeconds": 0})
        _after_a_pass(auditor, time.time(), lambda: _split(auditor) is None,
                      "the split to clear once the pod is gone")
    finally:
        clean_namespace(cluster, NAMESPACE, [job])
