"""Fixtures for `make e2e-full`: the envtest kube-apiserver + etcd (tests/e2e/controlplane.py), the real
kube-scheduler and kube-controller-manager, the real operators (components.py), topoguard serving as
the chart runs it (the watch cache: `serve --kubeconfig`, no `--cluster`), and Nodes in three zones:
device-plugin GPUs (fixtures/nodes.yaml), DRA-only GPU nodes with their ResourceSlices and MIG nodes
(fixtures/dra-cluster.yaml).

Opt-in: runs only when TOPOGUARD_ENVTEST_BIN (etcd + kube-apiserver) and TOPOGUARD_E2E_COMPONENTS
(hack/envtest/build-components.sh's output directory) are set; hack/e2e-full.sh sets both. A test
whose component did not build is skipped with that component's build error.

Every test gets its own namespace, created with the lab's policies before topoguard starts (so its
first sync already holds them), and its jobs and pods are removed afterwards so the next test finds
the GPUs free: no kubelet ever confirms a deletion, so the pods are deleted with gracePeriodSeconds=0
(what `kubectl delete --force` does).
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kubernetes import config
from kubernetes.client.exceptions import ApiException

from tests.e2e import kube, webhooks
from tests.e2e.controlplane import ControlPlane, Process
from tests.e2e.topoguard import TopoguardServer
from tests.e2e_full import components
from tests.e2e_full.components import ComponentMissing, Operator

BIN_ENV = "TOPOGUARD_ENVTEST_BIN"
HERE = Path(__file__).parent
REPO = HERE.parents[1]
FIXTURES = HERE / "fixtures"
OWN_CRDS = REPO / "tests" / "e2e" / "crds"
LAB_CLUSTER = REPO / "tests" / "data" / "clusters" / "lab.yaml"
LAB_JOB = REPO / "examples" / "pytorchjob-lab.yaml"
ZONE_LABEL = "topology.kubernetes.io/zone"
# Which topoguard answers for a namespace: the chart's selector plus this label; each mode is one
# `topoguard serve` with fixtures/config-<mode>.yaml.
TOPOGUARD_MODES = ("pin", "colocate", "colocate-anyzone")
MODE_LABEL = "e2e-full.topoguard.io/mode"
OPERATORS = ("training-operator", "jobset", "trainer", "kueue")
# Per test namespace: the topoguard mode that serves it.
NAMESPACES = {
    "lab-pin": "pin", "lab-colocate": "colocate", "open-colocate": "colocate-anyzone",
    "jobset": "pin", "trainjob": "pin", "kueue": "pin", "kueue-trainjob": "pin", "audit": "pin",
    "dra": "pin",
}
# Objects a namespace's tests need before topoguard's first sync (fixtures/, namespace set on load).
NAMESPACE_FIXTURES = {"dra": ("rct-four-gpus.yaml",)}
# Namespaces without the lab's policies (every zone with the GPUs is open).
NO_POLICIES = frozenset({"open-colocate"})
BIND_TIMEOUT_SECONDS = 180.0
POLL_SECONDS = 0.5


# Per test, session fixtures included: the first test pays for starting the control plane and the
# controllers on a loaded 2-core machine (pyproject's default is 120 s).
TEST_TIMEOUT_SECONDS = 900


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_SECONDS))
    missing = [env for env in (BIN_ENV, components.COMPONENTS_ENV) if not os.environ.get(env)]
    if not missing:
        return
    skip = pytest.mark.skip(reason=f"e2e-full: set {' and '.join(missing)} (make e2e-full does)")
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(skip)


@dataclass
class Placement:
    """Where one pod was bound (collected for the terminal summary)."""

    test: str
    pod: str
    node: str
    zone: str
    labels_zone: str | None


PLACEMENTS: list[Placement] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not PLACEMENTS:
        return
    terminalreporter.section("e2e-full: where the scheduler bound each pod")
    for p in PLACEMENTS:
        terminalreporter.write_line(f"{p.test:<34} {p.pod:<44} {p.node:<9} {p.zone:<7} label zone={p.labels_zone}")


def require(name: str) -> components.Built:
    try:
        return components.built(name)
    except ComponentMissing as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(Path(os.environ[BIN_ENV]), tmp_path_factory.mktemp("controlplane"))
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("components")


@pytest.fixture(scope="session")
def cluster(control_plane: ControlPlane) -> Iterator[kube.Cluster]:
    """CRDs (the suite's own for Cilium; each operator's from its module), the Nodes, the torch runtime,
    the operators' namespace and the test namespaces with the lab's policies."""
    api = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    try:
        crds = kube.crds_by_name(OWN_CRDS, *components.crd_directories(OPERATORS))
        handle = kube.Cluster(api, kube.install_crds(api, crds.values()))
        for node in kube.load_documents(FIXTURES / "nodes.yaml"):
            handle.create(node)
        create_dra_cluster(handle, kube.load_documents(FIXTURES / "dra-cluster.yaml"))
        # Before topoguard starts, so that its first sync holds the runtime the TrainJob names.
        handle.create(fixture("torch-distributed-runtime.yaml"))
        handle.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": components.OPERATOR_NAMESPACE}})
        lab = kube.load_documents(LAB_CLUSTER)
        policies = [d for d in lab if d["kind"] == "CiliumNetworkPolicy"]
        (lab_ns,) = [d for d in lab if d["kind"] == "Namespace"]
        for name, mode in NAMESPACES.items():
            ns = copy.deepcopy(lab_ns)
            ns["metadata"] = {"name": name, "labels": {**lab_ns["metadata"]["labels"],
                                                       "kubernetes.io/metadata.name": name, MODE_LABEL: mode}}
            handle.create(ns)
            for policy in [] if name in NO_POLICIES else policies:
                copied = copy.deepcopy(policy)
                copied["metadata"]["namespace"] = name
                handle.create(copied)
            for file in NAMESPACE_FIXTURES.get(name, ()):
                handle.create(fixture(file, namespace=name))
        yield handle
    finally:
        api.close()


def create_dra_cluster(cluster: kube.Cluster, docs: list[kube.RawObject]) -> None:
    """The Nodes first, then the DeviceClasses and ResourceSlices, each slice owned by its Node as the
    driver's kubelet plugin makes it (the garbage collector would delete a slice whose owner uid is not
    the Node's)."""
    uids = {}
    for node in (d for d in docs if d["kind"] == "Node"):
        created, _ = cluster.create(node)
        uids[created["metadata"]["name"]] = created["metadata"]["uid"]
    for obj in (d for d in docs if d["kind"] != "Node"):
        for owner in obj["metadata"].get("ownerReferences") or []:
            owner["uid"] = uids[owner["name"]]
        cluster.create(obj)


@dataclass
class ControlLoops:
    scheduler: Process
    controller_manager: Process
    processes: list[Process] = field(default_factory=list)


@pytest.fixture(scope="session")
def control_loops(cluster: kube.Cluster, control_plane: ControlPlane, work: Path) -> Iterator[ControlLoops]:
    """kube-scheduler (binds every pod) and kube-controller-manager (job, garbagecollector, serviceaccount)."""
    scheduler_bin = require("kube-scheduler").binary
    kcm_bin = require("kube-controller-manager").binary
    scheduler = components.start_scheduler(scheduler_bin, control_plane.kubeconfig, work)
    try:
        kcm = components.start_controller_manager(kcm_bin, control_plane.kubeconfig, work)
    except BaseException:
        scheduler.stop()
        raise
    try:
        for name in NAMESPACES:
            wait_for(lambda n=name: _exists(cluster, f"/api/v1/namespaces/{n}/serviceaccounts/default"),
                     f"the default ServiceAccount in {name}", 60)
        yield ControlLoops(scheduler, kcm)
    finally:
        kcm.stop()
        scheduler.stop()


@pytest.fixture(scope="session")
def topoguard(cluster: kube.Cluster, control_plane: ControlPlane, control_loops: ControlLoops,
              work: Path) -> Iterator[dict[str, TopoguardServer]]:
    """One `topoguard serve --kubeconfig` per mode (the watch cache the chart's Deployment runs, with the
    admin kubeconfig in place of its ServiceAccount), each registered through the chart's
    Mutating/ValidatingWebhookConfiguration for the namespaces labelled with its mode."""
    servers: dict[str, TopoguardServer] = {}
    try:
        for mode in TOPOGUARD_MODES:
            serving = control_plane.ca.issue_serving(f"topoguard-{mode}", common_name="topoguard-e2e")
            server = TopoguardServer(
                ["--kubeconfig", str(control_plane.kubeconfig), "--config", str(FIXTURES / f"config-{mode}.yaml"),
                 "--tls-cert", str(serving.cert_path), "--tls-key", str(serving.key_path)],
                work / f"topoguard-{mode}.log", ca_file=control_plane.ca.pair.cert_path,
                # The chart's Downward API env: the audit's Lease lives in the release namespace.
                env={"POD_NAMESPACE": components.OPERATOR_NAMESPACE, "POD_NAME": f"topoguard-{mode}"})
            server.start(wait_for="/readyz")
            servers[mode] = server
            selector = copy.deepcopy(webhooks.ENABLED_SELECTOR)
            selector["matchExpressions"].append({"key": MODE_LABEL, "operator": "In", "values": [mode]})
            ca = control_plane.ca.cert_pem
            cluster.create(webhooks.mutating_configuration(f"topoguard-{mode}", server.url, ca,
                                                           namespace_selector=selector))
            cluster.create(webhooks.validating_configuration(f"topoguard-{mode}", server.url, ca,
                                                             namespace_selector=selector))
        for ns in ("lab-pin", "lab-colocate"):
            wait_for(lambda n=ns: _webhook_answers(cluster, n), f"topoguard answering for {ns}", 30)
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture(scope="session")
def admission(cluster: kube.Cluster, control_loops: ControlLoops,
              topoguard: dict[str, TopoguardServer]) -> kube.Cluster:
    """The cluster with the scheduler, the controller-manager and both topoguards answering."""
    return cluster


def _webhook_answers(cluster: kube.Cluster, namespace: str) -> bool:
    probe = lab_job(namespace, "webhook-probe")
    try:
        created, _ = cluster.create(probe, dry_run=True)
    except ApiException as e:
        return "admission webhook" in str(kube.api_error_body(e).get("message", ""))
    return bool(created["metadata"].get("annotations", {}).get("topoguard.io/zone")
                or created["metadata"].get("annotations", {}).get("topoguard.io/decision"))


def _operator(name: str, cluster: kube.Cluster, control_plane: ControlPlane, work: Path) -> Iterator[Operator]:
    component = require(name)
    kubeconfig = control_plane.kubeconfig
    if name == "training-operator":
        operator = components.start_training_operator(component, cluster, kubeconfig, work)
    elif name == "jobset":
        operator = components.start_jobset(component, cluster, control_plane.ca, kubeconfig, work)
    elif name == "trainer":
        operator = components.start_trainer(component, cluster, control_plane.ca, kubeconfig, work)
    else:
        operator = components.start_kueue(component, cluster, kubeconfig, work)
    try:
        yield operator
    finally:
        operator.stop(cluster)


@pytest.fixture(scope="session")
def training_operator(cluster: kube.Cluster, control_plane: ControlPlane, work: Path) -> Iterator[Operator]:
    yield from _operator("training-operator", cluster, control_plane, work)


@pytest.fixture(scope="session")
def jobset_controller(cluster: kube.Cluster, control_plane: ControlPlane, work: Path) -> Iterator[Operator]:
    yield from _operator("jobset", cluster, control_plane, work)


@pytest.fixture(scope="session")
def trainer_controller(cluster: kube.Cluster, control_plane: ControlPlane, work: Path,
                       jobset_controller: Operator) -> Iterator[Operator]:
    yield from _operator("trainer", cluster, control_plane, work)


@pytest.fixture(scope="session")
def kueue_controller(cluster: kube.Cluster, control_plane: ControlPlane, work: Path) -> Iterator[Operator]:
    yield from _operator("kueue", cluster, control_plane, work)


# ---- helpers the tests share ----


def lab_job(namespace: str, name: str) -> kube.RawObject:
    (job,) = kube.load_documents(LAB_JOB)
    job["metadata"]["namespace"] = namespace
    job["metadata"]["name"] = name
    return job


def fixture(name: str, *, namespace: str | None = None) -> kube.RawObject:
    (obj,) = kube.load_documents(FIXTURES / name)
    if namespace is not None:
        obj["metadata"]["namespace"] = namespace
    return obj


def wait_for(probe: Callable[[], bool], what: str, timeout: float = BIND_TIMEOUT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return
        time.sleep(POLL_SECONDS)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def _exists(cluster: kube.Cluster, path: str) -> bool:
    try:
        cluster.request("GET", path)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


def pods(cluster: kube.Cluster, namespace: str, selector: str) -> list[kube.RawObject]:
    body, _ = cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods", query=[("labelSelector", selector)])
    items: list[kube.RawObject] = body.get("items") or []
    return items


def node_zones(cluster: kube.Cluster) -> dict[str, str]:
    body, _ = cluster.request("GET", "/api/v1/nodes")
    return {n["metadata"]["name"]: n["metadata"]["labels"].get(ZONE_LABEL, "") for n in body["items"]}


def wait_bound(cluster: kube.Cluster, namespace: str, selector: str, count: int) -> list[kube.RawObject]:
    """Wait until `count` pods match and the scheduler has bound every one; on timeout say which are
    not, with the scheduler's reason (the PodScheduled condition)."""
    found: list[kube.RawObject] = []

    def bound() -> bool:
        nonlocal found
        found = [p for p in pods(cluster, namespace, selector) if not p["metadata"].get("deletionTimestamp")]
        return len(found) == count and all(p["spec"].get("nodeName") for p in found)

    try:
        wait_for(bound, f"{count} bound pods matching {selector} in {namespace}")
    except AssertionError as e:
        states = [f"{p['metadata']['name']}: node={p['spec'].get('nodeName')} {_scheduled(p)}" for p in found]
        raise AssertionError(f"{e}; found {len(found)}: {states}") from None
    return sorted(found, key=lambda p: p["metadata"]["name"])


def _scheduled(pod: kube.RawObject) -> list[str]:
    conditions = pod.get("status", {}).get("conditions") or []
    return [c.get("message", "") for c in conditions if c.get("type") == "PodScheduled"]


def record(test: str, cluster: kube.Cluster, bound: list[kube.RawObject], label: str = "zone") -> dict[str, str]:
    """pod name -> zone of the node it is bound to; also kept for the terminal summary."""
    zones = node_zones(cluster)
    out = {}
    for pod in bound:
        node = pod["spec"]["nodeName"]
        out[pod["metadata"]["name"]] = zones[node]
        PLACEMENTS.append(Placement(test, pod["metadata"]["name"], node, zones[node],
                                    (pod["metadata"].get("labels") or {}).get(label)))
    return out


def clean_namespace(cluster: kube.Cluster, namespace: str, jobs: list[kube.RawObject]) -> None:
    """Delete the jobs (children by the garbage collector), the batch Jobs, then force-delete the pods
    (no kubelet would ever finish a graceful delete) and wait until none is left, nor any of their
    ResourceClaims (deallocated and deleted by the resource-claim controller and the garbage collector
    once the pods are gone), so that the next test finds the devices free."""
    for job in jobs:
        try:
            cluster.request("DELETE", cluster.object_path(job), {"propagationPolicy": "Background"})
        except ApiException as e:
            if e.status != 404:
                raise

    def gone() -> bool:
        # Again on every round: a JobSet controller that has not seen its JobSet's deletion yet may
        # create a Job again, and a Job controller a Pod.
        jobs_left, _ = cluster.request("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs")
        if jobs_left.get("items"):
            cluster.request("DELETE", f"/apis/batch/v1/namespaces/{namespace}/jobs",
                            {"propagationPolicy": "Background"})
        left = pods(cluster, namespace, "")
        for pod in left:
            try:
                cluster.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}",
                                {"gracePeriodSeconds": 0})
            except ApiException as e:
                if e.status != 404:
                    raise
        if left or jobs_left.get("items"):
            return False
        claims, _ = cluster.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims")
        return not claims.get("items")

    wait_for(gone, f"the pods and resource claims of {namespace} to be gone", 60)
