"""The webhook's Deployment, PDB, Service, ConfigMap and RBAC as rendered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config import Settings, load_settings
from app.models.network import PortRange
from tests.chart.rendering import RELEASE, HelmError, Render, one

READ_VERBS = {"get", "list", "watch"}


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(objects, "Deployment")["spec"]["template"]["spec"]
    return spec


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = pod_spec(objects)["containers"]
    assert len(containers) == 1
    c: dict[str, Any] = containers[0]
    return c


def test_default_runs_two_replicas_with_a_pdb(default_objects: list[dict[str, Any]]) -> None:
    deployment = one(default_objects, "Deployment")
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pdb = one(default_objects, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pod_labels.items() >= pdb["spec"]["selector"]["matchLabels"].items()


def test_single_replica_renders_no_pdb_that_would_block_drains(render: Render) -> None:
    objects = render(values={"replicaCount": 1})
    assert not [o for o in objects if o["kind"] == "PodDisruptionBudget"]


def test_pods_spread_over_zones_and_nodes(default_objects: list[dict[str, Any]]) -> None:
    deployment = one(default_objects, "Deployment")
    constraints = {c["topologyKey"]: c for c in pod_spec(default_objects)["topologySpreadConstraints"]}
    assert set(constraints) == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    for c in constraints.values():
        assert c["maxSkew"] == 1
        assert c["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
        assert c["matchLabelKeys"] == ["pod-template-hash"]


@pytest.mark.parametrize(("values", "want"), [
    pytest.param({}, None, id="no priority class by default"),
    pytest.param({"priorityClassName": "system-cluster-critical"}, "system-cluster-critical", id="priority class set"),
])
def test_priority_class_option(render: Render, values: dict[str, Any], want: str | None) -> None:
    assert pod_spec(render(values=values)).get("priorityClassName") == want


def test_restricted_pod_security(default_objects: list[dict[str, Any]]) -> None:
    spec = pod_spec(default_objects)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    ctx = container(default_objects)["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["runAsNonRoot"] is True
    assert ctx["privileged"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    assert not [v for v in spec["volumes"] if "hostPath" in v]


def test_probes_drain_and_resources(default_objects: list[dict[str, Any]]) -> None:
    c = container(default_objects)
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert c["lifecycle"]["preStop"] == {"sleep": {"seconds": 10}}
    assert pod_spec(default_objects)["terminationGracePeriodSeconds"] > 10
    for key in ("requests", "limits"):
        assert set(c["resources"][key]) == {"cpu", "memory"}


def test_server_args_point_at_the_mounted_config_and_certificate(default_objects: list[dict[str, Any]]) -> None:
    c = container(default_objects)
    assert "command" not in c, "the image's ENTRYPOINT is topoguard serve"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert "--config=" + mounts["config"] + "/config.yaml" in c["args"]
    assert "--tls-cert=" + mounts["tls"] + "/tls.crt" in c["args"]
    assert "--tls-key=" + mounts["tls"] + "/tls.key" in c["args"]
    assert "--port=8443" in c["args"]
    assert c["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]
    volumes = {v["name"]: v for v in pod_spec(default_objects)["volumes"]}
    assert volumes["config"]["configMap"]["name"] == f"{RELEASE}-config"


@pytest.mark.parametrize(("config", "want"), [
    pytest.param({}, {"zone_label": "topology.kubernetes.io/zone", "mode": "pin", "enforcement": "deny",
                      "gpu_resources": ("nvidia.com/gpu", "amd.com/gpu", "nvidia.com/mig-*"),
                      "request_deadline_seconds": 4.0,
                      "capacity_policy": "wait", "extended_resource_toleration": False,
                      "collective_ports": PortRange(32768, 60999)},
                 id="defaults load as the documented settings"),
    pytest.param({"config": {"zoneIdentityLabel": "zone", "mode": "colocate", "enforcement": "warn",
                             "policyEnforcement": "always", "spreadWithinZone": "hostname", "zoneStrategy": "binpack",
                             "gpuResources": ["nvidia.com/gpu"], "capacityPolicy": "refuse",
                             "extendedResourceToleration": True, "collectivePorts": "40000-40100"},
                  "webhook": {"mutating": {"timeoutSeconds": 1}}},
                 {"zone_identity_label": "zone", "mode": "colocate", "enforcement": "warn",
                  "policy_enforcement": "always",
                  "spread_within_zone": "hostname", "zone_strategy": "binpack", "gpu_resources": ("nvidia.com/gpu",),
                  "request_deadline_seconds": 0.5, "capacity_policy": "refuse", "extended_resource_toleration": True,
                  "collective_ports": PortRange(40000, 40100)},
                 id="every config key reaches topoguard's Settings"),
])
def test_rendered_config_loads_into_topoguard_settings(
    render: Render, tmp_path: Path, config: dict[str, Any], want: dict[str, Any],
) -> None:
    configmap = one(render(values=config), "ConfigMap", f"{RELEASE}-config")
    path = tmp_path / "config.yaml"
    path.write_text(configmap["data"]["config.yaml"])
    settings = load_settings(path, environ={})
    for field, value in want.items():
        assert getattr(settings, field) == value, field


def test_config_change_rolls_the_pods(render: Render, default_objects: list[dict[str, Any]]) -> None:
    def checksum(objects: list[dict[str, Any]]) -> str:
        value: str = one(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        return value
    assert checksum(render(values={"config": {"mode": "colocate"}})) != checksum(default_objects)


READ_ONLY = {
    ("", "nodes"): READ_VERBS, ("", "namespaces"): READ_VERBS, ("", "pods"): READ_VERBS,
    ("networking.k8s.io", "networkpolicies"): READ_VERBS,
    ("cilium.io", "ciliumnetworkpolicies"): READ_VERBS,
    ("cilium.io", "ciliumclusterwidenetworkpolicies"): READ_VERBS,
    ("cilium.io", "ciliumcidrgroups"): READ_VERBS,
    ("policy.networking.k8s.io", "clusternetworkpolicies"): READ_VERBS,
    ("trainer.kubeflow.org", "trainingruntimes"): READ_VERBS,
    ("trainer.kubeflow.org", "clustertrainingruntimes"): READ_VERBS,
    **{("kubeflow.org", r): READ_VERBS
       for r in ("pytorchjobs", "tfjobs", "mpijobs", "xgboostjobs", "paddlejobs", "jaxjobs")},
    ("jobset.x-k8s.io", "jobsets"): READ_VERBS,
    ("trainer.kubeflow.org", "trainjobs"): READ_VERBS,
    **{("resource.k8s.io", r): READ_VERBS
       for r in ("deviceclasses", "resourceslices", "resourceclaims", "resourceclaimtemplates")},
    ("resource.nvidia.com", "computedomains"): READ_VERBS,
}
AUDIT_EVENTS = {("events.k8s.io", "events"): {"create", "patch"}}
POLICY_REPORTS = {("wgpolicyk8s.io", "policyreports"): {"get", "list", "create", "update", "patch", "delete"}}


def _granted(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


@pytest.mark.parametrize("values, want", [
    pytest.param({"audit": {"enabled": False}}, READ_ONLY, id="read-only without the audit"),
    pytest.param({}, READ_ONLY | AUDIT_EVENTS | POLICY_REPORTS, id="the audit adds Events and PolicyReports"),
    pytest.param({"audit": {"policyReports": {"enabled": False}}}, READ_ONLY | AUDIT_EVENTS,
                 id="PolicyReports off: Events only"),
    pytest.param({"audit": {"enabled": False}, "rbac": {"events": True}},
                 READ_ONLY | {("", "events"): {"create"}, ("events.k8s.io", "events"): {"create"}},
                 id="rbac.events adds create on events only"),
])
def test_rbac_grants_reads_and_only_the_audits_writes(
        render: Render, values: dict[str, Any], want: dict[tuple[str, str], set[str]]) -> None:
    objects = render(values=values)
    role = one(objects, "ClusterRole")
    assert _granted(role) == want
    binding = one(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod_spec(objects)["serviceAccountName"],
                                    "namespace": "topoguard-system"}]
    # Besides the Cilium agent's (test_the_cilium_agent_objects_are_granted_by_name below).
    roles = [o for o in objects if o["kind"] in ("Role", "RoleBinding") and not _cilium_agent(o)]
    if values.get("audit", {}).get("enabled", True) is False:
        assert not roles


def _cilium_agent(obj: dict[str, Any]) -> bool:
    return bool(obj["metadata"]["name"].endswith("-cilium-agent"))


def test_the_cilium_agent_objects_are_granted_by_name(render: Render) -> None:
    objects = render(values={})
    # The Cilium agent's ConfigMap and DaemonSet: a Role in their namespace, on those two objects only.
    (agent_role,) = [o for o in objects if o["kind"] == "Role" and _cilium_agent(o)]
    assert agent_role["metadata"]["namespace"] == "kube-system"
    verbs = sorted(READ_VERBS)
    assert agent_role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cilium-config"], "verbs": verbs},
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": ["cilium"], "verbs": verbs},
    ]
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding" and _cilium_agent(o)]
    assert binding["roleRef"]["name"] == agent_role["metadata"]["name"]
    assert binding["subjects"][0]["namespace"] == "topoguard-system"


def test_the_audit_lease_is_granted_in_the_release_namespace_only(render: Render) -> None:
    objects = render(values={})
    (role,) = [o for o in objects if o["kind"] == "Role" and not _cilium_agent(o)]
    assert role["metadata"]["namespace"] == "topoguard-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["topoguard-audit"],
         "verbs": ["get", "update"]},
    ]
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding" and not _cilium_agent(o)]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"][0]["name"] == pod_spec(objects)["serviceAccountName"]


def test_audit_values_reach_the_config(render: Render) -> None:
    objects = render(values={"audit": {"intervalSeconds": 12, "scope": "all", "policyReports": {"enabled": False}}})
    config = yaml.safe_load(next(o for o in objects if o["kind"] == "ConfigMap"
                                 and o["metadata"]["name"].endswith("-config"))["data"]["config.yaml"])
    settings = Settings.model_validate(config)
    assert (settings.audit.enabled, settings.audit.interval_seconds, settings.audit.scope,
            settings.audit.policy_reports) == (True, 12, "all", False)
    assert settings.audit.lease_name == "topoguard-audit"  # the name the Role grants


def test_no_cilium_config_means_no_agent_role(render: Render) -> None:
    objects = render(values={"config": {"ciliumConfig": ""}})
    assert not [o for o in objects if o["kind"] in ("Role", "RoleBinding") and _cilium_agent(o)]


def test_service_targets_the_webhook_port(default_objects: list[dict[str, Any]]) -> None:
    service = one(default_objects, "Service")
    assert service["spec"]["selector"] == one(default_objects, "Deployment")["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP",
                                         "appProtocol": "https"}]


def test_names_stay_within_63_characters(render: Render) -> None:
    objects = render(sets=["fullnameOverride=" + "x" * 63])
    for obj in objects:
        name = obj["metadata"]["name"]
        limit = 253 if obj["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                                       "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
                                       "ConfigMap", "Secret") else 63
        assert len(name) <= limit, f"{obj['kind']} {name}"
    with pytest.raises(HelmError, match="fullnameOverride"):
        render(sets=["fullnameOverride=" + "x" * 64])


def test_ci_values_files_render(render: Render) -> None:
    ci = sorted((Path(__file__).resolve().parents[2] / "charts" / "topoguard" / "ci").glob("*.yaml"))
    assert ci, "charts/topoguard/ci/ has value combinations"
    for path in ci:
        assert render(values_files=[path]), path.name
        yaml.safe_load(path.read_text())
