"""What the apiserver does when the webhook is down, per failurePolicy.

The chart exposes failurePolicy as a value (DESIGN.md "Helm"); these tests pin down what each
choice means with a real apiserver: Ignore lets jobs through unpatched, Fail refuses them, and
either way the create returns within the webhook's timeoutSeconds instead of hanging.
"Down" is either a port nobody listens on (connection refused) or a listener that never answers
(a hung process: only timeoutSeconds ends the call).
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from kubernetes.client.exceptions import ApiException

from tests.e2e import kube, webhooks
from tests.e2e.conftest import load_job
from tests.e2e.controlplane import ControlPlane, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

DOWN_LABEL = "e2e.topoguard.io/down"
DOWN_WEBHOOK = "down.e2e.topoguard.io"
TIMEOUT_SECONDS = 2
ACTIVATION_TIMEOUT_SECONDS = 60.0


@contextmanager
def unreachable(kind: str) -> Iterator[str]:
    """A base URL whose webhook is down: `refused` (closed port) or `hung` (accepts, never answers)."""
    if kind == "refused":
        yield f"https://127.0.0.1:{free_port()}"
        return
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        # The kernel completes TCP handshakes into the backlog; nobody ever accept()s or speaks TLS.
        listener.listen(64)
        yield f"https://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def dry_run_refused(cluster: kube.Cluster, job: kube.RawObject) -> bool:
    try:
        cluster.create(job, dry_run=True)
    except ApiException as e:
        if "failed calling webhook" in str(kube.api_error_body(e).get("message", "")):
            return True
        raise
    return False


def wait_for(condition: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + ACTIVATION_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    pytest.fail(f"the apiserver did not pick up the webhook configuration ({condition}) "
                f"within {ACTIVATION_TIMEOUT_SECONDS:.0f}s")


@pytest.mark.parametrize(
    ("failure_policy", "down"),
    [
        pytest.param("Ignore", "refused", id="Ignore + connection refused: created unpatched"),
        pytest.param("Ignore", "hung", id="Ignore + hung webhook: created unpatched after timeoutSeconds"),
        pytest.param("Fail", "refused", id="Fail + connection refused: refused, nothing stored"),
        pytest.param("Fail", "hung", id="Fail + hung webhook: refused after timeoutSeconds, nothing stored"),
    ],
)
def test_webhook_down_follows_failure_policy(
    cluster: kube.Cluster, control_plane: ControlPlane, failure_policy: webhooks.FailurePolicy, down: str
) -> None:
    name = f"down-{uuid.uuid4().hex[:6]}"
    cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {DOWN_LABEL: name}}})
    job = load_job("lab-pytorchjob.yaml", namespace=name, job_name="job")
    with unreachable(down) as url:
        # Registered as Fail first: a refused dry run proves the apiserver now calls it, which an
        # Ignore webhook that is down could never show. Then switch to the policy under test.
        config = webhooks.mutating_configuration(
            name, url, control_plane.ca.cert_pem, failure_policy="Fail", timeout_seconds=TIMEOUT_SECONDS,
            namespace_selector={"matchLabels": {DOWN_LABEL: name}}, webhook_name=DOWN_WEBHOOK)
        cluster.create(config)
        try:
            wait_for("Fail", lambda: dry_run_refused(cluster, job))
            if failure_policy == "Ignore":
                live = cluster.get(config)
                assert live is not None
                live["webhooks"][0]["failurePolicy"] = "Ignore"
                cluster.replace(live)
                wait_for("Ignore", lambda: not dry_run_refused(cluster, job))
                check_created_unpatched(cluster, job)
            else:
                check_refused(cluster, job)
        finally:
            cluster.delete(config)


def check_created_unpatched(cluster: kube.Cluster, job: kube.RawObject) -> None:
    cluster.create(job)
    stored = cluster.get(job)
    assert stored is not None
    assert stored["spec"] == job["spec"]
    assert not stored["metadata"].get("annotations")


def check_refused(cluster: kube.Cluster, job: kube.RawObject) -> None:
    # The client's own timeout (kube.REQUEST_TIMEOUT_SECONDS) is far above timeoutSeconds: a create
    # that hung instead of failing would raise a client timeout here, not an ApiException.
    with pytest.raises(ApiException) as refused:
        cluster.create(job)
    status = kube.api_error_body(refused.value)
    assert refused.value.status == 500, status
    assert f'failed calling webhook "{DOWN_WEBHOOK}"' in status.get("message", ""), status
    assert cluster.get(job) is None
