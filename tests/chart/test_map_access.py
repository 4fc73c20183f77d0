"""config.mapAccess in the chart: off by default; `authorized` adds the delegation RBAC and a reader role;
`loopback` keeps the map port out of the Service."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.config import load_settings
from tests.chart.rendering import RELEASE, HelmError, Render, one


def settings_of(objects: list[dict[str, Any]], tmp_path: Path) -> Any:
    path = tmp_path / "config.yaml"
    path.write_text(one(objects, "ConfigMap", f"{RELEASE}-config")["data"]["config.yaml"])
    return load_settings(path, environ={})


def test_the_map_is_off_by_default(default_objects: list[dict[str, Any]], tmp_path: Path) -> None:
    assert settings_of(default_objects, tmp_path).map_access == "off"
    assert [o["metadata"]["name"] for o in default_objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")] \
        == [RELEASE, RELEASE]


def test_authorized_binds_auth_delegator_and_offers_a_reader_role(render: Render, tmp_path: Path) -> None:
    objects = render(values={"config": {"mapAccess": "authorized"}})
    assert settings_of(objects, tmp_path).map_access == "authorized"
    binding = one(objects, "ClusterRoleBinding", f"{RELEASE}-auth-delegator")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "system:auth-delegator"}
    account = one(objects, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["name"],
                                    "namespace": account["namespace"]}]
    reader = one(objects, "ClusterRole", f"{RELEASE}-map-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/map"], "verbs": ["get", "post"]}]


def test_loopback_keeps_the_map_port_out_of_the_service(render: Render, tmp_path: Path) -> None:
    objects = render(values={"config": {"mapAccess": "loopback", "mapPort": 9555}})
    settings = settings_of(objects, tmp_path)
    assert (settings.map_access, settings.map_port) == ("loopback", 9555)
    ports = [p for s in objects if s["kind"] == "Service" for p in s["spec"]["ports"]]
    assert ports and all(9555 not in (p.get("port"), p.get("targetPort")) for p in ports)
    assert not [o for o in objects if o["metadata"]["name"].endswith(("-map-reader", "-auth-delegator"))]


@pytest.mark.parametrize("sets", [["config.mapAccess=public"], ["config.mapPort=0"]])
def test_schema_rejects_bad_map_values(render: Render, sets: list[str]) -> None:
    with pytest.raises(HelmError, match="map"):
        render(sets=sets)
