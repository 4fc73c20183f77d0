"""TrainJob parsing with runtime composition: what reading the runtime costs a review.

Composes the upstream Trainer v2.3.0 example 02 (a runtimePatches entry) against three upstream
runtimes (tests/unit/jobs/fixtures/trainer/), and once without runtimes (the TrainJob alone), and
prints the median and p95 of `jobs.parse_job` in microseconds.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from app import jobs
from app.cache.files import build_snapshot

TRAINER = Path(__file__).resolve().parents[1] / "tests" / "unit" / "jobs" / "fixtures" / "trainer"
RUNTIMES = ["torch_distributed.yaml", "deepspeed_distributed.yaml", "torchtune_llama3_2_1B.yaml"]
RUNS = 3000


def load(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((TRAINER / name).read_text()) if isinstance(d, dict)]


def micros(fn: Any) -> tuple[float, float]:
    fn()
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return statistics.median(times) * 1e6, times[int(len(times) * 0.95)] * 1e6


def main() -> int:
    runtimes = [d for f in RUNTIMES for d in load(f)]
    known = build_snapshot(runtimes).training_runtimes
    (job,) = [d for d in load("example-02-runtime-patches.yaml") if d["kind"] == "TrainJob"]
    print(f"{'runtime':32} {'median µs':>10} {'p95 µs':>10}")
    for runtime in runtimes:
        job["spec"]["runtimeRef"] = {"kind": runtime["kind"], "name": runtime["metadata"]["name"]}
        median, p95 = micros(lambda: jobs.parse_job(job, gpu_resources=("nvidia.com/gpu",), namespace="ml",
                                                    runtimes=known))
        print(f"{runtime['metadata']['name']:32} {median:10.0f} {p95:10.0f}")
    median, p95 = micros(lambda: jobs.parse_job(job, gpu_resources=("nvidia.com/gpu",), namespace="ml"))
    print(f"{'(no runtimes: the TrainJob alone)':32} {median:10.0f} {p95:10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
