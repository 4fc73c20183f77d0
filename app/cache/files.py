"""The file snapshot (`--cluster PATH`): YAML/JSON, one object, multi-document, `kind: List`, or a
directory of such files. Unknown kinds are ignored; unparsable input is an error naming the file and
the document. Training jobs of the supported kinds are kept too (the reservation ledger reads them).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from app.cache import projections
from app.models.cluster import Snapshot

SUFFIXES = (".yaml", ".yml", ".json")


class SnapshotError(ValueError):
    """A snapshot file or document cannot be used."""


def _documents(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise SnapshotError(f"{path}: cannot read: {e}") from e
    try:
        if path.suffix == ".json":
            yield 1, json.loads(text)
            return
        yield from enumerate(yaml.safe_load_all(text), start=1)
    except (yaml.YAMLError, ValueError) as e:
        raise SnapshotError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {e}") from e


def _objects(path: Path) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for number, doc in _documents(path):
        where = f"{path} document {number}"
        if doc is None:
            continue
        if not isinstance(doc, Mapping):
            raise SnapshotError(f"{where}: expected a Kubernetes object, got {type(doc).__name__}")
        if str(doc.get("kind", "")).endswith("List") and isinstance(doc.get("items"), list):
            for j, item in enumerate(doc["items"]):
                if not isinstance(item, Mapping):
                    raise SnapshotError(f"{where} item {j}: expected a Kubernetes object")
                yield f"{where} item {j}", item
        else:
            yield where, doc


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
    objects: list[Mapping[str, Any]],
    *,
    revision: str = "0",
    gpu_resources: tuple[str, ...] = projections.DEFAULT_GPU_RESOURCES,
) -> Snapshot:
    """Project raw objects into a Snapshot; kinds other than KNOWN_KINDS are ignored. Every pod is kept
    (bound or pending); `gpu_resources` (settings `gpuResources`) is what the jobs' audit shapes count as GPUs."""
    nodes, pods, policies, jobs = [], [], [], []
    namespaces, groups, runtimes = {}, {}, {}
    for obj in objects:
        kind = obj.get("kind")
        if kind == "Node":
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
            job := projections.project_job(obj, gpu_resources=gpu_resources)
        ) is not None:
            jobs.append(job)
    return Snapshot(
        nodes=tuple(nodes),
        namespaces=MappingProxyType(namespaces),
        pods=tuple(pods),
        policies=tuple(policies),
        cidr_groups=MappingProxyType(groups),
        revision=revision,
        training_runtimes=MappingProxyType(runtimes),
        jobs=tuple(jobs),
    )


def load_snapshot(
    path: str | Path, *, gpu_resources: tuple[str, ...] = projections.DEFAULT_GPU_RESOURCES
) -> Snapshot:
    """Read a snapshot from a file or directory. Raises SnapshotError naming file and document."""
    objects: list[Mapping[str, Any]] = []
    digest = hashlib.sha256()
    for file in _files(Path(path)):
        for where, obj in _objects(file):
            if "kind" not in obj:
                raise SnapshotError(f"{where}: object has no kind")
            objects.append(obj)
        digest.update(file.read_bytes())
    return build_snapshot(objects, revision=digest.hexdigest()[:16], gpu_resources=gpu_resources)
