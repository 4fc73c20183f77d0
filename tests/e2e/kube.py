"""Kubernetes-side helpers for the end-to-end suite: load manifests, install CRDs, create objects.

Requests go through the official `kubernetes` client's ApiClient (built from the suite's
kubeconfig: same TLS, token and serialisation as a user's tooling), but as raw JSON by REST path,
the way its DynamicClient does: the typed APIs would round-trip bodies through the client's
models, and what a test asserts on must be exactly what the apiserver stored and answered.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

RawObject = dict[str, Any]

CRD_ESTABLISHED_TIMEOUT_SECONDS = 60.0
REQUEST_TIMEOUT_SECONDS = 30.0
POLL_SECONDS = 0.2
NOT_READY_TAINT = "node.kubernetes.io/not-ready"

# Built-in kinds the suite writes: (API prefix, plural, namespaced).
BUILTIN_PATHS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "CustomResourceDefinition": ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions", False),
    "MutatingWebhookConfiguration": ("/apis/admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", False),
    "ValidatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", False),
    "DeviceClass": ("/apis/resource.k8s.io/v1", "deviceclasses", False),
    "ResourceSlice": ("/apis/resource.k8s.io/v1", "resourceslices", False),
    "ResourceClaimTemplate": ("/apis/resource.k8s.io/v1", "resourceclaimtemplates", True),
    "ResourceClaim": ("/apis/resource.k8s.io/v1", "resourceclaims", True),
}


def load_documents(path: Path) -> list[RawObject]:
    """Every non-empty YAML document in a file, or in the *.yaml files of a directory tree (sorted)."""
    files = sorted(path.rglob("*.yaml")) if path.is_dir() else [path]
    docs: list[RawObject] = []
    for file in files:
        docs.extend(d for d in yaml.safe_load_all(file.read_text()) if isinstance(d, dict))
    return docs


def api_error_body(error: ApiException) -> RawObject:
    """The metav1.Status the apiserver sent with an error (what kubectl prints), or {} if none."""
    try:
        body = json.loads(error.body or "{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


@dataclass(frozen=True)
class ResourceRef:
    """Where a custom kind lives in the API."""

    group: str
    version: str
    plural: str
    namespaced: bool

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}"


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
    kube = Cluster(api, {})
    refs: dict[str, ResourceRef] = {}
    created = []
    for crd in crds:
        kube.create(crd)
        kind, ref = storage_ref(crd)
        refs[kind] = ref
        created.append(crd)
    deadline = time.monotonic() + CRD_ESTABLISHED_TIMEOUT_SECONDS
    for crd in created:
        while not _established(kube.get(crd)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {crd['metadata']['name']} not Established after "
                                   f"{CRD_ESTABLISHED_TIMEOUT_SECONDS:.0f}s")
            time.sleep(POLL_SECONDS)
    for kind, ref in refs.items():
        # Established is set before the REST handler is wired: list until it answers.
        while True:
            try:
                kube.request("GET", f"{ref.prefix}/{ref.plural}")
                break
            except ApiException as e:
                if e.status != 404 or time.monotonic() > deadline:
                    raise RuntimeError(f"{kind} ({ref.plural}.{ref.group}) is not served: {e.reason}") from e
                time.sleep(POLL_SECONDS)
    return refs


def _established(crd: RawObject | None) -> bool:
    conditions = (crd or {}).get("status", {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


@dataclass
class Cluster:
    """The suite's handle on the apiserver: raw JSON requests plus the kind -> resource map of the CRDs."""

    api: client.ApiClient
    refs: dict[str, ResourceRef]

    def request(self, method: str, path: str, body: RawObject | None = None,
                query: Sequence[tuple[str, str]] = ()) -> tuple[RawObject, list[str]]:
        """One API call; returns (JSON body, Warning header texts). Non-2xx raises ApiException."""
        serialized = self.api.param_serialize(
            method, path, query_params=list(query), body=body,
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*serialized, _request_timeout=REQUEST_TIMEOUT_SECONDS)
        response.read()
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response)
        data: RawObject = json.loads(response.data or b"{}")
        return data, _warnings(response.getheaders())

    def collection_path(self, obj: RawObject) -> str:
        kind = obj.get("kind", "")
        if kind in BUILTIN_PATHS:
            prefix, plural, namespaced = BUILTIN_PATHS[kind]
        elif kind in self.refs:
            ref = self.refs[kind]
            prefix, plural, namespaced = ref.prefix, ref.plural, ref.namespaced
        else:
            raise KeyError(f"no CRD installed for kind {kind!r}")
        if namespaced:
            return f"{prefix}/namespaces/{obj['metadata']['namespace']}/{plural}"
        return f"{prefix}/{plural}"

    def object_path(self, obj: RawObject) -> str:
        return f"{self.collection_path(obj)}/{obj['metadata']['name']}"

    def ref(self, obj: RawObject) -> ResourceRef:
        return self.refs[obj["kind"]]

    def create(self, obj: RawObject, *, dry_run: bool = False) -> tuple[RawObject, list[str]]:
        """Create obj as given; return (the object as the apiserver answered, Warning headers).

        Nodes get the treatment a kubelet and the node lifecycle controller would give them, since
        neither runs here: `status` is written through the status subresource, and the
        `node.kubernetes.io/not-ready:NoSchedule` taint that the TaintNodesByCondition admission
        plugin puts on every new Node is removed again once the status says Ready.
        """
        query = [("dryRun", "All")] if dry_run else []
        created, warnings = self.request("POST", self.collection_path(obj), obj, query)
        if obj.get("kind") == "Node" and "status" in obj and not dry_run:
            created = self._settle_node(created, obj["status"])
        return created, warnings

    def _settle_node(self, node: RawObject, status: RawObject) -> RawObject:
        node["status"] = status
        node, _ = self.request("PUT", f"{self.object_path(node)}/status", node)
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
        taints = node.get("spec", {}).get("taints") or []
        kept = [t for t in taints if t.get("key") != NOT_READY_TAINT]
        if ready and len(kept) != len(taints):
            node["spec"]["taints"] = kept
            node, _ = self.request("PUT", self.object_path(node), node)
        return node

    def get(self, obj: RawObject) -> RawObject | None:
        """The stored object with obj's kind, namespace and name, or None when there is none."""
        try:
            return self.request("GET", self.object_path(obj))[0]
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def replace(self, obj: RawObject) -> RawObject:
        return self.request("PUT", self.object_path(obj), obj)[0]

    def delete(self, obj: RawObject) -> None:
        self.request("DELETE", self.object_path(obj))


def _warnings(headers: Any) -> list[str]:
    """The text of each `Warning: 299 - "text"` header (RFC 7234 warn-text, as client-go decodes it)."""
    raw: list[str] = list(headers.getlist("Warning")) if hasattr(headers, "getlist") else []
    # http.client decodes header bytes as ISO-8859-1; the apiserver writes the webhook's text as
    # UTF-8 bytes (client-go, hence kubectl, reads them as such), so undo the decoding.
    decoded = [value.encode("latin-1").decode("utf-8", errors="replace") for value in raw]
    return [text for value in decoded for text in _split_warning(value)]


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
