"""The kinds the watch cache follows: where each is served, how it is requested, how it is projected.

One `Resource` per kind. Requests go through the official client's generated list methods with
`_preload_content=False`, so we get the raw urllib3 response and parse JSON ourselves: the client's
model deserialisation is far too slow for a 5,000-node NodeList (research/perf-rel-sec.md, P5),
and a projection is all we keep. This module does not loop, retry or keep state (reflector.py does).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from app.cache import projections
from app.cache.errors import ApiError
from app.config import Settings
from app.engine import ledger
from app.models.pods import PodIndexBuilder
from app.models.resources import gpu_matcher

# Non-terminal pods, bound or pending: the snapshot keeps the bound GPU pods (GPU capacity, DESIGN.md
# step 3) and every pod of a training job (the audit: which zones its pods run in, which are pending).
# A label selector cannot OR the operators' job-name labels, so the projector picks those pods.
POD_FIELD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"
CRD_ABSENT = "absent (CRD not installed)"

Projector = Callable[[Mapping[str, Any]], Any]  # raw object -> projection, or None to not keep it


@dataclass(frozen=True)
class Resource:
    """One watched kind.

    Attributes:
        kind: the Kubernetes kind, also the key in SyncStatus.detail and counts().
        plural: the resource name in the URL.
        api_versions: candidate apiVersions, most preferred first; the first one served is used
            (CiliumCIDRGroup is cilium.io/v2 since Cilium 1.18 and v2alpha1 before it).
        optional: a CRD that may not be installed: a 404 on list marks the kind absent, not failing.
        field_selector: sent with list and watch (the apiserver filters; it also turns an object
            that stops matching into a DELETED event).
        project: raw object -> projection, or None when the object is not kept.
        namespace: list and watch in this namespace only ("" = every namespace); with a
            `metadata.name=` field selector, RBAC can grant it on that one object (resourceNames).
    """

    kind: str
    plural: str
    api_versions: tuple[str, ...]
    project: Projector
    optional: bool = False
    field_selector: str = ""
    namespace: str = ""
    # Makes an aggregate kept as projections come and go (`replace(old, new)`, `freeze()`); None: none.
    aggregate: Callable[[], Any] | None = None

    def path(self, api_version: str) -> str:
        """The collection URL path (for logs and the fake apiserver)."""
        where = f"namespaces/{self.namespace}/" if self.namespace else ""
        if "/" not in api_version:
            return f"/api/{api_version}/{where}{self.plural}"
        return f"/apis/{api_version}/{where}{self.plural}"


def _pod_projector(gpu_resources: tuple[str, ...]) -> Projector:
    """Keeps a non-terminal pod that is bound and holds GPUs, or that belongs to a training job (bound or
    pending, CPU-only coordinators included; `ledger.is_job_pod`, the ledger's own matching); every other
    pod is dropped, so memory grows with GPU and training pods, not with the cluster's pods."""
    job_kinds = frozenset(projections.JOB_KINDS)
    is_gpu = gpu_matcher(gpu_resources)

    def project(obj: Mapping[str, Any]) -> Any:
        pod = projections.project_pod(obj)
        if pod.terminal:
            return None  # the field selector already filters these; a stale MODIFIED may still carry one
        if ledger.is_job_pod(pod, job_kinds):
            return pod
        if pod.node_name and any(n > 0 and is_gpu(name) for name, n in pod.requests.items()):
            return pod
        return None

    return project


# The training jobs, for the reservation ledger: every kind topoguard places, each an optional CRD
# (absent ones are reported in the status, never as missing policy input).
JOB_RESOURCES = (
    ("PyTorchJob", "pytorchjobs", ("kubeflow.org/v1",)),
    ("TFJob", "tfjobs", ("kubeflow.org/v1",)),
    ("MPIJob", "mpijobs", ("kubeflow.org/v2beta1", "kubeflow.org/v1")),
    ("XGBoostJob", "xgboostjobs", ("kubeflow.org/v1",)),
    ("PaddleJob", "paddlejobs", ("kubeflow.org/v1",)),
    ("JAXJob", "jaxjobs", ("kubeflow.org/v1",)),
    ("JobSet", "jobsets", ("jobset.x-k8s.io/v1alpha2",)),
    ("TrainJob", "trainjobs", ("trainer.kubeflow.org/v1alpha1",)),
)
JOB_KINDS = tuple(kind for kind, _, _ in JOB_RESOURCES)

# Dynamic Resource Allocation (GA as resource.k8s.io/v1 since Kubernetes 1.34) and NVIDIA ComputeDomains: every
# one optional (an older cluster, or no NVIDIA DRA driver, serves none), each projected compactly
# (projections.project_*; research/gpus-2026.md section 3). Claims are read in every namespace: any claim's
# allocation takes devices.
DRA_RESOURCES = (
    ("DeviceClass", "deviceclasses", ("resource.k8s.io/v1",), projections.project_device_class),
    ("ResourceSlice", "resourceslices", ("resource.k8s.io/v1",), projections.project_resource_slice),
    ("ResourceClaim", "resourceclaims", ("resource.k8s.io/v1",), projections.project_resource_claim),
    ("ResourceClaimTemplate", "resourceclaimtemplates", ("resource.k8s.io/v1",), projections.project_claim_template),
    ("ComputeDomain", "computedomains", ("resource.nvidia.com/v1beta1",), projections.project_compute_domain),
)
DRA_KINDS = tuple(kind for kind, _, _, _ in DRA_RESOURCES)


def build_resources(settings: Settings) -> tuple[Resource, ...]:
    """Every kind the cache follows, in the order their status is reported."""
    job_projector = functools.partial(projections.project_job, gpu_resources=tuple(settings.gpu_resources),
                                      collective_ports=settings.collective_ports)
    return (
        Resource("Node", "nodes", ("v1",), projections.project_node),
        Resource("Namespace", "namespaces", ("v1",), projections.project_namespace),
        Resource(
            "Pod",
            "pods",
            ("v1",),
            _pod_projector(tuple(settings.gpu_resources)),
            field_selector=POD_FIELD_SELECTOR,
            aggregate=PodIndexBuilder,
        ),
        Resource("NetworkPolicy", "networkpolicies", ("networking.k8s.io/v1",), projections.project_policy),
        Resource(
            "CiliumNetworkPolicy", "ciliumnetworkpolicies", ("cilium.io/v2",), projections.project_policy, optional=True
        ),
        Resource(
            "CiliumClusterwideNetworkPolicy",
            "ciliumclusterwidenetworkpolicies",
            ("cilium.io/v2",),
            projections.project_policy,
            optional=True,
        ),
        Resource(
            "CiliumCIDRGroup",
            "ciliumcidrgroups",
            ("cilium.io/v2", "cilium.io/v2alpha1"),
            projections.project_cidr_group,
            optional=True,
        ),
        Resource(
            "TrainingRuntime",
            "trainingruntimes",
            ("trainer.kubeflow.org/v1alpha1",),
            projections.project_training_runtime,
            optional=True,
        ),
        Resource(
            "ClusterTrainingRuntime",
            "clustertrainingruntimes",
            ("trainer.kubeflow.org/v1alpha1",),
            projections.project_training_runtime,
            optional=True,
        ),
        *(
            Resource(kind, plural, versions, job_projector, optional=True)
            for kind, plural, versions in JOB_RESOURCES
        ),
        # Cilium 1.20's ClusterNetworkPolicy; v1beta1 too, so a cluster serving only a newer version is
        # not mistaken for one without the CRD (those policies are then `unknown`, never skipped).
        Resource(
            "ClusterNetworkPolicy",
            "clusternetworkpolicies",
            ("policy.networking.k8s.io/v1alpha2", "policy.networking.k8s.io/v1beta1"),
            projections.project_policy,
            optional=True,
        ),
        *(
            Resource(kind, plural, versions, project, optional=True)
            for kind, plural, versions, project in DRA_RESOURCES
        ),
        *_cilium_agent_resources(settings),
    )


def _cilium_agent_resources(settings: Settings) -> tuple[Resource, ...]:
    """The cilium-config ConfigMap and the agent DaemonSet: one object each, field-selected by name."""
    where = settings.cilium_objects()
    if where is None:
        return ()
    namespace, config_map, daemon_set = where
    return (
        Resource("ConfigMap", "configmaps", ("v1",), projections.project_config_map, namespace=namespace,
                 field_selector=f"metadata.name={config_map}"),
        Resource("DaemonSet", "daemonsets", ("apps/v1",), projections.project_agent_image, namespace=namespace,
                 field_selector=f"metadata.name={daemon_set}"),
    )


_CORE_LISTERS = {"nodes": "list_node", "namespaces": "list_namespace", "pods": "list_pod_for_all_namespaces"}
_NAMESPACED_CORE_LISTERS = {"configmaps": "list_namespaced_config_map"}


@dataclass(frozen=True)
class Apis:
    """The generated API objects, built once: the first CoreV1Api() loads the client's models, which
    takes seconds, and much longer when every watch thread does it at the same time."""

    core: Any
    custom: Any

    @classmethod
    def build(cls, api_client: client.ApiClient) -> Apis:
        return cls(core=client.CoreV1Api(api_client), custom=client.CustomObjectsApi(api_client))


def open_collection(
    apis: Apis,
    resource: Resource,
    api_version: str,
    *,
    timeout: tuple[float, float],
    **query: Any,
) -> Any:
    """Send one list or watch request and return the unread urllib3 response.

    Args:
        apis: the generated API objects of the configured client (auth, TLS, host).
        resource: which collection.
        api_version: one of `resource.api_versions`.
        timeout: (connect, read) seconds for the socket; the read timeout must exceed a watch's
            `timeout_seconds`, or an idle watch would look like a failure.
        **query: the generated client's list parameters (watch, resource_version, limit, _continue,
            allow_watch_bookmarks, timeout_seconds). None values are not sent.

    Raises:
        ApiError: the apiserver answered with a non-2xx status (wraps ApiException).
    """
    params = {k: v for k, v in query.items() if v is not None}
    if resource.field_selector:
        params["field_selector"] = resource.field_selector
    params.update(_preload_content=False, _request_timeout=timeout)
    try:
        if "/" not in api_version and resource.namespace:
            return getattr(apis.core, _NAMESPACED_CORE_LISTERS[resource.plural])(resource.namespace, **params)
        if "/" not in api_version:
            return getattr(apis.core, _CORE_LISTERS[resource.plural])(**params)
        group, version = api_version.split("/", 1)
        if resource.namespace:
            return apis.custom.list_namespaced_custom_object(group, version, resource.namespace, resource.plural,
                                                             **params)
        return apis.custom.list_cluster_custom_object(group, version, resource.plural, **params)
    except ApiException as e:
        raise ApiError.from_exception(e) from e
