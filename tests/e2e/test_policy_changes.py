"""The policy-change webhook (POST /validate-policy) against the real kube-apiserver: `topoguard serve --kubeconfig`
watches a namespace holding the seed lab's fixed state (a running PyTorchJob, its pods, the lab's policies), and a
ValidatingWebhookConfiguration as the chart renders it with `policyChanges.enabled` sends it every policy change.

- `kubectl apply --dry-run=server` of a CNP that breaks the job returns the warnings naming job, flow and rule;
- with the namespace labelled `topoguard.io/policy-changes=deny` the real create is refused (403, the same words);
- in `warn` it is stored, and the job gets a `TopoguardPolicyChange` Event;
- the webhook down (a closed port): policies still apply (failurePolicy Ignore).
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from tests.e2e import kube, webhooks
from tests.e2e.conftest import FIXTURES
from tests.e2e.controlplane import ControlPlane, free_port
from tests.e2e.test_audit import DATA, EVENTS, create_namespaced
from tests.e2e.test_watch_cache import poll
from tests.e2e.topoguard import TopoguardServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = FIXTURES.parents[2]
LOCK = ROOT / "examples" / "what-if" / "lock-coordinator.yaml"
CONFIGS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
BREAKS = ("PyTorchJob {ns}/ml-training: Worker → Master TCP/23456 (rendezvous): allow → deny by "
          "CiliumNetworkPolicy {ns}/{name} ingressDeny[0]")


def lock(namespace: str, name: str) -> dict[str, Any]:
    policy = copy.deepcopy(yaml.safe_load(LOCK.read_text()))
    policy["metadata"] = {"name": name, "namespace": namespace}
    return policy


@pytest.fixture(scope="module")
def judged(cluster: kube.Cluster, control_plane: ControlPlane,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[kube.Cluster, str]]:
    """An opted-in namespace with the lab's running job, topoguard watching the cluster, the policy webhook on."""
    suffix = uuid.uuid4().hex[:6]
    release, namespace = f"topoguard-{suffix}", f"whatif-{suffix}"
    for name in (release, namespace):
        labels = {} if name == release else {"topoguard.io/enabled": "true"}
        cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
        cluster.request("POST", f"/api/v1/namespaces/{name}/serviceaccounts",
                        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
    create_namespaced(cluster, DATA / "lab-audit-after.yaml", namespace)
    work = tmp_path_factory.mktemp("policy-changes")
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump({**yaml.safe_load((FIXTURES / "config.yaml").read_text()),
                                      "audit": {"enabled": False}}))
    serving = control_plane.ca.issue_serving("policy-webhook", common_name="topoguard-policy-e2e")
    server = TopoguardServer(["--kubeconfig", str(control_plane.kubeconfig), "--config", str(config),
                              "--tls-cert", str(serving.cert_path), "--tls-key", str(serving.key_path)],
                             work / "topoguard.log", ca_file=control_plane.ca.pair.cert_path,
                             env={"POD_NAMESPACE": release, "POD_NAME": "topoguard-0"})
    server.start(wait_for="/readyz")
    config_name = f"topoguard-policy-changes-{suffix}"
    selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    cluster.create(webhooks.policy_configuration(config_name, server.url, control_plane.ca.cert_pem,
                                                 namespace_selector=selector))

    def live() -> tuple[bool, list[str]]:
        _, warnings = cluster.create(lock(namespace, "probe"), dry_run=True)
        return any("would break" in w for w in warnings), warnings

    poll("the policy webhook answering", live, timeout=60.0)
    try:
        yield cluster, namespace
    finally:
        cluster.request("DELETE", f"{CONFIGS}/{config_name}")
        server.stop()


def test_a_server_dry_run_returns_the_warning_and_stores_nothing(judged: tuple[kube.Cluster, str]) -> None:
    cluster, ns = judged
    policy = lock(ns, "lock-dry-run")
    _, warnings = cluster.create(policy, dry_run=True)
    assert warnings[0] == (f"topoguard: CiliumNetworkPolicy {ns}/lock-dry-run would break the required connections "
                           "of 1 training job; admitted (policyChanges.enforcement=warn); the next warnings name them")
    assert BREAKS.format(ns=ns, name="lock-dry-run") in warnings
    assert cluster.get(policy) is None


def test_deny_by_namespace_label_refuses_the_real_apply(judged: tuple[kube.Cluster, str]) -> None:
    cluster, ns = judged
    path = f"/api/v1/namespaces/{ns}"
    namespace, _ = cluster.request("GET", path)
    namespace["metadata"]["labels"]["topoguard.io/policy-changes"] = "deny"
    cluster.request("PUT", path, namespace)
    policy = lock(ns, "lock-denied")

    def refused() -> tuple[bool, str]:
        try:
            cluster.create(policy, dry_run=True)
        except ApiException as e:
            return True, str(kube.api_error_body(e).get("message", ""))
        return False, ""

    poll("the namespace label in topoguard's snapshot", refused)
    try:
        with pytest.raises(ApiException) as raised:
            cluster.create(policy)
        assert raised.value.status == 403
        message = str(kube.api_error_body(raised.value).get("message", ""))
        assert f"CiliumNetworkPolicy {ns}/lock-denied would break the required connections of PyTorchJob " \
               f"{ns}/ml-training: Worker → Master TCP/23456 (rendezvous): allow → deny" in message
        assert cluster.get(policy) is None
    finally:
        namespace, _ = cluster.request("GET", path)
        del namespace["metadata"]["labels"]["topoguard.io/policy-changes"]
        cluster.request("PUT", path, namespace)
        poll("the label gone from topoguard's snapshot", lambda: (not refused()[0], None))


def test_warn_stores_the_change_and_the_job_gets_its_event(judged: tuple[kube.Cluster, str]) -> None:
    cluster, ns = judged
    policy = lock(ns, "lock-stored")
    created, warnings = cluster.create(policy)
    assert BREAKS.format(ns=ns, name="lock-stored") in warnings
    assert cluster.get(policy) is not None

    def event() -> tuple[bool, list[dict[str, Any]]]:
        items = cluster.request("GET", f"{EVENTS}/namespaces/{ns}/events")[0]["items"]
        found = [e for e in items if e.get("reportingController") == "topoguard.io/policy-changes"]
        return any("lock-stored" in e.get("note", "") for e in found), found

    found = [e for e in poll("the TopoguardPolicyChange Event", event) if "lock-stored" in e["note"]]
    assert found[0]["reason"] == "TopoguardPolicyChange" and found[0]["type"] == "Warning"
    assert found[0]["regarding"]["kind"] == "PyTorchJob" and found[0]["regarding"]["name"] == "ml-training"
    assert found[0]["note"].startswith(f"Apply of CiliumNetworkPolicy {ns}/lock-stored breaks connections this job "
                                       "needs: Worker → Master TCP/23456 (rendezvous): allow → deny")
    # A dry run left none: only the stored change has an Event.
    assert not any("lock-dry-run" in e["note"] for e in event()[1])
    cluster.delete(created)


def test_with_the_webhook_down_policies_still_apply(judged: tuple[kube.Cluster, str], control_plane: ControlPlane
                                                    ) -> None:
    cluster, ns = judged
    down = f"topoguard-policy-down-{uuid.uuid4().hex[:6]}"
    cluster.create(webhooks.policy_configuration(
        down, f"https://127.0.0.1:{free_port()}", control_plane.ca.cert_pem,
        namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": ns}}))
    try:
        time.sleep(2.0)  # the apiserver's informer picks the configuration up
        started = time.monotonic()
        created, _ = cluster.create(lock(ns, "lock-while-down"))
        assert time.monotonic() - started < webhooks.CHART_TIMEOUT_SECONDS + 5
        assert cluster.get(created) is not None
        cluster.delete(created)
    finally:
        cluster.request("DELETE", f"{CONFIGS}/{down}")
