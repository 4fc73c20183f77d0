"""A large, realistic cluster for bench_scale.py, and a loopback list/watch server that serves it.

The objects are shaped as the apiserver stores them: kubelet-shaped Pods (managedFields, status with
conditions and containerStatuses, env, volumes, projected service-account tokens, owner references,
the operators' labels), Nodes with their status, CiliumNetworkPolicies, Namespaces and the training
jobs that own a share of the pods. Sizes scale with `World(nodes=...)`; the defaults are a 5,000-node
cluster with 150,000 pods, 1,000 CNPs, 200 namespaces and 3,000 PyTorchJobs.

`World.with_dra()` is the same cluster with its GPUs from NVIDIA's DRA driver (resource.k8s.io/v1): 7,500
nodes, the 5,000 GPU nodes each publishing one ResourceSlice of 8 GPUs (40,000 devices) and no
`nvidia.com/gpu` in allocatable; the DeviceClass `gpu.nvidia.com` mapping `nvidia.com/gpu` (KEP-5004);
ResourceClaimTemplates `gpus-1/2/4/8` in every namespace; 20,000 allocated ResourceClaims, one per GPU pod
that holds a device: workers of even-numbered jobs claim through a template (a `<pod>-gpu-<suffix>` claim
the resource-claim controller made), the other GPU pods write `nvidia.com/gpu` and hold the scheduler's
extended-resource claim. Shapes: ../shared/research/gpus-2026.md "Minimal realistic test fixtures".

The server (`serve`, run in a process of its own) speaks the part of the API the watch cache uses:
paged lists (`limit`/`continue`, one consistent resourceVersion per list, as the apiserver pages
them), watches from a resourceVersion with bookmarks, field selectors (`a=b`, `a!=b`, comma = AND),
and 404 for kinds it does not serve (absent CRDs). Items are serialised once, so a list costs what
writing the bytes costs, not what building them does. Pod churn is driven over a pipe: `churn(rate,
seconds)` sends ADDED / MODIFIED / DELETED pod events at a steady rate to every open pod watch (with
DRA, a recreated GPU pod's claim is deleted and a new one added too).
Loopback only; no TLS (the bench's kubeconfig says http).
"""

from __future__ import annotations

import functools
import random
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

ZONES = ("zone-a", "zone-b", "zone-c")
GPU = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
JOB_NS = "ml-demo"  # where the bench's reviews go (opted in)
DRIVER = "gpu.nvidia.com"  # NVIDIA's DRA driver, and its DeviceClass of whole GPUs
GPUS_PER_NODE = 8
CLAIM_TEMPLATES = (1, 2, 4, 8)  # ResourceClaimTemplate gpus-<n> in every namespace
EXTENDED_CLAIM = "resource.kubernetes.io/extended-resource-claim"


@dataclass(frozen=True)
class World:
    nodes: int = 5000
    pods: int = 150_000
    policies: int = 1000
    namespaces: int = 200
    jobs: int = 3000
    pods_per_job: int = 16
    dra: bool = False  # GPUs from DRA (ResourceSlices, claims), not the device plugin
    claims: int = 0  # allocated ResourceClaims (with dra)

    @staticmethod
    def with_dra() -> World:
        """5,000 GPU nodes (two thirds of 7,500) x 8 GPUs as ResourceSlices, 20,000 allocated claims."""
        return World(nodes=7500, dra=True, claims=20_000)

    def scaled(self, factor: float) -> World:
        return World(max(int(self.nodes * factor), 30), max(int(self.pods * factor), 300),
                     max(int(self.policies * factor), 30), max(int(self.namespaces * factor), 10),
                     max(int(self.jobs * factor), 10), self.pods_per_job, self.dra, int(self.claims * factor))


def _ts(i: int) -> str:
    return f"2026-11-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:{(i * 7) % 60:02d}Z"


def is_gpu_node(i: int) -> bool:
    return (i // len(ZONES)) % 3 != 2  # two thirds of every zone's nodes


@functools.cache
def _gpu_nodes_per_zone(nodes: int) -> int:
    return max(sum(1 for m in range(0, nodes // len(ZONES)) if m % 3 != 2), 1)


def gpu_node(zone: int, k: int, nodes: int) -> int:
    """The k-th GPU node of zone number `zone` (wrapping around the zone's GPU nodes)."""
    per_zone = _gpu_nodes_per_zone(nodes)
    k %= per_zone
    m = (k // 2) * 3 + (k % 2)
    return m * len(ZONES) + zone


def node(i: int, dra: bool = False) -> dict[str, Any]:
    """Node i; with `dra` a GPU node's GPUs come from its ResourceSlice, so its allocatable has none (KEP-5004)."""
    zone = ZONES[i % len(ZONES)]
    gpu = is_gpu_node(i)
    name = f"node-{i:05d}"
    labels = {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone,
              "topology.kubernetes.io/region": "us-east-1", "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "node.kubernetes.io/instance-type": "p4d.24xlarge" if gpu else "m6i.8xlarge",
              "beta.kubernetes.io/os": "linux", "failure-domain.beta.kubernetes.io/zone": zone}
    allocatable = {"cpu": "95500m", "memory": "1056276940Ki", "pods": "110", "ephemeral-storage": "1844Gi",
                   **({GPU: str(GPUS_PER_NODE)} if gpu and not dra else {})}
    return {
        "metadata": {"name": name, "uid": f"n-{i}", "resourceVersion": str(100 + i), "labels": labels,
                     "creationTimestamp": _ts(i),
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                     "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
        "spec": {"providerID": f"aws:///{zone}/i-{i:017x}", "podCIDR": f"10.{i // 256}.{i % 256}.0/24",
                 "podCIDRs": [f"10.{i // 256}.{i % 256}.0/24"], **({"taints": [GPU_TAINT]} if gpu else {})},
        "status": {"allocatable": allocatable, "capacity": allocatable,
                   "conditions": [{"type": t, "status": "False" if t != "Ready" else "True",
                                   "lastHeartbeatTime": _ts(i), "lastTransitionTime": _ts(i),
                                   "reason": f"Kubelet{t}", "message": f"kubelet {t}"}
                                  for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")],
                   "addresses": [{"type": "InternalIP", "address": f"10.0.{i // 256}.{i % 256}"},
                                 {"type": "Hostname", "address": name}],
                   "nodeInfo": {"kubeletVersion": "v1.36.3", "containerRuntimeVersion": "containerd://2.1.0",
                                "osImage": "Bottlerocket", "kernelVersion": "6.1.0", "architecture": "amd64",
                                "operatingSystem": "linux", "machineID": f"m{i}", "systemUUID": f"s{i}",
                                "bootID": f"b{i}", "kubeProxyVersion": "", "containerRuntime": "containerd"},
                   "images": [{"names": [f"registry.example/img-{k}:v1"], "sizeBytes": 100000000 + k}
                              for k in range(6)]},
    }


def namespace(i: int) -> dict[str, Any]:
    name = JOB_NS if i == 0 else f"team-{i:03d}"
    return {"metadata": {"name": name, "uid": f"ns-{i}", "resourceVersion": str(10 + i),
                         "labels": {"kubernetes.io/metadata.name": name, "topoguard.io/enabled": "true",
                                    "team": f"t{i % 20}"}},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}


def policy(i: int, namespaces: int) -> dict[str, Any]:
    if i < len(ZONES):
        zone = ZONES[i]
        return {"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
                "metadata": {"name": f"allow-intra-{zone}", "namespace": JOB_NS, "uid": f"p-{i}",
                             "resourceVersion": str(20000 + i)},
                "spec": {"endpointSelector": {"matchLabels": {"zone": zone}},
                         "ingress": [{"fromEndpoints": [{"matchLabels": {"zone": zone}}]}],
                         "egress": [{"toEndpoints": [{"matchLabels": {"zone": zone}}]},
                                    {"toEndpoints": [{"matchLabels": {
                                        "io.kubernetes.pod.namespace": "kube-system"}}]}]}}
    ns = f"team-{1 + i % max(namespaces - 1, 1):03d}"
    return {"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
            "metadata": {"name": f"svc-{i}", "namespace": ns, "uid": f"p-{i}", "resourceVersion": str(20000 + i)},
            "spec": {"endpointSelector": {"matchLabels": {"app": f"svc-{i}"}},
                     "ingress": [{"fromEndpoints": [{"matchLabels": {"app": f"client-{i}"}}],
                                  "toPorts": [{"ports": [{"port": str(8000 + i % 1000), "protocol": "TCP"}]}]}]}}


def job(i: int, namespaces: int, pods_per_job: int, dra: bool = False) -> dict[str, Any]:
    ns = f"team-{1 + i % max(namespaces - 1, 1):03d}"
    name = f"train-{i:05d}"
    zone = ZONES[i % len(ZONES)]

    def spec(role: str, gpus: int) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "pytorch", "image": "pytorch/pytorch:2.4.0",
                                     "resources": {"limits": {GPU: gpus}} if gpus else {}}
        claims = {}
        if gpus and dra and i % 2 == 0:  # the GPUs through a ResourceClaimTemplate
            container["resources"] = {"claims": [{"name": "gpu"}]}
            claims = {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": f"gpus-{gpus}"}]}
        return {"replicas": 1 if role == "Master" else pods_per_job - 1, "restartPolicy": "OnFailure",
                "template": {"spec": {"containers": [container], **claims,
                                      **({"tolerations": [{"key": GPU, "operator": "Exists"}]} if gpus else {})}}}

    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": ns, "uid": f"job-{i}", "resourceVersion": str(30000 + i),
                         "creationTimestamp": _ts(i), "annotations": {"topoguard.io/zone": zone}},
            "spec": {"pytorchReplicaSpecs": {"Master": spec("Master", 0), "Worker": spec("Worker", 4)}},
            "status": {"conditions": [{"type": "Running", "status": "True", "lastTransitionTime": _ts(i)}]}}


def _placement(i: int, world: World) -> tuple[bool, int, int, int, int]:
    """Pod i: (in a training job, job number, index in the job, node number, GPUs by the device plugin's count):
    the first jobs x pods_per_job pods are the jobs' (1-GPU Workers, a CPU Master, on GPU nodes of the job's
    zone), every fifth other pod on a GPU node takes a GPU."""
    in_job = i < world.jobs * world.pods_per_job
    job_i, index = divmod(i, world.pods_per_job)
    if in_job:
        return True, job_i, index, gpu_node(job_i % len(ZONES), job_i * 7 + index, world.nodes), 1 if index else 0
    node_i = i % world.nodes
    return False, job_i, index, node_i, 1 if is_gpu_node(node_i) and i % 5 == 0 else 0


@functools.cache
def dra_plan(world: World) -> dict[int, tuple[int, int]]:
    """With DRA: pod number -> (node number, device index) for `world.claims` bound GPU pods spread evenly over all
    of them (a pod whose node has no device left holds none, the next one takes its place)."""
    holders = [i for i in range(world.pods) if i % 97 and _placement(i, world)[4]]
    plan: dict[int, tuple[int, int]] = {}
    used: dict[int, int] = {}
    for o, i in enumerate(holders):
        if len(plan) >= (o + 1) * world.claims // len(holders):
            continue  # ahead of an even spread
        node_i = _placement(i, world)[3]
        if used.get(node_i, 0) < GPUS_PER_NODE:
            plan[i] = (node_i, used.get(node_i, 0))
            used[node_i] = plan[i][1] + 1
    return plan


def claim_name(pod_name: str, via_template: bool, attempt: int) -> str:
    """The claim's generated name: `<pod>-<claim>-<5 chars>` (resource-claim controller) or
    `<pod>-extended-resources-<5 chars>` (the scheduler, KEP-5004)."""
    return f"{pod_name}-{'gpu' if via_template else 'extended-resources'}-{attempt:05x}"


def claim(i: int, world: World, *, generation: int = 0, attempt: int = 0) -> dict[str, Any]:
    """The allocated ResourceClaim of pod i (one of `dra_plan`), as the resource-claim controller or the scheduler
    writes it."""
    node_i, device = dra_plan(world)[i]
    owner = pod(i, world, generation=generation, attempt=attempt)
    meta = owner["metadata"]
    via_template = "resourceClaims" in owner["spec"]
    request = "gpu" if via_template else "container-0-request-0"
    node_name = f"node-{node_i:05d}"
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": claim_name(meta["name"], via_template, attempt), "namespace": meta["namespace"],
                         "uid": f"claim-{i}-{generation}-{attempt}", "resourceVersion": "0",
                         "creationTimestamp": meta["creationTimestamp"],
                         "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"} if via_template
                         else {EXTENDED_CLAIM: "true"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                              "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"devices": {"requests": [{"name": request, "exactly": {
                "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 1}}]}},
            "status": {"allocation": {
                "devices": {"results": [{"request": request, "driver": DRIVER, "pool": node_name,
                                         "device": f"gpu-{device}"}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}},
                "reservedFor": [{"resource": "pods", "name": meta["name"], "uid": meta["uid"]}]}}


def device_class() -> dict[str, Any]:
    """NVIDIA's chart's DeviceClass of whole GPUs (templates/deviceclass-gpu.yaml), mapping nvidia.com/gpu."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": DRIVER, "uid": "dc-gpu", "resourceVersion": "0"},
            "spec": {"extendedResourceName": GPU, "selectors": [{"cel": {"expression": (
                f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'")}}]}}


def resource_slice(i: int) -> dict[str, Any]:
    """GPU node i's slice as the NVIDIA DRA driver publishes it: one pool per node (the node's name), 8 GPUs."""
    name = f"node-{i:05d}"
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{name}-{DRIVER}-{i % 99991:05x}", "uid": f"rs-{i}", "resourceVersion": "0",
                         "creationTimestamp": _ts(i),
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": f"n-{i}",
                                              "controller": True}]},
            "spec": {"driver": DRIVER, "nodeName": name, "pool": {"name": name, "generation": 1,
                                                                 "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{d}", "attributes": {
                         "type": {"string": "gpu"}, "uuid": {"string": f"GPU-{i:08x}-{d:04x}-7660-471eed407181"},
                         "productName": {"string": "NVIDIA H100 80GB HBM3"}, "brand": {"string": "Nvidia"},
                         "architecture": {"string": "Hopper"}, "cudaComputeCapability": {"version": "9.0.0"},
                         "driverVersion": {"version": "580.126.20"}, "cudaDriverVersion": {"version": "13.0.0"},
                         "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x18 + d:02x}:00.0"},
                         "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{d // 2:02x}"}},
                         "capacity": {"memory": {"value": "80Gi"}}} for d in range(GPUS_PER_NODE)]}}


def claim_template(namespace: str, gpus: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": f"gpus-{gpus}", "namespace": namespace, "uid": f"rct-{namespace}-{gpus}",
                         "resourceVersion": "0"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": gpus}}]}}}}


def pod(i: int, world: World, *, generation: int = 0, restarts: int = 0, attempt: int = 0) -> dict[str, Any]:
    """Pod number i: the first jobs x pods_per_job belong to training jobs (1-GPU Workers, a CPU Master, all
    in the job's zone), the rest are ordinary workloads (every fifth on a GPU node takes a GPU); a few
    are Pending. `generation` renames an ordinary pod (a rollout); `restarts` changes only its status. With DRA
    only the pods of `dra_plan` hold a GPU, each one device of its node through its claim (`claim`; `attempt`
    counts the claims a recreated pod has had)."""
    in_job, job_i, index, node_i, gpus = _placement(i, world)
    ns_count = max(world.namespaces - 1, 1)
    if in_job:
        ns = f"team-{1 + job_i % ns_count:03d}"
        role = "master" if index == 0 else "worker"
        name = f"train-{job_i:05d}-{role}-{index if index == 0 else index - 1}"
        labels = {"training.kubeflow.org/job-name": f"train-{job_i:05d}", "training.kubeflow.org/operator-name":
                  "pytorchjob-controller", "training.kubeflow.org/replica-type": role,
                  "training.kubeflow.org/replica-index": str(index if index == 0 else index - 1),
                  **({"training.kubeflow.org/job-role": "master"} if index == 0 else {})}
        owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": f"train-{job_i:05d}",
                 "uid": f"job-{job_i}", "controller": True, "blockOwnerDeletion": True}
    else:
        ns = f"team-{1 + i % ns_count:03d}"
        app = f"svc-{i % 997}"
        name = f"{app}-{i:06x}-{generation}"
        labels = {"app": app, "pod-template-hash": f"{i % 65536:04x}"}
        owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{app}-{i % 65536:04x}",
                 "uid": f"rs-{i % 997}", "controller": True, "blockOwnerDeletion": True}
    pending = i % 97 == 0
    node_name = "" if pending else f"node-{node_i:05d}"
    resources: dict[str, Any] = {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}
    via_template = False
    if world.dra:
        gpus = 1 if i in dra_plan(world) else 0
        via_template = gpus > 0 and in_job and job_i % 2 == 0
    if via_template:
        resources["claims"] = [{"name": "gpu"}]
    elif gpus:
        resources["limits"][GPU] = str(gpus)
        resources["requests"][GPU] = str(gpus)
    container = {
        "name": "main", "image": f"registry.example/team/app:{i % 13}", "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/app", "--port=8080"], "ports": [{"containerPort": 8080, "protocol": "TCP", "name": "http"}],
        "env": [{"name": f"VAR_{k}", "value": f"value-{k}-{i}"} for k in range(3)]
        + [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}],
        "resources": resources,
        "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                          "readOnly": True}, {"name": "data", "mountPath": "/data"}],
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
    }
    started = _ts(i + generation)
    restarts += generation % 3
    status: dict[str, Any] = {"phase": "Pending" if pending else "Running", "qosClass": "Burstable"}
    if not pending:
        status.update(
            hostIP=f"10.0.{node_i // 256}.{node_i % 256}", podIP=f"10.{node_i // 256}.{node_i % 256}.{i % 250 + 2}",
            podIPs=[{"ip": f"10.{node_i // 256}.{node_i % 256}.{i % 250 + 2}"}], startTime=started,
            conditions=[{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": started}
                        for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                  "PodScheduled")],
            containerStatuses=[{"name": "main", "ready": True, "restartCount": restarts, "started": True,
                                "image": container["image"], "imageID": f"sha256:{i:064x}",
                                "containerID": f"containerd://{i:064x}",
                                "state": {"running": {"startedAt": started}}, "lastState": {}}])
    else:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                 "message": "0/5000 nodes are available", "lastTransitionTime": started}]
    claim_refs = {}
    if world.dra and gpus:
        held = claim_name(name, via_template, attempt)
        if via_template:
            claim_refs = {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpus-1"}]}
            status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": held}]
        else:
            status["extendedResourceClaimStatus"] = {"resourceClaimName": held, "requestMappings": [
                {"containerName": "main", "resourceName": GPU, "requestName": "container-0-request-0"}]}
    return {
        "metadata": {
            "name": name, "namespace": ns, "uid": f"pod-{i}-{generation}", "resourceVersion": "0",
            "creationTimestamp": started, "labels": labels, "ownerReferences": [owner],
            "annotations": {"kubectl.kubernetes.io/restartedAt": started},
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1", "time": started,
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {k: {} for k in labels}},
                                                        "f:spec": {"f:containers": {'k:{"name":"main"}': {}}}}},
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": started,
                 "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:phase": {}}}}],
        },
        "spec": {
            "containers": [container], "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst", "serviceAccountName": "default", "serviceAccount": "default",
            **({"nodeName": node_name} if node_name else {}), "schedulerName": "default-scheduler", **claim_refs,
            "securityContext": {}, "priority": 0, "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300},
                            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300}] + ([{"key": GPU, "operator": "Exists"}] if gpus else []),
            "volumes": [{"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1",
                                                                              "fieldPath": "metadata.namespace"}}]}}]}},
                {"name": "data", "emptyDir": {}}],
        },
        "status": status,
    }


# --- the server ------------------------------------------------------------------------------------

# (api group/version path, plural) -> (kind, list kind)
SERVED = {
    ("/api/v1", "nodes"): "Node",
    ("/api/v1", "namespaces"): "Namespace",
    ("/api/v1", "pods"): "Pod",
    ("/apis/networking.k8s.io/v1", "networkpolicies"): "NetworkPolicy",
    ("/apis/cilium.io/v2", "ciliumnetworkpolicies"): "CiliumNetworkPolicy",
    ("/apis/cilium.io/v2", "ciliumclusterwidenetworkpolicies"): "CiliumClusterwideNetworkPolicy",
    ("/apis/kubeflow.org/v1", "pytorchjobs"): "PyTorchJob",
    # The Cilium agent's ConfigMap and DaemonSet, watched by name in kube-system: none here (an empty list).
    ("/api/v1/namespaces/kube-system", "configmaps"): "ConfigMap",
    ("/apis/apps/v1/namespaces/kube-system", "daemonsets"): "DaemonSet",
}
# Served only by a DRA world (elsewhere a 404, as on a cluster without resource.k8s.io/v1).
DRA_SERVED = {
    ("/apis/resource.k8s.io/v1", "deviceclasses"): "DeviceClass",
    ("/apis/resource.k8s.io/v1", "resourceslices"): "ResourceSlice",
    ("/apis/resource.k8s.io/v1", "resourceclaims"): "ResourceClaim",
    ("/apis/resource.k8s.io/v1", "resourceclaimtemplates"): "ResourceClaimTemplate",
}


def _field(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _matches(obj: dict[str, Any], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            path, want = term.split("!=", 1)
            if _field(obj, path) == want:
                return False
        else:
            path, want = term.split("=", 1)
            if _field(obj, path.rstrip("=")) != want:
                return False
    return True


class Store:
    """Objects by kind, each with its serialised form; one global resourceVersion, as etcd keeps it."""

    def __init__(self, served: dict[tuple[str, str], str]) -> None:
        self.lock = threading.Lock()
        self.rv = 1000
        self.served = served
        self.objects: dict[str, dict[str, tuple[dict[str, Any], bytes]]] = {k: {} for k in served.values()}
        self.watchers: dict[str, list[tuple[str, list[bytes], threading.Condition]]] = {k: [] for k in served.values()}
        self.order: dict[str, list[str]] = {}  # sorted keys per kind, dropped when a key comes or goes

    def put(self, kind: str, obj: dict[str, Any], event: str = "") -> None:
        with self.lock:
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            key = f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"
            if event == "DELETED":
                self.objects[kind].pop(key, None)
                self.order.pop(kind, None)
            else:
                if key not in self.objects[kind]:
                    self.order.pop(kind, None)
                self.objects[kind][key] = (obj, orjson.dumps(obj))
            if event:
                self._send(kind, event, obj)

    def _send(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        line = None
        for selector, queue, cond in self.watchers[kind]:
            if selector and not _matches(obj, selector):
                continue  # (an object leaving the selector would be a DELETED; churn keeps pods bound)
            line = line or orjson.dumps({"type": event, "object": obj}) + b"\n"
            with cond:
                queue.append(line)
                cond.notify()


def _pages(store: Store, kind: str, selector: str, limit: int, token: str) -> tuple[bytes, str]:
    with store.lock:
        rv = token.split(":")[0] if token else str(store.rv)
        keys = store.order.get(kind)
        if keys is None:
            keys = store.order[kind] = sorted(store.objects[kind])
        start = int(token.split(":")[1]) if token else 0
        items: list[bytes] = []
        i = start
        while i < len(keys) and len(items) < limit:
            obj, data = store.objects[kind][keys[i]]
            if not selector or _matches(obj, selector):
                items.append(data)
            i += 1
    more = f"{rv}:{i}" if i < len(keys) else ""
    meta = {"resourceVersion": rv, **({"continue": more} if more else {})}
    return (b'{"kind":"' + kind.encode() + b'List","apiVersion":"v1","metadata":' + orjson.dumps(meta)
            + b',"items":[' + b",".join(items) + b"]}"), more


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    store: Store

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        group, _, plural = url.path.rpartition("/")
        kind = self.store.served.get((group, plural))
        if kind is None:
            body = orjson.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                                 "code": 404, "message": "the server could not find the requested resource"})
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        selector = query.get("fieldSelector", "")
        if query.get("watch", "").lower() in ("true", "1"):
            self._watch(kind, selector, int(query.get("timeoutSeconds", "300")))
            return
        body, _ = _pages(self.store, kind, selector, int(query.get("limit", "500")), query.get("continue", ""))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _watch(self, kind: str, selector: str, timeout: int) -> None:
        queue: list[bytes] = []
        cond = threading.Condition()
        entry = (selector, queue, cond)
        with self.store.lock:
            self.store.watchers[kind].append(entry)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        until = time.monotonic() + timeout
        try:
            while time.monotonic() < until:
                with cond:
                    if not queue:
                        cond.wait(1.0)
                    lines, queue[:] = list(queue), []
                if not lines:
                    mark = {"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": "v1",
                                                           "metadata": {"resourceVersion": str(self.store.rv)}}}
                    lines = [orjson.dumps(mark) + b"\n"]
                data = b"".join(lines)
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with self.store.lock:
                self.store.watchers[kind].remove(entry)


def objects(world: World) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object of the world, by kind."""
    for i in range(world.namespaces):
        yield "Namespace", namespace(i)
    for i in range(world.nodes):
        yield "Node", node(i, world.dra)
    for i in range(world.policies):
        yield "CiliumNetworkPolicy", policy(i, world.namespaces)
    for i in range(world.jobs):
        yield "PyTorchJob", job(i, world.namespaces, world.pods_per_job, world.dra)
    for i in range(world.pods):
        yield "Pod", pod(i, world)
    if world.dra:
        yield "DeviceClass", device_class()
        for i in range(world.nodes):
            if is_gpu_node(i):
                yield "ResourceSlice", resource_slice(i)
        for i in range(world.namespaces):
            for gpus in CLAIM_TEMPLATES:
                yield "ResourceClaimTemplate", claim_template(namespace(i)["metadata"]["name"], gpus)
        for i in dra_plan(world):
            yield "ResourceClaim", claim(i, world)


def served(world: World) -> dict[tuple[str, str], str]:
    return {**SERVED, **(DRA_SERVED if world.dra else {})}


def populate(store: Store, world: World) -> None:
    for kind, obj in objects(world):
        store.put(kind, obj)


def write_list(world: World, path: Any) -> int:
    """The world as `kubectl get ... -o json` writes it (one List, `items` before `kind`; each item with its
    kind); the file's size in bytes."""
    with open(path, "wb") as out:
        out.write(b'{"apiVersion": "v1", "items": [')
        for n, (kind, obj) in enumerate(objects(world)):
            out.write(b"," if n else b"")
            out.write(orjson.dumps({"kind": kind, **obj}))
        out.write(b'], "kind": "List", "metadata": {"resourceVersion": ""}}')
        return out.tell()


def churn_events(world: World, rng: random.Random) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Endless pod churn, as (kind, event, object): 60 % MODIFIED (a status update: a restart), 40 % a rollout
    step (DELETED, then ADDED back: an ordinary pod under a new name, a training pod recreated by its operator).
    With DRA a recreated GPU pod's claim goes with it and a new one (another name) is allocated the device."""
    generations: dict[int, int] = {}
    restarts: dict[int, int] = {}
    attempts: dict[int, int] = {}
    plan = dra_plan(world) if world.dra else {}
    while True:
        i = rng.randrange(world.pods)
        generation, attempt = generations.get(i, 0), attempts.get(i, 0)
        if rng.random() < 0.6:
            restarts[i] = restarts.get(i, 0) + 1
            yield "Pod", "MODIFIED", pod(i, world, generation=generation, restarts=restarts[i], attempt=attempt)
        else:
            yield "Pod", "DELETED", pod(i, world, generation=generation, attempt=attempt)
            if i in plan:
                yield "ResourceClaim", "DELETED", claim(i, world, generation=generation, attempt=attempt)
                attempts[i] = attempt = attempt + 1
            if i >= world.jobs * world.pods_per_job:
                generations[i] = generation = generation + 1
            restarts.pop(i, None)
            if i in plan:
                yield "ResourceClaim", "ADDED", claim(i, world, generation=generation, attempt=attempt)
            yield "Pod", "ADDED", pod(i, world, generation=generation, attempt=attempt)


def serve(world: World, port_out: Any, commands: Any) -> None:
    """The server process: populate, listen on 127.0.0.1, send the port, then obey commands.

    Commands (over the pipe): ("churn", rate, seconds) starts sending events in a thread and answers
    ("churned", n, seconds) when done; ("put", kind, obj, event) stores one object (event "" for no
    watch event), answered with ("put",) only while no churn runs; ("stop",).
    """
    store = Store(served(world))
    started = time.perf_counter()
    populate(store, world)
    handler = type("Handler", (_Handler,), {"store": store})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port_out.send((server.server_address[1], time.perf_counter() - started))
    events = churn_events(world, random.Random(7))
    send_lock = threading.Lock()
    churning = threading.Event()

    def churn(rate: float, seconds: float) -> None:
        sent, begin = 0, time.perf_counter()
        while (now := time.perf_counter()) - begin < seconds:
            due = int((now - begin) * rate)
            while sent < due:
                kind, event, obj = next(events)
                store.put(kind, obj, event)
                sent += 1
            time.sleep(0.002)
        churning.clear()
        with send_lock:
            commands.send(("churned", sent, time.perf_counter() - begin))

    while True:
        command = commands.recv()
        if command[0] == "stop":
            server.shutdown()
            return
        if command[0] == "put":
            _, kind, obj, event = command
            store.put(kind, obj, event)
            if not churning.is_set():
                with send_lock:
                    commands.send(("put",))
        elif command[0] == "churn":
            churning.set()
            threading.Thread(target=churn, args=command[1:], daemon=True).start()
