"""`helm install` / `helm upgrade` against a real kube-apiserver: the certificate survives upgrades,
renews near expiry, and the webhooks' caBundle always trusts what the Secret serves.

This is the part `helm template` cannot show (`lookup` returns nothing offline). Runs when
TOPOGUARD_ENVTEST_BIN names a directory with `etcd` and `kube-apiserver` (hack/envtest/build.sh;
hack/chart-lint.sh sets it when the binaries are already cached), skipped otherwise. There is no
kubelet or controller manager: the objects are stored and validated by the apiserver, nothing runs.
"""

from __future__ import annotations

import base64
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from kubernetes import client, config

from tests.chart.rendering import CHART, NAMESPACE, RELEASE, ROOT, run_helm, template
from tests.e2e.controlplane import ControlPlane

BIN_ENV = "TOPOGUARD_ENVTEST_BIN"
SECRET = f"{RELEASE}-tls"
DAY_SECONDS = 86400

pytestmark = pytest.mark.skipif(not os.environ.get(BIN_ENV),
                                reason=f"set {BIN_ENV} to run helm against a real apiserver")


class Cluster:
    """helm and kubectl (bin/kubectl, from hack/helm.sh) pointed at the control plane."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def helm(self, *args: str) -> str:
        return run_helm([*args, "--kubeconfig", str(self.kubeconfig)])

    def install_or_upgrade(self, *sets: str, force_conflicts: bool = False) -> None:
        args = ["upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace"]
        if force_conflicts:
            # Helm 4 applies server-side; the test's stand-in for "time passed" (an annotation
            # written by another field manager) would otherwise be a conflict.
            args.append("--force-conflicts")
        for s in sets:
            args += ["--set", s]
        self.helm(*args)

    def get(self, kind: str, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        api = config.new_client_from_config(config_file=str(self.kubeconfig))
        try:
            if kind == "Secret":
                raw = client.CoreV1Api(api).read_namespaced_secret(
                    name, namespace or NAMESPACE, _preload_content=False)
            elif kind == "MutatingWebhookConfiguration":
                raw = client.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration(
                    name, _preload_content=False)
            else:
                raw = client.AdmissionregistrationV1Api(api).read_validating_webhook_configuration(
                    name, _preload_content=False)
            obj: dict[str, Any] = yaml.safe_load(raw.data)
            return obj
        finally:
            api.close()

    def annotate_secret(self, **annotations: str) -> None:
        api = config.new_client_from_config(config_file=str(self.kubeconfig))
        try:
            client.CoreV1Api(api).patch_namespaced_secret(
                SECRET, NAMESPACE, {"metadata": {"annotations": annotations}})
        finally:
            api.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # Module scope: starting etcd + kube-apiserver costs tens of seconds of a shared CPU.
    plane = ControlPlane(Path(os.environ[BIN_ENV]), tmp_path_factory.mktemp("helm-controlplane"))
    plane.start()
    try:
        c = Cluster(plane.kubeconfig)
        c.install_or_upgrade()
        yield c
    finally:
        plane.stop()


def served(cluster: Cluster) -> tuple[x509.Certificate, x509.Certificate, list[x509.Certificate]]:
    """(CA in the Secret, leaf in the Secret, caBundle of each webhook — asserted equal)."""
    data = {k: base64.b64decode(v) for k, v in cluster.get("Secret", SECRET)["data"].items()}
    bundles = {
        base64.b64decode(cluster.get(kind, RELEASE)["webhooks"][0]["clientConfig"]["caBundle"])
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    }
    assert len(bundles) == 1, "both webhooks carry the same caBundle"
    return (x509.load_pem_x509_certificate(data["ca.crt"]), x509.load_pem_x509_certificate(data["tls.crt"]),
            x509.load_pem_x509_certificates(bundles.pop()))


def test_install_stores_a_secret_the_webhooks_trust(cluster: Cluster) -> None:
    ca, leaf, bundle = served(cluster)
    assert bundle == [ca]
    leaf.verify_directly_issued_by(ca)


def test_upgrade_keeps_the_certificate(cluster: Cluster) -> None:
    before = served(cluster)
    cluster.install_or_upgrade("config.mode=colocate")
    assert served(cluster) == before


def test_upgrade_near_leaf_expiry_re_signs_with_the_same_ca(cluster: Cluster) -> None:
    ca, leaf, bundle = served(cluster)
    cluster.annotate_secret(**{"topoguard.io/cert-not-after": str(int(time.time()) + DAY_SECONDS)})
    cluster.install_or_upgrade(force_conflicts=True)
    new_ca, new_leaf, new_bundle = served(cluster)
    assert new_leaf != leaf, "renewed"
    assert (new_ca, new_bundle) == (ca, bundle), "same CA: the caBundle did not move"
    new_leaf.verify_directly_issued_by(ca)


def test_upgrade_near_ca_expiry_trusts_old_and_new_ca_during_the_switch(cluster: Cluster) -> None:
    old_ca, old_leaf, _ = served(cluster)
    cluster.annotate_secret(**{"topoguard.io/ca-not-after": str(int(time.time()) + DAY_SECONDS)})
    cluster.install_or_upgrade(force_conflicts=True)
    new_ca, new_leaf, bundle = served(cluster)
    assert new_ca != old_ca
    new_leaf.verify_directly_issued_by(new_ca)
    # Pods still serving the old leaf (kubelet refresh delay) stay trusted, and so do new ones.
    assert bundle == [new_ca, old_ca]
    old_leaf.verify_directly_issued_by(bundle[1])
    # The next upgrade keeps that bundle (nothing is near expiry any more).
    cluster.install_or_upgrade()
    assert served(cluster) == (new_ca, new_leaf, bundle)


def restricted_pod(**container_overrides: Any) -> dict[str, Any]:
    """A Pod made from the chart's Deployment template (default values)."""
    deployment = next(o for o in template() if o["kind"] == "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    spec["containers"][0]["securityContext"] |= container_overrides
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "pss-check-" + str(len(container_overrides)), "namespace": NAMESPACE},
            "spec": spec}


@pytest.mark.parametrize(("overrides", "admitted"), [
    pytest.param({}, True, id="the chart's pod passes PodSecurity restricted"),
    pytest.param({"allowPrivilegeEscalation": True}, False, id="control: privilege escalation is refused"),
])
def test_pod_security_admission_restricted(cluster: Cluster, overrides: dict[str, Any], admitted: bool) -> None:
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        core = client.CoreV1Api(api)
        core.patch_namespace(NAMESPACE, {"metadata": {"labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest"}}})
        pod = restricted_pod(**overrides)
        try:
            core.create_namespaced_pod(NAMESPACE, pod)
            outcome = True
        except client.ApiException as e:
            assert e.status == 403 and "violates PodSecurity" in str(e.body), e.body
            outcome = False
        else:
            core.delete_namespaced_pod(pod["metadata"]["name"], NAMESPACE)
    finally:
        api.close()
    assert outcome is admitted


def test_plain_manifests_apply_to_a_real_apiserver(cluster: Cluster) -> None:
    # Last in this module: it replaces the Helm release with deploy/install.sh's output.
    cluster.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
    manifests = subprocess.run([str(ROOT / "deploy" / "install.sh"), "--dry-run"], capture_output=True, text=True,
                               check=True, timeout=60).stdout
    kubectl = ROOT / "bin" / "kubectl"
    if not kubectl.is_file():
        pytest.skip("bin/kubectl missing (hack/helm.sh fetches it)")
    proc = subprocess.run([str(kubectl), "--kubeconfig", str(cluster.kubeconfig), "apply", "-f", "-"],
                          input=manifests, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    ca, leaf, bundle = served(cluster)
    assert bundle == [ca]
    leaf.verify_directly_issued_by(ca)
