"""The webhook configurations: what they match, where, how they fail, and which CA they trust."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cryptography.x509.oid import ExtendedKeyUsageOID

from tests.chart.rendering import NAMESPACE, RELEASE, Render, one

TRAINING_RESOURCES = {
    "kubeflow.org": {"pytorchjobs", "tfjobs", "mpijobs", "xgboostjobs", "paddlejobs", "jaxjobs"},
    "jobset.x-k8s.io": {"jobsets"},
    "trainer.kubeflow.org": {"trainjobs"},
}
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def webhook(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    config = one(objects, kind)
    assert len(config["webhooks"]) == 1
    hook: dict[str, Any] = config["webhooks"][0]
    return hook


def matched(hook: dict[str, Any]) -> dict[str, set[str]]:
    """apiGroup → resources the webhook's rules match."""
    out: dict[str, set[str]] = {}
    for rule in hook["rules"]:
        for group in rule["apiGroups"]:
            out.setdefault(group, set()).update(rule["resources"])
    return out


@pytest.mark.parametrize("kind", WEBHOOK_KINDS)
def test_rules_match_only_the_training_job_resources(default_objects: list[dict[str, Any]], kind: str) -> None:
    hook = webhook(default_objects, kind)
    assert matched(hook) == TRAINING_RESOURCES
    for rule in hook["rules"]:
        assert rule["scope"] == "Namespaced"
        assert rule["apiVersions"] == ["*"]
        assert not any("*" in r or "/" in r for r in rule["resources"]), "no wildcards, no subresources"


@pytest.mark.parametrize(("kind", "operations"), [
    pytest.param("MutatingWebhookConfiguration", ["CREATE"], id="mutating sees CREATE only"),
    pytest.param("ValidatingWebhookConfiguration", ["CREATE", "UPDATE"], id="validating sees CREATE and UPDATE"),
])
def test_operations(default_objects: list[dict[str, Any]], kind: str, operations: list[str]) -> None:
    for rule in webhook(default_objects, kind)["rules"]:
        assert rule["operations"] == operations


@pytest.mark.parametrize(("off", "want"), [
    pytest.param(["tfjobs", "mpijobs"], {
        "kubeflow.org": {"pytorchjobs", "xgboostjobs", "paddlejobs", "jaxjobs"},
        "jobset.x-k8s.io": {"jobsets"}, "trainer.kubeflow.org": {"trainjobs"}}, id="turning kinds off drops them"),
    pytest.param(["pytorchjobs", "tfjobs", "mpijobs", "xgboostjobs", "paddlejobs", "jaxjobs"], {
        "jobset.x-k8s.io": {"jobsets"}, "trainer.kubeflow.org": {"trainjobs"}},
        id="a group with no kind left gets no rule"),
    pytest.param(["pytorchjobs", "tfjobs", "mpijobs", "xgboostjobs", "paddlejobs", "jaxjobs", "jobsets"],
                 {"trainer.kubeflow.org": {"trainjobs"}}, id="trainjobs alone"),
])
def test_job_kinds_can_be_turned_off(render: Render, off: list[str], want: dict[str, set[str]]) -> None:
    objects = render(values={"webhook": {"jobKinds": dict.fromkeys(off, False)}})
    for kind in WEBHOOK_KINDS:
        assert matched(webhook(objects, kind)) == want


@pytest.mark.parametrize(("namespace", "extra", "excluded"), [
    pytest.param(NAMESPACE, [], ["kube-system", NAMESPACE],
                 id="default excludes kube-system and the release namespace"),
    pytest.param("webhooks", [], ["kube-system", "webhooks"], id="another release namespace is excluded instead"),
    pytest.param("ops", ["monitoring", "kube-system"], ["kube-system", "ops", "monitoring"],
                 id="extra exclusions add to the fixed ones without duplicates"),
])
def test_namespace_selector_is_opt_in_and_never_matches_system_or_own_namespace(
    render: Render, namespace: str, extra: list[str], excluded: list[str],
) -> None:
    objects = render(namespace=namespace, values={"webhook": {"excludeNamespaces": extra}})
    for kind in WEBHOOK_KINDS:
        selector = webhook(objects, kind)["namespaceSelector"]
        assert selector == {"matchExpressions": [
            {"key": "topoguard.io/enabled", "operator": "In", "values": ["true"]},
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": excluded},
        ]}


@pytest.mark.parametrize("kind", WEBHOOK_KINDS)
def test_fixed_webhook_settings(default_objects: list[dict[str, Any]], kind: str) -> None:
    hook = webhook(default_objects, kind)
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["matchPolicy"] == "Equivalent"
    assert hook["clientConfig"]["service"] == {
        "name": RELEASE, "namespace": NAMESPACE, "port": 443,
        "path": "/mutate" if kind.startswith("Mutating") else "/validate",
    }
    if kind.startswith("Mutating"):
        assert hook["reinvocationPolicy"] == "IfNeeded"
    assert "objectSelector" not in hook


@pytest.mark.parametrize(("values", "want"), [
    pytest.param({}, {"mutating": ("Fail", 5), "validating": ("Fail", 5)}, id="defaults fail closed at 5 s"),
    pytest.param({"webhook": {"mutating": {"failurePolicy": "Ignore", "timeoutSeconds": 2},
                              "validating": {"failurePolicy": "Fail", "timeoutSeconds": 30}}},
                 {"mutating": ("Ignore", 2), "validating": ("Fail", 30)}, id="values set each webhook separately"),
])
def test_failure_policy_and_timeout_come_from_values(
    render: Render, values: dict[str, Any], want: dict[str, tuple[str, int]],
) -> None:
    objects = render(values=values)
    for kind, key in zip(WEBHOOK_KINDS, ("mutating", "validating"), strict=True):
        hook = webhook(objects, kind)
        assert (hook["failurePolicy"], hook["timeoutSeconds"]) == want[key]


def test_object_selector_is_passed_through(render: Render) -> None:
    selector = {"matchExpressions": [{"key": "topoguard.io/skip", "operator": "DoesNotExist"}]}
    objects = render(values={"webhook": {"objectSelector": selector}})
    for kind in WEBHOOK_KINDS:
        assert webhook(objects, kind)["objectSelector"] == selector


def load_pems(data: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(data)


def test_generated_ca_bundle_matches_the_served_certificate(default_objects: list[dict[str, Any]]) -> None:
    secret = one(default_objects, "Secret")
    assert secret["type"] == "kubernetes.io/tls"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    leaf = x509.load_pem_x509_certificate(data["tls.crt"])
    for kind in WEBHOOK_KINDS:
        bundle = load_pems(base64.b64decode(webhook(default_objects, kind)["clientConfig"]["caBundle"]))
        assert bundle == [ca], "both webhooks trust exactly the CA in the Secret"
    leaf.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert f"{RELEASE}.{NAMESPACE}.svc" in sans
    assert f"{RELEASE}.{NAMESPACE}.svc.cluster.local" in sans
    assert isinstance(leaf.public_key(), ec.EllipticCurvePublicKey), "ECDSA: cheaper handshakes than RSA"
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku
    # The key in the Secret belongs to the certificate in the Secret.
    key = load_pem_private_key(data["tls.key"], password=None)
    assert key.public_key().public_numbers() == leaf.public_key().public_numbers()  # type: ignore[union-attr]
    not_after = int(secret["metadata"]["annotations"]["topoguard.io/cert-not-after"])
    assert abs(not_after - leaf.not_valid_after_utc.timestamp()) < 3600


def test_pods_mount_only_the_serving_pair_never_the_ca_key(default_objects: list[dict[str, Any]]) -> None:
    volumes = one(default_objects, "Deployment")["spec"]["template"]["spec"]["volumes"]
    tls = next(v for v in volumes if v["name"] == "tls")
    assert tls["secret"] == {"secretName": f"{RELEASE}-tls", "items": [
        {"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]}


def test_cert_manager_mode_injects_the_ca_and_renders_no_secret(render: Render) -> None:
    objects = render(values={"tls": {"mode": "cert-manager"}})
    assert not [o for o in objects if o["kind"] == "Secret"]
    serving = one(objects, "Certificate", RELEASE)
    assert serving["spec"]["secretName"] == f"{RELEASE}-tls"
    assert f"{RELEASE}.{NAMESPACE}.svc" in serving["spec"]["dnsNames"]
    issuer = one(objects, "Issuer", serving["spec"]["issuerRef"]["name"])
    ca_cert = one(objects, "Certificate", f"{RELEASE}-ca")
    assert issuer["spec"] == {"ca": {"secretName": ca_cert["spec"]["secretName"]}}
    assert ca_cert["spec"]["isCA"] is True
    for kind in WEBHOOK_KINDS:
        config = one(objects, kind)
        assert config["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/{RELEASE}"}
        assert "caBundle" not in config["webhooks"][0]["clientConfig"]


def test_secret_mode_uses_the_given_secret_and_ca_bundle(render: Render) -> None:
    objects = render(values={"tls": {"mode": "secret", "secret": {"name": "pki-cert", "caBundle": "Q0E="}}})
    assert not [o for o in objects if o["kind"] in ("Secret", "Certificate")]
    for kind in WEBHOOK_KINDS:
        assert webhook(objects, kind)["clientConfig"]["caBundle"] == "Q0E="
    volumes = one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert next(v for v in volumes if v["name"] == "tls")["secret"]["secretName"] == "pki-cert"
