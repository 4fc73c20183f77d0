"""Reach cases on the real datapath against `topoguard reach`: agreed / disagreed / not runnable.

The cases are the oracle's (hack/oracle/cases.py: the documented Cilium cases of
tests/unit/policy/data/cilium-cases.yaml, the reach verdict tables of the unit tests, and its seeded
generator), in the oracle's wire shape. For each runnable case: its namespaces get the case's labels,
its policies are applied and imported by the agent, a source and a destination pod with the case's
labels and service account are created (CNI ADD), and for each port of the case a real probe (TCP
connect + answer, or a UDP round trip) goes from source to destination. topoguard answers the same
question with `topoguard reach` on the objects as the apiserver stored them.

A case is not runnable when it needs what one node without a proxy cannot show (L7 rules, FQDN,
Services, mutual auth), when its endpoints are not pods (CIDR / ipBlock peers: the agent chooses the
pods' IPs), or when it depends on agent settings this node does not run (policy enforcement other
than `default`, node selector labels, a cluster name, identity label filters, the policy kinds the
agent does not watch). The reason is recorded for each.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from tests.e2e import kube
from tests.e2e.topoguard import clean_environment
from tests.e2e_datapath import datapath
from tests.e2e_datapath.datapath import PodNet, Server
from tests.e2e_datapath.node import DatapathNode

REPO = Path(__file__).resolve().parents[2]
ORACLE = REPO / "hack" / "oracle"
POLICY_IMPORT_TIMEOUT_SECONDS = 15.0
# The datapath's verdict for a case is the one that holds: identities and policy maps are updated
# asynchronously after an endpoint appears. Each probe is repeated until it gives topoguard's answer or
# this much time has passed; a disagreement is a verdict that stayed different all that time.
SETTLE_SECONDS = 8.0
PROBE_TIMEOUT_SECONDS = 1.0
NAMESPACE_LABELS_TIMEOUT_SECONDS = 15.0

# Policy keys whose verdict one node without Envoy / DNS proxy / Services cannot show, or whose
# peers are addresses rather than pods.
OUT_OF_REACH = {
    "rules": "L7 rules need the L7 proxy (off: --enable-l7-proxy=false)",
    "toFQDNs": "FQDN rules need the DNS proxy",
    "toServices": "toServices needs Services and their backends",
    "toCIDR": "CIDR peers: the agent, not the case, chooses the pods' IPs",
    "toCIDRSet": "CIDR peers: the agent, not the case, chooses the pods' IPs",
    "fromCIDR": "CIDR peers: the agent, not the case, chooses the pods' IPs",
    "fromCIDRSet": "CIDR peers: the agent, not the case, chooses the pods' IPs",
    "ipBlock": "ipBlock peers: the agent, not the case, chooses the pods' IPs",
    "fromNodes": "node selectors need --enable-node-selector-labels",
    "toNodes": "node selectors need --enable-node-selector-labels",
}
KIND_PATHS = {
    "CiliumNetworkPolicy": ("/apis/cilium.io/v2", "ciliumnetworkpolicies", True),
    "CiliumClusterwideNetworkPolicy": ("/apis/cilium.io/v2", "ciliumclusterwidenetworkpolicies", False),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies", True),
}
API_VERSIONS = {"CiliumNetworkPolicy": "cilium.io/v2", "CiliumClusterwideNetworkPolicy": "cilium.io/v2",
                "NetworkPolicy": "networking.k8s.io/v1"}


def load_cases(generated: int, seed: int, *, tables: bool) -> list[dict[str, Any]]:
    """The documented cases (always), the unit tests' verdict tables (tables=True), `generated` seeded ones."""
    sys.path.insert(0, str(ORACLE))
    try:
        import cases as oracle_cases  # hack/oracle/cases.py
    finally:
        sys.path.remove(str(ORACLE))
    selected = oracle_cases.table_cases() if tables else [
        {**c, "features": sorted(set(c["features"]) | oracle_cases.policy_features(c["policies"]))}
        for c in oracle_cases._documented_cases()
    ]
    kinds = ("CiliumNetworkPolicy", "CiliumClusterwideNetworkPolicy", "NetworkPolicy")
    selected += oracle_cases.Generator(seed, kinds=kinds).cases(generated)
    return selected


def _keys(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield str(key), item
            yield from _keys(item)
    elif isinstance(value, list):
        for item in value:
            yield from _keys(item)


def not_runnable(case: Mapping[str, Any]) -> str | None:
    """Why the datapath cannot decide this case, or None."""
    settings = case.get("settings") or {}
    if settings.get("policyEnforcement", "default") != "default":
        return f"policy enforcement {settings['policyEnforcement']!r}: the agent runs --enable-policy=default"
    if settings.get("clusterName") or settings.get("labels"):
        return "cluster name / identity label filter other than the agent's defaults"
    for policy in case["policies"]:
        kind = policy.get("kind")
        if kind not in KIND_PATHS:
            return f"{kind}: a policy kind this agent does not enforce"
        if policy.get("apiVersion") != API_VERSIONS[kind]:
            return f"{kind} {policy.get('apiVersion')}: not served by the apiserver"
        for key, item in _keys(policy):
            if key in OUT_OF_REACH and item:
                return OUT_OF_REACH[key]
            if key == "authentication" and isinstance(item, Mapping) and item.get("mode") not in (None, "disabled"):
                return "mutual authentication needs the auth machinery (SPIRE)"
    if case["protocol"] not in ("TCP", "UDP", "ANY"):
        return f"{case['protocol']}: the probes speak TCP and UDP"
    return None


@dataclass
class Outcome:
    name: str
    status: str  # agreed | disagreed | unknown (topoguard's answer) | not-runnable | error
    reason: str = ""
    ports: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


def _policy_path(policy: Mapping[str, Any]) -> str:
    prefix, plural, namespaced = KIND_PATHS[str(policy["kind"])]
    if namespaced:
        return f"{prefix}/namespaces/{policy['metadata']['namespace']}/{plural}"
    return f"{prefix}/{plural}"


class Runner:
    """Runs cases one at a time on the node; everything a case creates is removed before the next."""

    def __init__(self, node: DatapathNode, work: Path) -> None:
        self.node = node
        self.work = work
        self.count = 0

    def run(self, case: Mapping[str, Any]) -> Outcome:
        started = time.monotonic()
        reason = not_runnable(case)
        if reason is not None:
            return Outcome(case["name"], "not-runnable", reason)
        self.count += 1
        applied: list[dict[str, Any]] = []
        pods: list[PodNet] = []
        try:
            outcome = self._run(case, applied, pods)
        except (datapath.DatapathError, ApiException, subprocess.SubprocessError) as e:
            outcome = Outcome(case["name"], "error", f"{type(e).__name__}: {str(e)[:2000]}")
        finally:
            for pod in pods:
                self.node.delete_pod(pod)
            for policy in applied:
                with contextlib.suppress(ApiException):
                    self.node.cluster.request("DELETE", f"{_policy_path(policy)}/{policy['metadata']['name']}")
            self._wait_policies(set())
        outcome.seconds = time.monotonic() - started
        print(f"datapath differential: {outcome.status} {case['name']} ({outcome.seconds:.0f}s) {outcome.ports}",
              flush=True)
        return outcome

    def _run(self, case: Mapping[str, Any], applied: list[dict[str, Any]], pods: list[PodNet]) -> Outcome:
        src_side, dst_side = case["src"], case["dst"]
        for side in (src_side, dst_side):
            self._namespace(side["namespace"], side.get("namespaceLabels") or {})
        for policy in case["policies"]:
            namespace = (policy.get("metadata") or {}).get("namespace")
            if namespace and KIND_PATHS[str(policy["kind"])][2]:
                self._namespace(namespace, None)
            body = json.loads(json.dumps(policy))
            body.get("metadata", {}).pop("resourceVersion", None)
            try:
                self.node.cluster.request("POST", _policy_path(body), body)
            except ApiException as e:
                if e.status in (400, 422):
                    message = str(kube.api_error_body(e).get("message", e.reason))
                    return Outcome(case["name"], "not-runnable",
                                   f"the apiserver (Cilium v1.20.2's CRD) refuses the policy: {message[:300]}")
                raise
            applied.append(body)
        note = self._wait_policies({str(p["metadata"]["name"]) for p in applied})
        tag = f"c{self.count}"
        src = self.node.add_pod(self._pod(src_side, f"{tag}-src", with_ports=False))
        pods.append(src)
        self._wait_namespace_labels(src, src_side)
        dst = self.node.add_pod(self._pod(dst_side, f"{tag}-dst", with_ports=True))
        pods.append(dst)
        self._wait_namespace_labels(dst, dst_side)
        snapshot = self._snapshot(case, [src, dst])
        protocol = "TCP" if case["protocol"] == "ANY" else case["protocol"]
        results = []
        for port in case["ports"]:
            ours = self._topoguard(snapshot, src, dst, port, case["protocol"], case)
            server = Server(dst, port, protocol.lower())
            try:
                def once(p: int = port) -> bool:
                    return datapath.probe(src, dst.ip, p, protocol.lower(), timeout=PROBE_TIMEOUT_SECONDS)
                expect = ours == "allow"
                reached = datapath.settle(once, expect=expect, timeout=SETTLE_SECONDS) if ours != "unknown" \
                    else once()
            finally:
                server.stop()
            observed = "allow" if reached else "deny"
            results.append({"port": port, "protocol": protocol, "topoguard": ours, "datapath": observed})
        if any(r["topoguard"] == "unknown" for r in results):
            return Outcome(case["name"], "unknown", "topoguard cannot evaluate it (datapath verdict recorded)",
                           ports=results)
        disagreements = [r for r in results if r["topoguard"] != r["datapath"]]
        if not disagreements:
            return Outcome(case["name"], "agreed", note, ports=results)
        evidence = self.node.agent.dbg(["policy", "get"], check=False).stdout[-1500:]
        return Outcome(case["name"], "disagreed", f"{note}agent policy repository:\n{evidence}", ports=results)

    def _namespace(self, name: str, labels: Mapping[str, str] | None) -> None:
        self.node.ensure_namespace(name)
        if labels is None:
            return
        stored, _ = self.node.cluster.request("GET", f"/api/v1/namespaces/{name}")
        wanted = {"kubernetes.io/metadata.name": name, **labels}
        if stored["metadata"].get("labels") != wanted:
            stored["metadata"]["labels"] = wanted
            self.node.cluster.request("PUT", f"/api/v1/namespaces/{name}", stored)

    def _pod(self, side: Mapping[str, Any], name: str, *, with_ports: bool) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "main", "image": "registry.invalid/datapath-probe:none"}
        if with_ports and side.get("containerPorts"):
            container["ports"] = [{k: v for k, v in p.items() if v != ""} for p in side["containerPorts"]]
        spec: dict[str, Any] = {"containers": [container]}
        if side.get("serviceAccountName", "default") != "default":
            spec["serviceAccountName"] = side["serviceAccountName"]
        return {"metadata": {"namespace": side["namespace"], "name": name, "labels": dict(side.get("labels") or {})},
                "spec": spec}

    def _wait_namespace_labels(self, pod: PodNet, side: Mapping[str, Any]) -> None:
        """The agent labels an identity with its namespace's labels as its informer last saw them: wait for
        the case's (a pod created right after a relabel can carry the old ones; the agent then updates it)."""
        wanted = {f"k8s:io.cilium.k8s.namespace.labels.{k}={v}" for k, v in (side.get("namespaceLabels") or {}).items()}

        def current() -> bool:
            _, labels = self.node.identity_of(pod)
            return wanted <= set(labels)

        deadline = time.monotonic() + NAMESPACE_LABELS_TIMEOUT_SECONDS
        while not current() and time.monotonic() < deadline:
            time.sleep(datapath.POLL_SECONDS)

    def _wait_policies(self, names: set[str]) -> str:
        """Until the agent's policy repository holds exactly the policies named (by their name label); a
        note when it does not within the timeout (the probes still run: they show what the datapath does)."""

        def loaded() -> set[str]:
            out = self.node.agent.dbg(["policy", "get", "-o", "json"], check=False)
            found: set[str] = set()
            if out.returncode != 0:
                return found
            # GET /v1/policy: {"policy": "<the rules as a JSON string>", "revision": N}
            data = json.loads(out.stdout or "{}")
            rules = json.loads(data.get("policy") or "[]") if isinstance(data, dict) else data
            for rule in rules or []:
                for label in rule.get("labels") or []:
                    if label.get("key") == "io.cilium.k8s.policy.name":
                        found.add(str(label.get("value")))
            return found

        deadline = time.monotonic() + POLICY_IMPORT_TIMEOUT_SECONDS
        while (found := loaded()) != names and time.monotonic() < deadline:
            time.sleep(datapath.POLL_SECONDS)
        if found == names:
            return ""
        return f"the agent's policy repository showed {sorted(found)}, not {sorted(names)}; "

    def _snapshot(self, case: Mapping[str, Any], pods: Sequence[PodNet]) -> Path:
        """The case's objects as the apiserver stored them: namespaces, the two pods, the policies."""
        items: list[dict[str, Any]] = []
        namespaces = {p.namespace for p in pods} | {
            (p.get("metadata") or {}).get("namespace") for p in case["policies"]} - {None}
        for ns in sorted(str(n) for n in namespaces):
            obj, _ = self.node.cluster.request("GET", f"/api/v1/namespaces/{ns}")
            items.append({**obj, "apiVersion": "v1", "kind": "Namespace"})
        for pod in pods:
            obj, _ = self.node.cluster.request("GET", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}")
            items.append({**obj, "apiVersion": "v1", "kind": "Pod"})
        for policy in case["policies"]:
            obj, _ = self.node.cluster.request("GET", f"{_policy_path(policy)}/{policy['metadata']['name']}")
            items.append({**obj, "apiVersion": policy["apiVersion"], "kind": policy["kind"]})
        path = self.work / f"case-{self.count}.yaml"
        path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
        return path

    def _topoguard(self, snapshot: Path, src: PodNet, dst: PodNet, port: int, protocol: str,
                   case: Mapping[str, Any]) -> str:
        enforcement = (case.get("settings") or {}).get("policyEnforcement", "default")
        out = subprocess.run(
            [sys.executable, "-m", "app", "reach", "--cluster", str(snapshot),
             "--from", f"{src.namespace}/{src.name}", "--to", f"{dst.namespace}/{dst.name}",
             "--port", f"{port}/{protocol}", "--policy-enforcement", enforcement, "-o", "json"],
            capture_output=True, text=True, timeout=120, env=clean_environment(), cwd=REPO, check=False)
        verdicts = {0: "allow", 1: "deny", 3: "unknown"}
        if out.returncode not in verdicts:
            raise datapath.DatapathError(f"topoguard reach exited {out.returncode}: {out.stdout}{out.stderr}")
        return verdicts[out.returncode]


def summary(outcomes: Sequence[Outcome]) -> dict[str, int]:
    counts = {"agreed": 0, "disagreed": 0, "unknown": 0, "not-runnable": 0, "error": 0}
    for outcome in outcomes:
        counts[outcome.status] += 1
    return counts
