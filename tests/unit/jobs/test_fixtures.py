"""Upstream example jobs (fixtures/README.md) parse into the groups their operators would run."""

from __future__ import annotations

import pytest

from app import jobs
from tests.unit.jobs.builders import GPU_RESOURCES, load_fixture

# file → (coordinator, {replica: (count, gpus per pod)}, non-collective flows as (src, dst, ports, purpose))
CASES = {
    "pytorch-simple.yaml": (
        "Master",
        {"Master": (1, 0), "Worker": (1, 0)},
        [("Worker", "Master", "23456", "rendezvous")],
    ),
    "pytorch-elastic-echo.yaml": ("Worker", {"Worker": (2, 0)}, [("Worker", "Worker", "23456", "rendezvous")]),
    "pytorch-mnist-nccl.yaml": (
        "Master",
        {"Master": (1, 1), "Worker": (1, 1)},
        [("Worker", "Master", "23456", "rendezvous")],
    ),
    "tf-dist-mnist.yaml": (
        "Chief",
        {"Chief": (1, 0), "PS": (1, 0), "Worker": (2, 0)},
        [
            ("Chief", "PS", "2222", "all-to-all"),
            ("Chief", "Worker", "2222", "all-to-all"),
            ("PS", "Chief", "2222", "all-to-all"),
            ("PS", "Worker", "2222", "all-to-all"),
            ("Worker", "Chief", "2222", "all-to-all"),
            ("Worker", "PS", "2222", "all-to-all"),
            ("Worker", "Worker", "2222", "all-to-all"),
        ],
    ),
    "tf-single-worker.yaml": ("Worker", {"Worker": (1, 0)}, []),
    "xgboost.yaml": ("Master", {"Master": (1, 0), "Worker": (2, 0)}, [("Worker", "Master", "9991", "rendezvous")]),
    "paddle-gpu.yaml": ("Worker", {"Worker": (2, 2)}, [("Worker", "Worker", "37777", "rendezvous")]),
    "jax-cpu-demo.yaml": ("Worker", {"Worker": (2, 0)}, [("Worker", "Worker", "6666", "rendezvous")]),
    "mpi-v1-tensorflow-mnist.yaml": ("Launcher", {"Launcher": (1, 0), "Worker": (2, 0)}, []),
    "mpi-v2-tensorflow-benchmarks.yaml": (
        "Launcher",
        {"Launcher": (1, 0), "Worker": (2, 1)},
        [("Launcher", "Worker", "22", "launcher")],
    ),
    "jobset-coordinator.yaml": ("driver", {"workers": (4, 0), "driver": (1, 0)}, []),
    "jobset-depends-on.yaml": ("launcher", {"initializer": (1, 0), "launcher": (1, 0), "worker": (4, 0)}, []),
    "trainjob-multi-node.yaml": ("node", {"node": (3, 0)}, [("node", "node", "29500", "rendezvous")]),
    "trainjob-runtime-patches.yaml": ("node", {"node": (2, 0)}, [("node", "node", "29500", "rendezvous")]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_upstream_example_parses_to_the_expected_group(name: str) -> None:
    group = jobs.parse_job(load_fixture(name), gpu_resources=GPU_RESOURCES, namespace="default")
    got = (
        group.coordinator,
        {r.key: (r.count, r.gpus_per_pod) for r in group.replicas},
        [(f.src, f.dst, str(f.ports), f.purpose) for f in group.flows if f.purpose != "collective"],
    )
    assert got == CASES[name]
