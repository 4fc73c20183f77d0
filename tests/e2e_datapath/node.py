"""One Cilium node against the suite's kube-apiserver, and the test-only kubelet stand-in for its pods.

DatapathNode wires the pieces of datapath.py together: the node's and gateway's netns, the
apiserver forwarder, the Node object (spec.podCIDR for --ipam=kubernetes, status InternalIP), the
agent. `add_pod` plays the kubelet + container runtime for one Pod bound to the node: it creates the
Pod object (what the agent reads the pod's labels, hence its identity, from), a netns, and calls the
real CNI plugin (ADD). It is test infrastructure: no images, no containers; the test runs the
"container's" command in the pod's netns itself.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from tests.e2e import kube
from tests.e2e.controlplane import ControlPlane
from tests.e2e_datapath import datapath
from tests.e2e_datapath.datapath import Agent, DatapathError, Forwarder, Netns, PodNet

NODE_NAME = "dp-node1"
APISERVER_PORT_IN_NODE = 6443
FORCE_DELETE = [("gracePeriodSeconds", "0")]
POD_GONE_TIMEOUT_SECONDS = 60.0


def cgroup2_root() -> Path:
    """Where the host mounts the cgroup2 hierarchy (cgroup v1 hosts: /sys/fs/cgroup/unified)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] == "cgroup2" and fields[3] == "/":
            return Path(fields[4])
    raise DatapathError("no cgroup2 hierarchy mounted on this machine (the agent needs one for --cgroup-root)")


@dataclass
class DatapathNode:
    bin_dir: Path
    work: Path
    plane: ControlPlane
    cluster: kube.Cluster
    nets: list[Netns] = field(default_factory=list, init=False)
    pods: dict[tuple[str, str], PodNet] = field(default_factory=dict, init=False)
    namespaces: set[str] = field(default_factory=set, init=False)
    agent: Agent = field(init=False)
    forwarder: Forwarder | None = field(default=None, init=False)
    cgroup_dir: Path | None = field(default=None, init=False)

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "ns").mkdir(exist_ok=True)
        node = self._netns("node")
        gateway = self._netns("gateway")
        # eth0 of the node, its peer in the gateway netns (the kernel here has no dummy interfaces).
        node.run(["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "gw0", "netns", str(gateway.path)])
        node.run(["ip", "addr", "add", f"{datapath.NODE_IP}/{datapath.NODE_CIDR_PREFIX}", "dev", "eth0"])
        node.run(["ip", "link", "set", "eth0", "up"])
        node.run(["ip", "route", "add", "default", "via", datapath.GATEWAY_IP])
        gateway.run(["ip", "addr", "add", f"{datapath.GATEWAY_IP}/{datapath.NODE_CIDR_PREFIX}", "dev", "gw0"])
        gateway.run(["ip", "link", "set", "gw0", "up"])
        self.node_ns = node
        self.forwarder = Forwarder(datapath.listen_in(node, "127.0.0.1", APISERVER_PORT_IN_NODE),
                                   ("127.0.0.1", self.plane.port))
        kubeconfig = self._agent_kubeconfig()
        self.cluster.create({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE_NAME, "labels": {"kubernetes.io/hostname": NODE_NAME,
                                                       "kubernetes.io/os": "linux"}},
            "spec": {"podCIDR": datapath.POD_CIDR, "podCIDRs": [datapath.POD_CIDR]},
            "status": {"addresses": [{"type": "InternalIP", "address": datapath.NODE_IP},
                                     {"type": "Hostname", "address": NODE_NAME}],
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "datapath suite", "lastHeartbeatTime": None,
                                       "lastTransitionTime": None}]},
        })
        self.cgroup_dir = cgroup2_root() / f"topoguard-datapath-{self.work.name}"
        self.cgroup_dir.mkdir(exist_ok=True)
        self.agent = Agent(self.bin_dir, self.work / "agent", node, NODE_NAME, kubeconfig, self.cgroup_dir)
        self.agent.start()

    def _netns(self, name: str) -> Netns:
        ns = Netns.create(self.work / "ns" / name)
        self.nets.append(ns)
        return ns

    def _agent_kubeconfig(self) -> Path:
        config: dict[str, Any] = yaml.safe_load(self.plane.kubeconfig.read_text())
        config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{APISERVER_PORT_IN_NODE}"
        path = self.work / "agent-kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    # --- namespaces and pods ---

    def ensure_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        if name in self.namespaces:
            return
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels or {})}}
        with contextlib.suppress(ApiException):
            self.cluster.create(body)
        # No controller-manager: the `default` ServiceAccount a Pod needs does not appear on its own.
        self.ensure_service_account(name, "default")
        self.namespaces.add(name)

    def ensure_service_account(self, namespace: str, name: str) -> None:
        try:
            self.cluster.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
                                 {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
        except ApiException as e:
            if e.status != 409:
                raise

    def add_pod(self, pod: dict[str, Any]) -> PodNet:
        """Create the Pod (bound to this node) and its sandbox: netns + CNI ADD. Returns its network."""
        pod = copy.deepcopy(pod)
        meta = pod.setdefault("metadata", {})
        namespace, name = meta["namespace"], meta["name"]
        self.ensure_namespace(namespace)
        spec = pod.setdefault("spec", {})
        if spec.get("serviceAccountName"):
            self.ensure_service_account(namespace, spec["serviceAccountName"])
        spec["nodeName"] = NODE_NAME
        spec.setdefault("containers", [{"name": "main", "image": "registry.invalid/datapath-probe:none"}])
        pod.setdefault("apiVersion", "v1")
        pod.setdefault("kind", "Pod")
        self.cluster.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
        netns = self._netns(f"pod-{namespace}-{name}")
        container_id = datapath.new_container_id()
        result = datapath.cni(self.bin_dir, self.node_ns, self.agent, "ADD", namespace=namespace, name=name,
                              container_id=container_id, netns_path=netns.path)
        if result.returncode != 0:
            raise DatapathError(f"CNI ADD {namespace}/{name} exited {result.returncode}: {result.stdout}"
                                f"{result.stderr}\nagent log:\n{datapath.log_tail(self.agent.log_path, 3000)}")
        ips = [ip["address"].split("/")[0] for ip in json.loads(result.stdout).get("ips", [])]
        if not ips:
            raise DatapathError(f"CNI ADD {namespace}/{name} gave no IP: {result.stdout}")
        net = PodNet(namespace, name, netns, container_id, ips[0])
        self.pods[(namespace, name)] = net
        # What a kubelet reports: the pod's IP and phase (the audit reads bound, running pods).
        status = {"phase": "Running", "podIP": net.ip, "podIPs": [{"ip": net.ip}], "hostIP": datapath.NODE_IP,
                  "conditions": [{"type": "Ready", "status": "True"}]}
        stored, _ = self.cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        stored["status"] = status
        self.cluster.request("PUT", f"/api/v1/namespaces/{namespace}/pods/{name}/status", stored)
        self.wait_endpoint(net)
        return net

    def wait_endpoint(self, net: PodNet) -> None:
        """Until the agent's endpoint for the pod is `ready` with an identity from the pod's labels."""

        def ready() -> bool:
            for endpoint in self.agent.endpoints():
                ip, state, identity, labels = datapath.endpoint_summary(endpoint)
                if ip == net.ip:
                    return state == "ready" and identity > 0 and not any("reserved:init" in x for x in labels)
            return False

        datapath.wait_for(ready, timeout=datapath.ENDPOINT_READY_TIMEOUT_SECONDS,
                          what=f"endpoint of {net.namespace}/{net.name} ({net.ip}) ready",
                          evidence=lambda: self.agent.dbg(["endpoint", "list"], check=False).stdout)

    def identity_of(self, net: PodNet) -> tuple[int, list[str]]:
        for endpoint in self.agent.endpoints():
            ip, _, identity, labels = datapath.endpoint_summary(endpoint)
            if ip == net.ip:
                return identity, labels
        raise DatapathError(f"no endpoint for {net.namespace}/{net.name} ({net.ip})")

    def delete_pod(self, net: PodNet) -> None:
        datapath.cni(self.bin_dir, self.node_ns, self.agent, "DEL", namespace=net.namespace, name=net.name,
                     container_id=net.container_id, netns_path=net.netns.path)
        net.netns.destroy()
        self.nets.remove(net.netns)
        self.pods.pop((net.namespace, net.name), None)
        path = f"/api/v1/namespaces/{net.namespace}/pods/{net.name}"
        with contextlib.suppress(ApiException):
            self.cluster.request("DELETE", path, query=FORCE_DELETE)
        deadline = time.monotonic() + POD_GONE_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            try:
                self.cluster.request("GET", path)
            except ApiException as e:
                if e.status == 404:
                    return
            time.sleep(datapath.POLL_SECONDS)

    def stop(self) -> None:
        """Tear down in reverse: pods (CNI DEL), agent (by PID), forwarder, namespaces, the cgroup."""
        for net in list(self.pods.values()):
            with contextlib.suppress(Exception):
                datapath.cni(self.bin_dir, self.node_ns, self.agent, "DEL", namespace=net.namespace,
                             name=net.name, container_id=net.container_id, netns_path=net.netns.path)
        if hasattr(self, "agent"):
            self.agent.stop()
        if self.forwarder is not None:
            self.forwarder.close()
        for ns in reversed(self.nets):
            ns.destroy()
        if self.cgroup_dir is not None:
            with contextlib.suppress(OSError):
                self.cgroup_dir.rmdir()
