"""The decision path judges flows with the Cilium version the settings (or the cluster) name (issue 14).

From Cilium 1.19 the identity label filter drops `topology.kubernetes.io/*` pod labels, so a policy that
admits peers by the zone label admits nobody there; 1.15 keeps the label. A job pinned with the zone label as
its identity is therefore open on 1.15, blocked on 1.20, and `unknown` (never guessed) when no version is
known. `topoguard reach` already read `ciliumVersion`; the placement decision must read the same.
"""

from __future__ import annotations

import pytest

from app import engine, jobs
from app.config import Settings
from app.models.labels import DEFAULT_ZONE_LABEL
from tests.builders import GPU, make_cnp, make_namespace, make_node, make_pytorchjob, make_snapshot

NS = "ml"


def snapshot() -> object:
    zone_peers = make_cnp("zone-peers", {
        "endpointSelector": {},
        "ingress": [{"fromEndpoints": [{"matchLabels": {DEFAULT_ZONE_LABEL: "zone-a"}}]}],
    }, namespace=NS)
    return make_snapshot(
        [make_node("gpu-a", zone="zone-a", gpus=8)],
        namespaces=[make_namespace(NS, {"topoguard.io/enabled": "true", "kubernetes.io/metadata.name": NS})],
        policies=[zone_peers],
    )


@pytest.mark.parametrize(("version", "network"), [
    pytest.param("1.15.6", "allow", id="1.15 keeps the zone label in identities: open"),
    pytest.param("1.20.2", "deny", id="1.20 drops it: the peer selector admits nobody"),
    pytest.param("", "unknown", id="no version known: unknown, not a guess"),
])
def test_the_decision_uses_the_configured_cilium_version(version: str, network: str) -> None:
    settings = Settings(cilium_version=version, zone_identity_label=DEFAULT_ZONE_LABEL)
    snap = snapshot()
    group = jobs.parse_job(make_pytorchjob("train", namespace=NS), gpu_resources=(GPU,), namespace=NS)
    decision = engine.decide(group, snap, settings)  # type: ignore[arg-type]
    assert [z.network for z in decision.zones] == [network]
    assert decision.allowed is (network == "allow")
