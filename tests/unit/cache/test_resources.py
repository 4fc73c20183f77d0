"""The table of watched kinds: URLs, optional CRDs, which pods are kept."""

from __future__ import annotations

from typing import Any

import pytest

from app.cache import resources
from app.config import Settings


def test_every_kind_is_watched_at_its_collection_url() -> None:
    got = {r.kind: (r.path(r.api_versions[0]), r.optional) for r in resources.build_resources(Settings())}

    assert got == {
        "Node": ("/api/v1/nodes", False),
        "Namespace": ("/api/v1/namespaces", False),
        "Pod": ("/api/v1/pods", False),
        "NetworkPolicy": ("/apis/networking.k8s.io/v1/networkpolicies", False),
        "CiliumNetworkPolicy": ("/apis/cilium.io/v2/ciliumnetworkpolicies", True),
        "CiliumClusterwideNetworkPolicy": ("/apis/cilium.io/v2/ciliumclusterwidenetworkpolicies", True),
        "CiliumCIDRGroup": ("/apis/cilium.io/v2/ciliumcidrgroups", True),
        "TrainingRuntime": ("/apis/trainer.kubeflow.org/v1alpha1/trainingruntimes", True),
        "ClusterTrainingRuntime": ("/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes", True),
        "PyTorchJob": ("/apis/kubeflow.org/v1/pytorchjobs", True),
        "TFJob": ("/apis/kubeflow.org/v1/tfjobs", True),
        "MPIJob": ("/apis/kubeflow.org/v2beta1/mpijobs", True),
        "XGBoostJob": ("/apis/kubeflow.org/v1/xgboostjobs", True),
        "PaddleJob": ("/apis/kubeflow.org/v1/paddlejobs", True),
        "JAXJob": ("/apis/kubeflow.org/v1/jaxjobs", True),
        "JobSet": ("/apis/jobset.x-k8s.io/v1alpha2/jobsets", True),
        "TrainJob": ("/apis/trainer.kubeflow.org/v1alpha1/trainjobs", True),
        "ClusterNetworkPolicy": ("/apis/policy.networking.k8s.io/v1alpha2/clusternetworkpolicies", True),
        # Dynamic Resource Allocation, cluster-wide (claims of every namespace), and NVIDIA ComputeDomains.
        "DeviceClass": ("/apis/resource.k8s.io/v1/deviceclasses", True),
        "ResourceSlice": ("/apis/resource.k8s.io/v1/resourceslices", True),
        "ResourceClaim": ("/apis/resource.k8s.io/v1/resourceclaims", True),
        "ResourceClaimTemplate": ("/apis/resource.k8s.io/v1/resourceclaimtemplates", True),
        "ComputeDomain": ("/apis/resource.nvidia.com/v1beta1/computedomains", True),
        # The Cilium agent's settings and version: one object each, in its namespace (ciliumConfig).
        "ConfigMap": ("/api/v1/namespaces/kube-system/configmaps", False),
        "DaemonSet": ("/apis/apps/v1/namespaces/kube-system/daemonsets", False),
    }


def test_cilium_agent_objects_are_field_selected_by_name() -> None:
    got = {r.kind: (r.namespace, r.field_selector) for r in resources.build_resources(
        Settings(cilium_config="cilium/agent-config")) if r.kind in ("ConfigMap", "DaemonSet")}
    assert got == {"ConfigMap": ("cilium", "metadata.name=agent-config"),
                   "DaemonSet": ("cilium", "metadata.name=cilium")}


def test_empty_cilium_config_reads_neither() -> None:
    kinds = {r.kind for r in resources.build_resources(Settings(cilium_config=""))}
    assert not kinds & {"ConfigMap", "DaemonSet"}


def test_cluster_network_policies_are_also_read_at_a_newer_version() -> None:
    (kcnp,) = [r for r in resources.build_resources(Settings()) if r.kind == "ClusterNetworkPolicy"]
    assert kcnp.api_versions == ("policy.networking.k8s.io/v1alpha2", "policy.networking.k8s.io/v1beta1")


def test_cidr_groups_fall_back_to_v2alpha1() -> None:
    (groups,) = [r for r in resources.build_resources(Settings()) if r.kind == "CiliumCIDRGroup"]

    assert groups.api_versions == ("cilium.io/v2", "cilium.io/v2alpha1")


def test_pods_are_filtered_by_the_apiserver_to_non_terminal_ones() -> None:
    (pods,) = [r for r in resources.build_resources(Settings()) if r.kind == "Pod"]

    # Pending pods too: the audit counts a training job's pending pods (zone-closed).
    assert pods.field_selector == "status.phase!=Succeeded,status.phase!=Failed"


def pod(
    limits: dict[str, str],
    *,
    init: dict[str, str] | None = None,
    node: str = "n1",
    labels: dict[str, str] | None = None,
    owner: str = "",
    phase: str = "Running",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    if node:
        spec["nodeName"] = node
    if init:
        spec["initContainers"] = [{"name": "i", "resources": {"limits": init}}]
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "kubeflow.org/v1", "kind": owner, "name": "j", "controller": True}]
    return {"kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": phase}}


KF_POD = {"training.kubeflow.org/job-name": "train", "training.kubeflow.org/replica-type": "master"}
JOBSET_POD = {"jobset.sigs.k8s.io/jobset-name": "train", "jobset.sigs.k8s.io/replicatedjob-name": "node"}


@pytest.mark.parametrize(
    "gpu_resources, obj, kept",
    [
        pytest.param(("nvidia.com/gpu",), pod({"nvidia.com/gpu": "1"}), True, id="a GPU pod is kept"),
        pytest.param(("nvidia.com/gpu",), pod({"cpu": "4"}), False, id="a CPU pod is not kept"),
        pytest.param(("nvidia.com/gpu",), pod({"nvidia.com/gpu": "0"}), False, id="zero GPUs is not kept"),
        pytest.param(("nvidia.com/gpu",), pod({"amd.com/gpu": "2"}), False, id="an unconfigured GPU kind is ignored"),
        pytest.param(("amd.com/gpu", "nvidia.com/gpu"), pod({"amd.com/gpu": "2"}), True,
                     id="any configured GPU kind keeps the pod"),
        pytest.param(("nvidia.com/gpu",), pod({"cpu": "1"}, init={"nvidia.com/gpu": "1"}), True,
                     id="an init container holding a GPU keeps the pod"),
        pytest.param(("nvidia.com/gpu",), pod({"nvidia.com/gpu": "1"}, node=""), False,
                     id="a pending GPU pod of no training job is not kept"),
        pytest.param(("nvidia.com/gpu",), pod({"cpu": "1"}, labels=KF_POD), True,
                     id="a CPU-only kubeflow coordinator is kept"),
        pytest.param(("nvidia.com/gpu",), pod({"cpu": "1"}, labels=KF_POD, node="", phase="Pending"), True,
                     id="a pending kubeflow pod is kept"),
        pytest.param(("nvidia.com/gpu",), pod({"cpu": "1"}, labels=JOBSET_POD, node="", phase="Pending"), True,
                     id="a pending JobSet or TrainJob pod is kept"),
        pytest.param(("nvidia.com/gpu",), pod({"cpu": "1"}, owner="PyTorchJob"), True,
                     id="a pod a training job controls is kept"),
        pytest.param(("nvidia.com/gpu",), pod({"cpu": "1"}, owner="ReplicaSet", labels={"app": "web"}), False,
                     id="a pod of another controller is not kept"),
        pytest.param(("nvidia.com/gpu",), pod({"cpu": "1"}, labels=KF_POD, phase="Succeeded"), False,
                     id="a finished training pod is not kept"),
    ],
)
def test_which_pods_are_kept(gpu_resources: tuple[str, ...], obj: dict[str, Any], kept: bool) -> None:
    (pods,) = [r for r in resources.build_resources(Settings(gpu_resources=gpu_resources)) if r.kind == "Pod"]

    assert (pods.project(obj) is not None) == kept
