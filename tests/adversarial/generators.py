"""Adversarial reviews, built by seeded generators of our own (issue 18: one user's job must not take admission down).

Each `Case` is a request body for POST /mutate (or /map) plus the snapshot objects it needs and what a
correct answer looks like: the HTTP status, and for a 200 the AdmissionReview's `allowed` and `status.code`.
The generators vary sizes, names and numbers with a seeded `random.Random`, so a failure reproduces from
its seed and no case is a fixed string the server could recognise.

The shapes are the ones the issue measured: pod-count blow-ups (`replicas: 2147483647` in a 1.9 KB review),
thousands of replica types (flows grow with their square), a policy in another namespace naming a thousand
replica-index values, nesting past orjson's own limit, a GPU limit of 1e30, and bodies whose decoded size is
many times their text (`[{},{},...]`).
"""

from __future__ import annotations

import copy
import json
import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LAB_REVIEW = Path(__file__).resolve().parents[1] / "data" / "reviews" / "lab-pytorchjob-create.json"
NAMESPACE = "ml-demo"
INDEX_LABEL = "training.kubeflow.org/replica-index"


@dataclass(frozen=True)
class Case:
    """One adversarial request and the answer it must get."""

    name: str
    body: bytes
    status: int  # HTTP status
    allowed: bool | None = None  # for 200: response.allowed
    code: int | None = None  # for a refusal: response.status.code
    mentions: tuple[str, ...] = ()  # words the refusal (or the 4xx error) must contain
    objects: tuple[dict[str, Any], ...] = ()  # extra snapshot objects (policies) the case needs
    path: str = "/mutate"
    extra: dict[str, Any] = field(default_factory=dict)


def lab_job() -> dict[str, Any]:
    """The seed lab's PyTorchJob (Master + 4 GPU Workers) as the review carries it."""
    job: dict[str, Any] = json.loads(LAB_REVIEW.read_text())["request"]["object"]
    return job


def review_of(job: dict[str, Any], *, uid: str | None = None) -> dict[str, Any]:
    """A CREATE AdmissionReview of `job`, written the way the apiserver writes one."""
    review: dict[str, Any] = json.loads(LAB_REVIEW.read_text())
    request = review["request"]
    request["uid"] = uid or str(uuid.uuid4())
    request["object"] = job
    request["name"] = job["metadata"]["name"]
    request["namespace"] = job["metadata"].get("namespace", NAMESPACE)
    api, kind = job["apiVersion"], job["kind"]
    group, version = api.split("/")
    request["kind"] = request["requestKind"] = {"group": group, "version": version, "kind": kind}
    plural = kind.lower() + "s"
    request["resource"] = request["requestResource"] = {"group": group, "version": version, "resource": plural}
    return review


def encode(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _named(rng: random.Random, job: dict[str, Any]) -> dict[str, Any]:
    job["metadata"]["name"] = f"adv-{rng.randrange(10**9):09d}"
    return job


def pod_blowup(rng: random.Random) -> Case:
    """Worker.replicas far past any real job (up to the CRD's int32)."""
    job = _named(rng, lab_job())
    replicas = rng.choice([10_000_001, 2_147_483_647, rng.randrange(10**7, 2**31)])
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = replicas
    return Case(f"pod-blowup-{replicas}", encode(review_of(job)), 200, allowed=False, code=422,
                mentions=("limits.podsPerReplicaType", "spec.pytorchReplicaSpecs.Worker"))


def many_replica_types(rng: random.Random) -> Case:
    """A TFJob with ~1,400 replica types (~196 KB): N² flows if nothing bounds them."""
    types = rng.randrange(1_200, 1_600)
    specs = {
        f"T{rng.randrange(10**6)}x{i}": {
            "replicas": 1,
            "template": {"spec": {"containers": [{"name": "tensorflow", "image": "tf:2",
                                                  "ports": [{"name": "tfjob-port", "containerPort": 2222}]}]}},
        }
        for i in range(types)
    }
    job = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
           "metadata": {"name": f"adv-tf-{rng.randrange(10**6)}", "namespace": NAMESPACE},
           "spec": {"tfReplicaSpecs": specs}}
    return Case(f"replica-types-{types}", encode(review_of(job)), 200, allowed=False, code=422,
                mentions=("limits.replicaTypesPerJob", "spec.tfReplicaSpecs"))


def many_replicated_jobs(rng: random.Random) -> Case:
    """A JobSet with a thousand replicatedJobs."""
    count = rng.randrange(800, 1_200)
    rjobs = [{"name": f"r{i}", "replicas": 1, "template": {"spec": {"parallelism": 1, "completions": 1, "template": {
        "spec": {"containers": [{"name": "c", "image": "i"}], "restartPolicy": "Never"}}}}} for i in range(count)]
    job = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
           "metadata": {"name": f"adv-js-{rng.randrange(10**6)}", "namespace": NAMESPACE},
           "spec": {"replicatedJobs": rjobs}}
    return Case(f"replicated-jobs-{count}", encode(review_of(job)), 200, allowed=False, code=422,
                mentions=("limits.replicaTypesPerJob",))


def index_policy(rng: random.Random, values: int) -> dict[str, Any]:
    """A CNP in another namespace naming `values` replica-index values one by one (a policy's own choice)."""
    named = [str(i) for i in rng.sample(range(1, values * 3), values)]
    return {
        "apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
        "metadata": {"name": f"pick-{rng.randrange(10**6)}", "namespace": "other-team"},
        "spec": {"endpointSelector": {"matchExpressions": [
            {"key": INDEX_LABEL, "operator": "In", "values": named}]},
            "ingress": [{"fromEndpoints": [{}]}]},
    }


def index_values_and_huge_job(rng: random.Random) -> Case:
    """That policy plus a 100,000-worker job: stopped by the pods limit before any class is built."""
    job = _named(rng, lab_job())
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = rng.randrange(100_000, 200_000)
    return Case("index-values-huge-job", encode(review_of(job)), 200, allowed=False, code=422,
                mentions=("limits.pods",), objects=(index_policy(rng, 1_000),))


def index_values_within_pod_limits(rng: random.Random) -> Case:
    """That policy plus a job within the pod limits: its classes pass limits.policyIndexValuesPerJob."""
    job = _named(rng, lab_job())
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = rng.randrange(5_000, 9_999)
    return Case("index-values-limit", encode(review_of(job)), 200, allowed=False, code=422,
                mentions=("limits.policyIndexValuesPerJob", INDEX_LABEL), objects=(index_policy(rng, 1_000),))


def deep_nesting(rng: random.Random) -> Case:
    """A label value nested past orjson's own encoder limit (254) and the review's screen (100)."""
    job = _named(rng, lab_job())
    depth = rng.randrange(260, 400)
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["annotations"] = {"deep": value}
    return Case(f"nesting-{depth}", encode(review_of(job)), 400, mentions=("levels deep",))


def huge_gpu_limit(rng: random.Random) -> Case:
    """A GPU limit of 1e30: a number no node has, never a crash."""
    job = _named(rng, lab_job())
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    worker.setdefault("resources", {})["limits"] = {"nvidia.com/gpu": rng.choice([1e30, 10**30, "1e30"])}
    worker["resources"].pop("requests", None)
    return Case("gpu-1e30", encode(review_of(job)), 200, allowed=False, code=422,
                mentions=("nvidia.com/gpu", "more than any node has"))


def decoded_bomb(rng: random.Random, max_body: int) -> Case:
    """A body well inside the byte limit whose decoded objects would take ~25 times its size."""
    count = max_body // 4
    job = _named(rng, lab_job())
    job["metadata"]["annotations"] = {"x": "y"}
    review = review_of(job)
    text = encode(review)
    filler = b"[" + b",".join([b"{}"] * count) + b"]"
    body = text[:-2] + b',"filler":' + filler + text[-2:]  # inside request: {..., "filler": [...]}}
    return Case(f"decoded-bomb-{count}", body[: max_body - 1], 413, mentions=("reviewMemoryBytes",))


def oversized_body(rng: random.Random, max_body: int) -> Case:
    """More bytes than maxBodyBytes: refused from the Content-Length, before reading it."""
    job = _named(rng, lab_job())
    job["metadata"]["annotations"] = {"pad": "p" * (max_body + rng.randrange(1, 1000))}
    return Case("oversized", encode(review_of(job)), 413, mentions=("exceeds the limit",))


def map_huge_job(rng: random.Random) -> Case:
    """POST /map with a 100,000-worker job: the same limits as a review (422), no decision run."""
    job = _named(rng, lab_job())
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = rng.randrange(100_000, 10**6)
    return Case("map-huge-job", encode(job), 422, path="/map", mentions=("limits.pods",))


def map_deep_nesting(rng: random.Random) -> Case:
    value: Any = 1
    for _ in range(rng.randrange(300, 500)):
        value = {"a": value}
    job = _named(rng, lab_job())
    job["metadata"]["annotations"] = value
    return Case("map-nesting", encode(job), 400, path="/map", mentions=("levels deep",))


def map_gpu_1e30(rng: random.Random) -> Case:
    case = huge_gpu_limit(rng)
    job = json.loads(case.body)["request"]["object"]
    return Case("map-gpu-1e30", encode(job), 400, path="/map", mentions=("more than any node has",))


GENERATORS: tuple[Callable[[random.Random], Case], ...] = (
    pod_blowup, many_replica_types, many_replicated_jobs, index_values_and_huge_job, index_values_within_pod_limits,
    deep_nesting, huge_gpu_limit, map_huge_job, map_deep_nesting, map_gpu_1e30,
)


def cases(seed: int, *, max_body: int) -> Iterator[Case]:
    """Every adversarial case once, drawn with `seed`."""
    rng = random.Random(seed)
    for generate in GENERATORS:
        yield generate(rng)
    yield decoded_bomb(rng, max_body)
    yield oversized_body(rng, max_body)


def normal_review(rng: random.Random) -> dict[str, Any]:
    """A review of a real-sized job, never the same body twice (distinct names, sizes and a seed argument)."""
    job = copy.deepcopy(lab_job())
    job["metadata"]["name"] = f"train-{rng.randrange(10**9)}"
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = rng.randrange(1, 5)
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    container["args"] = [f"--seed={rng.randrange(10**9)}"]
    return review_of(job)
