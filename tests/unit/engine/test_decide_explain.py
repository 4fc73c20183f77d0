"""`topoguard explain`: exit codes, the JSON map and the text table, on the bundled seed-lab example."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from app import cli

ROOT = Path(__file__).resolve().parents[3]
LAB_CLUSTER = ROOT / "examples" / "lab-cluster.yaml"
LAB_JOB = ROOT / "examples" / "pytorchjob-lab.yaml"
LAB_CONFIG = ROOT / "examples" / "config.yaml"


def explain(*argv: str) -> tuple[int, str, str]:
    from app.commands import explain as command

    args = cli.build_parser().parse_args(["explain", *argv])
    out, err = io.StringIO(), io.StringIO()
    code = command.run(args, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_lab_job_json_map_chooses_zone_a_with_the_patch() -> None:
    code, out, _ = explain(str(LAB_JOB), "--cluster", str(LAB_CLUSTER), "--config", str(LAB_CONFIG), "-o", "json")
    got = json.loads(out)
    assert code == 0
    assert (got["allowed"], got["zone"], got["labels"], got["openZones"]) == (
        True,
        "zone-a",
        {"zone": "zone-a"},
        ["zone-a"],
    )
    assert got["tolerations"] == {
        "Master": [{"key": "gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}]
    }
    assert [(z["zone"], z["gpuNodes"], z["gpusFree"], z["gpusNeeded"], z["network"]) for z in got["zones"]] == [
        ("zone-a", 2, 8, 4, "allow")
    ]
    assert {
        "op": "replace",
        "path": "/spec/pytorchReplicaSpecs/Master/template/metadata/labels/zone",
        "value": "zone-a",
    } in got["patch"]


def test_lab_job_without_identity_label_exits_1_with_the_fix() -> None:
    code, out, _ = explain(str(LAB_JOB), "--cluster", str(LAB_CLUSTER))
    assert code == 1
    first = out.splitlines()[0]
    assert first.startswith("Refused: Rendezvous traffic (TCP 23456) and NCCL/Gloo collective traffic "
                            "(TCP 32768-60999) between the Worker pods and the Master pod are blocked in zone-a")
    assert "smallest fix: Master carries the static label zone=zone-b" in first
    assert "set zoneIdentityLabel: zone" in first
    # Said once: the flow lines show each verdict, and neither the lead's finding nor the hint is repeated.
    assert "Worker → Master TCP/23456 (pytorchjob-port) is blocked" not in out
    assert out.count("carries the static label") == 2  # the lead, and the zone's own problem line


def test_text_map_has_the_zone_table_and_the_choice() -> None:
    code, out, _ = explain(str(LAB_JOB), "--cluster", str(LAB_CLUSTER), "--config", str(LAB_CONFIG))
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == ("Admitted: The job goes to zone-a: all 4 required flows are open there and 8 free GPUs "
                        "cover the 4 it needs.")
    assert lines[4].split() == [
        "ZONE", "GPU", "NODES", "GPUS", "FREE/NEEDED", "RESERVED", "CAPACITY", "FITS", "NETWORK", "ELIGIBLE"
    ]
    assert lines[5].split() == ["zone-a", "2", "8/4", "0", "now", "yes", "allow", "yes"]
    assert "chosen zone: zone-a (zoneStrategy most-free, mode pin, capacity=now, capacityPolicy wait)" in lines


ADMITTED = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: admitted
  namespace: research
  annotations: {topoguard.io/zone: zone-a}
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: 3
      template:
        spec:
          containers: [{name: pytorch, image: pytorch, resources: {limits: {nvidia.com/gpu: 4}}}]
"""


def test_explain_shows_what_admitted_jobs_reserve_and_who_holds_it(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    (cluster / "nodes.yaml").write_text(THREE_ZONES)
    (cluster / "admitted.yaml").write_text(ADMITTED)
    job = tmp_path / "job.yaml"
    job.write_text(NEWCOMER)

    code, out, _ = explain(str(job), "--cluster", str(cluster), "-o", "json")
    got = json.loads(out)

    assert code == 0
    assert got["zone"] == "zone-c"
    assert got["capacity"] == "now"
    assert {z["zone"]: (z["gpusReserved"], z["capacity"], [h["job"] for h in z["reservedBy"]])
            for z in got["zones"]} == {
        "zone-a": (12, "wait", ["PyTorchJob research/admitted"]),
        "zone-c": (0, "now", []),
    }
    code, text, _ = explain(str(job), "--cluster", str(cluster))
    assert "    reserved: 12 GPUs by PyTorchJob research/admitted" in text.splitlines()


THREE_ZONES = """
apiVersion: v1
kind: Namespace
metadata: {name: research, labels: {topoguard.io/enabled: "true"}}
---
apiVersion: v1
kind: Node
metadata: {name: a-1, labels: {kubernetes.io/hostname: a-1, topology.kubernetes.io/zone: zone-a}}
status: {allocatable: {nvidia.com/gpu: "8"}, conditions: [{type: Ready, status: "True"}]}
---
apiVersion: v1
kind: Node
metadata: {name: a-2, labels: {kubernetes.io/hostname: a-2, topology.kubernetes.io/zone: zone-a}}
status: {allocatable: {nvidia.com/gpu: "8"}, conditions: [{type: Ready, status: "True"}]}
---
apiVersion: v1
kind: Node
metadata: {name: c-1, labels: {kubernetes.io/hostname: c-1, topology.kubernetes.io/zone: zone-c}}
status: {allocatable: {nvidia.com/gpu: "8"}, conditions: [{type: Ready, status: "True"}]}
"""

NEWCOMER = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: newcomer, namespace: research}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          containers: [{name: pytorch, image: pytorch, resources: {limits: {nvidia.com/gpu: 4}}}]
    Worker:
      replicas: 1
      template:
        spec:
          containers: [{name: pytorch, image: pytorch, resources: {limits: {nvidia.com/gpu: 4}}}]
"""


@pytest.mark.parametrize(
    "job_text, message",
    [
        pytest.param("kind: [unclosed", "not valid YAML", id="unparsable YAML"),
        pytest.param("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", "unsupported job kind", id="not a job kind"),
        pytest.param("a: 1\n---\nb: 2\n", "expected exactly one job object, found 2", id="two documents"),
        pytest.param("- 1\n- 2\n", "expected a Kubernetes object", id="a list, not an object"),
        pytest.param(
            "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: x}\nspec: {pytorchReplicaSpecs: 3}\n",
            "pytorchReplicaSpecs",
            id="a malformed job names the field",
        ),
    ],
)
def test_unusable_job_exits_2(tmp_path: Path, job_text: str, message: str) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(job_text)
    code, out, err = explain(str(job), "--cluster", str(LAB_CLUSTER))
    assert (code, out) == (2, "")
    assert message in err


def test_missing_cluster_exits_2(tmp_path: Path) -> None:
    code, out, err = explain(str(LAB_JOB), "--cluster", str(tmp_path / "nope.yaml"))
    assert (code, out) == (2, "")
    assert "no such file or directory" in err




def _lab_with(tmp_path: Path, transform) -> Path:  # type: ignore[no-untyped-def]
    import yaml

    docs = [d for d in yaml.safe_load_all(LAB_CLUSTER.read_text()) if d]
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all([d for d in map(transform, docs) if d is not None]))
    return path


def test_a_namespace_not_opted_in_is_said_first_and_the_analysis_still_follows(tmp_path: Path) -> None:
    def drop_opt_in(doc):  # type: ignore[no-untyped-def]
        if doc["kind"] == "Namespace":
            doc["metadata"]["labels"].pop("topoguard.io/enabled", None)
        return doc

    cluster = _lab_with(tmp_path, drop_opt_in)
    code, out, _ = explain(str(LAB_JOB), "--cluster", str(cluster), "--config", str(LAB_CONFIG))
    lines = out.splitlines()
    assert lines[0] == "note: the webhook will not review this job: namespace ml-demo lacks topoguard.io/enabled=true"
    assert lines[1].startswith("Admitted: The job goes to zone-a")
    assert code == 0
    code, out, _ = explain(str(LAB_JOB), "--cluster", str(cluster), "--config", str(LAB_CONFIG), "-o", "json")
    assert json.loads(out)["webhookReviews"] is False


def test_a_snapshot_without_nodes_names_the_missing_kind(tmp_path: Path) -> None:
    cluster = _lab_with(tmp_path, lambda doc: None if doc["kind"] == "Node" else doc)
    code, out, _ = explain(str(LAB_JOB), "--cluster", str(cluster))
    assert code == 1
    assert out.splitlines()[0] == (
        "Refused: No zone can run the job's GPU pods: the cluster snapshot has no Node objects, so no zone can be "
        "judged: add them (kubectl get nodes -o yaml)."
    )
    assert "warning: the cluster snapshot has no Node" in out
    assert "carries the zone label" not in out


def test_fits_says_no_capacity_apart_from_cannot_run_here(tmp_path: Path) -> None:
    def shrink(doc):  # type: ignore[no-untyped-def]
        if doc["kind"] == "Node" and "nvidia.com/gpu" in doc["status"]["allocatable"]:
            doc["status"]["allocatable"]["nvidia.com/gpu"] = "1"
        return doc

    cluster = _lab_with(tmp_path, shrink)
    config = tmp_path / "config.yaml"
    config.write_text(LAB_CONFIG.read_text() + "\ncapacityPolicy: refuse\n")
    code, out, _ = explain(str(LAB_JOB), "--cluster", str(cluster), "--config", str(config))
    assert code == 1
    row = next(line for line in out.splitlines() if line.startswith("zone-a  "))
    assert "no capacity" in row
    assert out.splitlines()[0].startswith("Refused: There are not enough GPUs for the job in any open zone")

    import yaml

    job = yaml.safe_load(LAB_JOB.read_text())
    job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["nodeSelector"] = {"pool": "nowhere"}
    pinned = tmp_path / "job.yaml"
    pinned.write_text(yaml.safe_dump(job))
    code, out, _ = explain(str(pinned), "--cluster", str(LAB_CLUSTER), "--config", str(LAB_CONFIG), "-o", "json")
    assert code == 1
    assert {z["zone"]: z["fitsText"] for z in json.loads(out)["zones"]} == {"zone-a": "cannot run here"}


def test_an_unparsable_gpu_allocatable_is_reported(tmp_path: Path) -> None:
    def garble(doc):  # type: ignore[no-untyped-def]
        if doc["kind"] == "Node" and doc["metadata"]["name"] == "gpu-a-2":
            doc["status"]["allocatable"]["nvidia.com/gpu"] = "four"
        return doc

    cluster = _lab_with(tmp_path, garble)
    code, out, _ = explain(str(LAB_JOB), "--cluster", str(cluster), "--config", str(LAB_CONFIG))
    assert code == 0
    assert "warning: node gpu-a-2: allocatable nvidia.com/gpu='four' is not a quantity, so it counts as 0 GPUs" in out
