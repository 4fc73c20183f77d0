"""Kubernetes-side helpers for the end-to-end suite: load manifests, install CRDs, create objects.

Everything goes through the official `kubernetes` client built from the suite's kubeconfig, as a
user's tooling would. Responses are read as raw JSON (`_preload_content=False`) so what a test
asserts on is exactly what the apiserver stored, not the client's typed model of it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

RawObject = dict[str, Any]

CRD_ESTABLISHED_TIMEOUT_SECONDS = 60.0
REQUEST_TIMEOUT_SECONDS = 30.0
POLL_SECONDS = 0.2


def load_documents(path: Path) -> list[RawObject]:
    """Every non-empty YAML document in a file, or in the *.yaml files of a directory tree (sorted)."""
    files = sorted(path.rglob("*.yaml")) if path.is_dir() else [path]
    docs: list[RawObject] = []
    for file in files:
        docs.extend(d for d in yaml.safe_load_all(file.read_text()) if isinstance(d, dict))
    return docs


def read_json(response: Any) -> RawObject:
    """The body of a `_preload_content=False` response."""
    body: RawObject = json.loads(response.data)
    return body


def api_error_body(error: ApiException) -> RawObject:
    """The metav1.Status the apiserver sent with an error (what kubectl prints), or {} if none."""
    try:
        body = json.loads(error.body or "{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


@dataclass(frozen=True)
class ResourceRef:
    """Where a kind lives in the API: enough to call CustomObjectsApi."""

    group: str
    version: str
    plural: str
    namespaced: bool


def crds_by_name(*directories: Path | None) -> dict[str, RawObject]:
    """CustomResourceDefinitions from the directories in order; a later one replaces an earlier one
    of the same name (the suite's own CRDs first, the upstream ones over them)."""
    found: dict[str, RawObject] = {}
    for directory in directories:
        if directory is None:
            continue
        for doc in load_documents(directory):
            if doc.get("kind") == "CustomResourceDefinition":
                found[doc["metadata"]["name"]] = doc
    return found


def storage_ref(crd: RawObject) -> tuple[str, ResourceRef]:
    """(kind, where) for the CRD's storage version."""
    spec = crd["spec"]
    version = next(v["name"] for v in spec["versions"] if v.get("storage"))
    return spec["names"]["kind"], ResourceRef(spec["group"], version, spec["names"]["plural"],
                                              spec.get("scope", "Namespaced") == "Namespaced")


def install_crds(api: client.ApiClient, crds: Iterable[RawObject]) -> dict[str, ResourceRef]:
    """Create the CRDs, wait until each is Established AND actually serves its resource."""
    ext = client.ApiextensionsV1Api(api)
    refs: dict[str, ResourceRef] = {}
    names = []
    for crd in crds:
        ext.create_custom_resource_definition(body=crd, _preload_content=False,
                                              _request_timeout=REQUEST_TIMEOUT_SECONDS)
        kind, ref = storage_ref(crd)
        refs[kind] = ref
        names.append(crd["metadata"]["name"])
    deadline = time.monotonic() + CRD_ESTABLISHED_TIMEOUT_SECONDS
    for name in names:
        while not _established(ext, name):
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {CRD_ESTABLISHED_TIMEOUT_SECONDS:.0f}s")
            time.sleep(POLL_SECONDS)
    custom = client.CustomObjectsApi(api)
    for kind, ref in refs.items():
        # Established is set before the REST handler is wired: list until it answers.
        while True:
            try:
                custom.list_cluster_custom_object(ref.group, ref.version, ref.plural, _preload_content=False)
                break
            except ApiException as e:
                if e.status != 404 or time.monotonic() > deadline:
                    raise RuntimeError(f"{kind} ({ref.plural}.{ref.group}) is not served: {e.reason}") from e
                time.sleep(POLL_SECONDS)
    return refs


def _established(ext: client.ApiextensionsV1Api, name: str) -> bool:
    crd = read_json(ext.read_custom_resource_definition(name, _preload_content=False))
    conditions = crd.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


@dataclass
class Cluster:
    """The suite's handle on the apiserver: typed APIs plus the kind -> resource map of the CRDs."""

    api: client.ApiClient
    refs: dict[str, ResourceRef]

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def ref(self, obj: RawObject) -> ResourceRef:
        kind = obj.get("kind", "")
        if kind not in self.refs:
            raise KeyError(f"no CRD installed for kind {kind!r}")
        return self.refs[kind]

    def create(self, obj: RawObject, *, dry_run: bool = False) -> tuple[RawObject, list[str]]:
        """Create a Namespace, Node or custom object as given; return (stored object, Warning headers).

        A Node's `status` is written afterwards through the status subresource, as a kubelet would.
        """
        kind = obj.get("kind")
        dry = {"dry_run": "All"} if dry_run else {}
        opts: dict[str, Any] = {"_preload_content": False, "_request_timeout": REQUEST_TIMEOUT_SECONDS, **dry}
        if kind == "Namespace":
            return read_json(self.core.create_namespace(body=obj, **opts)), []
        if kind == "Node":
            created = read_json(self.core.create_node(body=obj, **opts))
            if "status" in obj and not dry_run:
                created["status"] = obj["status"]
                created = read_json(self.core.replace_node_status(created["metadata"]["name"], created,
                                                                  **opts))
            return created, []
        ref = self.ref(obj)
        if ref.namespaced:
            response, _, headers = self.custom.create_namespaced_custom_object_with_http_info(
                ref.group, ref.version, obj["metadata"]["namespace"], ref.plural, obj, **opts)
        else:
            response, _, headers = self.custom.create_cluster_custom_object_with_http_info(
                ref.group, ref.version, ref.plural, obj, **opts)
        return read_json(response), _warnings(headers)

    def get(self, obj: RawObject) -> RawObject | None:
        """The stored object with obj's kind, namespace and name, or None when there is none."""
        ref = self.ref(obj)
        meta = obj["metadata"]
        try:
            if ref.namespaced:
                response = self.custom.get_namespaced_custom_object(
                    ref.group, ref.version, meta["namespace"], ref.plural, meta["name"], _preload_content=False)
            else:
                response = self.custom.get_cluster_custom_object(
                    ref.group, ref.version, ref.plural, meta["name"], _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return read_json(response)


def _warnings(headers: Any) -> list[str]:
    """The text of each `Warning: 299 - "text"` header (RFC 7234 warn-text, as client-go decodes it)."""
    raw: list[str] = list(headers.getlist("Warning")) if hasattr(headers, "getlist") else []
    return [text for value in raw for text in _split_warning(value)]


def _split_warning(value: str) -> Iterator[str]:
    # One header may hold several comma-joined warn-values; each is `code agent "quoted text"`.
    i = 0
    while i < len(value):
        start = value.find('"', i)
        if start < 0:
            return
        j, text = start + 1, []
        while j < len(value) and value[j] != '"':
            if value[j] == "\\" and j + 1 < len(value):
                j += 1
            text.append(value[j])
            j += 1
        yield "".join(text)
        i = j + 1
