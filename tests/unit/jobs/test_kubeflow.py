"""kubeflow.org replica-map kinds: coordinator, labels, counts, ports and flows."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from app import jobs
from app.jobs import kubeflow
from app.models import labels as L
from app.models.cluster import BoundedMemo, ContainerPort
from app.models.job import Flow, JobGroup, Replica, UserPlacement
from app.models.network import EPHEMERAL_PORTS, PortRange
from tests.unit.jobs.builders import GPU, GPU_RESOURCES, container, kubeflow_job, replica, template

V2 = "kubeflow.org/v2beta1"


def parse(raw: dict[str, Any], namespace: str = "") -> JobGroup:
    return jobs.parse_job(raw, gpu_resources=GPU_RESOURCES, namespace=namespace)


def port(number: int, name: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"containerPort": number}
    if name:
        out["name"] = name
    return out


def rendezvous(src: str, dst: str, number: int, name: str = "") -> Flow:
    return Flow(src, dst, PortRange.single(number), "TCP", "rendezvous", name)


def non_collective(group: JobGroup) -> list[Flow]:
    return [f for f in group.flows if f.purpose != "collective"]


def collective_pairs(group: JobGroup) -> set[tuple[str, str]]:
    return {(f.src, f.dst) for f in group.flows if f.purpose == "collective"}


W = replica(template(container("pytorch")), 2)


@pytest.mark.parametrize(
    "raw, want",
    [
        pytest.param(
            kubeflow_job("PyTorchJob", {"Worker": W, "Master": replica()}), "Master", id="pytorch master coordinates"
        ),
        pytest.param(
            kubeflow_job("PyTorchJob", {"Worker": W}), "Worker", id="pytorch without master: worker-0 coordinates"
        ),
        pytest.param(
            kubeflow_job("PyTorchJob", {"worker": W, "master": replica()}),
            "master",
            id="pytorch lower-case keys match, key kept as written",
        ),
        pytest.param(
            kubeflow_job("TFJob", {"PS": W, "Worker": W, "Chief": replica()}), "Chief", id="tf chief coordinates"
        ),
        pytest.param(
            kubeflow_job("TFJob", {"Worker": W, "MASTER": replica()}), "MASTER", id="tf upper-case master is the chief"
        ),
        pytest.param(
            kubeflow_job("TFJob", {"ps": W, "worker": W}), "worker", id="tf without chief: worker-0 coordinates"
        ),
        pytest.param(
            kubeflow_job("TFJob", {"PS": W, "Evaluator": W}), "PS", id="tf without chief or worker: first replica"
        ),
        pytest.param(
            kubeflow_job("XGBoostJob", {"Worker": W, "Master": replica()}), "Master", id="xgboost master coordinates"
        ),
        pytest.param(
            kubeflow_job("PaddleJob", {"Worker": W, "Master": replica()}),
            "Master",
            id="paddle ps mode: master coordinates",
        ),
        pytest.param(
            kubeflow_job("PaddleJob", {"Worker": W}), "Worker", id="paddle collective mode: worker-0 coordinates"
        ),
        pytest.param(kubeflow_job("JAXJob", {"Worker": W}), "Worker", id="jax worker-0 coordinates"),
        pytest.param(
            kubeflow_job("MPIJob", {"Worker": W, "Launcher": replica()}), "Launcher", id="mpi v1 launcher coordinates"
        ),
        pytest.param(
            kubeflow_job("MPIJob", {"Worker": W, "launcher": replica()}, api_version=V2),
            "launcher",
            id="mpi v2 launcher coordinates",
        ),
    ],
)
def test_coordinator_is_chosen_per_kind(raw: dict[str, Any], want: str) -> None:
    group = parse(raw)
    assert group.coordinator == want
    assert [r.key for r in group.replicas if r.is_coordinator] == [want]


def _labels(kind: str, rtype: str, **extra: str) -> dict[str, str]:
    return {
        L.KF_OPERATOR_NAME: f"{kind.lower()}-controller",
        L.KF_JOB_NAME: "train",
        L.KF_REPLICA_TYPE: rtype,
        **extra,
    }


@pytest.mark.parametrize(
    "raw, key, want_labels, want_leader, want_index",
    [
        pytest.param(
            kubeflow_job(
                "PyTorchJob",
                {"Master": replica(template(container("pytorch"), labels={"app": "x", L.KF_REPLICA_TYPE: "spoof"}))},
            ),
            "Master",
            {"app": "x", **_labels("PyTorchJob", "master"), L.KF_JOB_ROLE: "master"},
            {L.KF_JOB_ROLE: "master"},
            L.KF_REPLICA_INDEX,
            id="single master carries job-role and operator labels win over the template",
        ),
        pytest.param(
            kubeflow_job("PyTorchJob", {"WORKER": replica(template(container("pytorch")), 3)}),
            "WORKER",
            _labels("PyTorchJob", "worker"),
            {L.KF_JOB_ROLE: "master"},
            L.KF_REPLICA_INDEX,
            id="worker-only pytorch: job-role only on worker-0, replica-type lower-cased",
        ),
        pytest.param(
            kubeflow_job("PyTorchJob", {"Master": replica(), "Worker": replica(None, 2)}),
            "Worker",
            _labels("PyTorchJob", "worker"),
            {},
            L.KF_REPLICA_INDEX,
            id="workers beside a master get no job-role",
        ),
        pytest.param(
            kubeflow_job("PaddleJob", {"Worker": replica(None, 2)}),
            "Worker",
            _labels("PaddleJob", "worker"),
            {},
            L.KF_REPLICA_INDEX,
            id="paddle collective mode: rendezvous worker gets no job-role",
        ),
        pytest.param(
            kubeflow_job("TFJob", {"ps": replica(), "chief": replica()}),
            "ps",
            _labels("TFJob", "ps"),
            {},
            L.KF_REPLICA_INDEX,
            id="tf ps labelled with the lower-case type",
        ),
        pytest.param(
            kubeflow_job("MPIJob", {"Launcher": replica(), "Worker": replica()}),
            "Launcher",
            {**_labels("MPIJob", "launcher"), L.KF_JOB_ROLE: "master"},
            {L.KF_JOB_ROLE: "master"},
            "",
            id="mpi v1 launcher: job-role master and no replica-index label",
        ),
        pytest.param(
            kubeflow_job("MPIJob", {"Launcher": replica(), "Worker": replica()}, api_version=V2),
            "Launcher",
            {
                L.KF_OPERATOR_NAME: "mpi-operator",
                L.KF_JOB_NAME: "train",
                L.KF_JOB_ROLE: "launcher",
                "batch.kubernetes.io/job-name": "train-launcher",
                "job-name": "train-launcher",
            },
            {},
            "",
            id="mpi v2 launcher: job-role launcher, batch job labels, no replica-type",
        ),
        pytest.param(
            kubeflow_job("MPIJob", {"Launcher": replica(), "Worker": replica()}, api_version=V2),
            "Worker",
            {L.KF_OPERATOR_NAME: "mpi-operator", L.KF_JOB_NAME: "train", L.KF_JOB_ROLE: "worker"},
            {},
            L.KF_REPLICA_INDEX,
            id="mpi v2 worker: job-role worker",
        ),
        pytest.param(
            kubeflow_job(
                "MPIJob", {"Launcher": replica(), "Worker": replica()}, api_version=V2, runLauncherAsWorker=True
            ),
            "Launcher",
            {
                L.KF_OPERATOR_NAME: "mpi-operator",
                L.KF_JOB_NAME: "train",
                L.KF_JOB_ROLE: "launcher",
                L.KF_REPLICA_INDEX: "0",
                "batch.kubernetes.io/job-name": "train-launcher",
                "job-name": "train-launcher",
            },
            {},
            "",
            id="mpi v2 launcher as worker is replica-index 0",
        ),
    ],
)
def test_pod_labels_match_what_the_operator_sets(
    raw: dict[str, Any], key: str, want_labels: dict[str, str], want_leader: dict[str, str], want_index: str
) -> None:
    r = parse(raw).replica(key)
    assert (dict(r.pod_labels), dict(r.leader_labels), r.index_label) == (want_labels, want_leader, want_index)


@pytest.mark.parametrize(
    "raw, want",
    [
        pytest.param(
            kubeflow_job("PyTorchJob", {"Master": replica(), "Worker": replica(None, 3)}),
            {"Master": 1, "Worker": 3},
            id="replicas default to 1",
        ),
        pytest.param(
            kubeflow_job("MPIJob", {"Launcher": replica(), "Worker": replica()}),
            {"Launcher": 1, "Worker": 0},
            id="mpi v1 workers default to 0",
        ),
        pytest.param(
            kubeflow_job("MPIJob", {"Launcher": replica(), "Worker": replica()}, api_version=V2),
            {"Launcher": 1, "Worker": 1},
            id="mpi v2 workers default to 1",
        ),
        pytest.param(
            kubeflow_job("TFJob", {"Worker": replica(None, 0), "PS": replica(None, 2)}),
            {"Worker": 0, "PS": 2},
            id="zero replicas kept",
        ),
        pytest.param(
            kubeflow_job("MPIJob", {"Launcher": replica(), "Worker": replica(), "Extra": replica()}, api_version=V2),
            {"Launcher": 1, "Worker": 1},
            id="mpi v2 ignores unknown replica keys as the operator does",
        ),
    ],
)
def test_replica_counts(raw: dict[str, Any], want: dict[str, int]) -> None:
    assert {r.key: r.count for r in parse(raw).replicas} == want


@pytest.mark.parametrize(
    "raw, want",
    [
        pytest.param(
            kubeflow_job(
                "PyTorchJob",
                {
                    "Master": replica(template(container("pytorch"))),
                    "Worker": replica(template(container("pytorch")), 2),
                },
            ),
            [rendezvous("Worker", "Master", 23456, "pytorchjob-port")],
            id="pytorch default port 23456 to the master",
        ),
        pytest.param(
            kubeflow_job(
                "PyTorchJob",
                {
                    "Master": replica(template(container("pytorch", ports=[port(29400, "pytorchjob-port")]))),
                    "Worker": replica(template(container("pytorch"))),
                },
            ),
            [rendezvous("Worker", "Master", 29400, "pytorchjob-port")],
            id="pytorch port named pytorchjob-port on the master wins",
        ),
        pytest.param(
            kubeflow_job(
                "PyTorchJob",
                {
                    "Master": replica(
                        template(container("sidecar", ports=[port(29400, "pytorchjob-port")]), container("pytorch"))
                    ),
                    "Worker": replica(template(container("pytorch"))),
                },
            ),
            [rendezvous("Worker", "Master", 23456, "pytorchjob-port")],
            id="pytorch port named on another container is not the operator's port",
        ),
        pytest.param(
            kubeflow_job(
                "PyTorchJob", {"Worker": replica(template(container("pytorch")), 3)}, elasticPolicy={"rdzvPort": 29400}
            ),
            [rendezvous("Worker", "Worker", 29400)],
            id="pytorch elastic rdzvPort to worker-0",
        ),
        pytest.param(
            kubeflow_job(
                "PyTorchJob", {"Worker": replica(template(container("pytorch")), 3)}, elasticPolicy={"rdzvHost": "etcd"}
            ),
            [],
            id="pytorch elastic with an external rdzvHost needs no rendezvous flow in the group",
        ),
        pytest.param(
            kubeflow_job(
                "XGBoostJob",
                {"Master": replica(template(container("xgboost"))), "Worker": replica(template(container("xgboost")))},
            ),
            [rendezvous("Worker", "Master", 9999, "xgboostjob-port")],
            id="xgboost default port 9999",
        ),
        pytest.param(
            kubeflow_job("PaddleJob", {"Worker": replica(template(container("paddle")), 2)}),
            [rendezvous("Worker", "Worker", 36543, "master")],
            id="paddle default port named master 36543",
        ),
        pytest.param(
            kubeflow_job(
                "JAXJob", {"Worker": replica(template(container("jax", ports=[port(7777, "jaxjob-port")])), 2)}
            ),
            [rendezvous("Worker", "Worker", 7777, "jaxjob-port")],
            id="jax named port wins over 6666",
        ),
        pytest.param(
            kubeflow_job("JAXJob", {"Worker": replica(template(container("jax")), 2)}),
            [rendezvous("Worker", "Worker", 6666, "jaxjob-port")],
            id="jax default port 6666",
        ),
        pytest.param(
            kubeflow_job(
                "TFJob",
                {
                    "PS": replica(template(container("tensorflow", ports=[port(2223, "tfjob-port")]))),
                    "Worker": replica(template(container("tensorflow"))),
                },
            ),
            [
                Flow("PS", "Worker", PortRange.single(2222), "TCP", "all-to-all", "tfjob-port"),
                Flow("Worker", "PS", PortRange.single(2223), "TCP", "all-to-all", "tfjob-port"),
            ],
            id="tf all-to-all on each destination's own port",
        ),
        pytest.param(
            kubeflow_job("TFJob", {"Worker": replica(template(container("tensorflow")))}),
            [],
            id="tf single pod is not distributed: no flows",
        ),
        pytest.param(
            kubeflow_job("MPIJob", {"Launcher": replica(), "Worker": replica(None, 2)}, api_version=V2),
            [Flow("Launcher", "Worker", PortRange.single(22), "TCP", "launcher")],
            id="mpi v2 launcher reaches workers over ssh",
        ),
        pytest.param(
            kubeflow_job("MPIJob", {"Launcher": replica(), "Worker": replica(None, 2)}),
            [],
            id="mpi v1 launcher uses kubectl exec: no pod-to-pod launcher flow",
        ),
    ],
)
def test_framework_flows(raw: dict[str, Any], want: list[Flow]) -> None:
    assert non_collective(parse(raw)) == want


def test_default_port_is_added_to_the_framework_container_ports() -> None:
    raw = kubeflow_job("PyTorchJob", {"Master": replica(template(container("pytorch", ports=[port(8080, "metrics")])))})
    assert parse(raw).replica("Master").ports == (
        ContainerPort(8080, "TCP", "metrics"),
        ContainerPort(23456, "TCP", "pytorchjob-port"),
    )


@pytest.mark.parametrize(
    "raw, want",
    [
        pytest.param(
            kubeflow_job(
                "TFJob",
                {
                    "Chief": replica(template(container("tensorflow"))),
                    "PS": replica(template(container("tensorflow")), 2),
                    "Worker": replica(template(container("tensorflow", gpus=1)), 2),
                },
            ),
            {("Chief", "Worker"), ("Worker", "Chief"), ("Worker", "Worker")},
            id="gpu workers and the cpu chief exchange collectives, the cpu ps does not",
        ),
        pytest.param(
            kubeflow_job(
                "PyTorchJob",
                {"Master": replica(template(container("pytorch"))), "Worker": replica(template(container("pytorch")))},
            ),
            {("Master", "Worker"), ("Worker", "Master")},
            id="cpu-only job: every replica takes part",
        ),
        pytest.param(
            kubeflow_job("PyTorchJob", {"Master": replica(template(container("pytorch", gpus=1)))}),
            set(),
            id="one pod: nothing to connect",
        ),
        pytest.param(
            kubeflow_job("TFJob", {"PS": replica(template(container("tensorflow"))), "Worker": replica(None, 2)}),
            set(),
            id="cpu-only tf: collectives run over the grpc port, no extra flows",
        ),
    ],
)
def test_collective_flows_cover_the_ephemeral_range_between_participants(
    raw: dict[str, Any], want: set[tuple[str, str]]
) -> None:
    group = parse(raw)
    assert collective_pairs(group) == want
    assert all(f.ports == EPHEMERAL_PORTS and f.protocol == "TCP" for f in group.flows if f.purpose == "collective")


def test_replica_reads_placement_account_and_host_network_as_written() -> None:
    term = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a100"]}]}
    toleration = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    tpl = template(
        container("pytorch", gpus="2"),
        nodeSelector={"disk": "ssd"},
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}},
        tolerations=[toleration],
        serviceAccountName="trainer",
        hostNetwork=True,
    )
    r = parse(kubeflow_job("PyTorchJob", {"Master": replica(tpl)})).replica("Master")
    assert (dict(r.placement.node_selector), r.placement.node_selector_terms, r.placement.tolerations) == (
        {"disk": "ssd"},
        (term,),
        (toleration,),
    )
    assert (r.service_account, r.host_network, dict(r.gpus), r.template_path) == (
        "trainer",
        True,
        {"nvidia.com/gpu": 2},
        "/spec/pytorchReplicaSpecs/Master/template",
    )


def test_job_identity_selector_and_namespace_fallback() -> None:
    raw = kubeflow_job("PyTorchJob", {"Master": replica()}, namespace=None)
    raw["metadata"]["annotations"] = {"team": "a"}
    group = parse(raw, namespace="from-request")
    assert (
        group.name,
        group.namespace,
        dict(group.annotations),
        dict(group.group_selector),
        group.supports_spread,
    ) == (
        "train",
        "from-request",
        {"team": "a"},
        {L.KF_OPERATOR_NAME: "pytorchjob-controller", L.KF_JOB_NAME: "train"},
        True,
    )


def test_generate_name_leaves_name_derived_labels_out() -> None:
    raw = kubeflow_job("PyTorchJob", {"Master": replica()})
    raw["metadata"] = {"generateName": "train-"}
    group = parse(raw, namespace="ml")
    assert dict(group.group_selector) == {L.KF_OPERATOR_NAME: "pytorchjob-controller"}
    assert L.KF_JOB_NAME not in group.replica("Master").pod_labels


def test_template_key_with_slash_and_tilde_is_escaped() -> None:
    group = parse(kubeflow_job("TFJob", {"a/b~c": replica()}))
    assert group.replicas[0].template_path == "/spec/tfReplicaSpecs/a~1b~0c/template"


@pytest.mark.parametrize(
    "raw, want",
    [
        pytest.param(
            kubeflow_job("MPIJob", {"Launcher": replica(template(container())), "Worker": replica()}),
            "train-launcher",
            id="mpi v1 launcher runs as the operator's <job>-launcher account",
        ),
        pytest.param(
            kubeflow_job(
                "MPIJob", {"Launcher": replica(template(container(), serviceAccountName="mine")), "Worker": replica()}
            ),
            "mine",
            id="mpi v1 launcher keeps an account the user named",
        ),
        pytest.param(
            kubeflow_job("MPIJob", {"Launcher": replica(template(container())), "Worker": replica()}, api_version=V2),
            "default",
            id="mpi v2 launcher keeps the namespace default account",
        ),
    ],
)
def test_launcher_service_account(raw: dict[str, Any], want: str) -> None:
    assert parse(raw).replica("Launcher").service_account == want


def test_whole_group_of_a_gpu_pytorchjob() -> None:
    toleration = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    raw = kubeflow_job(
        "PyTorchJob",
        {
            "Master": replica(template(container("pytorch"), labels={"app": "llm"})),
            "Worker": replica(
                template(container("pytorch", gpus=8), labels={"app": "llm"}, tolerations=[toleration]), 2
            ),
        },
    )
    common = {L.KF_OPERATOR_NAME: "pytorchjob-controller", L.KF_JOB_NAME: "train"}
    no_placement = UserPlacement(node_selector={}, node_selector_terms=(), tolerations=())
    default_port = (ContainerPort(23456, "TCP", "pytorchjob-port"),)
    want = JobGroup(
        api_version="kubeflow.org/v1",
        kind="PyTorchJob",
        name="train",
        namespace="ml",
        replicas=(
            Replica(
                key="Master",
                role="master",
                count=1,
                template_path="/spec/pytorchReplicaSpecs/Master/template",
                template=raw["spec"]["pytorchReplicaSpecs"]["Master"]["template"],
                pod_labels={"app": "llm", **common, L.KF_REPLICA_TYPE: "master", L.KF_JOB_ROLE: "master"},
                index_label=L.KF_REPLICA_INDEX,
                gpus={},
                ports=default_port,
                service_account="default",
                host_network=False,
                placement=no_placement,
                is_coordinator=True,
                leader_labels={L.KF_JOB_ROLE: "master"},
            ),
            Replica(
                key="Worker",
                role="worker",
                count=2,
                template_path="/spec/pytorchReplicaSpecs/Worker/template",
                template=raw["spec"]["pytorchReplicaSpecs"]["Worker"]["template"],
                pod_labels={"app": "llm", **common, L.KF_REPLICA_TYPE: "worker"},
                index_label=L.KF_REPLICA_INDEX,
                gpus={"nvidia.com/gpu": 8},
                ports=default_port,
                service_account="default",
                host_network=False,
                placement=UserPlacement(node_selector={}, node_selector_terms=(), tolerations=(toleration,)),
                is_coordinator=False,
                leader_labels={},
                requests={"nvidia.com/gpu": 8},
            ),
        ),
        coordinator="Master",
        flows=(
            rendezvous("Worker", "Master", 23456, "pytorchjob-port"),
            Flow("Master", "Worker", EPHEMERAL_PORTS, "TCP", "collective"),
            Flow("Worker", "Master", EPHEMERAL_PORTS, "TCP", "collective"),
            Flow("Worker", "Worker", EPHEMERAL_PORTS, "TCP", "collective"),
        ),
        group_selector=common,
        annotations={},
    )
    assert parse(raw) == want


TOLERATE_GPUS = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]


def bench_job() -> dict[str, Any]:
    """The shape of the bench job (bench/bench_http.py): Master + 15 Workers x 4 GPUs, kubectl-applied."""
    master = template(container("pytorch", requests={"cpu": "16"}), labels={"app": "llm", "role": "coordinator"})
    worker = template(container("pytorch", gpus=4), labels={"app": "llm", "role": "worker"}, tolerations=TOLERATE_GPUS)
    doc = kubeflow_job("PyTorchJob", {"Master": replica(master, 1), "Worker": replica(worker, 15)}, name="llm")
    doc["metadata"]["labels"] = {"app": "llm", "team": "research"}
    doc["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": json.dumps(doc)}
    doc["metadata"]["managedFields"] = [{"manager": "kubectl-client-side-apply", "operation": "Update"}]
    return doc


def _with(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


WORKER = ("spec", "pytorchReplicaSpecs", "Worker")
# Both replicas on Paddle's default port, named as PyTorch names it: the same replicas and ports
# to either framework, but the rendezvous port's name differs (pytorchjob-port; master).
ON_PADDLE_PORT = {
    key: replica(template(container("pytorch", ports=[{"containerPort": 36543, "name": "pytorchjob-port"}])), n)
    for key, n in (("Master", 1), ("Worker", 2))
}
# Jobs one after the other that differ only in what the flows depend on: each needs its own flows.
FLOW_SHAPES = [
    bench_job(),
    _with(bench_job(), (*WORKER, "replicas"), 1),
    _with(bench_job(), (*WORKER, "replicas"), 0),
    _with(bench_job(), (*WORKER, "template", "spec", "containers"), [container("pytorch")]),
    _with(bench_job(), ("spec", "elasticPolicy"), {"rdzvPort": 29400}),
    _with(bench_job(), ("spec", "elasticPolicy"), {"rdzvHost": "etcd"}),
    kubeflow_job("PaddleJob", bench_job()["spec"]["pytorchReplicaSpecs"], name="llm"),
    kubeflow_job("PyTorchJob", ON_PADDLE_PORT),
    kubeflow_job("PaddleJob", ON_PADDLE_PORT),
    kubeflow_job("TFJob", {"PS": replica(template(container("tensorflow")), 2), "Worker": W}),
    kubeflow_job("MPIJob", {"Launcher": replica(), "Worker": W}),
    kubeflow_job("MPIJob", {"Launcher": replica(), "Worker": W}, api_version=V2),
    bench_job(),
]


def test_flows_follow_each_shape_of_job_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """The flows kept per shape of job are those the job's own replicas give (built with nothing kept)."""
    warm = [parse(doc, "ml").flows for doc in FLOW_SHAPES]
    for doc, flows in zip(FLOW_SHAPES, warm, strict=True):
        monkeypatch.setattr(kubeflow, "_FLOWS", BoundedMemo(kubeflow.FLOWS_MEMO_SIZE))
        assert parse(doc, "ml").flows == flows


def test_jobs_of_one_shape_share_one_flows_tuple() -> None:
    """engine/memo.py reuses the plain form of the last flows seen by identity: reviews of one job, or of
    jobs that differ only where flows do not look (names, labels, GPU counts), get the same tuple."""
    first = parse(bench_job(), "ml")
    renamed = _with(bench_job(), ("metadata", "name"), "other")
    more_gpus = _with(bench_job(), (*WORKER, "template", "spec", "containers"), [container("pytorch", gpus=8)])
    for doc in (bench_job(), renamed, more_gpus):
        assert parse(doc, "ml").flows is first.flows


BENCH = bench_job()
SPECS = ("spec", "pytorchReplicaSpecs")
# Each field the reader checks, written otherwise: all but the last two are errors.
WRITTEN_OTHERWISE = {
    "metadata not an object": _with(BENCH, ("metadata",), []),
    "name not a string": _with(BENCH, ("metadata", "name"), 1),
    "no name": _with(BENCH, ("metadata", "name"), ""),
    "generateName not a string": {**BENCH, "metadata": {"generateName": 1}},
    "namespace not a string": _with(BENCH, ("metadata", "namespace"), ["ml"]),
    "annotation not a string": _with(BENCH, ("metadata", "annotations"), {"a": 1}),
    "no spec": _with(BENCH, ("spec",), None),
    "replica map not an object": _with(BENCH, SPECS, []),
    "replica map empty": _with(BENCH, SPECS, {}),
    "empty replica type": _with(BENCH, (*SPECS, ""), {}),
    "unknown replica type": _with(BENCH, (*SPECS, "PS"), {}),
    "replica types equal but for case": _with(BENCH, (*SPECS, "worker"), {}),
    "replica spec not an object": _with(BENCH, WORKER, []),
    "negative replicas": _with(BENCH, (*WORKER, "replicas"), -1),
    "boolean replicas": _with(BENCH, (*WORKER, "replicas"), True),
    "replicas as text": _with(BENCH, (*WORKER, "replicas"), "2"),
    "hostNetwork as text": _with(BENCH, (*WORKER, "template", "spec", "hostNetwork"), "yes"),
    "elasticPolicy not an object": _with(BENCH, ("spec", "elasticPolicy"), "etcd"),
    "rdzvPort 0": _with(BENCH, ("spec", "elasticPolicy"), {"rdzvPort": 0}),
    "rdzvPort boolean": _with(BENCH, ("spec", "elasticPolicy"), {"rdzvPort": True}),
    "rdzvHost not a string": _with(BENCH, ("spec", "elasticPolicy"), {"rdzvHost": 1}),
    "xgboost without master": kubeflow_job("XGBoostJob", {"Worker": W}),
    "mpi v2 without known types": kubeflow_job("MPIJob", {"Other": {}}, api_version=V2),
    "valid: null replica spec": _with(BENCH, WORKER, None),
    "valid: init container": _with(BENCH, (*WORKER, "template", "spec", "initContainers"), [container("init")]),
}


@pytest.mark.parametrize(("case", "doc"), WRITTEN_OTHERWISE.items(), ids=WRITTEN_OTHERWISE.keys())
def test_each_field_written_otherwise_is_refused_or_read(case: str, doc: dict[str, Any]) -> None:
    if case.startswith("valid"):
        assert isinstance(parse(doc, "ml"), JobGroup)
        return
    with pytest.raises(jobs.InvalidJobError) as raised:
        parse(doc, "ml")
    assert raised.value.errors
