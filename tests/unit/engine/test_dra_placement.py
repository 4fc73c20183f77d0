"""GPUs handed out through DRA are placed as the kube-scheduler serves them: claims from templates, extended
resources a DeviceClass maps on nodes whose allocatable lists none (KEP-5004), allocated devices taken, and a
claim that cannot be judged never placed blind."""

from __future__ import annotations

from typing import Any

from app import jobs
from app.cache.files import build_snapshot
from app.config import Settings
from app.engine.decide import decide_fresh
from app.models.cluster import Snapshot

ZL = "topology.kubernetes.io/zone"
SETTINGS = Settings()
GPU_CLASS = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                                                  "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}],
             "extendedResourceName": "nvidia.com/gpu"},
}


def node(name: str, zone: str, gpus: int = 0) -> dict[str, Any]:
    allocatable = {"cpu": "32", "memory": "256Gi", "pods": "110"}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {ZL: zone, "kubernetes.io/hostname": name}},
            "status": {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": "True"}]}}


def gpu_slice(node_name: str, count: int, *, generation: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node_name}-gpus"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node_name,
                 "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
                 "devices": [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}}} for i in range(count)]},
    }


def allocated_claim(name: str, node_name: str, devices: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": "other"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                       "count": len(devices)}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node_name, "device": d} for d in devices]}}},
    }


ONE_GPU = {
    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "one-gpu",
                                                                                     "namespace": "ml"},
    "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                           "count": 1}}]}}},
}


def pytorchjob(worker_spec: dict[str, Any], workers: int = 4) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": {"spec": {"containers": [{"name": "pytorch", "image": "x"}]}}},
            "Worker": {"replicas": workers, "template": {"spec": worker_spec}},
        }},
    }


def claims_worker(template: str = "one-gpu") -> dict[str, Any]:
    return {"containers": [{"name": "pytorch", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}]}


def plugin_worker(gpus: int = 1) -> dict[str, Any]:
    return {"containers": [{"name": "pytorch", "image": "x", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}


def decide(job: dict[str, Any], snapshot: Snapshot) -> Any:
    group = jobs.parse_job(job, gpu_resources=SETTINGS.gpu_resources, namespace="ml")
    return decide_fresh(group, snapshot, SETTINGS)


def world(*objects: dict[str, Any]) -> Snapshot:
    return build_snapshot([GPU_CLASS, ONE_GPU, *objects])


def test_workers_claiming_gpus_from_a_template_go_where_the_slices_publish_them() -> None:
    snapshot = world(node("a1", "zone-a"), node("b1", "zone-b"), gpu_slice("a1", 4))
    decision = decide(pytorchjob(claims_worker()), snapshot)
    assert decision.allowed and decision.zone == "zone-a", decision.reasons
    assert "gpus=4" in decision.summary


def test_pods_writing_nvidia_gpu_on_dra_only_nodes_are_served_by_the_mapped_class() -> None:
    snapshot = world(node("a1", "zone-a"), node("b1", "zone-b"), gpu_slice("b1", 8))
    decision = decide(pytorchjob(plugin_worker(2)), snapshot)
    assert decision.allowed and decision.zone == "zone-b", decision.reasons


def test_allocated_devices_are_not_free_and_the_zone_with_free_devices_wins() -> None:
    snapshot = world(node("a1", "zone-a"), node("b1", "zone-b"), gpu_slice("a1", 4), gpu_slice("b1", 4),
                     allocated_claim("taken", "a1", ["gpu-0", "gpu-1", "gpu-2"]))
    decision = decide(pytorchjob(claims_worker(), workers=2), snapshot)
    assert decision.allowed and decision.zone == "zone-b"
    assert decision.capacity == "now"


def test_a_node_whose_allocatable_has_the_gpus_uses_its_device_plugin() -> None:
    # b1's allocatable says 1 GPU; its slice's 8 devices are not what the scheduler uses for nvidia.com/gpu there.
    snapshot = world(node("a1", "zone-a", gpus=8), node("b1", "zone-b", gpus=1), gpu_slice("b1", 8))
    decision = decide(pytorchjob(plugin_worker(4), workers=1), snapshot)
    assert decision.allowed and decision.zone == "zone-a"


def test_an_old_pool_generation_offers_nothing() -> None:
    stale = gpu_slice("a1", 4, generation=1)
    fresh = gpu_slice("a1", 1, generation=2)
    fresh["metadata"]["name"] = "a1-gpus-2"
    snapshot = world(node("a1", "zone-a"), node("b1", "zone-b"), stale, fresh, gpu_slice("b1", 2))
    decision = decide(pytorchjob(claims_worker(), workers=2), snapshot)
    assert decision.allowed and decision.zone == "zone-b"


def test_a_claim_template_that_does_not_exist_is_not_placed_blind() -> None:
    snapshot = world(node("a1", "zone-a"), gpu_slice("a1", 4))
    decision = decide(pytorchjob(claims_worker("no-such-template")), snapshot)
    assert not decision.allowed
    assert any("ResourceClaimTemplate ml/no-such-template" in r and "does not exist" in r for r in decision.reasons)


def test_claims_on_a_cluster_without_device_classes_are_not_placed_blind() -> None:
    snapshot = build_snapshot([node("a1", "zone-a", gpus=8)])
    decision = decide(pytorchjob(claims_worker()), snapshot)
    assert not decision.allowed
    assert any("no DeviceClass" in r for r in decision.reasons)


def test_a_selector_that_cannot_be_evaluated_makes_the_count_unknown_and_is_said() -> None:
    broken = {**GPU_CLASS, "spec": {"selectors": [{"cel": {"expression": "device.driver.nosuchfunction("}}]}}
    snapshot = build_snapshot([broken, ONE_GPU, node("a1", "zone-a"), gpu_slice("a1", 4)])
    decision = decide(pytorchjob(claims_worker()), snapshot)
    assert not decision.allowed
    assert any("cannot count the devices" in r for r in decision.reasons), decision.reasons


def test_a_mapped_extended_resource_of_another_class_is_not_compared_with_allocatable() -> None:
    nic_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "nic.example.com"},
                 "spec": {"extendedResourceName": "example.com/nic"}}
    snapshot = world(nic_class, node("a1", "zone-a", gpus=8))
    worker = plugin_worker(1)
    worker["containers"][0]["resources"]["limits"]["example.com/nic"] = 1
    decision = decide(pytorchjob(worker, workers=1), snapshot)
    assert decision.allowed and decision.zone == "zone-a", decision.reasons


# --- NVLink cliques (ComputeDomains) -------------------------------------------------------------------

CLIQUE = "nvidia.com/gpu.clique"
DOMAIN = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
          "metadata": {"name": "train-cd", "namespace": "ml", "uid": "cd-uid-1"},
          "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "train-cd-channel"}}}}


def gb200(name: str, zone: str, clique: str, *, domain: str = "") -> dict[str, Any]:
    out = node(name, zone, gpus=4)
    out["metadata"]["labels"][CLIQUE] = clique
    if domain:
        out["metadata"]["labels"]["resource.nvidia.com/computeDomain"] = domain
    return out


def domain_worker(gpus: int = 4) -> dict[str, Any]:
    return {"containers": [{"name": "pytorch", "image": "x",
                            "resources": {"limits": {"nvidia.com/gpu": gpus}, "claims": [{"name": "channel"}]}}],
            "resourceClaims": [{"name": "channel", "resourceClaimTemplateName": "train-cd-channel"}]}


def channel_class() -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "compute-domain-default-channel.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'compute-domain.nvidia.com' && "
                                                          "device.attributes['compute-domain.nvidia.com'].type == "
                                                          "'channel'"}}]}}


def test_a_compute_domain_job_is_kept_in_one_clique_and_pinned_to_it() -> None:
    from app.engine import patches
    from tests.unit.crd.jsonpatch import apply_patch
    nodes = [gb200("r1-1", "zone-a", "c1.1"), gb200("r1-2", "zone-a", "c1.1"),
             gb200("r2-1", "zone-a", "c1.2"), gb200("r2-2", "zone-a", "c1.2"), gb200("r2-3", "zone-a", "c1.2")]
    snapshot = world(channel_class(), DOMAIN, *nodes)
    job = pytorchjob(domain_worker(), workers=3)
    decision = decide(job, snapshot)
    assert decision.allowed and decision.clique == "c1.2", decision.reasons  # 3 x 4 GPUs fit only rack 2
    assert "clique=c1.2" in decision.summary
    group = jobs.parse_job(job, gpu_resources=SETTINGS.gpu_resources, namespace="ml")
    patched = apply_patch(job, patches.build_patch(job, group, decision, SETTINGS))
    terms = patched["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["affinity"]["nodeAffinity"][
        patches.REQUIRED]["nodeSelectorTerms"]
    assert {"key": CLIQUE, "operator": "In", "values": ["c1.2"]} in terms[0]["matchExpressions"]
    again = jobs.parse_job(patched, gpu_resources=SETTINGS.gpu_resources, namespace="ml")
    assert patches.build_patch(patched, again, decide(patched, snapshot), SETTINGS) == []


def test_nodes_of_another_compute_domain_are_not_usable_and_the_refusal_names_the_largest_clique() -> None:
    nodes = [gb200("r1-1", "zone-a", "c1.1"), gb200("r1-2", "zone-a", "c1.1", domain="other-uid"),
             gb200("r2-1", "zone-b", "c2.1")]
    snapshot = world(channel_class(), DOMAIN, *nodes)
    decision = decide(pytorchjob(domain_worker(), workers=2), snapshot)
    assert not decision.allowed
    assert "ComputeDomain ml/train-cd" in decision.reasons[0]
    assert "has 1 usable node(s)" in decision.reasons[0], decision.reasons


def test_a_pod_naming_more_claims_than_the_limit_is_refused_naming_the_field() -> None:
    import pytest
    worker = claims_worker()
    worker["resourceClaims"] = [{"name": f"c{i}", "resourceClaimTemplateName": "one-gpu"} for i in range(33)]
    with pytest.raises(jobs.JobError, match=r"33 resourceClaims in a Worker pod exceed the limit of 32 per pod "
                                            r"\(limits.claimsPerPod\)"):
        jobs.parse_job(pytorchjob(worker), gpu_resources=SETTINGS.gpu_resources, namespace="ml",
                       limits=SETTINGS.limits)
