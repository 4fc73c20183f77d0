"""The file snapshot loader (app/cache/files.py) and the projections it applies.

Every accepted layout (one object, multi-document YAML, `kind: List`, JSON, a directory tree),
unknown kinds ignored, and errors that name the file and the document.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cache.files import SnapshotError, build_snapshot, load_snapshot
from app.models.cluster import ContainerPort, NamespaceInfo, PodInfo, PolicyObject, Taint

NAMESPACE = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml", "labels": {"team": "a"}}}
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "w-0", "namespace": "ml", "labels": {"role": "worker"}},
    "spec": {
        "serviceAccountName": "trainer",
        "nodeName": "gpu-1",
        "containers": [
            {
                "name": "a",
                "ports": [{"name": "rdzv", "containerPort": 23456}, {"containerPort": 53, "protocol": "UDP"}],
                "resources": {"requests": {"nvidia.com/gpu": "2", "cpu": "4"}},
            },
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": 1}}},
        ],
        "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": 8}}}],
    },
    "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.5"}], "podIP": "10.0.0.5"},
}
NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "gpu-1", "labels": {"topology.kubernetes.io/zone": "z1"}},
    "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
    "status": {
        "allocatable": {"nvidia.com/gpu": "8", "cpu": "64"},
        "conditions": [{"type": "Ready", "status": "True"}],
    },
}
CNP = {
    "apiVersion": "cilium.io/v2",
    "kind": "CiliumNetworkPolicy",
    "metadata": {"name": "p", "namespace": "ml", "uid": "x", "managedFields": []},
    "spec": {"endpointSelector": {}, "ingress": [{}]},
    "status": {"conditions": []},
}
CCNP = {
    "apiVersion": "cilium.io/v2",
    "kind": "CiliumClusterwideNetworkPolicy",
    "metadata": {"name": "cw", "namespace": "ignored"},
    "spec": {"endpointSelector": {}, "ingress": [{}]},
}
KNP = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"name": "k"},
    "spec": {"podSelector": {}},
}
GROUP = {
    "apiVersion": "cilium.io/v2",
    "kind": "CiliumCIDRGroup",
    "metadata": {"name": "g"},
    "spec": {"externalCIDRs": ["10.0.0.0/8"]},
}
DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}}
ALL = [NAMESPACE, POD, NODE, CNP, CCNP, KNP, GROUP, DEPLOYMENT]


def summary(path: Path) -> dict[str, Any]:
    snap = load_snapshot(path)
    return {
        "nodes": [n.name for n in snap.nodes],
        "namespaces": sorted(snap.namespaces),
        "pods": [p.name for p in snap.pods],
        "policies": [(p.kind, p.ref) for p in snap.policies],
        "groups": sorted(snap.cidr_groups),
    }


WANT_ALL = {
    "nodes": ["gpu-1"],
    "namespaces": ["ml"],
    "pods": ["w-0"],
    "policies": [
        ("CiliumNetworkPolicy", "ml/p"),
        ("CiliumClusterwideNetworkPolicy", "cw"),
        ("NetworkPolicy", "default/k"),
    ],
    "groups": ["g"],
}


def write_multi_document(tmp: Path) -> Path:
    path = tmp / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(ALL))
    return path


def write_list(tmp: Path) -> Path:
    path = tmp / "cluster.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": ALL}))
    return path


def write_json_list(tmp: Path) -> Path:
    path = tmp / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": ALL}))
    return path


def write_directory(tmp: Path) -> Path:
    (tmp / "nested" / "deeper").mkdir(parents=True)
    (tmp / "a.yml").write_text(yaml.safe_dump_all(ALL[:2]))
    (tmp / "nested" / "b.json").write_text(json.dumps({"kind": "NodeList", "items": [NODE]}))
    (tmp / "nested" / "deeper" / "c.yaml").write_text("---\n" + yaml.safe_dump_all(ALL[3:]) + "---\n")
    (tmp / "nested" / "README.md").write_text("not: [yaml")  # other suffixes are skipped
    return tmp


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(write_multi_document, id="multi-document YAML loads every supported kind"),
        pytest.param(write_list, id="a kind List loads its items"),
        pytest.param(write_json_list, id="a JSON List loads its items"),
        pytest.param(write_directory, id="a directory tree loads yaml, yml and json files only"),
    ],
)
def test_layouts(tmp_path: Path, write: Any) -> None:
    assert summary(write(tmp_path)) == WANT_ALL


def test_projections_keep_what_decisions_read() -> None:
    snap = build_snapshot([NAMESPACE, POD, NODE, CNP, CCNP])
    assert snap.namespaces["ml"] == NamespaceInfo("ml", {"team": "a", "kubernetes.io/metadata.name": "ml"})
    assert snap.pods[0] == PodInfo(
        name="w-0",
        namespace="ml",
        labels={"role": "worker"},
        service_account="trainer",
        node_name="gpu-1",
        phase="Running",
        requests={"nvidia.com/gpu": 8},
        ports=(ContainerPort(23456, "TCP", "rdzv"), ContainerPort(53, "UDP", "")),
        host_network=False,
        ips=("10.0.0.5",),
    )
    node = snap.nodes[0]
    assert (node.taints, dict(node.allocatable), node.ready) == (
        (Taint("nvidia.com/gpu", "", "NoSchedule"),),
        {"nvidia.com/gpu": 8},
        True,
    )
    assert snap.policies[0] == PolicyObject(
        kind="CiliumNetworkPolicy",
        api_version="cilium.io/v2",
        name="p",
        namespace="ml",
        body={
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumNetworkPolicy",
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"endpointSelector": {}, "ingress": [{}]},
        },
    )
    assert snap.policies[1].namespace == ""  # cluster-wide, whatever metadata says


@pytest.mark.parametrize(
    "obj, want",
    [
        pytest.param(
            {"kind": "Pod", "metadata": {"name": "p"}},
            ("default", "default", False, ()),
            id="a bare pod gets namespace and service account default",
        ),
        pytest.param(
            {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"serviceAccount": "old"}},
            ("default", "old", False, ()),
            id="the deprecated serviceAccount field is read",
        ),
        pytest.param(
            {
                "kind": "Pod",
                "metadata": {"name": "p", "namespace": "n"},
                "spec": {"hostNetwork": True},
                "status": {"podIP": "10.1.1.1"},
            },
            ("n", "default", True, ("10.1.1.1",)),
            id="hostNetwork and podIP without podIPs",
        ),
        pytest.param(
            {"kind": "Pod", "metadata": "junk", "spec": ["junk"], "status": 5},
            ("default", "default", False, ()),
            id="mistyped fields fall back to defaults",
        ),
    ],
)
def test_pod_defaults(obj: dict[str, Any], want: tuple[Any, ...]) -> None:
    pod = build_snapshot([obj]).pods[0]
    assert (pod.namespace, pod.service_account, pod.host_network, pod.ips) == want


@pytest.mark.parametrize(
    "files, message",
    [
        pytest.param({"bad.yaml": "kind: [unclosed"}, "bad.yaml: not valid YAML", id="broken YAML names the file"),
        pytest.param({"bad.json": "{nope"}, "bad.json: not valid JSON", id="broken JSON names the file"),
        pytest.param(
            {"bad.yaml": "kind: Pod\n---\n- a\n"},
            "bad.yaml document 2: expected a Kubernetes object, got list",
            id="a non-object document is named by number",
        ),
        pytest.param(
            {"bad.yaml": "kind: Pod\n---\nmetadata: {name: x}\n"},
            "bad.yaml document 2: object has no kind",
            id="an object without kind beside Kubernetes objects",
        ),
        pytest.param(
            {"bad.yaml": "kind: List\nitems: [1]\n"},
            "bad.yaml document 1 item 0: expected a Kubernetes object",
            id="a List item that is not an object",
        ),
        pytest.param({"bad.yaml": b"\xff\xfe\x00"}, "bad.yaml: cannot read", id="undecodable bytes"),
    ],
)
def test_errors_name_the_file_and_document(tmp_path: Path, files: dict[str, str | bytes], message: str) -> None:
    for name, content in files.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    with pytest.raises(SnapshotError) as caught:
        load_snapshot(tmp_path)
    assert message in str(caught.value)


def test_missing_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="no such file or directory"):
        load_snapshot(tmp_path / "absent.yaml")


def test_revision_follows_content(tmp_path: Path) -> None:
    path = write_multi_document(tmp_path)
    first, again = load_snapshot(path).revision, load_snapshot(path).revision
    path.write_text(yaml.safe_dump_all(ALL[:3]))
    assert first == again
    assert load_snapshot(path).revision != first


def test_string_host_network_false_is_not_host_network() -> None:
    pod = build_snapshot([{"kind": "Pod", "metadata": {"name": "p"}, "spec": {"hostNetwork": "false"}}]).pods[0]
    assert pod.host_network is False


def test_unquoted_boolean_label_values_read_as_the_apiserver_would_store_them() -> None:
    raw = {"kind": "Node", "metadata": {"name": "n", "labels": {"gpu": True, "spot": False}}}
    node = build_snapshot([raw]).nodes[0]
    assert dict(node.labels) == {"gpu": "true", "spot": "false"}


def test_empty_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="holds no"):
        load_snapshot(tmp_path)


def test_training_runtimes_keep_template_and_policies_only() -> None:
    pod = {"spec": {"containers": [{"name": "node", "image": "pytorch"}]}}
    template = {"metadata": {"labels": {"team": "a"}}, "spec": {"replicatedJobs": [{"name": "node", "template": {
        "spec": {"template": pod}}}]}}
    cluster_runtime = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "torch-distributed", "resourceVersion": "42",
                     "labels": {"trainer.kubeflow.org/framework": "torch"}, "managedFields": [{"manager": "kubectl"}]},
        "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "podGroupPolicy": {"volcano": {}}, "template": template},
        "status": {"whatever": True},
    }
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime",
               "metadata": {"name": "torch", "namespace": "ml"}, "spec": {"template": template}}

    snapshot = build_snapshot([cluster_runtime, runtime])

    got = {key: (r.ref, r.resource_version, dict(r.labels), dict(r.ml_policy), dict(r.pod_group_policy),
                 dict(r.template)) for key, r in snapshot.training_runtimes.items()}
    assert got == {
        ("ClusterTrainingRuntime", "", "torch-distributed"): (
            "ClusterTrainingRuntime torch-distributed", "42", {"trainer.kubeflow.org/framework": "torch"},
            {"numNodes": 1, "torch": {}}, {"volcano": {}}, template),
        ("TrainingRuntime", "ml", "torch"): ("TrainingRuntime ml/torch", "", {}, {}, {}, template),
    }
    assert snapshot.missing_kinds == ()
JOBS = """
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: js, namespace: ml, uid: u-js, annotations: {topoguard.io/zone: zone-b}}
spec:
  suspend: true
  replicatedJobs:
    - name: workers
      replicas: 2
      template:
        spec:
          parallelism: 4
          template:
            spec:
              containers: [{name: c, resources: {limits: {nvidia.com/gpu: "2"}}}]
---
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {name: tj, namespace: ml, creationTimestamp: "2026-12-01T10:00:00Z"}
spec:
  runtimeRef: {name: torch-distributed}
  trainer: {numNodes: 3, resourcesPerNode: {limits: {nvidia.com/gpu: 8}}}
status:
  conditions: [{type: Complete, status: "True"}]
---
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: tj
  namespace: ml
  ownerReferences: [{apiVersion: trainer.kubeflow.org/v1alpha1, kind: TrainJob, name: tj, uid: u-tj}]
spec:
  replicatedJobs: [{name: node, template: {spec: {template: {spec: {containers: [{name: node}]}}}}}]
"""


def test_training_jobs_are_kept_as_compact_projections(tmp_path: Path) -> None:
    (tmp_path / "jobs.yaml").write_text(JOBS)

    got = [(j.ref, j.zone, dict(j.demand), j.pods, j.suspended, j.finished, j.created)
           for j in load_snapshot(tmp_path).jobs]

    assert got == [
        ("JobSet ml/js", "zone-b", {"nvidia.com/gpu": 16}, 8, True, False, ""),
        ("TrainJob ml/tj", "", {"nvidia.com/gpu": 24}, 3, False, True, "2026-12-01T10:00:00Z"),
    ]  # the JobSet a TrainJob owns is the TrainJob's (it holds its GPUs), not a job of its own


def test_a_directory_file_that_is_no_kubernetes_object_is_skipped_with_a_note(tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump_all([NODE, NAMESPACE]))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"zoneIdentityLabel": "zone", "mode": "pin"}))
    notes: list[str] = []
    snap = load_snapshot(tmp_path, note=notes.append)
    assert [n.name for n in snap.nodes] == ["gpu-1"]
    assert notes == [f"{tmp_path / 'config.yaml'}: not a Kubernetes object (no kind), skipped"]


def test_the_same_file_named_directly_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"zoneIdentityLabel": "zone"}))
    with pytest.raises(SnapshotError, match="object has no kind"):
        load_snapshot(path)


def test_a_snapshot_without_nodes_says_nodes_are_missing(tmp_path: Path) -> None:
    (tmp_path / "ns.yaml").write_text(yaml.safe_dump(NAMESPACE))
    assert load_snapshot(tmp_path).missing_kinds == ("Node",)
    (tmp_path / "node.yaml").write_text(yaml.safe_dump(NODE))
    assert load_snapshot(tmp_path).missing_kinds == ()


@pytest.mark.parametrize("value", ["eight", "8x", [8], "nan", "inf"])
def test_an_unparsable_gpu_allocatable_is_kept_to_be_reported(value: Any) -> None:
    node = {**NODE, "status": {**NODE["status"], "allocatable": {"nvidia.com/gpu": value}}}  # type: ignore[dict-item]
    (got,) = build_snapshot([node]).nodes
    assert got.allocatable["nvidia.com/gpu"] == 0
    assert dict(got.unparsable) == {"nvidia.com/gpu": str(value)}
