"""Reading one PodTemplateSpec (or a PodSpec patch) as written: labels, GPUs, ports, placement.

Every reader takes the field path of what it reads and appends a `FieldError` to `errors`
instead of raising, so one pass reports every malformed field. Values that are absent get the
Kubernetes default (service account `default`, protocol `TCP`); values of the wrong type are
errors, never guessed.

This runs on every admission review, so one reader serves every template and is cheap for the
usual one: each container is read once; paths are handed down as `LazyPath`s (`(parent, key)`
tuples) and rendered only for an error message; fields most templates leave out (init containers,
placement, claims, overhead, the service account) cost one pass over the spec's keys together
(`_OPTIONAL_POD_FIELDS`); a container's requests are read once per way of asking (`_AMOUNTS`), and
quantities once per value (`_QUANTITIES`); and dicts (what JSON decoding gives) are recognised by
`type(x) is dict` before the slower generic `isinstance(x, Mapping)`, which still accepts any other
mapping.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from fractions import Fraction
from typing import Any, NamedTuple

from app.jobs.errors import FieldError, LazyPath, render_path
from app.jobs.records import build_record, build_tuple
from app.models.cluster import BoundedMemo, ContainerPort
from app.models.dra import PodClaimRef
from app.models.job import UserPlacement
from app.models.resources import gpu_matcher, parse_quantity, scheduler_units

DEFAULT_SERVICE_ACCOUNT = "default"
MAX_PORT = 65535
PROTOCOLS = ("TCP", "UDP", "SCTP")
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"  # nodeAffinity's hard constraints

# Records internal to app/jobs are NamedTuples: immutable like frozen dataclasses, and about a third
# of the cost to build (a frozen dataclass sets each field through object.__setattr__).
class NamedContainerPort(NamedTuple):
    """A container port together with the container that declares it."""

    container: str
    port: ContainerPort


class PodFacts(NamedTuple):
    """What a pod template says about the pods made from it."""

    labels: Mapping[str, str]
    gpus: Mapping[str, int]
    ports: tuple[NamedContainerPort, ...]
    container_names: tuple[str, ...]
    service_account: str
    host_network: bool
    placement: UserPlacement
    # Every resource a pod asks for, as the scheduler sums it (NodeResourcesFit: containers and sidecars
    # add up, each plain init container runs beside the sidecars started before it, plus spec.overhead):
    # cpu in millicores, every other resource in whole base units (bytes, devices), rounded up.
    requests: Mapping[str, int] = {}
    claims: tuple[PodClaimRef, ...] = ()  # spec.resourceClaims, in order


# Shared by every template without placement constraints (nothing writes to a parsed job).
EMPTY_PLACEMENT = UserPlacement(node_selector={}, node_selector_terms=(), tolerations=())
EMPTY_FACTS = PodFacts({}, {}, (), (), DEFAULT_SERVICE_ACCOUNT, False, EMPTY_PLACEMENT)


def read_mapping(value: Any, at: LazyPath, errors: list[FieldError]) -> Mapping[str, Any]:
    """`value` as a mapping; None → `{}`; anything else → an error and `{}`."""
    if type(value) is dict:
        return value
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return value
    errors.append(FieldError(render_path(at), f"must be an object, got {type_name(value)}"))
    return {}


def read_list(value: Any, at: LazyPath, errors: list[FieldError]) -> Sequence[Any]:
    """`value` as a list; None → `[]`; anything else → an error and `[]`."""
    if type(value) is list:
        return value
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return value
    errors.append(FieldError(render_path(at), f"must be a list, got {type_name(value)}"))
    return []


def read_string_map(value: Any, at: LazyPath, errors: list[FieldError]) -> dict[str, str]:
    """A map of string to string (labels, annotations, nodeSelector)."""
    if value is None:
        return {}
    out: dict[str, str] = {}
    for key, item in (value if type(value) is dict else read_mapping(value, at, errors)).items():
        if not isinstance(key, str) or not isinstance(item, str):
            errors.append(FieldError(render_path((at, str(key))), f"must be a string, got {type_name(item)}"))
            continue
        out[key] = item
    return out


def read_int(value: Any, at: LazyPath, errors: list[FieldError], *, default: int, minimum: int = 0) -> int:
    """A non-negative integer field (replicas, parallelism); None → `default`."""
    if type(value) is int and value >= minimum:
        return value
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        errors.append(FieldError(render_path(at), f"must be an integer, got {type_name(value)}"))
        return default
    if value < minimum:
        errors.append(FieldError(render_path(at), f"must be >= {minimum}, got {value}"))
        return default
    return value


def read_str(value: Any, at: LazyPath, errors: list[FieldError], *, default: str = "") -> str:
    if type(value) is str:
        return value
    if value is None:
        return default
    if not isinstance(value, str):
        errors.append(FieldError(render_path(at), f"must be a string, got {type_name(value)}"))
        return default
    return value


# A device count no node reports (device plugins count in int32): past it a job is refused, and every sum of GPUs
# (pods x containers x this, within the job limits) stays a number JSON and the metrics can carry.
MAX_GPUS_PER_CONTAINER = 2**31 - 1


def read_pod_template(raw: Any, at: LazyPath, errors: list[FieldError], *, gpu_resources: Sequence[str]) -> PodFacts:
    """Facts about the pods of a PodTemplateSpec (`{metadata, spec}`) at `at`."""
    template = raw if type(raw) is dict else read_mapping(raw, at, errors)
    metadata = template.get("metadata")
    labels: dict[str, str] = {}
    if metadata is not None:
        metadata_at = (at, "metadata")
        metadata = metadata if type(metadata) is dict else read_mapping(metadata, metadata_at, errors)
        labels = read_string_map(metadata.get("labels"), (metadata_at, "labels"), errors)
    return read_pod_spec(template.get("spec"), (at, "spec"), errors, gpu_resources=gpu_resources, labels=labels)


# The PodSpec fields read besides `containers`, which most templates leave out: a spec holding none of them (one
# pass over its keys, `isdisjoint`) takes every default without a lookup each.
_OPTIONAL_POD_FIELDS = frozenset({
    "initContainers", "serviceAccountName", "serviceAccount", "hostNetwork", "overhead", "nodeSelector", "affinity",
    "tolerations", "resourceClaims",
})


def read_pod_spec(
    raw: Any,
    at: LazyPath,
    errors: list[FieldError],
    *,
    gpu_resources: Sequence[str],
    labels: dict[str, str] | None = None,
) -> PodFacts:
    """Facts about the pods of a PodSpec at `at` (`labels`, the template's, become the facts' own).

    Each container is read once, its name, ports and requests together; their errors are reported
    by kind all the same (every name, then every port, then every request), as they always were.
    """
    spec = raw if type(raw) is dict else read_mapping(raw, at, errors)
    is_gpu = gpu_matcher(gpu_resources)
    optional = not _OPTIONAL_POD_FIELDS.isdisjoint(spec)
    containers_at = (at, "containers")
    containers = spec.get("containers")
    if type(containers) is not list:
        containers = read_list(containers, containers_at, errors)
    names: list[str] = []
    ports: list[NamedContainerPort] = []
    running: dict[str, int] = {}
    gpus: dict[str, int] | None = {}  # None once more than what one container asks for adds up
    name_errors: list[FieldError] = []
    port_errors: list[FieldError] = []
    request_errors: list[FieldError] = []
    for i, c in enumerate(containers):
        if type(c) is not dict and not isinstance(c, Mapping):
            errors.append(FieldError(render_path((containers_at, i)), f"must be an object, got {type_name(c)}"))
            continue
        c_at = (containers_at, i)
        name = c.get("name")
        names.append(name if type(name) is str else read_str(name, (c_at, "name"), name_errors))
        if c.get("ports") is not None:
            ports += _read_ports(c, c_at, port_errors)
        resources = c.get("resources")
        if resources is not None:
            amounts, container_gpus = _read_amounts(resources, (c_at, "resources"), request_errors, is_gpu)
            if running:
                _add(running, amounts)
                gpus = None
            else:  # the first container asking for anything: its requests and GPUs are the pod's so far
                running, gpus = amounts, container_gpus  # dicts of their own (`_read_amounts`)
    raw_init = spec.get("initContainers") if optional else None
    init_containers = [] if raw_init is None else _read_objects_at(raw_init, (at, "initContainers"), errors)
    errors += name_errors  # after the structure of both lists, as always
    errors += port_errors
    service_account = ""
    host_network = False
    if optional:
        written = spec.get("serviceAccountName")
        service_account = written if type(written) is str else read_str(written, (at, "serviceAccountName"), errors)
        if not service_account and "serviceAccount" in spec:  # the deprecated alias, still honoured by the apiserver
            service_account = read_str(spec["serviceAccount"], (at, "serviceAccount"), errors)
        written = spec.get("hostNetwork")
        if written is not None and not isinstance(written, bool):
            errors.append(FieldError(render_path((at, "hostNetwork")), f"must be a boolean, got {type_name(written)}"))
        else:
            host_network = written is True
    errors += request_errors
    requests = _pod_requests(running, init_containers, errors, is_gpu)
    overhead = spec.get("overhead") if optional else None
    if overhead is not None:  # RuntimeClass overhead, which the scheduler adds to the pod's requests
        _add(requests, _read_amounts({"requests": overhead}, (at, "overhead"), errors, is_gpu)[0])
    if gpus is None or init_containers or overhead is not None:
        # GPUs by name: `requests` is sorted by name unless the overhead added a resource (`_pod_requests`).
        gpus = {r: n for r, n in (requests.items() if overhead is None else sorted(requests.items())) if is_gpu(r)}
    placement = read_placement(spec, at, errors) if optional else EMPTY_PLACEMENT
    raw_claims = spec.get("resourceClaims") if optional else None
    return build_tuple(PodFacts, (
        labels if labels is not None else {},
        gpus,
        tuple(ports),
        tuple(names),
        service_account or DEFAULT_SERVICE_ACCOUNT,
        host_network,
        placement,
        requests,
        () if raw_claims is None else _read_claims(raw_claims, (at, "resourceClaims"), errors),
    ))


def read_placement(spec: Mapping[str, Any], at: LazyPath, errors: list[FieldError]) -> UserPlacement:
    """nodeSelector, required nodeSelectorTerms and tolerations, kept as written."""
    raw_selector, affinity, raw_tolerations = spec.get("nodeSelector"), spec.get("affinity"), spec.get("tolerations")
    if raw_selector is None and affinity is None and raw_tolerations is None:  # most templates
        return EMPTY_PLACEMENT
    node_selector = {} if raw_selector is None else read_string_map(raw_selector, (at, "nodeSelector"), errors)
    terms: tuple[Mapping[str, Any], ...] = ()
    if affinity is not None:
        affinity_at = (at, "affinity")
        affinity = read_mapping(affinity, affinity_at, errors)
        node_affinity_at = (affinity_at, "nodeAffinity")
        node_affinity = read_mapping(affinity.get("nodeAffinity"), node_affinity_at, errors)
        required_at = (node_affinity_at, _REQUIRED)
        required = read_mapping(node_affinity.get(_REQUIRED), required_at, errors)
        terms = _read_objects(required.get("nodeSelectorTerms"), (required_at, "nodeSelectorTerms"), errors)
    tolerations = _read_objects(raw_tolerations, (at, "tolerations"), errors)
    if not (node_selector or terms or tolerations):
        return EMPTY_PLACEMENT
    return build_record(
        UserPlacement, {"node_selector": node_selector, "node_selector_terms": terms, "tolerations": tolerations}
    )


def type_name(value: Any) -> str:
    """JSON type names for messages: object, list, string, integer, number, boolean, null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "list"
    return type(value).__name__


def is_object(value: Any) -> bool:
    """True for a JSON object: a dict (checked first: what JSON decoding gives) or any other Mapping."""
    return type(value) is dict or isinstance(value, Mapping)


def _read_objects(value: Any, at: LazyPath, errors: list[FieldError]) -> tuple[Mapping[str, Any], ...]:
    """The object entries of a list; a non-object entry is an error."""
    if type(value) is list:
        for item in value:
            if type(item) is not dict:
                break
        else:  # dicts only, as JSON decoding gives them: every entry, as written
            return tuple(value)
    return tuple([item for _, item in _read_objects_at(value, at, errors)])


def _read_objects_at(value: Any, at: LazyPath, errors: list[FieldError]) -> list[tuple[LazyPath, Mapping[str, Any]]]:
    """(path, entry) for every object entry of a list (containers keep their own index in paths)."""
    out: list[tuple[LazyPath, Mapping[str, Any]]] = []
    for i, item in enumerate(value if type(value) is list else read_list(value, at, errors)):
        if type(item) is dict or isinstance(item, Mapping):
            out.append(((at, i), item))
        else:
            errors.append(FieldError(render_path((at, i)), f"must be an object, got {type_name(item)}"))
    return out


def _read_ports(container: Mapping[str, Any], at: LazyPath, errors: list[FieldError]) -> list[NamedContainerPort]:
    raw_ports = container.get("ports")
    name = container.get("name") if isinstance(container.get("name"), str) else ""
    out: list[NamedContainerPort] = []
    ports_at = (at, "ports")
    for i, raw in enumerate(read_list(raw_ports, ports_at, errors)):
        port_at = (ports_at, i)
        if not is_object(raw):  # reported in list order, among the errors of the other entries
            errors.append(FieldError(render_path(port_at), f"must be an object, got {type_name(raw)}"))
            continue
        number = raw.get("containerPort")
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= MAX_PORT:
            errors.append(FieldError(render_path((port_at, "containerPort")), f"must be an integer in 1..{MAX_PORT}"))
            continue
        protocol = read_str(raw.get("protocol"), (port_at, "protocol"), errors, default="TCP")
        if protocol not in PROTOCOLS:
            errors.append(FieldError(render_path((port_at, "protocol")), f"must be one of {', '.join(PROTOCOLS)}"))
            continue
        port_name = read_str(raw.get("name"), (port_at, "name"), errors)
        out.append(NamedContainerPort(str(name), ContainerPort(port=number, protocol=protocol, name=port_name)))
    return out


# Past this no node has it (Kubernetes quantities are int64 in their base unit, millicores for cpu).
MAX_QUANTITY = 2**63 - 1


# Quantities as read, by (resource name, value as written): the templates of one job, and of most jobs, repeat a
# few values ("16", "128Gi", 4), and reading one (a regular expression, then Fractions) costs more than the rest of
# its container. Both are user data: the memo is bounded in entries, and only short ones are kept.
QUANTITY_MEMO_SIZE = 4096
_MEMO_NAME_CHARS = 253  # the longest resource name the apiserver takes (a DNS subdomain prefix + name)
_MEMO_VALUE_CHARS = 32
_QUANTITIES: BoundedMemo[tuple[str, str | int], tuple[Fraction | None, int]] = BoundedMemo(QUANTITY_MEMO_SIZE)


def resource_amounts(resources: Mapping[str, Any], gpu_resources: Sequence[str]) -> tuple[dict[str, int], list[str]]:
    """One container's requests per resource as the scheduler reads them, and what is wrong (`section/name: why`).

    A request wins over a limit, and a limit stands in for an absent request (the apiserver's defaulting);
    for GPUs (extended resources, where the two must be equal) the limit wins as before. GPUs must be
    whole numbers.
    """
    return _amounts(resources, gpu_matcher(gpu_resources))


_SECTIONS = ("limits", "requests")  # in this order: a GPU's limit wins over its request
_INT64 = range(-(2**63), 2**63)


def _short(name: Any, raw: Any) -> bool:
    """Whether a memo may keep a quantity read: a resource name and a short string or an int64 (exact types)."""
    kind = type(raw)
    return (type(name) is str and len(name) <= _MEMO_NAME_CHARS
            and ((kind is str and len(raw) <= _MEMO_VALUE_CHARS) or (kind is int and raw in _INT64)))


def _amounts(resources: Mapping[str, Any], is_gpu: Callable[[str], bool]) -> tuple[dict[str, int], list[str]]:
    """`resource_amounts` with the setting's GPU predicate (`gpu_matcher`) at hand."""
    memo = _QUANTITIES
    out: dict[str, int] = {}
    problems: list[str] = []
    zero = False
    for section in _SECTIONS:
        values = resources.get(section)
        if values is None:
            continue
        if type(values) is not dict and not isinstance(values, Mapping):
            problems.append(f"{section}\x00must be an object, got {type_name(values)}")
            continue
        for name, raw in values.items():
            if not isinstance(name, str):
                problems.append(f"{section}\x00{name}\x00must be a resource name")
                continue
            gpu = is_gpu(name)
            if gpu and section == "requests" and name in out:
                continue  # the limit wins
            # Quantities read are kept per (name, value) (`_QUANTITIES`), for strings and integers only: `True` and
            # `1.0` equal `1` but are read otherwise, so they are never looked up.
            kind = type(raw)
            read = memo.get((name, raw)) if kind is str or kind is int else None
            if read is None:
                quantity = parse_quantity(raw)
                read = (quantity, 0 if quantity is None else scheduler_units(name, quantity))
                if _short(name, raw):
                    memo.put((name, raw), read)
            amount, units = read
            if amount is None or (gpu and amount.denominator != 1):
                why = ("must be a whole non-negative quantity" if gpu
                       else "must be a non-negative quantity (like 500m, 2Gi)")
                problems.append(f"{section}\x00{name}\x00{why}")
                continue
            cap = MAX_GPUS_PER_CONTAINER if gpu else MAX_QUANTITY
            if units > cap:
                problems.append(f"{section}\x00{name}\x00{float(amount):.3g} is more than any node has"
                                + (f" (at most {MAX_GPUS_PER_CONTAINER} per container)" if gpu else ""))
                continue
            out[name] = units
            if units <= 0:
                zero = True
    return ({r: n for r, n in out.items() if n > 0} if zero else out), problems


def read_resources(raw: Any, at: LazyPath, errors: list[FieldError], *, gpu_resources: Sequence[str]) -> dict[str, int]:
    """A ResourceRequirements' requests per resource (`resource_amounts`), each problem reported at its field."""
    return _read_amounts(raw, at, errors, gpu_matcher(gpu_resources))[0]


# A container's requests as read (`_amounts`), by what they are read from: its `limits` and `requests` entries as
# written, the types of their values (so `True` and `1.0` never stand for `1`) and the GPU predicate. The
# containers of one job, and of most jobs, ask alike, and reading one is most of reading its template. Bounded
# (user data): only containers of a few short entries (`_short`, at most 512 characters in all) read without a
# problem are kept, so the memo holds at most about 1,024 x 512 characters.
AMOUNTS_MEMO_SIZE = 1024
_MEMO_CONTAINER_ENTRIES = 16
_MEMO_CONTAINER_CHARS = 512
_AMOUNTS: BoundedMemo[tuple[Hashable, ...], tuple[dict[str, int], dict[str, int]]] = BoundedMemo(AMOUNTS_MEMO_SIZE)
_NO_ENTRIES: dict[str, Any] = {}  # an absent section (read only)


def _read_amounts(
    raw: Any, at: LazyPath, errors: list[FieldError], is_gpu: Callable[[str], bool]
) -> tuple[dict[str, int], dict[str, int]]:
    """`read_resources` with the setting's GPU predicate at hand, and the GPUs among the requests (by name); both
    dicts returned are new ones."""
    resources = raw if type(raw) is dict else read_mapping(raw, at, errors)
    if not resources:
        return {}, {}
    limits, requests = resources.get("limits"), resources.get("requests")
    key: tuple[Hashable, ...] | None = None
    if (limits is None or type(limits) is dict) and (requests is None or type(requests) is dict):
        # One flat tuple (the number of limits tells where the requests start): names, values, their types.
        limits_, requests_ = limits or _NO_ENTRIES, requests or _NO_ENTRIES
        key = (is_gpu, len(limits_), *limits_, *limits_.values(), *map(type, limits_.values()),
               *requests_, *requests_.values(), *map(type, requests_.values()))
        try:
            found = _AMOUNTS.get(key)
        except TypeError:  # a value that is a list or an object: no quantity, reported below
            key = found = None
        if found is not None:
            return dict(found[0]), dict(found[1])
    amounts, problems = _amounts(resources, is_gpu)
    for problem in problems:
        parts = problem.split("\x00")
        where: LazyPath = (at, parts[0])
        if len(parts) == 3:
            where = (where, parts[1])
        errors.append(FieldError(render_path(where), parts[-1]))
    gpus = {r: n for r, n in sorted(amounts.items()) if is_gpu(r)}
    if key is not None and not problems and _memoizable(limits or _NO_ENTRIES, requests or _NO_ENTRIES):
        _AMOUNTS.put(key, (dict(amounts), dict(gpus)))
    return amounts, gpus


def _memoizable(*sections: dict[Any, Any]) -> bool:
    """Whether `_AMOUNTS` may keep a reading of a container's `sections`: a few `_short` entries, a few characters."""
    entries = chars = 0
    for section in sections:
        for name, raw in section.items():
            if not _short(name, raw):
                return False
            entries += 1
            chars += len(name) + (len(raw) if type(raw) is str else 0)
    return entries <= _MEMO_CONTAINER_ENTRIES and chars <= _MEMO_CONTAINER_CHARS


def _pod_requests(
    running: dict[str, int],
    init_containers: list[tuple[LazyPath, Mapping[str, Any]]],
    errors: list[FieldError],
    is_gpu: Callable[[str], bool],
) -> dict[str, int]:
    """A pod's effective request per resource, as the scheduler computes it, from `running` (the sum of its
    regular containers', which this adds to).

    Regular containers and restartable init containers (sidecars, `restartPolicy: Always`) run
    together and add up; each plain init container runs alone beside the sidecars started before
    it, so the pod needs the max of that and the running sum.
    """
    if not init_containers:  # most pods; every amount read is positive (`_amounts`), and so is every sum
        names = sorted(running)
        # `running` is the caller's own; a single container's (limits before requests) is mostly in order already.
        return running if names == list(running) else {r: running[r] for r in names}
    sidecars: dict[str, int] = {}
    peak: dict[str, int] = {}
    for at, container in init_containers:
        amounts = _read_amounts(container.get("resources"), (at, "resources"), errors, is_gpu)[0]
        if container.get("restartPolicy") == "Always":
            _add(sidecars, amounts)
            continue
        during = dict(sidecars)
        _add(during, amounts)
        for resource, amount in during.items():
            peak[resource] = max(peak.get(resource, 0), amount)
    _add(running, sidecars)
    total = {r: max(running.get(r, 0), peak.get(r, 0)) for r in {*running, *peak}}
    return {r: n for r, n in sorted(total.items()) if n > 0}


def _read_claims(raw: Any, at: LazyPath, errors: list[FieldError]) -> tuple[PodClaimRef, ...]:
    """spec.resourceClaims: each entry's name and the template or claim it names."""
    out: list[PodClaimRef] = []
    for entry_at, entry in _read_objects_at(raw, at, errors):
        name = read_str(entry.get("name"), (entry_at, "name"), errors)
        template = read_str(entry.get("resourceClaimTemplateName"), (entry_at, "resourceClaimTemplateName"), errors)
        claim = read_str(entry.get("resourceClaimName"), (entry_at, "resourceClaimName"), errors)
        if template and claim:
            errors.append(FieldError(render_path(entry_at),
                                     "must set only one of resourceClaimName and resourceClaimTemplateName"))
            continue
        out.append(PodClaimRef(name, template, claim))
    return tuple(out)


def _add(into: dict[str, int], more: Mapping[str, int]) -> None:
    for resource, amount in more.items():
        into[resource] = into.get(resource, 0) + amount
