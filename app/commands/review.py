"""`topoguard review --cluster PATH [--operation mutate|validate|validate-policy] [--config F] [FILE|-]`.

Reads one AdmissionReview (a file or stdin), or a plain job manifest (JSON or YAML) which it wraps in
the AdmissionReview the apiserver would send for creating it (`wrap_job`), answers it with the server's own pipeline
(`pipeline.parse_review` → `pipeline.answer`) against the file snapshot, and prints the response
AdmissionReview encoded exactly as the server sends it. Exit 0 whenever it answered, allowed or
not; 2 when the input is unusable (unreadable file, bad JSON, not an AdmissionReview, unreadable
snapshot or config), with the reason on stderr and nothing on stdout.

NB: the file snapshot is complete by construction, so no cache problem is ever passed on.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import yaml

from app.admission import pipeline, policy_changes
from app.cache.files import SnapshotError, load_snapshot
from app.config import ConfigError, load_settings
from app.models import admission as admission_models

EXIT_ANSWERED = 0
EXIT_USAGE = 2


class _Unusable(Exception):
    pass


def _read_review(source: str) -> Any:
    """The AdmissionReview in `source`, or one wrapped around the plain job manifest it holds (JSON or YAML)."""
    try:
        data = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    except OSError as e:
        raise _Unusable(f"cannot read {source}: {e.strerror or e}") from e
    where = "stdin" if source == "-" else source
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        body = _read_yaml(data, where, e)
    if isinstance(body, dict) and body.get("kind") != admission_models.KIND and "request" not in body:
        if not (body.get("apiVersion") and body.get("kind")):
            raise _Unusable(f"{where} is neither an AdmissionReview nor a job manifest (no apiVersion and kind)")
        return wrap_job(body)
    return body


def _read_yaml(data: bytes, where: str, json_error: orjson.JSONDecodeError) -> Any:
    """A job manifest written as YAML (one document); JSON's error when it is not YAML either."""
    try:
        documents = [d for d in yaml.safe_load_all(data) if d is not None]
    except yaml.YAMLError:
        raise _Unusable(f"{where} is not valid JSON or YAML: {json_error}") from None
    if len(documents) != 1 or not isinstance(documents[0], dict):
        raise _Unusable(f"{where}: expected one AdmissionReview or one job object, found {len(documents)} documents")
    return documents[0]


def wrap_job(job: dict[str, Any]) -> dict[str, Any]:
    """The AdmissionReview the apiserver would send for creating `job`: CREATE in the job's namespace
    (`default` when it names none), its group/version/kind and resource, a uid derived from the
    manifest (the same file gives the same review), and a placeholder user."""
    group, _, version = str(job.get("apiVersion", "")).rpartition("/")
    kind = str(job.get("kind", ""))
    raw_metadata = job.get("metadata")
    metadata: dict[str, Any] = raw_metadata if isinstance(raw_metadata, dict) else {}
    namespace = str(metadata.get("namespace") or "default")
    gvk = {"group": group, "version": version, "kind": kind}
    gvr = {"group": group, "version": version, "resource": kind.lower() + "s"}
    uid = str(uuid.uuid5(uuid.NAMESPACE_URL, "topoguard-review:" + hashlib.sha256(orjson.dumps(
        job, option=orjson.OPT_SORT_KEYS)).hexdigest()))
    request: dict[str, Any] = {
        "uid": uid, "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
        "namespace": namespace, "operation": "CREATE",
        "userInfo": {"username": "topoguard-review", "groups": ["system:authenticated"]},
        "object": {**job, "metadata": {**metadata, "namespace": namespace}}, "oldObject": None, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    if metadata.get("name"):
        request["name"] = str(metadata["name"])
    return {"apiVersion": admission_models.API_VERSION, "kind": admission_models.KIND, "request": request}


def run(args: argparse.Namespace) -> int:
    try:
        body = _read_review(args.file)
        request = pipeline.parse_review(body)
        settings = load_settings(args.config)
        snapshot = load_snapshot(args.cluster, cilium_config=settings.cilium_config)
    except pipeline.BadReview as e:
        print(f"topoguard review: not a usable AdmissionReview: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (_Unusable, ConfigError, SnapshotError) as e:
        print(f"topoguard review: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.operation == "validate-policy":  # POST /validate-policy: a policy change judged against the jobs
        review = policy_changes.answer(request, snapshot=snapshot, settings=settings).review
    else:
        review = pipeline.answer(request, snapshot=snapshot, settings=settings, operation=args.operation).review
    sys.stdout.buffer.write(orjson.dumps(review) + b"\n")
    sys.stdout.flush()
    return EXIT_ANSWERED
