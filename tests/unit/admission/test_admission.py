"""The admission pipeline: parse_review refuses malformed reviews, answer gives each outcome.

Reviews are built as the apiserver sends them; answers are checked as the apiserver reads them
(uid echo, `allowed`, `status.code` inside the body, base64 JSON Patch applied with RFC 6902).
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
from typing import Any

import pytest

from app import jobs
from app.admission import pipeline
from app.config import Settings
from app.models.cluster import Snapshot
from tests.builders import GPU, make_namespace, make_node, make_pytorchjob, make_snapshot, make_template
from tests.unit.crd.jsonpatch import apply_patch

UID = "705ab4f5-6393-11e8-b7cc-42010a800002"
NS = "ml"
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
ENABLED = {"kubernetes.io/metadata.name": NS, "topoguard.io/enabled": "true"}


def review(obj: Any, *, operation: str = "CREATE", old: Any = None, dry_run: bool = False,
           namespace: str = NS, **extra: Any) -> dict[str, Any]:
    """An AdmissionReview v1 as the apiserver sends it for a kubeflow.org/v1 job."""
    kind = obj.get("kind", "PyTorchJob") if isinstance(obj, dict) else "PyTorchJob"
    gvk = {"group": "kubeflow.org", "version": "v1", "kind": kind}
    request: dict[str, Any] = {
        "uid": UID, "kind": gvk, "resource": {"group": "kubeflow.org", "version": "v1", "resource": "pytorchjobs"},
        "requestKind": gvk, "name": "train", "namespace": namespace, "operation": operation,
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": obj, "oldObject": old, "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}, **extra,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def cluster(*, namespace_labels: dict[str, str] | None = None, gpus_per_node: int = 4) -> Snapshot:
    """zone-a: two tainted 4-GPU nodes; zone-b: one CPU node; namespace `ml` opted in; no policies."""
    return make_snapshot(
        [make_node("gpu-a-1", zone="zone-a", gpus=gpus_per_node, taints=[GPU_TAINT]),
         make_node("gpu-a-2", zone="zone-a", gpus=gpus_per_node, taints=[GPU_TAINT]),
         make_node("cpu-b-1", zone="zone-b")],
        namespaces=[make_namespace(NS, ENABLED if namespace_labels is None else namespace_labels)],
    )


def job(**kwargs: Any) -> dict[str, Any]:
    return make_pytorchjob(namespace=NS, **kwargs)


def response_of(outcome: pipeline.Outcome) -> dict[str, Any]:
    body = outcome.review
    assert (body["apiVersion"], body["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    assert body["response"]["uid"] == UID
    return dict(body["response"])


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    assert ops, "an empty patch must be omitted, not sent"
    return ops


def answer(body: dict[str, Any], snapshot: Snapshot, *, settings: Settings | None = None,
           operation: pipeline.Operation = "mutate", cache_problem: str | None = None) -> pipeline.Outcome:
    return pipeline.answer(pipeline.parse_review(body), snapshot=snapshot, settings=settings or Settings(),
                            operation=operation, cache_problem=cache_problem)


# --- parse_review ---------------------------------------------------------------------------------

def _without(key: str) -> dict[str, Any]:
    body = review(job())
    del body["request"][key]
    return body


def _with(**fields: Any) -> dict[str, Any]:
    body = review(job())
    body["request"].update(fields)
    return body


@pytest.mark.parametrize(
    "body, fragment",
    [
        pytest.param([], "got array", id="a JSON array is not a review"),
        pytest.param({**review(job()), "apiVersion": "admission.k8s.io/v1beta1"}, "apiVersion must be",
                     id="v1beta1 is refused naming the version wanted"),
        pytest.param({**review(job()), "kind": "TokenReview"}, "kind must be 'AdmissionReview'",
                     id="another kind is refused"),
        pytest.param({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "request is missing",
                     id="no request is refused"),
        pytest.param({**review(job()), "request": "x"}, "request must be an object", id="a string request is refused"),
        pytest.param(_without("uid"), "request.uid", id="a missing uid is refused naming the field"),
        pytest.param(_with(uid=""), "request.uid must not be empty", id="an empty uid is refused"),
        pytest.param(_with(uid=7), "request.uid", id="a numeric uid is refused naming the field"),
        pytest.param(_with(operation="PATCH"), "request.operation", id="an unknown operation is refused"),
        pytest.param(_without("object"), "request.object is required for CREATE",
                     id="CREATE without an object is refused"),
        pytest.param(_with(object="job"), "request.object", id="an object that is a string is refused"),
    ],
)
def test_parse_review_refuses_malformed_reviews(body: Any, fragment: str) -> None:
    with pytest.raises(pipeline.BadReview, match=fragment.replace(".", r"\.")):
        pipeline.parse_review(body)


def _nested(levels: int, *, arrays: bool = False) -> dict[str, Any]:
    """The job's review with a field nesting `levels` levels in all (the review itself is level 1)."""
    body = review(job())
    chain: Any = "leaf"
    for _ in range(levels - 2):  # the review and its request are the first two levels
        chain = [chain] if arrays else {"x": chain}
    body["request"]["extension"] = chain
    return body


@pytest.mark.parametrize(
    "levels, arrays, refused",
    [
        pytest.param(pipeline.MAX_NESTING_DEPTH, False, False, id="nesting at the limit is accepted"),
        pytest.param(pipeline.MAX_NESTING_DEPTH + 1, False, True, id="one object level over the limit is refused"),
        pytest.param(pipeline.MAX_NESTING_DEPTH + 1, True, True, id="arrays count as levels too"),
        pytest.param(900, False, True, id="900 levels are refused early, not a recursion error later"),
    ],
)
def test_parse_review_bounds_the_nesting(levels: int, arrays: bool, refused: bool) -> None:
    body = _nested(levels, arrays=arrays)
    if refused:
        with pytest.raises(pipeline.BadReview, match=f"more than {pipeline.MAX_NESTING_DEPTH} levels deep"):
            pipeline.parse_review(body)
    else:
        assert pipeline.parse_review(body).uid == UID


def test_parse_review_keeps_unknown_fields_and_allows_delete_without_object() -> None:
    body = _with(operation="DELETE", object=None, newFieldFromAFutureRelease={"x": 1})
    request = pipeline.parse_review(body)
    assert (request.uid, request.operation, request.obj, request.namespace) == (UID, "DELETE", None, NS)


# --- answer: outcomes decided before the engine runs -----------------------------------------------

def _being_deleted() -> dict[str, Any]:
    obj = job()
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return review(obj, operation="UPDATE", old=job())


def _annotation_only_update() -> dict[str, Any]:
    new = job()
    new["metadata"]["annotations"] = {"note": "changed"}
    return review(new, operation="UPDATE", old=job())


def _malformed() -> dict[str, Any]:
    obj = job()
    obj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "two"
    return review(obj)


ALLOWED_UNTOUCHED = {"uid": UID, "allowed": True}


@pytest.mark.parametrize(
    "body, snapshot, want_outcome, want_response",
    [
        pytest.param(_with(operation="DELETE", object=None), cluster(), "skipped", ALLOWED_UNTOUCHED,
                     id="DELETE is allowed untouched"),
        pytest.param(_with(operation="CONNECT", object=None), cluster(), "skipped", ALLOWED_UNTOUCHED,
                     id="CONNECT is allowed untouched"),
        pytest.param(_with(subResource="scale", object={"apiVersion": "autoscaling/v1", "kind": "Scale"}), cluster(),
                     "skipped", ALLOWED_UNTOUCHED, id="a scale subresource request is allowed untouched"),
        pytest.param(_being_deleted(), cluster(), "skipped", ALLOWED_UNTOUCHED,
                     id="an object being deleted is allowed untouched"),
        pytest.param(review(job()), cluster(namespace_labels={"kubernetes.io/metadata.name": NS}), "skipped",
                     ALLOWED_UNTOUCHED, id="a namespace known without the opt-in label is allowed untouched"),
        pytest.param(_annotation_only_update(), cluster(), "unchanged", ALLOWED_UNTOUCHED,
                     id="an UPDATE that leaves placement alone is allowed without a patch"),
    ],
)
def test_answer_lets_through_what_is_not_ours_to_place(
    body: dict[str, Any], snapshot: Snapshot, want_outcome: str, want_response: dict[str, Any]
) -> None:
    got = answer(body, snapshot)
    assert (got.outcome, response_of(got), got.decision) == (want_outcome, want_response, None)


@pytest.mark.parametrize(
    "body, code, fragments",
    [
        pytest.param(review({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}}), 400,
                     ["topoguard: unsupported job kind 'Deployment' in apiVersion 'apps/v1'; supported: ",
                      "PyTorchJob (kubeflow.org/v1)", "TrainJob"],
                     id="an unsupported kind is refused with 400 naming it and the supported kinds"),
        pytest.param(_malformed(), 422, ["PyTorchJob ml/train is invalid", "spec.pytorchReplicaSpecs.Worker.replicas"],
                     id="a malformed job is refused with 422 naming the field path"),
    ],
)
def test_answer_refuses_jobs_it_cannot_read(body: dict[str, Any], code: int, fragments: list[str]) -> None:
    got = answer(body, cluster())
    response = response_of(got)
    assert (got.outcome, response["allowed"], response["status"]["code"]) == ("denied", False, code)
    for fragment in fragments:
        assert fragment in response["status"]["message"]


@pytest.mark.parametrize(
    "snapshot, settings, want",
    [
        pytest.param(cluster(), Settings(), {
            "uid": UID, "allowed": False,
            "status": {"code": 503, "reason": "ServiceUnavailable",
                       "message": "topoguard: cannot check PyTorchJob ml/train: cache not synced; retry shortly"}},
            id="deny enforcement refuses with 503 naming the cache problem"),
        pytest.param(cluster(namespace_labels={**ENABLED, "topoguard.io/enforcement": "warn"}), Settings(), {
            "uid": UID, "allowed": True,
            "warnings": ["topoguard: cannot check PyTorchJob ml/train: cache not synced; "
                         "admitted unchecked (enforcement=warn)"]},
            id="a warn namespace admits with a warning naming the cache problem"),
        pytest.param(cluster(namespace_labels={**ENABLED, "topoguard.io/enforcement": "deny"}),
                     Settings(enforcement="warn"), {
            "uid": UID, "allowed": False,
            "status": {"code": 503, "reason": "ServiceUnavailable",
                       "message": "topoguard: cannot check PyTorchJob ml/train: cache not synced; retry shortly"}},
            id="the namespace label overrides a warn setting back to deny"),
    ],
)
def test_a_cache_problem_is_never_a_silent_allow(snapshot: Snapshot, settings: Settings, want: dict[str, Any]) -> None:
    got = answer(review(job()), snapshot, settings=settings, cache_problem="cache not synced")
    assert response_of(got) == want


def test_an_unexpected_error_is_a_500_naming_the_uid() -> None:
    broken = Snapshot(nodes=("not a node",))  # type: ignore[arg-type]
    got = answer(review(job()), broken)
    response = response_of(got)
    assert (got.outcome, response["allowed"], response["status"]["code"]) == ("error", False, 500)
    assert UID in response["status"]["message"]


# --- answer: the engine's decisions -------------------------------------------------------------------

def _mutated(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` after the mutating webhook (validation runs after mutation in the apiserver)."""
    return apply_patch(obj, patch_of(response_of(answer(review(obj), cluster()))))


def _too_big() -> dict[str, Any]:
    return job(workers=3, worker_gpus=4)  # 12 GPUs, the cluster has 8


@pytest.mark.parametrize(
    "obj, snapshot, settings, operation, want_outcome, want_allowed",
    [
        pytest.param(job(), cluster(), Settings(), "mutate", "patched", True,
                     id="a job that fits is admitted with a patch"),
        pytest.param(_mutated(job()), cluster(), Settings(), "validate", "unchanged", True,
                     id="validate admits the mutated job and never patches"),
        pytest.param(job(), cluster(), Settings(), "validate", "denied", False,
                     id="validate judges the job as written so an unpinned coordinator is refused"),
        pytest.param(_too_big(), cluster(), Settings(), "mutate", "denied", False,
                     id="no zone with enough GPUs is refused under deny"),
        pytest.param(_too_big(), cluster(namespace_labels={**ENABLED, "topoguard.io/enforcement": "warn"}),
                     Settings(), "mutate", "warned", True,
                     id="no zone with enough GPUs is admitted in a warn namespace"),
        pytest.param(_too_big(), cluster(), Settings(enforcement="warn"), "validate", "warned", True,
                     id="the warn setting admits when the namespace does not override it"),
    ],
)
def test_answer_applies_the_decision_and_enforcement(
    obj: dict[str, Any], snapshot: Snapshot, settings: Settings, operation: pipeline.Operation,
    want_outcome: str, want_allowed: bool,
) -> None:
    got = answer(review(obj), snapshot, settings=settings, operation=operation)
    response = response_of(got)
    assert (got.outcome, response["allowed"]) == (want_outcome, want_allowed)
    assert got.decision is not None and got.decision.allowed == (want_outcome in ("patched", "unchanged"))
    if want_outcome == "denied":
        assert response["status"]["code"] == 403
        assert response["status"]["message"].startswith("topoguard: PyTorchJob ml/train cannot run in one open zone: ")
        assert "zone-a" in response["status"]["message"]
        assert "patch" not in response
    if want_outcome == "warned":
        assert "patch" not in response and "status" not in response
        assert response["warnings"][0] == ("topoguard: PyTorchJob ml/train cannot run in one open zone; "
                                           "admitted unchanged (enforcement=warn); the next warning says why, "
                                               "`topoguard explain` shows every zone and flow")
        assert any("zone-a" in w for w in response["warnings"][1:])
        assert all(len(w) <= 256 for w in response["warnings"])
    if want_outcome == "unchanged":
        assert "patch" not in response


def test_the_patch_pins_every_replica_and_a_second_review_is_a_no_op() -> None:
    obj = job()
    first = response_of(answer(review(obj), cluster()))
    patched = apply_patch(obj, patch_of(first))
    for key in ("Master", "Worker"):
        spec = patched["spec"]["pytorchReplicaSpecs"][key]["template"]["spec"]
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In",
                                                "values": ["zone-a"]}]}]
    master_tolerations = patched["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["tolerations"]
    assert any(t.get("key") == GPU for t in master_tolerations), "the CPU coordinator must tolerate the GPU pool"
    assert patched["metadata"]["annotations"]["topoguard.io/zone"] == "zone-a"
    second = answer(review(patched), cluster())
    assert (second.outcome, response_of(second)) == ("unchanged", {
        "uid": UID, "allowed": True, "auditAnnotations": {"zone": "zone-a", "outcome": "unchanged"}})


def test_an_update_that_changes_placement_is_checked_again() -> None:
    old = job()
    new = copy.deepcopy(old)
    new["spec"]["pytorchReplicaSpecs"]["Worker"]["template"] = make_template(
        gpus=4, tolerations=[{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}])
    new["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 3
    got = answer(review(new, operation="UPDATE", old=old), cluster())
    assert (got.outcome, response_of(got)["status"]["code"]) == ("denied", 403)


@pytest.mark.parametrize(
    "change, unchanged",
    [
        pytest.param({}, True, id="the same group is unchanged"),
        pytest.param({"leader_labels": {"training.kubeflow.org/job-role": "worker"}}, False,
                     id="a different label on pod 0 only is a placement change"),
        pytest.param({"pod_labels": {"team": "other"}}, False, id="different pod labels are a placement change"),
    ],
)
def test_placement_compares_the_labels_policies_can_read(change: dict[str, Any], unchanged: bool) -> None:
    group = jobs.parse_job(job(), gpu_resources=Settings().gpu_resources, namespace=NS)
    master = next(r for r in group.replicas if r.key == "Master")
    assert master.leader_labels, "kubeflow v1 labels the coordinator's pod 0 job-role=master"
    changed = dataclasses.replace(group, replicas=tuple(
        dataclasses.replace(r, **change) if r.key == "Master" else r for r in group.replicas))
    assert (pipeline._placement(group) == pipeline._placement(changed)) is unchanged


def test_dry_run_gets_the_same_answer_and_is_flagged_for_the_caller() -> None:
    real = answer(review(job()), cluster())
    dry = answer(review(job(), dry_run=True), cluster())
    assert (dry.review, dry.outcome, dry.dry_run, real.dry_run) == (real.review, real.outcome, True, False)


def test_a_field_the_patch_cannot_edit_is_refused_with_422_naming_it() -> None:
    obj = job()
    obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["affinity"] = {"podAffinity": "same-zone"}
    got = answer(review(obj), cluster(), settings=Settings(mode="colocate"))
    response = response_of(got)
    assert (got.outcome, response["allowed"], response["status"]["code"]) == ("denied", False, 422)
    assert "/spec/pytorchReplicaSpecs/Worker/template/spec/affinity/podAffinity: expected an object" in (
        response["status"]["message"])


def test_an_update_whose_old_object_cannot_be_read_is_checked_like_a_create() -> None:
    got = answer(review(job(), operation="UPDATE", old={"kind": "Unknown"}), cluster())
    assert (got.outcome, response_of(got)["allowed"]) == ("patched", True)
