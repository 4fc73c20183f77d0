"""Helpers for the audit controller's tests: a fake clock, hand-built JobAudits, an Api on the fake apiserver."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from app.controller.api import RestApi
from app.engine.audit import AuditFinding, JobAudit
from tests.integration.fakeapi import FakeApiServer

SPLIT = ("Worker pods are in zone-a, Master in zone-b: the job is split across 2 zones")
BLOCKED = ("Worker pods in zone-a cannot reach Master in zone-b on TCP 23456: "
           "CiliumNetworkPolicy ml-demo/allow-intra-zone-b")


@dataclass
class FakeClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def job(name: str, *findings: tuple[str, str], namespace: str = "ml-demo", kind: str = "PyTorchJob",
        zones: dict[str, int] | None = None) -> JobAudit:
    return JobAudit(
        kind=kind, namespace=namespace, name=name, uid=f"uid-{namespace}-{name}",
        zones=zones if zones is not None else {"zone-a": 2},
        pending=0,
        findings=tuple(AuditFinding(type=t, message=m, policies=()) for t, m in findings),
    )


@contextmanager
def fake_api(*, policy_reports: bool = False) -> Iterator[tuple[FakeApiServer, RestApi]]:
    """A started fake apiserver and a RestApi (the real client) pointed at it."""
    import tempfile
    from pathlib import Path

    from app.controller.api import build_api

    with FakeApiServer() as server, tempfile.TemporaryDirectory() as tmp:
        if policy_reports:
            server.install_policy_reports()
        api = build_api(str(server.write_kubeconfig(Path(tmp) / "kubeconfig")))
        try:
            yield server, api
        finally:
            api.close()
