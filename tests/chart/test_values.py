"""values.yaml, values.schema.json, validate.yaml and NOTES.txt: bad values fail, every value is documented."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from tests.chart import valuesdoc
from tests.chart.rendering import CHART, HelmError, Render, run_helm


@pytest.mark.parametrize(("sets", "error"), [
    pytest.param(["bogus=1"], "additional properties 'bogus' not allowed", id="unknown top-level key is rejected"),
    pytest.param(["config.zoneLable=x"], "additional properties 'zoneLable' not allowed",
                 id="misspelt config key is rejected"),
    pytest.param(["webhook.jobKinds.pods=true"], "additional properties 'pods' not allowed",
                 id="a non-training kind cannot be added"),
    pytest.param(["tls.helm.validity=3"], "additional properties 'validity' not allowed", id="unknown nested key"),
    pytest.param(["config.mode=spread"], "/config/mode", id="mode outside pin|colocate"),
    pytest.param(["config.enforcement=audit"], "/config/enforcement", id="enforcement outside deny|warn"),
    pytest.param(["config.policyEnforcement=sometimes"], "/config/policyEnforcement", id="bad policyEnforcement"),
    pytest.param(["config.zoneStrategy=random"], "/config/zoneStrategy", id="bad zoneStrategy"),
    pytest.param(["config.limits.podsPerJob=0"], "/config/limits/podsPerJob", id="a limit below 1"),
    pytest.param(["config.limits.podsPerPod=3"], "additional properties 'podsPerPod' not allowed",
                 id="a misspelt limit is rejected"),
    pytest.param(["server.decisionWorkers=0"], "/server/decisionWorkers", id="no decision workers"),
    pytest.param(["config.capacityPolicy=later"], "/config/capacityPolicy", id="bad capacityPolicy"),
    pytest.param(["config.spreadWithinZone=zone"], "/config/spreadWithinZone", id="bad spreadWithinZone"),
    pytest.param(["config.gpuResources=nvidia.com/gpu"], "/config/gpuResources", id="gpuResources must be a list"),
    pytest.param(["config.collectivePorts=every"], "/config/collectivePorts", id="collectivePorts must be a range"),
    pytest.param(["webhook.mutating.failurePolicy=Open"], "/webhook/mutating/failurePolicy", id="bad failurePolicy"),
    pytest.param(["webhook.validating.timeoutSeconds=31"], "/webhook/validating/timeoutSeconds",
                 id="timeout above the apiserver's 30 s"),
    pytest.param(["webhook.mutating.timeoutSeconds=0"], "/webhook/mutating/timeoutSeconds", id="timeout below 1 s"),
    pytest.param(["tls.mode=selfsigned"], "/tls/mode", id="unknown TLS mode"),
    pytest.param(["replicaCount=0"], "/replicaCount", id="zero replicas"),
    pytest.param(["webhook.excludeNamespaces[0]=Not_A_Namespace"], "/webhook/excludeNamespaces",
                 id="excluded namespace must be a DNS label"),
    pytest.param(["networkPolicy.apiserverEntities[0]=everyone"], "/networkPolicy/apiserverEntities",
                 id="unknown Cilium entity"),
])
def test_schema_rejects_bad_values(render: Render, sets: list[str], error: str) -> None:
    with pytest.raises(HelmError, match=re.escape(error)):
        render(sets=sets)


@pytest.mark.parametrize(("values", "error"), [
    pytest.param({"webhook": {"jobKinds": dict.fromkeys(
        ["pytorchjobs", "tfjobs", "mpijobs", "xgboostjobs", "paddlejobs", "jaxjobs", "jobsets", "trainjobs"], False)}},
        "every kind is turned off", id="all kinds off fails"),
    pytest.param({"tls": {"mode": "secret", "secret": {"caBundle": "Q0E="}}}, "needs tls.secret.name",
                 id="secret mode without a Secret fails"),
    pytest.param({"tls": {"mode": "secret", "secret": {"name": "x"}}}, "needs tls.secret.caBundle",
                 id="secret mode without a caBundle fails"),
    pytest.param({"tls": {"helm": {"certValidityDays": 30, "renewBeforeDays": 30}}}, "renewBeforeDays must be shorter",
                 id="renewal window as long as the validity fails"),
    pytest.param({"terminationGracePeriodSeconds": 10, "preStopSleepSeconds": 10}, "must exceed preStopSleepSeconds",
                 id="grace period not longer than the drain fails"),
    pytest.param({"replicaCount": 2, "podDisruptionBudget": {"minAvailable": 2}}, "minAvailable must be below",
                 id="PDB that can never be satisfied during a drain fails"),
    pytest.param({"resources": {"limits": {"memory": "256Mi"}}}, "is below 384Mi",
                 id="a memory limit that cannot hold the cache and the reviews in flight fails"),
    pytest.param({"resources": {"limits": {"memory": "1Gi"}}, "server": {"reviewMemoryBytes": 536870912}},
                 "is below 1152Mi", id="the floor follows server.reviewMemoryBytes"),
])
def test_impossible_combinations_fail_with_a_message(render: Render, values: dict[str, Any], error: str) -> None:
    with pytest.raises(HelmError, match=re.escape(error)):
        render(values=values)


@pytest.mark.parametrize(("version", "ok"), [
    pytest.param("1.29.9", False, id="1.29 is refused: no preStop sleep action"),
    pytest.param("1.30.0", True, id="1.30 is the oldest supported"),
    pytest.param("1.37.0", True, id="the newest schema kubernetes-validate knows"),
])
def test_kube_version_floor(render: Render, version: str, ok: bool) -> None:
    if ok:
        assert render(extra=["--kube-version", version])
    else:
        with pytest.raises(HelmError, match="kubeVersion"):
            render(extra=["--kube-version", version])


def value_paths(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of every key in values.yaml, descending only into objects the schema spells out.

    Fails when a key is missing from the schema (the schema would then reject the chart's defaults).
    """
    paths = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        assert key in schema.get("properties", {}), f"{path} missing from values.schema.json"
        paths.append(path)
        child = schema["properties"][key]
        if isinstance(value, dict) and "properties" in child:
            paths += value_paths(value, child, f"{path}.")
    return paths


def documented_paths(text: str) -> set[str]:
    """Dotted paths of keys in values.yaml preceded by a `# --` comment block (helm-docs style)."""
    paths: set[str] = set()
    stack: list[tuple[int, str]] = []
    in_doc = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            in_doc = True
            continue
        if stripped.startswith("#") or not stripped:
            continue
        match = re.match(r"^(\s*)([A-Za-z0-9_]+):", line)
        if not match:
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([*(k for _, k in stack), match.group(2)])
        stack.append((indent, match.group(2)))
        if in_doc:
            paths.add(path)
        in_doc = False
    return paths


def test_every_value_is_documented_and_in_the_schema() -> None:
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    schema = json.loads((CHART / "values.schema.json").read_text())
    documented = documented_paths(text)
    paths = value_paths(values, schema)
    # A group of documented keys (e.g. `webhook:`) needs no comment of its own; everything else does.
    groups = {p.rsplit(".", 1)[0] for p in paths if "." in p}
    assert [p for p in paths if p not in documented and p not in groups] == []


def test_readme_values_table_is_current() -> None:
    current = valuesdoc.README.read_text()
    assert valuesdoc.render_readme(current) == current, "run: .venv/bin/python -m tests.chart.valuesdoc"


def test_every_schema_object_rejects_unknown_keys() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    free_form = {"updateStrategy", "resources", "podSecurityContext", "securityContext", "affinity",
                 "objectSelector", "global"}

    def walk(node: dict[str, Any], path: str) -> list[str]:
        open_objects = []
        if node.get("type") == "object" and "properties" in node and node.get("additionalProperties") is not False:
            open_objects.append(path)
        for key, child in node.get("properties", {}).items():
            if key not in free_form:
                open_objects += walk(child, f"{path}.{key}")
        return open_objects

    assert walk(schema, "") == []


def install_notes(*sets: str) -> str:
    """NOTES.txt as `helm install --dry-run=client` prints it (no cluster, so no Cilium CRD either)."""
    args = ["install", "topoguard", str(CHART), "--namespace", "topoguard-system", "--dry-run=client"]
    for s in sets:
        args += ["--set", s]
    return run_helm(args).split("NOTES:", 1)[1]


ONE_REPLICA = "replicaCount=1 with failurePolicy Fail"
BOTH_IGNORE = "Both webhooks use failurePolicy Ignore"
WARN_MODE = "config.enforcement=warn"


@pytest.mark.parametrize(("sets", "present", "absent"), [
    pytest.param((), ["kubectl label namespace <your-namespace> topoguard.io/enabled=true",
                      "CiliumNetworkPolicy CRD (cilium.io/v2) is not installed"],
                 [ONE_REPLICA, BOTH_IGNORE, WARN_MODE], id="defaults: next step, only the missing-Cilium warning"),
    pytest.param(("replicaCount=1",), [ONE_REPLICA], [BOTH_IGNORE], id="one replica with Fail warns"),
    pytest.param(("replicaCount=1", "webhook.mutating.failurePolicy=Ignore", "webhook.validating.failurePolicy=Ignore"),
                 [BOTH_IGNORE], [ONE_REPLICA], id="both webhooks failing open warns about unchecked jobs"),
    pytest.param(("config.enforcement=warn",), [WARN_MODE], [ONE_REPLICA], id="warn enforcement warns"),
])
def test_notes_give_the_next_step_and_warn_about_risky_choices(
    sets: tuple[str, ...], present: list[str], absent: list[str],
) -> None:
    notes = install_notes(*sets)
    for text in present:
        assert text in notes
    for text in absent:
        assert text not in notes
