"""The webhook under test as a real process (`python -m app serve ...`), and how to talk to it.

The suite never imports the server: it runs the same entry point a Deployment runs, so what is
tested is the CLI contract, the TLS set-up and the HTTP answers the apiserver actually receives.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import ssl
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.controlplane import Process, client_context, free_port, https_ok, wait_until
from tests.e2e.kube import RawObject, ResourceRef

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVER_READY_TIMEOUT_SECONDS = 60.0


def clean_environment() -> dict[str, str]:
    """The suite's environment minus TOPOGUARD_* (settings overrides would make the runs differ)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPOGUARD_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class TopoguardServer:
    """One `topoguard serve` on 127.0.0.1 with a CA-signed certificate (or --self-signed)."""

    args: Sequence[str]
    log_path: Path
    ca_file: Path | None = None
    port: int = field(default_factory=free_port)
    host: str = "127.0.0.1"  # any loopback address (127.0.0.0/8): replicas behind one Service each get their own
    env: dict[str, str] = field(default_factory=dict)  # added to the clean environment (e.g. POD_NAME)
    process: Process = field(init=False)

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def start(self, *, wait_for: str = "/healthz") -> None:
        argv = [sys.executable, "-m", "app", "serve", *self.args, "--host", self.host, "--port", str(self.port)]
        self.process = Process("topoguard serve", argv, self.log_path, env={**clean_environment(), **self.env})
        self.process.start()
        try:
            wait_until(self.process, lambda: self.get_status(wait_for) == 200,
                       timeout=SERVER_READY_TIMEOUT_SECONDS, what=f"answering {wait_for}")
        except BaseException:
            self.process.stop()
            raise

    def stop(self) -> None:
        self.process.stop()

    def _context(self) -> ssl.SSLContext:
        return client_context(self.ca_file)

    def get_status(self, path: str) -> int | None:
        """The HTTP status of GET path, or None when nothing answers."""
        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=5, context=self._context()) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except (urllib.error.URLError, OSError):
            return None

    def get_text(self, path: str) -> str:
        """The body of GET path (e.g. /metrics), "" when nothing answers."""
        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=5, context=self._context()) as resp:
                return str(resp.read().decode())
        except (urllib.error.URLError, OSError):
            return ""

    def ok(self, path: str) -> bool:
        return https_ok(f"{self.url}{path}", ca_file=self.ca_file)

    def review(self, operation: str, obj: RawObject, ref: ResourceRef) -> RawObject:
        """POST an AdmissionReview for creating obj to /mutate or /validate; return its `response`."""
        body = json.dumps(admission_review(obj, ref)).encode()
        req = urllib.request.Request(f"{self.url}/{operation}", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30, context=self._context()) as resp:
            answer: RawObject = json.loads(resp.read())
        response: RawObject = answer["response"]
        return response


def admission_review(obj: RawObject, ref: ResourceRef) -> RawObject:
    """An admission.k8s.io/v1 AdmissionReview for a CREATE of obj, shaped as kube-apiserver sends it."""
    group_version = obj["apiVersion"]
    group, _, version = group_version.rpartition("/")
    meta = obj.get("metadata", {})
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": group, "version": version, "kind": obj["kind"]},
            "resource": {"group": ref.group, "version": ref.version, "resource": ref.plural},
            "requestKind": {"group": group, "version": version, "kind": obj["kind"]},
            "requestResource": {"group": ref.group, "version": ref.version, "resource": ref.plural},
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""),
            "operation": "CREATE",
            "userInfo": {"username": "e2e-admin", "groups": ["system:masters", "system:authenticated"]},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def response_patch(response: RawObject) -> list[RawObject]:
    """The JSON Patch carried by an AdmissionResponse (empty when there is none)."""
    if not response.get("patch"):
        return []
    ops: list[RawObject] = json.loads(base64.b64decode(response["patch"]))
    return ops


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")  # RFC 6901 section 4: ~1 first, then ~0


def apply_patch(obj: RawObject, ops: list[RawObject]) -> RawObject:
    """RFC 6902 add/replace/remove on a copy of obj (the ops an admission webhook sends)."""
    doc: Any = copy.deepcopy(obj)
    for op in ops:
        tokens = [_unescape(t) for t in op["path"].split("/")[1:]]
        parent: Any = doc
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        last = tokens[-1]
        kind = op["op"]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(index, copy.deepcopy(op["value"]))
            elif kind == "replace":
                parent[index] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[index]
            else:
                raise ValueError(f"unsupported JSON Patch op {kind!r}")
        elif kind in ("add", "replace"):
            parent[last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del parent[last]
        else:
            raise ValueError(f"unsupported JSON Patch op {kind!r}")
    result: RawObject = doc
    return result


def missing_from(expected: Any, stored: Any, path: str = "") -> list[str]:
    """Paths where `stored` lacks what `expected` holds (stored may add fields: CRD defaults).

    Lists must have the same length and match item by item: a toleration or a nodeSelectorTerm
    that was dropped is exactly what this is looking for.
    """
    if isinstance(expected, dict):
        if not isinstance(stored, dict):
            return [f"{path or '/'}: expected an object, stored {stored!r}"]
        out: list[str] = []
        for key, value in expected.items():
            if key not in stored:
                out.append(f"{path}/{key}: pruned (expected {json.dumps(value)[:120]})")
            else:
                out.extend(missing_from(value, stored[key], f"{path}/{key}"))
        return out
    if isinstance(expected, list):
        if not isinstance(stored, list) or len(stored) != len(expected):
            return [f"{path}: expected {json.dumps(expected)[:160]}, stored {json.dumps(stored)[:160]}"]
        return [p for i, (e, s) in enumerate(zip(expected, stored, strict=True))
                for p in missing_from(e, s, f"{path}/{i}")]
    if expected != stored:
        return [f"{path}: expected {expected!r}, stored {stored!r}"]
    return []
