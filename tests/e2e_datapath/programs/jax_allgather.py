"""One process of a JAX job on CPU: rendezvous through the coordinator, then one cross-process collective.

Run in a pod's netns by the datapath suite (test_framework.py), with the framework venv's python:
    jax_allgather.py COORDINATOR_HOST:PORT NUM_PROCESSES PROCESS_ID TIMEOUT_SECONDS
jax.distributed.initialize() connects every process to the coordination service on the coordinator
(process 0) and waits for all of them; the all-gather then runs over Gloo's TCP transport between the
processes. Prints `collective ok <values>` and exits 0, or exits non-zero with the framework's error
(a rendezvous that never completes raises after TIMEOUT_SECONDS).
"""

import sys

import numpy as np


def main() -> int:
    coordinator, num_processes, process_id, timeout = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id,
                               initialization_timeout=timeout)
    print(f"rendezvous ok: process {jax.process_index()} of {jax.process_count()}", flush=True)
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.array([process_id + 1], dtype=np.int32))
    values = sorted(int(v) for v in np.asarray(gathered).ravel())
    expected = list(range(1, num_processes + 1))
    if values != expected:
        print(f"collective wrong: {values} != {expected}", flush=True)
        return 1
    print(f"collective ok {values}", flush=True)
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
