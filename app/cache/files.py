"""The file snapshot (`--cluster PATH`): YAML/JSON, one object, multi-document, `kind: List`, or a
directory of such files. Unknown kinds are ignored; unparsable input is an error naming the file and
the document. Training jobs of the supported kinds are kept too (the reservation ledger reads them).

Files are read in chunks and projected object by object, never held whole: a JSON List's items are
parsed one at a time (`_JsonStream`; `kubectl get ... -o json` of a large cluster is hundreds of MB,
and its document tree several times that), YAML one document at a time. A YAML `kind: List` is one
document, so it is parsed whole: for a large cluster, write JSON.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any

import yaml

from app.cache import projections
from app.config import CILIUM_AGENT_DAEMONSET, DEFAULT_CILIUM_CONFIG
from app.models.cluster import ConfigMapInfo, Snapshot
from app.models.network import EPHEMERAL_PORTS, PortRange

SUFFIXES = (".yaml", ".yml", ".json")
CHUNK_CHARS = 1 << 20  # how much of a file is read at a time


class SnapshotError(ValueError):
    """A snapshot file or document cannot be used."""


class _Reader:
    """One file read in chunks: UTF-8 text for the parsers, its bytes into the snapshot's digest."""

    def __init__(self, path: Path, digest: Any) -> None:
        self.path = path
        self.name = str(path)  # what yaml's errors call the stream
        self._digest = digest
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        try:
            self._file = path.open("rb")
        except OSError as e:
            raise SnapshotError(f"{path}: cannot read: {e}") from e

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._file.close()

    def read(self, size: int = -1) -> str:
        """Up to about `size` characters ("" at the end); the whole rest when `size` < 0 (yaml's contract)."""
        try:
            data = self._file.read(size if size > 0 else -1)
            self._digest.update(data)
            return self._decoder.decode(data, final=not data)
        except (OSError, UnicodeDecodeError) as e:
            raise SnapshotError(f"{self.path}: cannot read: {e}") from e


_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace (RFC 8259 section 2)
_DECODER = json.JSONDecoder()


class _JsonStream:
    """A JSON document parsed from a `_Reader` a value at a time, keeping only the unparsed rest of the
    current chunk: `value()` decodes the next whole value (growing the buffer while the value is cut off),
    `peek()`/`take()` step over the punctuation between values. Errors name the line and column."""

    def __init__(self, reader: _Reader) -> None:
        self._reader = reader
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._line = 1  # line and first offset of that line, of _buf[0]
        self._column_base = 0

    def _more(self) -> bool:
        """Drop what was parsed and read on (at least doubling the buffer, so a value larger than a chunk
        costs linear time); False at the end of the file."""
        if self._eof:
            return False
        chunk = self._reader.read(max(CHUNK_CHARS, len(self._buf)))
        if not chunk:
            self._eof = True  # the buffer stays as it is, so an error's position still points into it
            return False
        if self._pos:
            done = self._buf[: self._pos]
            newlines = done.count("\n")
            if newlines:
                self._line += newlines
                self._column_base = -(len(done) - done.rfind("\n") - 1)
            else:
                self._column_base -= len(done)
            self._buf, self._pos = self._buf[self._pos :], 0
        self._buf += chunk
        return True

    def peek(self) -> str:
        """The next character that is not whitespace ("" at the end of the file), not consumed."""
        while True:
            self._pos = _SPACE.match(self._buf, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._more():
                return ""

    def take(self, allowed: str, what: str) -> str:
        """Consume the next non-whitespace character, one of `allowed`."""
        found = self.peek()
        if not found or found not in allowed:
            raise self.error(f"expecting {what}", self._pos)
        self._pos += 1
        return found

    def value(self) -> Any:
        if not self.peek():
            raise self.error("expecting value", self._pos)
        while True:
            try:
                value, end = _DECODER.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as e:
                if self._more():
                    continue  # cut off at the chunk's end (or broken: then it fails again at the file's end)
                raise self.error(e.msg, e.pos) from None
            if end == len(self._buf) and self._more():
                continue  # a number at the chunk's end may go on in the next one
            self._pos = end
            return value

    def key(self) -> str:
        """An object's member name."""
        if self.peek() != '"':
            raise self.error("expecting property name enclosed in double quotes", self._pos)
        return str(self.value())

    def finish(self) -> None:
        """Only whitespace may follow the document (as json.loads requires)."""
        if self.peek():
            raise self.error("extra data", self._pos)

    def error(self, message: str, at: int) -> SnapshotError:
        newlines = self._buf.count("\n", 0, at)
        line = self._line + newlines
        column = at - self._buf.rfind("\n", 0, at) if newlines else at - self._column_base + 1
        return SnapshotError(f"{self._reader.path}: not valid JSON: {message}: line {line} column {column}")


def _document_objects(path: Path, number: int, doc: Any) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The objects of one parsed document: the document, or a List's items."""
    where = f"{path} document {number}"
    if doc is None:
        return
    if not isinstance(doc, Mapping):
        raise SnapshotError(f"{where}: expected a Kubernetes object, got {type(doc).__name__}")
    if str(doc.get("kind", "")).endswith("List") and isinstance(doc.get("items"), list):
        for j, item in enumerate(doc["items"]):
            yield _item(where, j, item)
    else:
        yield where, doc


def _item(where: str, j: int, item: Any) -> tuple[str, Mapping[str, Any]]:
    if not isinstance(item, Mapping):
        raise SnapshotError(f"{where} item {j}: expected a Kubernetes object")
    return f"{where} item {j}", item


def _json_objects(reader: _Reader, skip: Callable[[str], None] | None) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """A JSON file's objects. A top-level `items` array is streamed item by item (in kubectl's output it
    comes before `kind`, so the List is confirmed at the end: an `items` array in an object that turns
    out not to be a List is an error rather than read whole)."""
    path, stream = reader.path, _JsonStream(reader)
    where = f"{path} document 1"
    if stream.peek() != "{":
        doc = stream.value()
        stream.finish()
        if skip is not None and not _is_object(doc):
            skip(f"{path}: not a Kubernetes object (no kind), skipped")
            return
        yield from _document_objects(path, 1, doc)
        return
    stream.take("{", "'{'")
    head: dict[str, Any] = {}
    streamed = False
    if stream.peek() == "}":
        stream.take("}", "'}'")
    else:
        while True:
            key = stream.key()
            stream.take(":", "':'")
            if key == "items" and stream.peek() == "[" and str(head.get("kind", "List")).endswith("List"):
                stream.take("[", "'['")
                streamed = True
                j = 0
                if stream.peek() == "]":
                    stream.take("]", "']'")
                else:
                    while True:
                        yield _item(where, j, stream.value())
                        j += 1
                        if stream.take(",]", "',' or ']'") == "]":
                            break
            else:
                head[key] = stream.value()
            if stream.take(",}", "',' or '}'") == "}":
                break
    stream.finish()
    if streamed:
        kind = head.get("kind")
        if not (isinstance(kind, str) and kind.endswith("List")):
            raise SnapshotError(f"{where}: has an items array but is not a List (kind {kind!r})")
        return
    if skip is not None and not _is_object(head):
        skip(f"{path}: not a Kubernetes object (no kind), skipped")
        return
    yield from _document_objects(path, 1, head)


def _yaml_objects(reader: _Reader, skip: Callable[[str], None] | None) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """A YAML file's objects, a document at a time. With `skip`, documents before the first Kubernetes
    object are held back: a file with none is skipped, otherwise they are judged like the rest."""
    path = reader.path
    held: list[tuple[int, Any]] | None = [] if skip is not None else None
    try:
        for number, doc in enumerate(yaml.safe_load_all(reader), start=1):
            if held is not None:
                if not _is_object(doc):
                    held.append((number, doc))
                    continue
                for n, earlier in held:
                    yield from _document_objects(path, n, earlier)
                held = None
            yield from _document_objects(path, number, doc)
    except yaml.YAMLError as e:
        raise SnapshotError(f"{path}: not valid YAML: {e}") from e
    if held is not None and skip is not None:
        skip(f"{path}: not a Kubernetes object (no kind), skipped")


def _objects(
    path: Path, digest: Any, *, skip: Callable[[str], None] | None = None
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The objects of one file, read in chunks (its bytes go into `digest`). `skip`: in a directory, a
    file whose documents are not Kubernetes objects (no `kind`: a topoguard config file, a values file)
    is passed over with a note, not fatal."""
    with _Reader(path, digest) as reader:
        parse = _json_objects if path.suffix == ".json" else _yaml_objects
        yield from parse(reader, skip)


def read_objects(
    path: str | Path, *, note: Callable[[str], None] | None = None
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(where, object) for every Kubernetes object of a file or directory, as `load_snapshot` reads them (a
    directory's files that hold no object are skipped with a `note`). Raises SnapshotError naming file and
    document."""
    root = Path(path)
    directory = root.is_dir()
    for file in _files(root):
        for where, obj in _objects(file, hashlib.sha256(), skip=(note or _note) if directory else None):
            if "kind" not in obj:
                raise SnapshotError(f"{where}: object has no kind")
            yield where, obj


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
        if not found:
            raise SnapshotError(f"{path}: directory holds no .yaml, .yml or .json files")
        return found
    if path.exists():
        return [path]
    raise SnapshotError(f"{path}: no such file or directory")


def build_snapshot(
    objects: Iterable[Mapping[str, Any]],
    *,
    revision: str = "0",
    gpu_resources: tuple[str, ...] = projections.DEFAULT_GPU_RESOURCES,
    missing_kinds: tuple[str, ...] = (),
    cilium_config: str = DEFAULT_CILIUM_CONFIG,
    collective_ports: PortRange = EPHEMERAL_PORTS,
) -> Snapshot:
    """Project raw objects into a Snapshot; kinds other than KNOWN_KINDS are ignored. Every pod is kept
    (bound or pending); `gpu_resources` (settings `gpuResources`) is what the jobs' audit shapes count as GPUs,
    `collective_ports` (settings `collectivePorts`) the ports their collectives use.

    `cilium_config` (settings `ciliumConfig`, `namespace/name`; "" = not read) names the ConfigMap kept as
    the agent's settings; the DaemonSet `cilium` in its namespace gives the agent image.
    """
    return Snapshot(**_project(objects, gpu_resources, cilium_config, collective_ports), revision=revision,
                    missing_kinds=missing_kinds)


def _project(
    objects: Iterable[Mapping[str, Any]], gpu_resources: tuple[str, ...], cilium_config: str,
    collective_ports: PortRange,
) -> dict[str, Any]:
    """The Snapshot fields projected from `objects`, each object projected as it comes and then dropped."""
    nodes, pods, policies, jobs, slices, claims, domains = [], [], [], [], [], [], []
    namespaces, groups, runtimes, classes, templates = {}, {}, {}, {}, {}
    config_map: ConfigMapInfo | None = None
    image = ""
    where = cilium_config.split("/", 1) if cilium_config else None
    for obj in objects:
        kind = obj.get("kind")
        if where is not None and kind in ("ConfigMap", "DaemonSet") and _named(obj, where[0]):
            if kind == "ConfigMap" and _named(obj, where[0], where[1]):
                config_map = projections.project_config_map(obj)
            elif kind == "DaemonSet" and _named(obj, where[0], CILIUM_AGENT_DAEMONSET):
                image = projections.project_agent_image(obj)
        elif kind == "Node":
            nodes.append(projections.project_node(obj))
        elif kind == "Namespace":
            ns = projections.project_namespace(obj)
            namespaces[ns.name] = ns
        elif kind == "Pod":
            pods.append(projections.project_pod(obj))
        elif kind in projections.POLICY_KINDS:
            policies.append(projections.project_policy(obj))
        elif kind == "CiliumCIDRGroup":
            group = projections.project_cidr_group(obj)
            groups[group.name] = group
        elif kind in projections.RUNTIME_KINDS:
            runtime = projections.project_training_runtime(obj)
            runtimes[(runtime.kind, runtime.namespace, runtime.name)] = runtime
        elif kind in projections.JOB_KINDS and (
            job := projections.project_job(obj, gpu_resources=gpu_resources, collective_ports=collective_ports)
        ) is not None:
            jobs.append(job)
        elif kind == "DeviceClass":
            device_class = projections.project_device_class(obj)
            classes[device_class.name] = device_class
        elif kind == "ResourceSlice":
            slices.append(projections.project_resource_slice(obj))
        elif kind == "ResourceClaim":
            claims.append(projections.project_resource_claim(obj))
        elif kind == "ResourceClaimTemplate":
            template = projections.project_claim_template(obj)
            templates[(template.namespace, template.name)] = template
        elif kind == "ComputeDomain":
            domains.append(projections.project_compute_domain(obj))
    return {
        "nodes": tuple(nodes),
        "namespaces": MappingProxyType(namespaces),
        "pods": tuple(pods),
        "policies": tuple(policies),
        "cidr_groups": MappingProxyType(groups),
        "training_runtimes": MappingProxyType(runtimes),
        "jobs": tuple(jobs),
        "cilium_config": config_map.data if config_map else None,
        "cilium_config_labels": config_map.labels if config_map else MappingProxyType({}),
        "cilium_image": image,
        "device_classes": MappingProxyType(classes),
        "resource_slices": tuple(slices),
        "resource_claims": tuple(claims),
        "claim_templates": MappingProxyType(templates),
        "compute_domains": tuple(domains),
    }


def _named(obj: Mapping[str, Any], namespace: str, name: str | None = None) -> bool:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or meta.get("namespace") != namespace:
        return False
    return name is None or meta.get("name") == name


def _is_object(doc: Any) -> bool:
    return isinstance(doc, Mapping) and isinstance(doc.get("kind"), str) and bool(doc["kind"])


def _note(text: str) -> None:
    print(f"topoguard: note: {text}", file=sys.stderr)


def load_snapshot(
    path: str | Path,
    *,
    gpu_resources: tuple[str, ...] = projections.DEFAULT_GPU_RESOURCES,
    note: Callable[[str], None] = _note,
    cilium_config: str = DEFAULT_CILIUM_CONFIG,
    collective_ports: PortRange = EPHEMERAL_PORTS,
) -> Snapshot:
    """Read a snapshot from a file or directory. Raises SnapshotError naming file and document.

    In a directory, files that hold no Kubernetes object are skipped, each with a `note` (stderr by
    default). A snapshot without Nodes says so (`missing_kinds`): no zone can be judged without them.
    `cilium_config`, `collective_ports`: as for `build_snapshot`.
    """
    digest = hashlib.sha256()
    root = Path(path)
    directory = root.is_dir()

    def objects() -> Iterator[Mapping[str, Any]]:
        for file in _files(root):
            for where, obj in _objects(file, digest, skip=note if directory else None):
                if "kind" not in obj:
                    raise SnapshotError(f"{where}: object has no kind")
                yield obj

    fields = _project(objects(), gpu_resources, cilium_config, collective_ports)
    return Snapshot(**fields, revision=digest.hexdigest()[:16], missing_kinds=() if fields["nodes"] else ("Node",))
