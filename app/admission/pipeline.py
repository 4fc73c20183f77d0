"""PURE admission pipeline: AdmissionReview in → response AdmissionReview out.

The server's POST /mutate and /validate and `topoguard review` both call `parse_review` then
`answer`, so they give the same answer to the same review. No FastAPI, no I/O, no metrics: the
caller records those. The one side effect is the server's in-flight reservation (admission/inflight.py,
passed in as `in_flight`): an admitted mutating review holds its job's GPUs in its zone until the
watch shows the job; a dry-run review holds nothing (otherwise its answer is the same, and
`Outcome.dry_run` lets the caller skip its own side effects), nor does the validating path.

Order of the checks in `answer` (each one ends the pipeline):

1. DELETE / CONNECT, a subresource (`status`, `scale`: its object is not the job, and the pod
   templates, hence placement, do not change through it), or an object being deleted
   (`metadata.deletionTimestamp`): allowed untouched.
2. A namespace the snapshot knows but which is not labelled `topoguard.io/enabled=true`: allowed
   untouched. The webhook's namespaceSelector is the real gate; this makes `topoguard review` and
   a mis-scoped webhook configuration agree with it instead of patching jobs nobody opted in. A
   namespace missing from the snapshot is checked (the selector already let the request through).
3. Unsupported apiVersion/kind: refused, 400, naming the kind and the supported ones.
4. A malformed job: refused, 422, listing every bad field path.
5. UPDATE whose placement-relevant parts (per replica: count, GPUs, ports, hostNetwork, service
   account, pod labels and the labels of pod 0 only, nodeSelector, affinity, tolerations, spread
   constraints; the required flows) equal the old object's: allowed, no patch. Only
   placement is re-checked on UPDATE; everything else the operators and Kueue change is let through.
6. A cache problem (not synced, stale): refused 503 or, under enforcement `warn`, allowed with a
   warning, never a silent allow.
7. The engine: mutate uses `engine.decide` (best effort: adds tolerations, picks a zone), validate
   uses `engine.validate` (strict: the job as written). No zone qualifies → enforcement `deny`
   refuses with 403 and the per-zone reasons; `warn` admits unchanged with warnings.
   Otherwise mutate answers the JSON Patch (none when already placed), validate admits.

Enforcement is the setting `enforcement`, overridden by the Namespace label
`topoguard.io/enforcement=warn|deny`. An unexpected exception anywhere becomes a refusal with code
500 naming the request uid (the caller logs it).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Required, TypedDict, Unpack, get_args

import orjson
from pydantic import ValidationError

from app import engine, jobs
from app.admission import responses
from app.admission.inflight import InFlight
from app.config import Settings
from app.engine import lead, patches
from app.jobs import status as job_status
from app.models import labels
from app.models.admission import API_VERSION, KIND, AdmissionRequest, RequestKind, ReviewRequest
from app.models.admission import Operation as RequestOperation  # the operations a request may name
from app.models.cluster import Snapshot
from app.models.decision import Decision
from app.models.job import JobGroup

__all__ = [
    "BadReview", "Outcome", "Prepared", "ReviewRequest", "answer", "check_nesting", "parse_review", "prepare",
    "replica_types", "unsupported_message",
]

log = logging.getLogger(__name__)

OutcomeName = Literal["patched", "unchanged", "denied", "warned", "skipped", "error"]
Operation = Literal["mutate", "validate"]

# Template fields whose change on UPDATE means placement must be checked again.
PLACEMENT_SPEC_FIELDS = ("nodeSelector", "affinity", "tolerations", "topologySpreadConstraints")
MAX_LISTED_ERRORS = 20
# Deepest nesting of objects/arrays accepted in a review (the AdmissionReview itself is level 1).
# Kubernetes objects are far shallower: the deepest field of a supported job, a JobSet pod's
# affinity matchExpressions values, sits about 20 levels down its review. Generous, yet far below
# Python's recursion limit (1,000), which a deeply nested job would otherwise hit in a recursive
# copy or comparison further down the pipeline (an HTTP 500 instead of a clear 400).
MAX_NESTING_DEPTH = 100


class BadReview(ValueError):
    """The body is not a usable AdmissionReview v1: the server answers HTTP 400 with str(e)."""


@dataclass(frozen=True)
class Outcome:
    """What `answer` decided: the full response AdmissionReview, and labels for metrics and logs."""

    review: dict[str, Any]
    outcome: OutcomeName
    kind: str
    decision: Decision | None
    dry_run: bool = False
    # The job asked to be skipped (`topoguard.io/skip: "true"`): "honoured" or "ignored" (namespace does not
    # allow it); "" when it did not ask. Counted in topoguard_skip_requests_total.
    skip: str = ""


def parse_review(body: Any) -> ReviewRequest:
    """The request of an AdmissionReview `admission.k8s.io/v1` (already decoded from JSON).

    Raises:
        BadReview: not an object, nested more than MAX_NESTING_DEPTH levels, wrong apiVersion or
            kind, no request, a missing or mistyped request field (uid, operation, ...), or no
            object for CREATE/UPDATE.
    """
    if not isinstance(body, Mapping):
        raise BadReview(f"body must be an AdmissionReview object, got {_json_type(body)}")
    check_nesting(body, "the review")
    if body.get("apiVersion") != API_VERSION:
        raise BadReview(f"apiVersion must be {API_VERSION!r}, got {body.get('apiVersion')!r}")
    if body.get("kind") != KIND:
        raise BadReview(f"kind must be {KIND!r}, got {body.get('kind')!r}")
    raw = body.get("request")
    if not isinstance(raw, Mapping):
        raise BadReview("request is missing" if raw is None else f"request must be an object, got {_json_type(raw)}")
    request = _plain_request(raw) or _validated_request(raw)
    if not request.uid:
        raise BadReview("request.uid must not be empty")
    if request.obj is None and request.operation in ("CREATE", "UPDATE"):
        raise BadReview(f"request.object is required for {request.operation}")
    return request


def check_nesting(body: Any, what: str) -> None:
    """Refuse decoded JSON nested more than MAX_NESTING_DEPTH levels (a review, or POST /map's job).

    Raises:
        BadReview: naming `what` and the limit.
    """
    if _nested_deeper_than(body, MAX_NESTING_DEPTH):
        raise BadReview(f"{what} nests objects and arrays more than {MAX_NESTING_DEPTH} levels deep; "
                        "no Kubernetes object needs that many")


def _validated_request(raw: Mapping[str, Any]) -> ReviewRequest:
    """The request as the `AdmissionRequest` schema reads it, or BadReview naming every problem."""
    try:
        return ReviewRequest.of(AdmissionRequest.model_validate(raw))
    except ValidationError as e:
        problems = [f"request.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
        raise BadReview("; ".join(problems[:MAX_LISTED_ERRORS])) from None


# AdmissionRequest field names that differ from their wire names: the schema accepts both spellings
# (populate_by_name), so a request using one of these is left to it.
_PYTHON_NAMES = frozenset(
    name for name, field in AdmissionRequest.model_fields.items() if field.alias and field.alias != name
)
_OPERATIONS = frozenset(get_args(RequestOperation))


def _plain_request(raw: Mapping[str, Any]) -> ReviewRequest | None:
    """`_validated_request(raw)` for a request written the way the apiserver writes one, without the schema
    (about half the cost of validating it); None for anything else, which the schema then reads or refuses.

    The way the apiserver writes one: a dict whose fields hold exactly the JSON types the schema wants
    (strings, objects with string keys, a boolean dryRun), so the schema would take every value as it
    is. tests/unit/admission/test_parse_review_fast.py holds the two equal.
    """
    if type(raw) is not dict or not _PYTHON_NAMES.isdisjoint(raw):
        return None
    get = raw.get
    uid, operation, kind = get("uid"), get("operation"), get("kind", _ABSENT)
    name, namespace = get("name"), get("namespace")
    if type(uid) is not str or type(operation) is not str or operation not in _OPERATIONS:
        return None
    if (name is not None and type(name) is not str) or (namespace is not None and type(namespace) is not str):
        return None
    if kind is _ABSENT:
        request_kind = _ABSENT_GVK
    elif _plain_gvk(kind, "kind"):
        request_kind = RequestKind(kind.get("group", ""), kind.get("version", ""), kind.get("kind", ""))
    else:
        return None
    resource = get("resource", _ABSENT)
    if resource is not _ABSENT and not _plain_gvk(resource, "resource"):
        return None
    for key, last in (("requestKind", "kind"), ("requestResource", "resource")):
        value = get(key)
        if value is not None and not _plain_gvk(value, last):  # these two may be null
            return None
    sub_resource, request_sub_resource = get("subResource"), get("requestSubResource")
    if (sub_resource is not None and type(sub_resource) is not str) or (
        request_sub_resource is not None and type(request_sub_resource) is not str
    ):
        return None
    obj, old_object = get("object"), get("oldObject")
    for value in (obj, old_object, get("userInfo"), get("options")):
        if value is not None and (type(value) is not dict or not _string_keys(value)):
            return None
    dry_run = get("dryRun")
    if dry_run is not None and type(dry_run) is not bool:
        return None
    return ReviewRequest(uid, operation, request_kind, name, namespace, sub_resource,  # type: ignore[arg-type]
                         obj, old_object, dry_run)


_ABSENT = object()
_ABSENT_GVK = RequestKind()


def _plain_gvk(value: Any, last: str) -> bool:
    """Whether `value` is a group/version/`last` object of strings (null is not: the schema refuses it where
    the field may not be null)."""
    if type(value) is not dict or not _string_keys(value):
        return False
    get = value.get
    return type(get("group", "")) is str and type(get("version", "")) is str and type(get(last, "")) is str


def _string_keys(value: dict[Any, Any]) -> bool:
    """Whether every key of `value` is a string (as the schema's `dict[str, ...]` wants)."""
    try:
        "".join(value)  # NB: a C loop over the keys; anything but a str raises
    except TypeError:
        return False
    return True


def _nested_deeper_than(node: Any, limit: int) -> bool:
    """Whether decoded JSON `node` (dicts and lists exactly, as json/orjson decode) nests more than
    `limit` levels.

    A screen at C speed first: orjson's two-space indented output (OPT_INDENT_2, the layout of
    `json.dumps(indent=2)`) puts each member of a container n levels deep on a line of its own indented
    2n spaces, and no string can hold a raw newline. So when no line is indented 2*limit spaces, no
    container at level `limit` has a member and nothing sits at level limit + 1. For the lab review the
    screen costs about half the walk (13 µs against 28 µs on the 2-core dev VM; issue 4). Whatever it
    cannot rule out goes to the exact walk: a line that deep, or a value orjson will not encode (a key
    that is not a string, an integer past 64 bits, nesting past orjson's own limit of 254 levels).
    """
    if limit > 0:
        try:
            if b"\n" + b"  " * limit not in orjson.dumps(node, option=orjson.OPT_INDENT_2):
                return False
        except orjson.JSONEncodeError:
            pass
    return _walked_deeper_than(node, limit)


def _walked_deeper_than(node: Any, limit: int) -> bool:
    """`_nested_deeper_than` by walking the dicts and lists. Recursive but bounded: it stops `limit`
    calls down, so it never nears Python's recursion limit itself."""
    if limit == 0:
        return True
    for child in node.values() if type(node) is dict else node:
        kind = type(child)
        if (kind is dict or kind is list) and _walked_deeper_than(child, limit - 1):
            return True
    return False


class Context(TypedDict, total=False):
    """What a review is answered against (`prepare`'s keyword arguments)."""

    snapshot: Required[Snapshot]
    settings: Required[Settings]
    operation: Required[Operation]
    cache_problem: str | None
    in_flight: InFlight | None


def answer(request: ReviewRequest, **context: Unpack[Context]) -> Outcome:
    """The response AdmissionReview for `request` (see the module docstring for the rules): `prepare`, then
    `Prepared.result`, at once."""
    return prepare(request, **context).result()


class Prepared:
    """A review taken as far as the engine's decision (`prepare`); `result()` finishes it.

    `cheap` says whether finishing costs microseconds (the answer is known, the decision is in the
    snapshot's memo, or only its reservations are new: `engine.Pending.cheap`) or may take milliseconds and
    more (a decision to compute): the server finishes cheap ones at once and runs the others where its
    deadline can be kept.
    """

    def __init__(self, request: ReviewRequest, kind: str, step: Outcome | Callable[[], Outcome], *,
                 cheap: bool = True, skip_ignored: str = "") -> None:
        self.request = request
        self.kind = kind
        self.cheap = cheap
        self._step = step
        self._skip_ignored = skip_ignored  # the warning for a skip request the namespace does not allow

    def result(self) -> Outcome:
        """The outcome; raises engine.DeadlineExceeded when the decision ran past its deadline (the caller
        has answered already: nothing here may turn that into an answer)."""
        try:
            outcome = self._step if isinstance(self._step, Outcome) else self._step()
        except engine.DeadlineExceeded:
            raise
        except Exception as e:
            outcome = _internal_error(self.request, self.kind, e)
        if self._skip_ignored:
            outcome = _with_warning(outcome, self._skip_ignored)
        if self.request.dry_run:
            outcome = dataclasses.replace(outcome, dry_run=True)
        return outcome


def _with_warning(outcome: Outcome, warning: str) -> Outcome:
    """`outcome` with `warning` first among its warnings, marked as an ignored skip request."""
    response = dict(outcome.review.get("response") or {})
    response["warnings"] = responses.bound_warnings([warning, *(response.get("warnings") or [])])
    return dataclasses.replace(outcome, review={**outcome.review, "response": response}, skip="ignored")


def prepare(request: ReviewRequest, **context: Unpack[Context]) -> Prepared:
    """Everything of `answer` up to the engine's decision, which is looked up but not computed.

    `in_flight`: the replica's in-flight reservations (the server passes its own; `topoguard review`
    none). The decision counts them, and an admitted, non-dry-run mutating review adds its own hold.
    """
    kind = request.kind.kind or str((request.obj or {}).get("kind", ""))
    try:
        return _prepare(request, kind, context)
    except Exception as e:
        return Prepared(request, kind, _internal_error(request, kind, e))


def replica_types(request: ReviewRequest) -> int:
    """The most replica types the request's job (or, on UPDATE, its old version) writes (`jobs.replica_types`):
    what `prepare` costs grows with its square."""
    return max(jobs.replica_types(request.obj), jobs.replica_types(request.old_object))


def _internal_error(request: ReviewRequest, kind: str, error: Exception) -> Outcome:
    """The webhook must answer whatever goes wrong: a refusal naming the uid; the traceback goes to the log."""
    log.error("unexpected error answering a review", extra={"uid": request.uid}, exc_info=error)
    message = f"topoguard: internal error answering request {request.uid}: {type(error).__name__}: {error}"
    return Outcome(responses.refused(request.uid, code=500, message=message), "error", kind, None)


def _prepare(request: ReviewRequest, kind: str, context: Context) -> Prepared:
    uid, obj, snapshot = request.uid, request.obj, context["snapshot"]
    if obj is None or not _ours_to_place(request, obj, snapshot):
        return Prepared(request, kind, Outcome(responses.allowed(uid), "skipped", kind, None))
    namespace = request.namespace or str(_mapping(obj.get("metadata")).get("namespace") or "")
    subject = _subject(obj, kind, namespace, request.name)
    skip_ignored = ""
    if _asks_to_skip(obj):
        if _allows_skip(snapshot, namespace):
            return Prepared(request, kind, _skipped(request, obj, namespace, context["operation"]))
        skip_ignored = (f"topoguard: {labels.SKIP_ANNOTATION}=true ignored: namespace {namespace or '(none)'} is not "
                        f"labelled {labels.ALLOW_SKIP_LABEL}=true, so {subject} is checked as usual")
    return _prepare_checked(request, kind, context, namespace=namespace, subject=subject, skip_ignored=skip_ignored)


def _asks_to_skip(obj: Mapping[str, Any]) -> bool:
    """The job's annotation `topoguard.io/skip: "true"` (an annotation: it says something about the job to
    tools, it selects nothing; labels on a job are for selectors)."""
    return _mapping(_mapping(obj.get("metadata")).get("annotations")).get(labels.SKIP_ANNOTATION) == "true"


def _allows_skip(snapshot: Snapshot, namespace: str) -> bool:
    return bool(namespace) and snapshot.namespace_labels(namespace).get(labels.ALLOW_SKIP_LABEL) == "true"


def _skipped(request: ReviewRequest, obj: Mapping[str, Any], namespace: str, operation: Operation) -> Outcome:
    """A skip the namespace allows: admitted unchecked, and (mutating) the decision annotation says so, so the
    bypass is visible on the job; an annotation that says so already is left as it is (no patch)."""
    value = f"skipped: {labels.SKIP_ANNOTATION}=true, allowed by namespace {namespace} ({labels.ALLOW_SKIP_LABEL}=true)"
    annotations = _mapping(_mapping(obj.get("metadata")).get("annotations"))
    ops: list[dict[str, Any]] = []
    if operation == "mutate" and annotations.get(labels.DECISION_ANNOTATION) != value:
        path = "/metadata/annotations/" + labels.DECISION_ANNOTATION.replace("~", "~0").replace("/", "~1")
        ops = [{"op": "add", "path": path, "value": value}]
    review = responses.allowed(request.uid, patch=ops, audit={"outcome": "skipped", "skip": "honoured"})
    return Outcome(review, "skipped", str(obj.get("kind", "")), None, skip="honoured")


def _prepare_checked(request: ReviewRequest, kind: str, context: Context, *, namespace: str, subject: str,
                     skip_ignored: str) -> Prepared:
    """`_prepare` for a job of ours that is not skipped: read it, then look its decision up. `skip_ignored`: the
    warning every answer carries when the job asked for a skip its namespace does not allow."""
    uid, obj = request.uid, request.obj or {}  # _prepare answered a request without an object already
    snapshot, settings, operation = context["snapshot"], context["settings"], context["operation"]
    cache_problem, in_flight = context.get("cache_problem"), context.get("in_flight")

    def done(outcome: Outcome) -> Prepared:
        return Prepared(request, kind, outcome, skip_ignored=skip_ignored)

    warn = _enforcement(snapshot, namespace, settings) == "warn"
    try:
        group = jobs.parse_job(obj, gpu_resources=settings.gpu_resources, namespace=namespace, limits=settings.limits,
                               runtimes=snapshot.training_runtimes, collective_ports=settings.collective_ports)
    except jobs.MissingRuntimeError as e:
        return done(_missing_runtime(request, subject, kind, e, warn=warn, cache_problem=cache_problem))
    except jobs.UnsupportedKindError as e:
        refusal = responses.refused(uid, code=400, message="topoguard: " + unsupported_message(e))
        return done(Outcome(refusal, "denied", kind, None))
    except jobs.InvalidJobError as e:
        return done(Outcome(_invalid(uid, subject, [str(err) for err in e.errors]), "denied", kind, None))
    except jobs.JobLimitError as e:
        return done(_too_large(uid, subject, kind, [str(err) for err in e.errors], warn=warn))
    if (request.operation == "UPDATE" and not jobs.unsuspends(request.old_object, obj)
            and _placement_unchanged(request.old_object, group, settings, namespace, snapshot)):
        return done(Outcome(responses.allowed(uid), "unchanged", kind, None))

    if cache_problem is not None:
        message = f"topoguard: cannot check {subject}: {cache_problem}"
        if warn:
            review = responses.allowed(uid, warnings=[message + "; admitted unchecked (enforcement=warn)"])
            return done(Outcome(review, "warned", kind, None))
        refusal = responses.refused(uid, code=503, message=message + "; retry shortly")
        return done(Outcome(refusal, "denied", kind, None))

    holds = in_flight.totals(snapshot, job=engine.job_key(group)) if in_flight is not None else None
    suspended = job_status.is_suspended(obj)
    pending = engine.pending("decide" if operation == "mutate" else "validate", group, snapshot, settings,
                             suspended=suspended, in_flight=holds)

    def finish() -> Outcome:
        try:
            decision = pending.result()
        except engine.IndexValuesLimitError as e:
            return _too_large(uid, subject, kind, [str(e)], warn=warn)
        outcome = _finish(uid, obj, subject, kind, group, decision, settings, operation,
                          warn=warn, job_name=_job_name(obj, request.name))
        if in_flight is not None and operation == "mutate" and not request.dry_run and not suspended:
            _hold(in_flight, group, outcome, request.uid)
        return outcome

    return Prepared(request, kind, finish, cheap=pending.cheap, skip_ignored=skip_ignored)


def _finish(
    uid: str, obj: Mapping[str, Any], subject: str, kind: str, group: JobGroup, decision: Decision,
    settings: Settings, operation: Operation, *, warn: bool, job_name: str,
) -> Outcome:
    """The answer for a decision: a refusal (or warnings), or an admission with the patch when mutating."""
    if not decision.allowed:
        return _refusal(uid, subject, kind, decision, warn=warn, job_name=job_name)
    ops: list[dict[str, Any]] = []
    if operation == "mutate":
        try:
            ops = patches.build_patch(obj, group, decision, settings)
        except jobs.InvalidJobError as e:
            return Outcome(_invalid(uid, subject, [str(err) for err in e.errors]), "denied", kind, decision)
        except patches.PatchError as e:
            return Outcome(_invalid(uid, subject, [str(e)]), "denied", kind, decision)
    name: OutcomeName = "patched" if ops else "unchanged"
    warnings = [engine.render(w, job_name) for w in decision.warnings]
    review = responses.allowed(uid, patch=ops, warnings=warnings, audit=_audit(decision, name))
    return Outcome(review, name, kind, decision)


def _hold(in_flight: InFlight, group: JobGroup, outcome: Outcome, uid: str) -> None:
    """Keep the GPUs of a job just admitted to a zone until the watch shows it (admission/inflight.py).

    (A suspended job reserves nothing: the caller does not call this.) A job named by generateName has
    no name yet: its hold is keyed by the request uid, so only the window (not its appearance in the
    watch) ends it.
    """
    decision = outcome.decision
    if decision is None or not decision.allowed or not decision.zone:
        return
    if outcome.outcome not in ("patched", "unchanged"):
        return
    gpus: dict[str, int] = {}
    for replica in group.replicas:
        for resource, count in replica.gpus.items():
            gpus[resource] = gpus.get(resource, 0) + count * replica.count
    name = group.name or f"{uid}*"
    in_flight.hold((group.kind, group.namespace, name), decision.zone, gpus)


def _ours_to_place(request: ReviewRequest, obj: Mapping[str, Any], snapshot: Snapshot) -> bool:
    """False for DELETE/CONNECT, a subresource, an object being deleted, or a namespace not opted in."""
    if request.operation in ("DELETE", "CONNECT") or request.sub_resource:
        return False
    metadata = _mapping(obj.get("metadata"))
    if metadata.get("deletionTimestamp"):
        return False
    return _opted_in(snapshot, request.namespace or str(metadata.get("namespace") or ""))


def _refusal(uid: str, subject: str, kind: str, decision: Decision, *, warn: bool, job_name: str) -> Outcome:
    """No zone qualifies: refuse with 403 and the per-zone reasons, or admit unchanged with warnings."""
    lead_text = engine.render(decision.lead or "no zone qualifies", job_name)
    rest = [engine.render(r, job_name) for r in lead.remaining_reasons(decision)]
    warnings = [engine.render(w, job_name) for w in decision.warnings]
    if warn:
        # The first warning says where the rest is: the apiserver keeps 12 of at most 256 characters each.
        summary = (f"topoguard: {subject} cannot run in one open zone; admitted unchanged (enforcement=warn); "
                   "the next warning says why, `topoguard explain` shows every zone and flow")
        review = responses.allowed(uid, warnings=[summary, lead_text, *rest, *warnings],
                                   audit=_audit(decision, "warned"))
        return Outcome(review, "warned", kind, decision)
    more = f" Also: {'; '.join(rest)}" if rest else ""
    message = f"topoguard: {subject} cannot run in one open zone: {lead_text}.{more}"
    review = responses.refused(uid, code=403, message=message, warnings=warnings, audit=_audit(decision, "denied"))
    return Outcome(review, "denied", kind, decision)


def _audit(decision: Decision, outcome: OutcomeName) -> dict[str, str]:
    """auditAnnotations (the apiserver prefixes each key with the webhook's name)."""
    return {**({"zone": decision.zone} if decision.zone else {}), "outcome": outcome}


def _opted_in(snapshot: Snapshot, namespace: str) -> bool:
    return snapshot.opted_in(namespace)


def _enforcement(snapshot: Snapshot, namespace: str, settings: Settings) -> str:
    """The namespace label `topoguard.io/enforcement` (warn|deny) when set, else the setting."""
    value = snapshot.namespace_labels(namespace).get(labels.ENFORCEMENT_LABEL, "") if namespace else ""
    return value if value in ("deny", "warn") else settings.enforcement


def _job_name(obj: Mapping[str, Any], name: str | None) -> str:
    """The name the job's pods will be named after, for the engine's messages (`engine.render`)."""
    metadata = _mapping(obj.get("metadata"))
    return str(name or metadata.get("name") or (f"{metadata['generateName']}*" if metadata.get("generateName") else ""))


def _subject(obj: Mapping[str, Any], kind: str, namespace: str, name: str | None) -> str:
    """`PyTorchJob ml/train` for messages (a generateName shows as `prefix*`)."""
    shown = _job_name(obj, name)
    where = f"{namespace}/{shown}" if namespace else shown
    return f"{kind or 'object'} {where}".strip()


def unsupported_message(error: jobs.UnsupportedKindError) -> str:
    """`unsupported job kind 'Pod' in apiVersion 'v1'; supported: JAXJob (kubeflow.org/v1), ...`.

    The one wording for every surface (the webhook's 400, `topoguard review`, `topoguard explain`).
    """
    supported = ", ".join(f"{kind} ({api})" for api, kind in sorted(jobs.SUPPORTED, key=lambda p: (p[1], p[0])))
    kind = repr(error.kind) if error.kind else "(none)"
    api_version = repr(error.api_version) if error.api_version else "(none)"
    return f"unsupported job kind {kind} in apiVersion {api_version}; supported: {supported}"


def _too_large(uid: str, subject: str, kind: str, problems: Sequence[str], *, warn: bool) -> Outcome:
    """A job past the settings' `limits` (or whose policies name more pod indices than they allow): refused
    with 422 naming every field and limit, or admitted unchanged with that warning under `warn`."""
    if warn:
        summary = f"topoguard: {subject} was not checked, it is larger than topoguard checks; admitted unchanged " \
                  "(enforcement=warn)"
        review = responses.allowed(uid, warnings=[summary, *problems[:MAX_LISTED_ERRORS]])
        return Outcome(review, "warned", kind, None)
    listed = "; ".join(problems[:MAX_LISTED_ERRORS])
    message = f"topoguard: {subject} is larger than topoguard checks: {listed}; raise the limit or split the job"
    return Outcome(responses.refused(uid, code=422, message=message), "denied", kind, None)


def _invalid(uid: str, subject: str, problems: Sequence[str]) -> dict[str, Any]:
    listed = "; ".join(problems[:MAX_LISTED_ERRORS])
    more = f" (and {len(problems) - MAX_LISTED_ERRORS} more)" if len(problems) > MAX_LISTED_ERRORS else ""
    return responses.refused(uid, code=422, message=f"topoguard: {subject} is invalid: {listed}{more}")


def _placement(group: JobGroup) -> list[tuple[Any, ...]]:
    """What decides where a group's pods may run and which flows they need, per replica."""
    out: list[tuple[Any, ...]] = []
    for r in group.replicas:
        spec = _mapping(r.template.get("spec"))
        out.append((r.key, r.count, dict(r.gpus), dict(r.requests), r.claims, r.ports, r.host_network,
                    r.service_account, dict(r.pod_labels),
                    dict(r.leader_labels), tuple(spec.get(f) for f in PLACEMENT_SPEC_FIELDS), r.placement))
    return out


def _missing_runtime(
    request: ReviewRequest, subject: str, kind: str, error: jobs.MissingRuntimeError, *, warn: bool,
    cache_problem: str | None,
) -> Outcome:
    """A TrainJob whose runtime is not in the snapshot: its pods cannot be known, so it is not judged.

    Refused (403, naming the runtime; 503 while the cache is not usable) or, under enforcement `warn`,
    admitted with a warning. An UPDATE that leaves the spec as it was (a controller's metadata edit) is
    let through: refusing it would wedge a job whose runtime was deleted after it started.
    """
    uid, old = request.uid, request.old_object
    if request.operation == "UPDATE" and old is not None and (request.obj or {}).get("spec") == old.get("spec"):
        return Outcome(responses.allowed(uid), "unchanged", kind, None)
    message = f"topoguard: cannot check {subject}: {cache_problem or error}"
    if warn:
        review = responses.allowed(uid, warnings=[message + "; admitted unchecked (enforcement=warn)"])
        return Outcome(review, "warned", kind, None)
    code = 503 if cache_problem else 403
    return Outcome(responses.refused(uid, code=code, message=message), "denied", kind, None)


def _placement_unchanged(
    old: Mapping[str, Any] | None, group: JobGroup, settings: Settings, namespace: str, snapshot: Snapshot
) -> bool:
    """Whether an UPDATE leaves placement as the old object had it (unparsable old → re-check)."""
    if old is None:
        return False
    try:
        before = jobs.parse_job(old, gpu_resources=settings.gpu_resources, namespace=namespace,
                                limits=settings.limits, runtimes=snapshot.training_runtimes,
                                collective_ports=settings.collective_ports)
    except jobs.JobError:
        return False
    return _placement(before) == _placement(group) and before.flows == group.flows


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return type(value).__name__
