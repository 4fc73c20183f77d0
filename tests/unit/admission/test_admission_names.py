"""The job's name in the engine's messages: the engine writes a placeholder (its decisions are shared by
jobs of the same shape, engine/memo.py) and the admission answer puts the job's own name in."""

from __future__ import annotations

from typing import Any

from app.admission import pipeline
from app.config import Settings
from app.engine import JOB_PLACEHOLDER
from tests.builders import make_namespace, make_node, make_pytorchjob, make_snapshot
from tests.unit.admission.test_admission import ENABLED, GPU_TAINT, NS, review
from tests.unit.engine.test_decide import L7_MASTER  # an L7 rule: unknown, with pod names in its message

SNAPSHOT = make_snapshot(
    [
        make_node("gpu-a-1", zone="zone-a", gpus=4, taints=[GPU_TAINT]),
        make_node("gpu-a-2", zone="zone-a", gpus=4, taints=[GPU_TAINT]),
    ],
    namespaces=[make_namespace(NS, ENABLED)],
    policies=[L7_MASTER],
)


def _refusal(name: str) -> str:
    body: dict[str, Any] = review(make_pytorchjob(name, namespace=NS))
    body["request"]["name"] = name
    outcome = pipeline.answer(pipeline.parse_review(body), snapshot=SNAPSHOT, settings=Settings(), operation="mutate")
    assert outcome.outcome == "denied"
    return str(outcome.review["response"]["status"]["message"])


def test_a_refusal_names_the_jobs_own_pods() -> None:
    first, second = _refusal("llm-a"), _refusal("llm-b")  # the second decision comes from the memo
    assert JOB_PLACEHOLDER not in first + second
    assert f"{NS}/llm-a-master-0" in first and "llm-b" not in first
    assert f"{NS}/llm-b-master-0" in second and "llm-a" not in second
