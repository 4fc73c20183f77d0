"""Fixtures for the end-to-end suite: a real etcd + kube-apiserver, the CRDs, the seed lab's
objects, and `topoguard serve` registered as the cluster's admission webhook.

Opt-in: the suite runs only when TOPOGUARD_ENVTEST_BIN names a directory holding `etcd` and
`kube-apiserver` (hack/e2e-apiserver.sh builds them and sets it); otherwise every test here is
skipped. TOPOGUARD_UPSTREAM_CRDS may name a directory tree of real CRDs (the Kubeflow/JobSet ones
in ../shared/upstream); they replace the suite's own small CRDs of the same name.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests.e2e import kube, webhooks
from tests.e2e.controlplane import ControlPlane
from tests.e2e.topoguard import TopoguardServer

BIN_ENV = "TOPOGUARD_ENVTEST_BIN"
UPSTREAM_CRDS_ENV = "TOPOGUARD_UPSTREAM_CRDS"
HERE = Path(__file__).parent
OWN_CRDS = HERE / "crds"
FIXTURES = HERE / "fixtures"
CLUSTER_FIXTURES = FIXTURES / "cluster"
WEBHOOK_ACTIVE_TIMEOUT_SECONDS = 30.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(BIN_ENV):
        return
    skip = pytest.mark.skip(reason=f"end-to-end: set {BIN_ENV} (make e2e does) to run against a real apiserver")
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(skip)


def load_job(name: str, *, namespace: str, job_name: str) -> kube.RawObject:
    """A job manifest from fixtures/jobs with its namespace and name set for one test."""
    (job,) = kube.load_documents(FIXTURES / "jobs" / name)
    job["metadata"]["namespace"] = namespace
    job["metadata"]["name"] = job_name
    return job


# Session scope for everything below: starting etcd + kube-apiserver and installing ~10 CRDs
# costs tens of seconds on a shared 2-core machine, and no test changes shared state: each
# creates its own uniquely named jobs / namespaces / webhook configurations.


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    bin_dir = Path(os.environ[BIN_ENV])
    plane = ControlPlane(bin_dir, tmp_path_factory.mktemp("controlplane"))
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def api_client(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def cluster(api_client: client.ApiClient) -> kube.Cluster:
    """CRDs installed and the seed lab (+ the suite's namespaces and policies) created."""
    upstream = os.environ.get(UPSTREAM_CRDS_ENV)
    crds = kube.crds_by_name(OWN_CRDS, Path(upstream) if upstream else None)
    handle = kube.Cluster(api_client, kube.install_crds(api_client, crds.values()))
    objects = kube.load_documents(CLUSTER_FIXTURES)
    # Namespaces before what lives in them.
    for obj in sorted(objects, key=lambda o: o["kind"] != "Namespace"):
        handle.create(obj)
    return handle


@pytest.fixture(scope="session")
def webhook_server(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TopoguardServer]:
    """`topoguard serve --cluster <the same objects>` with a certificate from the suite's CA."""
    work = tmp_path_factory.mktemp("webhook")
    serving = control_plane.ca.issue_serving("webhook", common_name="topoguard-e2e")
    server = TopoguardServer(
        ["--cluster", str(CLUSTER_FIXTURES), "--config", str(FIXTURES / "config.yaml"),
         "--tls-cert", str(serving.cert_path), "--tls-key", str(serving.key_path)],
        work / "topoguard.log", ca_file=control_plane.ca.pair.cert_path,
    )
    server.start(wait_for="/readyz")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def admission(cluster: kube.Cluster, control_plane: ControlPlane, webhook_server: TopoguardServer) -> kube.Cluster:
    """The cluster with topoguard's Mutating + ValidatingWebhookConfiguration registered and active."""
    ca_pem = control_plane.ca.cert_pem
    cluster.create(webhooks.mutating_configuration("topoguard", webhook_server.url, ca_pem))
    cluster.create(webhooks.validating_configuration("topoguard", webhook_server.url, ca_pem))
    wait_for_webhook(cluster)
    return cluster


def wait_for_webhook(cluster: kube.Cluster) -> None:
    """Wait until the apiserver calls topoguard for opted-in namespaces.

    The apiserver picks up new WebhookConfigurations through an informer, a moment after the
    create returns. A dry-run create of the lab job is the probe: once topoguard answers (a patch,
    or a denial from one of its webhooks) the configuration is live. If it never answers the tests
    themselves report why; this only avoids racing the informer.
    """
    probe = load_job("lab-pytorchjob.yaml", namespace="ml-dryrun", job_name="webhook-probe")
    deadline = time.monotonic() + WEBHOOK_ACTIVE_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        try:
            created, _ = cluster.create(probe, dry_run=True)
            if created["metadata"].get("annotations"):
                return
        except ApiException as e:
            if "admission webhook" in str(kube.api_error_body(e).get("message", "")):
                return
        time.sleep(0.5)
