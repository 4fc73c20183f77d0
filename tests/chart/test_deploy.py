"""deploy/: the plain manifests (rendered from the chart, installed by install.sh) and the samples."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from app.cache.files import load_snapshot
from tests.chart.rendering import ROOT, one

DEPLOY = ROOT / "deploy"
PLACEHOLDER = "${TOPOGUARD_CA_BUNDLE}"
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def objects_in(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def test_plain_manifests_carry_no_key_material_and_a_ca_placeholder() -> None:
    text = (DEPLOY / "topoguard.yaml").read_text()
    assert "PRIVATE KEY" not in text and "LS0tLS1CRUdJTi" not in text, "no certificate or key committed"
    objects = objects_in(text)
    assert not [o for o in objects if o["kind"] == "Secret"]
    for kind in WEBHOOK_KINDS:
        assert one(objects, kind)["webhooks"][0]["clientConfig"]["caBundle"] == PLACEHOLDER
    namespace = one(objects, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    placed = {(o["metadata"]["name"], o["metadata"].get("namespace", namespace["metadata"]["name"])) for o in objects}
    # Everything in topoguard's namespace but the Role (and its binding) on the Cilium agent's ConfigMap and
    # DaemonSet, which must live where those are.
    assert {ns for name, ns in placed if not name.endswith("-cilium-agent")} == {"topoguard-system"}
    assert {ns for name, ns in placed if name.endswith("-cilium-agent")} == {"kube-system"}


@pytest.fixture(scope="module")
def installed_dry_run() -> list[dict[str, Any]]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not found")
    # Module scope: one certificate generation serves every assertion below.
    proc = subprocess.run([str(DEPLOY / "install.sh"), "--dry-run"], capture_output=True, text=True, timeout=60,
                          check=True)
    return objects_in(proc.stdout)


def test_install_script_makes_a_certificate_the_webhooks_trust(installed_dry_run: list[dict[str, Any]]) -> None:
    secret = one(installed_dry_run, "Secret", "topoguard-tls")
    assert secret["type"] == "kubernetes.io/tls"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert set(data) == {"tls.crt", "tls.key", "ca.crt"}, "the CA key is thrown away"
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    leaf = x509.load_pem_x509_certificate(data["tls.crt"])
    leaf.verify_directly_issued_by(ca)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "topoguard.topoguard-system.svc" in sans
    for kind in WEBHOOK_KINDS:
        bundle = one(installed_dry_run, kind)["webhooks"][0]["clientConfig"]["caBundle"]
        assert x509.load_pem_x509_certificates(base64.b64decode(bundle)) == [ca]
    deployment = one(installed_dry_run, "Deployment")
    tls_volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert tls_volume["secret"]["secretName"] == secret["metadata"]["name"]


def test_samples_are_the_seed_lab_zone_policies_in_an_opted_in_namespace() -> None:
    snapshot = load_snapshot(DEPLOY / "samples")
    assert snapshot.namespaces["ml-demo"].labels["topoguard.io/enabled"] == "true"
    assert sorted(p.ref for p in snapshot.policies) == [
        "ml-demo/allow-intra-zone-a", "ml-demo/allow-intra-zone-b", "ml-demo/deny-cross-zone-gpu-traffic"]
    assert {p.kind for p in snapshot.policies} == {"CiliumNetworkPolicy"}


@pytest.mark.parametrize("path", sorted((DEPLOY / "samples").glob("pytorchjob-*.yaml")), ids=lambda p: Path(p).name)
def test_sample_jobs_are_reviewed_by_the_chart(path: Path) -> None:
    (job,) = objects_in(path.read_text())
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert job["metadata"]["namespace"] == "ml-demo"
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert set(specs) == {"Master", "Worker"}
    assert any("nvidia.com/gpu" in c.get("resources", {}).get("limits", {})
               for c in specs["Worker"]["template"]["spec"]["containers"])
