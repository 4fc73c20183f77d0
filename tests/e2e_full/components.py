"""The rest of the control plane for `make e2e-full`: the real kube-scheduler, kube-controller-manager
and training-job operators, each as its own process on 127.0.0.1 against the envtest kube-apiserver.

Binaries come from hack/envtest/build-components.sh, which writes, per component, NAME.bin (the cached
binary), NAME.module (the module's directory in the Go module cache: its CRDs and webhook manifests)
and NAME.version, or NAME.error when the build failed. TOPOGUARD_E2E_COMPONENTS names that directory.
A component that did not build makes the tests needing it skip with the recorded error, never a fake.

Each operator runs as its Deployment runs it, minus what only a cluster has:
- leader election off (one replica; flag or config file, per operator);
- its admission webhooks served, with certificates from the suite (tests/e2e/pki.py), registered from
  the module's own webhook manifests with `clientConfig.url: https://127.0.0.1:PORT/<path>` in place of
  the in-cluster Service (no kube-proxy or DNS here);
- metrics off (`0`), health probes on 127.0.0.1.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import datetime
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.e2e import kube, pki
from tests.e2e.controlplane import Process, free_port, https_ok, wait_until
from tests.e2e.kube import RawObject

COMPONENTS_ENV = "TOPOGUARD_E2E_COMPONENTS"
READY_TIMEOUT_SECONDS = 180.0
# Where each operator keeps its CRDs and webhook manifests inside its module (kustomize bases).
CRD_DIRS = {
    "training-operator": "manifests/base/crds",
    "jobset": "config/components/crd/bases",
    "trainer": "manifests/base/crds",
    "kueue": "config/components/crd/bases",
}
WEBHOOK_MANIFESTS = {
    "training-operator": "manifests/base/webhook/manifests.yaml",
    "jobset": "config/components/webhook/manifests.yaml",
    "trainer": "manifests/base/webhook/manifests.yaml",
    "kueue": "config/components/webhook/manifests.yaml",
}
# The namespace the operators "run in" (their Secrets, Kueue's own objects).
OPERATOR_NAMESPACE = "topoguard-e2e-system"


class ComponentMissing(RuntimeError):
    """A component hack/envtest/build-components.sh could not build (the message says what failed)."""


@dataclass(frozen=True)
class Built:
    name: str
    binary: Path
    module_dir: Path | None
    version: str

    def crd_dir(self) -> Path | None:
        if self.module_dir is None or self.name not in CRD_DIRS:
            return None
        return self.module_dir / CRD_DIRS[self.name]

    def webhook_manifest(self) -> Path:
        assert self.module_dir is not None
        return self.module_dir / WEBHOOK_MANIFESTS[self.name]


def built(name: str) -> Built:
    """The built component, or ComponentMissing naming why it is not there."""
    root = os.environ.get(COMPONENTS_ENV)
    if not root:
        raise ComponentMissing(f"{COMPONENTS_ENV} is not set (make e2e-full sets it)")
    directory = Path(root)
    error, binary = directory / f"{name}.error", directory / f"{name}.bin"
    if error.exists():
        raise ComponentMissing(f"{name} could not be built: {error.read_text().strip()}")
    if not binary.exists():
        raise ComponentMissing(f"{name} was not built (no {binary}; run hack/envtest/build-components.sh)")
    path = Path(binary.read_text().strip())
    if not os.access(path, os.X_OK):
        raise ComponentMissing(f"{name}: {path} is missing or not executable")
    module = directory / f"{name}.module"
    version = directory / f"{name}.version"
    return Built(name, path, Path(module.read_text().strip()) if module.exists() else None,
                 version.read_text().strip() if version.exists() else "?")


def available(name: str) -> Built | None:
    try:
        return built(name)
    except ComponentMissing:
        return None


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _env(kubeconfig: Path, tmp: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """KUBECONFIG for controller-runtime's GetConfigOrDie; TMPDIR so that controller-runtime's default
    webhook cert dir ($TMPDIR/k8s-webhook-server/serving-certs) is this run's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOPOGUARD_", "KUBE"))}
    env.update({"KUBECONFIG": str(kubeconfig), "TMPDIR": str(tmp)})
    env.update(extra or {})
    return env


def _start(process: Process, probe: Callable[[], bool], what: str) -> Process:
    process.start()
    try:
        wait_until(process, probe, timeout=READY_TIMEOUT_SECONDS, what=what)
    except BaseException:
        process.stop()
        raise
    return process


def start_scheduler(binary: Path, kubeconfig: Path, work: Path) -> Process:
    """kube-scheduler with its default profile; its secure port (self-signed) on 127.0.0.1 for /readyz."""
    port = free_port()
    proc = Process("kube-scheduler", [
        str(binary), f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}", "--leader-elect=false", "--bind-address=127.0.0.1",
        f"--secure-port={port}", f"--cert-dir={work / 'scheduler-certs'}", "--v=2",
    ], work / "kube-scheduler.log")
    return _start(proc, lambda: https_ok(f"https://127.0.0.1:{port}/readyz", ca_file=None), "ready (/readyz)")


# kube-controller-manager runs only what the tests need and nothing that would fight the suite:
# `job-controller` (a JobSet's Jobs -> Pods), `garbagecollector` (children of a deleted job), `serviceaccount`
# (each namespace's `default` ServiceAccount, without which the ServiceAccount admission plugin
# refuses every Pod), `resourceclaim` (a pod's ResourceClaims made from its ResourceClaimTemplates, which
# the scheduler waits for; claims deallocated and deleted once their pods are gone). Not `nodelifecycle`:
# with no kubelet it would taint every Node unreachable.
# DRA needs no flag in v1.36: `DynamicResourceAllocation` is GA and locked on, `DRAExtendedResource`
# (KEP-5004) beta and on by default, resource.k8s.io/v1 served by default (k8s.io/kubernetes
# pkg/features/kube_features.go); test_dra.py fails if the scheduler does not serve them.
CONTROLLER_MANAGER_CONTROLLERS = ("job-controller,garbage-collector-controller,serviceaccount-controller,"
                                  "resourceclaim-controller")


def start_controller_manager(binary: Path, kubeconfig: Path, work: Path) -> Process:
    port = free_port()
    proc = Process("kube-controller-manager", [
        str(binary), f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}", "--leader-elect=false", "--bind-address=127.0.0.1",
        f"--secure-port={port}", f"--cert-dir={work / 'kcm-certs'}",
        f"--controllers={CONTROLLER_MANAGER_CONTROLLERS}", "--use-service-account-credentials=false", "--v=2",
    ], work / "kube-controller-manager.log")
    return _start(proc, lambda: https_ok(f"https://127.0.0.1:{port}/healthz", ca_file=None), "healthy (/healthz)")


def webhook_configurations(manifest: Path, base_url: str, ca_pem: bytes, *, names: Mapping[str, str],
                           keep: Callable[[str], bool] = lambda _: True,
                           edit: Mapping[str, Mapping[str, Any]] | None = None) -> list[RawObject]:
    """The operator's own Mutating/ValidatingWebhookConfigurations (kubebuilder's manifests.yaml), with
    each webhook's Service reference replaced by `url: <base_url><its path>` and the suite's CA.

    names: kind -> metadata.name (what the operator's kustomize overlay names them; a cert rotator
    looks its configuration up by that name). keep: which webhooks (by name) to register. edit: per
    webhook name, fields to set (the overlay's objectSelector / namespaceSelector patches).
    """
    out = []
    for doc in kube.load_documents(manifest):
        kind = doc.get("kind", "")
        if kind not in names:
            continue
        config = copy.deepcopy(doc)
        config["metadata"] = {"name": names[kind]}
        hooks = []
        for hook in config.get("webhooks") or []:
            if not keep(hook["name"]):
                continue
            path = hook["clientConfig"]["service"].get("path", "/")
            hook["clientConfig"] = {"url": f"{base_url}{path}", "caBundle": base64.b64encode(ca_pem).decode()}
            hook.update(copy.deepcopy(dict((edit or {}).get(hook["name"], {}))))
            hooks.append(hook)
        if hooks:
            config["webhooks"] = hooks
            out.append(config)
    return out


def _write_certs(directory: Path, pair: pki.IssuedPair) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(pair.cert_pem)
    (directory / "tls.key").write_bytes(pair.key_pem)
    (directory / "tls.key").chmod(0o600)
    return directory


def _config_file(path: Path, config: RawObject) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@dataclass
class Operator:
    """A running operator and the webhook configurations registered for it (removed on stop)."""

    name: str
    process: Process
    configurations: list[RawObject]
    # Files the suite put outside its work directory for this operator, removed on stop.
    outside: list[Path] = field(default_factory=list)

    def stop(self, cluster: kube.Cluster) -> None:
        for config in self.configurations:
            # Teardown: the apiserver may already be gone; the process must be stopped regardless.
            with contextlib.suppress(Exception):
                cluster.delete(config)
        self.process.stop()
        for path in self.outside:
            path.unlink(missing_ok=True)


def _register(cluster: kube.Cluster, configurations: Iterable[RawObject]) -> list[RawObject]:
    created = []
    for config in configurations:
        cluster.create(config)
        created.append(config)
    return created


def start_training_operator(component: Built, cluster: kube.Cluster, kubeconfig: Path, work: Path) -> Operator:
    """training-operator v1: its webhook is always on and its cert rotator (open-policy-agent
    cert-controller) cannot be switched off, so the fixture hands the rotator certificates it keeps:
    a Secret `training-operator-webhook-cert` holding a CA named `training-operator-ca` and a serving
    certificate for `training-operator.<ns>.svc` AND 127.0.0.1, valid past the rotator's 90-day
    look-ahead, the CA key in PKCS#1 RSA (the only form the rotator parses back). The rotator then
    injects that CA into `validator.training-operator.kubeflow.org` itself, exactly as in a cluster.
    Its webhook server has no host flag and listens on every interface (port chosen free); metrics are
    off and probes on 127.0.0.1."""
    tmp = work / "training-operator-tmp"
    ca, serving = rotator_certificates(cluster, work / "training-operator-pki", ca_name="training-operator-ca",
                                       secret="training-operator-webhook-cert", service="training-operator")
    # The webhook server reads $TMPDIR/k8s-webhook-server/serving-certs (this run's own). The rotator waits
    # for tls.crt at a fixed /tmp/k8s-webhook-server/serving-certs, where the Deployment mounts the Secret:
    # the suite plays kubelet and puts the same files there (only their existence is checked there).
    _write_certs(tmp / "k8s-webhook-server" / "serving-certs", serving)
    _write_certs(ROTATOR_MOUNT, serving)
    port, probe = free_port(), free_port()
    configs = _register(cluster, webhook_configurations(
        component.webhook_manifest(), f"https://127.0.0.1:{port}", ca.cert_pem,
        names={"ValidatingWebhookConfiguration": "validator.training-operator.kubeflow.org"}))
    proc = Process("training-operator", [
        str(component.binary), "--leader-elect=false", "--metrics-bind-address=0",
        f"--health-probe-bind-address=127.0.0.1:{probe}", f"--webhook-server-port={port}",
    ], work / "training-operator.log", env=_env(kubeconfig, tmp, {"MY_POD_NAMESPACE": OPERATOR_NAMESPACE}))
    _start(proc, lambda: _http_ok(f"http://127.0.0.1:{probe}/readyz"), "ready (/readyz)")
    return Operator("training-operator", proc, configs, [ROTATOR_MOUNT / "tls.crt", ROTATOR_MOUNT / "tls.key"])


# Where training-operator's rotator expects the Secret mounted (pkg/cert/cert.go certDir).
ROTATOR_MOUNT = Path("/tmp/k8s-webhook-server/serving-certs")
# cert-controller renews anything expiring within 90 days (defaultLookaheadInterval).
_ROTATOR_VALIDITY = datetime.timedelta(days=120)


def rotator_certificates(cluster: kube.Cluster, directory: Path, *, ca_name: str, secret: str,
                         service: str) -> tuple[pki.CertificateAuthority, pki.IssuedPair]:
    """Certificates an open-policy-agent cert-controller rotator keeps rather than replaces, stored in
    the Secret it reads (ca.crt, ca.key, tls.crt, tls.key in OPERATOR_NAMESPACE): a CA whose
    certificate verifies for the rotator's CA name and whose key is PKCS#1 RSA (the only form it parses
    back), and a serving certificate for `<service>.<ns>.svc` (what it checks) and 127.0.0.1 (what the
    apiserver dials here), both valid past its 90-day look-ahead."""
    ca = pki.CertificateAuthority(_mkdir(directory), name=ca_name, validity=_ROTATOR_VALIDITY,
                                  dns_names=[ca_name], rsa_key=True)
    dns = f"{service}.{OPERATOR_NAMESPACE}.svc"
    serving = ca.issue_serving("serving", common_name=dns, dns_names=[dns])
    data = {"ca.crt": ca.cert_pem, "ca.key": (directory / "ca.key").read_bytes(),
            "tls.crt": serving.cert_pem, "tls.key": serving.key_pem}
    cluster.request("POST", f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret, "namespace": OPERATOR_NAMESPACE},
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    })
    return ca, serving


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _serving_dir(ca: pki.CertificateAuthority, directory: Path, name: str) -> Path:
    return _write_certs(directory, ca.issue_serving(f"{name}-webhook", common_name=name))


def start_jobset(component: Built, cluster: kube.Cluster, ca: pki.CertificateAuthority, kubeconfig: Path,
                 work: Path) -> Operator:
    """JobSet: internalCertManagement off (its config allows it), webhook on 127.0.0.1 with the suite's
    certificate. All four of its webhooks registered; the pod ones with the overlay's objectSelector
    (`jobset.sigs.k8s.io/jobset-name` Exists) so they see JobSet pods only."""
    port, probe = free_port(), free_port()
    certs = _serving_dir(ca, work / "jobset-certs", "jobset")
    config = _config_file(work / "jobset-config.yaml", {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(certs)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe}"},
    })
    pod_selector = {"objectSelector": {"matchExpressions": [
        {"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}}
    configs = _register(cluster, webhook_configurations(
        component.webhook_manifest(), f"https://127.0.0.1:{port}", ca.cert_pem,
        names={"MutatingWebhookConfiguration": "jobset-mutating-webhook-configuration",
               "ValidatingWebhookConfiguration": "jobset-validating-webhook-configuration"},
        edit={"mpod.kb.io": pod_selector, "vpod.kb.io": pod_selector}))
    proc = Process("jobset", [str(component.binary), f"--config={config}", "--zap-log-level=info"],
                   work / "jobset.log", env=_env(kubeconfig, _mkdir(work / "jobset-tmp")))
    _start(proc, lambda: _http_ok(f"http://127.0.0.1:{probe}/readyz"), "ready (/readyz)")
    return Operator("jobset", proc, configs)


def start_trainer(component: Built, cluster: kube.Cluster, ca: pki.CertificateAuthority, kubeconfig: Path,
                  work: Path) -> Operator:
    """Trainer v2: certManagement off (its config allows it); the webhook server has no certDir setting,
    so the suite's certificate goes where controller-runtime looks by default, under this process's
    TMPDIR. Its defaulting and validating webhooks registered as its overlay names them, with the
    overlay's `trainer.kubeflow.org/webhook-validation NotIn [disabled]` objectSelector on the runtime
    validators."""
    port, probe = free_port(), free_port()
    tmp = _mkdir(work / "trainer-tmp")
    _serving_dir(ca, tmp / "k8s-webhook-server" / "serving-certs", "trainer")
    config = _config_file(work / "trainer-config.yaml", {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1", "kind": "Configuration",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe}", "readinessEndpointName": "readyz",
                   "livenessEndpointName": "healthz"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": port, "host": "127.0.0.1"},
        "leaderElection": {"leaderElect": False},
        "certManagement": {"enable": False},
    })
    not_disabled = {"objectSelector": {"matchExpressions": [
        {"key": "trainer.kubeflow.org/webhook-validation", "operator": "NotIn", "values": ["disabled"]}]}}
    configs = _register(cluster, webhook_configurations(
        component.webhook_manifest(), f"https://127.0.0.1:{port}", ca.cert_pem,
        names={"MutatingWebhookConfiguration": "defaulter.trainer.kubeflow.org",
               "ValidatingWebhookConfiguration": "validator.trainer.kubeflow.org"},
        edit={"validator.clustertrainingruntime.trainer.kubeflow.org": not_disabled,
              "validator.trainingruntime.trainer.kubeflow.org": not_disabled}))
    proc = Process("trainer", [str(component.binary), f"--config={config}"], work / "trainer.log",
                   env=_env(kubeconfig, tmp))
    _start(proc, lambda: _http_ok(f"http://127.0.0.1:{probe}/readyz"), "ready (/readyz)")
    return Operator("trainer", proc, configs)


# The integrations the Kueue tests use. Kueue v0.19.0 ships pytorchjob commented out of its default
# list (kubeflow.org/v1 is legacy); a cluster that queues PyTorchJobs turns it on exactly like this.
KUEUE_FRAMEWORKS = ("kubeflow.org/pytorchjob", "trainer.kubeflow.org/trainjob", "jobset.x-k8s.io/jobset")
# Kueue's webhooks registered: those of the enabled integrations and of its own kinds. The others
# (pod, deployment, statefulset, ray, ...) belong to integrations that are off here.
KUEUE_WEBHOOKS = frozenset({
    "mpytorchjob.kb.io", "vpytorchjob.kb.io", "mtrainjob.kb.io", "vtrainjob.kb.io", "mjobset.kb.io",
    "vjobset.kb.io", "mclusterqueue.kb.io", "vclusterqueue.kb.io", "mresourceflavor.kb.io",
    "vresourceflavor.kb.io", "mworkload.kb.io", "vworkload.kb.io", "vcohort.kb.io",
})


# The CRDs Kueue serves a conversion webhook for (config/components/crd/patches/webhook_in_*.yaml); its
# cert rotator injects its CA into each, and waits until it could.
KUEUE_CONVERTED_CRDS = ("localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters")


def start_kueue(component: Built, cluster: kube.Cluster, kubeconfig: Path, work: Path) -> Operator:
    """Kueue: with `internalCertManagement` off it insists on metrics certificates at a fixed
    /etc/kueue/metrics/certs even with metrics off, so it runs as shipped, with its cert rotator on,
    given certificates it keeps (rotator_certificates) in `webhook.certDir`. Webhook on 127.0.0.1; its
    job webhooks keep the overlay's namespaceSelector (not kube-system, not its own namespace); the
    conversion webhooks of its five converted CRDs point at it too, as its overlay sets them."""
    port, probe = free_port(), free_port()
    certs = work / "kueue-certs"
    ca, serving = rotator_certificates(cluster, work / "kueue-pki", ca_name="kueue-ca",
                                       secret="kueue-webhook-server-cert", service="kueue-webhook-service")
    _write_certs(certs, serving)
    base_url = f"https://127.0.0.1:{port}"
    for plural in KUEUE_CONVERTED_CRDS:
        crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "metadata": {"name": f"{plural}.kueue.x-k8s.io"}}
        stored = cluster.get(crd)
        assert stored is not None, f"CRD {plural}.kueue.x-k8s.io is not installed"
        stored["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
            "clientConfig": {"url": f"{base_url}/convert", "caBundle": base64.b64encode(ca.cert_pem).decode()},
            "conversionReviewVersions": ["v1"]}}
        cluster.replace(stored)
    config = _config_file(work / "kueue-config.yaml", {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": OPERATOR_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": True},
        "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)},
        # Its on-demand visibility API (an aggregated API server for pending workloads, unused here) would
        # bind 0.0.0.0:8082 and, with internal cert management, write certificates under a fixed /visibility.
        "featureGates": {"VisibilityOnDemand": False},
    })
    not_system = {"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", OPERATOR_NAMESPACE]}]}}
    job_hooks = {"mpytorchjob.kb.io", "vpytorchjob.kb.io", "mtrainjob.kb.io", "vtrainjob.kb.io",
                 "mjobset.kb.io", "vjobset.kb.io"}
    # The names its rotator derives from webhookServiceName `kueue-webhook-service`.
    configs = _register(cluster, webhook_configurations(
        component.webhook_manifest(), base_url, ca.cert_pem,
        names={"MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
               "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration"},
        keep=lambda name: name in KUEUE_WEBHOOKS, edit={name: not_system for name in job_hooks}))
    # --kubeconfig as well as KUBECONFIG: some of its parts look the flag up (flag.Lookup("kubeconfig")).
    proc = Process("kueue", [str(component.binary), f"--config={config}", f"--kubeconfig={kubeconfig}",
                             "--zap-log-level=2"],
                   work / "kueue.log", env=_env(kubeconfig, _mkdir(work / "kueue-tmp")))
    _start(proc, lambda: _http_ok(f"http://127.0.0.1:{probe}/readyz"), "ready (/readyz)")
    return Operator("kueue", proc, configs)


def crd_directories(names: Sequence[str]) -> list[Path]:
    """The CRD directories of the components that built (each one matching its controller's version)."""
    out = []
    for name in names:
        component = available(name)
        directory = component.crd_dir() if component else None
        if directory is not None and directory.is_dir():
            out.append(directory)
    return out
