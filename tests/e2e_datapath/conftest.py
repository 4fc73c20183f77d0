"""Fixtures for the datapath suite (`make e2e-datapath`): the e2e apiserver, Cilium's CRDs from the
Cilium module, one Cilium node (agent in its own netns), and `topoguard serve` as the webhook.

Opt-in: runs only as root with TOPOGUARD_ENVTEST_BIN (etcd + kube-apiserver) and
TOPOGUARD_DATAPATH_BIN (cilium-agent, cilium-cni, cilium-dbg, lib/bpf, crds; hack/datapath/build.sh)
set; hack/e2e-datapath.sh sets both. Otherwise every test here is skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import config

from tests.e2e import kube, webhooks
from tests.e2e.controlplane import ControlPlane
from tests.e2e.topoguard import TopoguardServer
from tests.e2e_datapath import lab
from tests.e2e_datapath.datapath import HostState
from tests.e2e_datapath.node import DatapathNode

ENVTEST_ENV = "TOPOGUARD_ENVTEST_BIN"
DATAPATH_ENV = "TOPOGUARD_DATAPATH_BIN"
FRAMEWORK_ENV = "TOPOGUARD_DATAPATH_FRAMEWORK"
HERE = Path(__file__).parent
E2E = HERE.parent / "e2e"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = [name for name in (ENVTEST_ENV, DATAPATH_ENV) if not os.environ.get(name)]
    if not missing and os.geteuid() == 0:
        return
    why = f"set {', '.join(missing)} (make e2e-datapath does)" if missing else "needs root (network namespaces)"
    skip = pytest.mark.skip(reason=f"datapath: {why}")
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def host_before() -> HostState:
    """The host's network state before the suite creates anything (compared at the end)."""
    return HostState.capture()


@pytest.fixture(scope="session")
def control_plane(host_before: HostState, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(Path(os.environ[ENVTEST_ENV]), tmp_path_factory.mktemp("controlplane"))
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def cluster(control_plane: ControlPlane) -> Iterator[kube.Cluster]:
    """The apiserver with the job CRDs (the e2e suite's) and Cilium's own CRDs from the Cilium module."""
    api = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    crds = kube.crds_by_name(E2E / "crds", Path(os.environ[DATAPATH_ENV]) / "crds")
    try:
        yield kube.Cluster(api, kube.install_crds(api, crds.values()))
    finally:
        api.close()


@pytest.fixture(scope="session")
def node(host_before: HostState, control_plane: ControlPlane, cluster: kube.Cluster,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[DatapathNode]:
    """The Cilium node, torn down at the end; then the host must look as it did before."""
    # A short work path: unix socket paths under it must stay below 108 bytes.
    work = Path(tmp_path_factory.mktemp("dp"))
    dp = DatapathNode(Path(os.environ[DATAPATH_ENV]), work, control_plane, cluster)
    try:
        dp.start()
        yield dp
    finally:
        dp.stop()
        differences = host_before.differences(HostState.capture())
        assert not differences, "the datapath suite changed the host:\n" + "\n".join(differences)


@pytest.fixture(scope="session")
def framework_python() -> str:
    """The python of the JAX (CPU) virtualenv hack/datapath/framework.sh installs."""
    python = os.environ.get(FRAMEWORK_ENV, "")
    if not python or not os.access(python, os.X_OK):
        pytest.fail(f"{FRAMEWORK_ENV} must name the framework venv's python (hack/datapath/framework.sh)")
    return python


@pytest.fixture(scope="session")
def webhook(control_plane: ControlPlane, cluster: kube.Cluster,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[TopoguardServer]:
    """`topoguard serve` on the seed lab's snapshot (zoneIdentityLabel=zone), registered with the apiserver."""
    work = tmp_path_factory.mktemp("webhook")
    serving = control_plane.ca.issue_serving("webhook", common_name="topoguard-datapath")
    server = TopoguardServer(
        ["--cluster", str(lab.LAB_CLUSTER), "--config", str(lab.LAB_CONFIG),
         "--tls-cert", str(serving.cert_path), "--tls-key", str(serving.key_path)],
        work / "topoguard.log", ca_file=control_plane.ca.pair.cert_path,
    )
    server.start(wait_for="/readyz")
    try:
        ca_pem = control_plane.ca.cert_pem
        cluster.create(webhooks.mutating_configuration("topoguard", server.url, ca_pem))
        cluster.create(webhooks.validating_configuration("topoguard", server.url, ca_pem))
        yield server
    finally:
        server.stop()

