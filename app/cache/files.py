"""The file snapshot (`--cluster PATH`): YAML/JSON, one object, multi-document, `kind: List`, or a
directory of such files. Unknown kinds are ignored; unparsable input is an error naming the file and
the document. Training jobs of the supported kinds are kept too (the reservation ledger reads them).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from app.cache import projections
from app.config import CILIUM_AGENT_DAEMONSET, DEFAULT_CILIUM_CONFIG
from app.models.cluster import ConfigMapInfo, Snapshot

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


def _objects(path: Path, *, skip: Callable[[str], None] | None = None) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The objects of one file. `skip`: in a directory, a file whose documents are not Kubernetes objects
    (no `kind`: a topoguard config file, a values file) is passed over with a note, not fatal."""
    documents = list(_documents(path))
    if skip is not None and not any(_is_object(doc) for _, doc in documents):
        skip(f"{path}: not a Kubernetes object (no kind), skipped")
        return
    for number, doc in documents:
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
    missing_kinds: tuple[str, ...] = (),
    cilium_config: str = DEFAULT_CILIUM_CONFIG,
) -> Snapshot:
    """Project raw objects into a Snapshot; kinds other than KNOWN_KINDS are ignored. Every pod is kept
    (bound or pending); `gpu_resources` (settings `gpuResources`) is what the jobs' audit shapes count as GPUs.

    `cilium_config` (settings `ciliumConfig`, `namespace/name`; "" = not read) names the ConfigMap kept as
    the agent's settings; the DaemonSet `cilium` in its namespace gives the agent image.
    """
    nodes, pods, policies, jobs = [], [], [], []
    namespaces, groups, runtimes = {}, {}, {}
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
        missing_kinds=missing_kinds,
        cilium_config=config_map.data if config_map else None,
        cilium_config_labels=config_map.labels if config_map else MappingProxyType({}),
        cilium_image=image,
    )


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
) -> Snapshot:
    """Read a snapshot from a file or directory. Raises SnapshotError naming file and document.

    In a directory, files that hold no Kubernetes object are skipped, each with a `note` (stderr by
    default). A snapshot without Nodes says so (`missing_kinds`): no zone can be judged without them.
    `cilium_config`: which ConfigMap holds the Cilium agent's settings (see `build_snapshot`).
    """
    objects: list[Mapping[str, Any]] = []
    digest = hashlib.sha256()
    root = Path(path)
    directory = root.is_dir()
    for file in _files(root):
        for where, obj in _objects(file, skip=note if directory else None):
            if "kind" not in obj:
                raise SnapshotError(f"{where}: object has no kind")
            objects.append(obj)
        digest.update(file.read_bytes())
    no_nodes = not any(obj.get("kind") == "Node" for obj in objects)
    return build_snapshot(objects, revision=digest.hexdigest()[:16], gpu_resources=gpu_resources,
                          missing_kinds=("Node",) if no_nodes else (), cilium_config=cilium_config)
